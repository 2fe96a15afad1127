"""PyTorch peers for the benchmark harness: RNNsearch written the way ``attn_jax`` writes it, and its train step.

:class:`TorchRNNsearch` is Bahdanau, Cho & Bengio (2015), appendix A, with exactly the equations, parameter
shapes and wiring of ``attn_jax/models/rnnsearch.py`` (scorer ``additive``, no input feeding) and
``attn_jax/nn/recurrent.py``:

* encoder: shared source embedding, a forward and a backward GRU with the paper's reset gate *before* ``U``
  (``h̃ = tanh(W x + U[r ∘ h] + b)`` — not ``torch.nn.GRU``, which computes ``r ∘ (U h + b)``); masked steps
  carry the state, annotations ``[→h; ←h]`` are zero at padding;
* ``s_0 = tanh(W_s ←h_1 + b_s)``;
* decoder step ``i``: additive attention ``e_ij = vᵀ tanh(W_q s_{i-1} + U_a h_j + b)`` (``U_a h_j`` once per
  batch), masked softmax over the source, ``c_i = Σ α_ij h_j``, then ``s_i = GRU(s_{i-1}; W E y_{i-1} + C c_i)``;
* deep output after the loop: ``t_i = maxout_2(U_o s_{i-1} + V_o E y_{i-1} + C_o c_i + b_o)``,
  ``logits = W_o t_i + b``.

Parameters are stored with the JAX layouts flattened to matrices (``w_x [m, 3·n]`` is ``[m, 3, n]`` row-major),
so :func:`load_jax_params` copies an ``attn_jax`` parameter dict in without any transposition and
:func:`param_count` equals ``attn_jax.train.param_count``. Nothing here imports JAX.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "TorchRNNsearch",
    "TorchRNNsearchFused",
    "beam_search",
    "load_jax_params",
    "make_train_step",
    "param_count",
]


def _normal(*shape: int, std: float = 0.01) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * std)


def _orthogonal_blocks(n: int, gates: int) -> nn.Parameter:
    """``[n, gates·n]``: every ``n × n`` block orthogonal (appendix B.1)."""
    return nn.Parameter(torch.cat([nn.init.orthogonal_(torch.empty(n, n)) for _ in range(gates)], dim=1))


class _GRU(nn.Module):
    """The paper's GRU: ``{"w_x": [Din, 3n], "u": [n, 3n], "b": [3n]}`` (+ ``"w_c": [Dc, 3n]``), gates z, r, h̃."""

    def __init__(self, in_features: int, hidden: int, context_features: int | None = None):
        super().__init__()
        self.n = hidden
        self.w_x = _normal(in_features, 3 * hidden)
        self.u = _orthogonal_blocks(hidden, 3)
        self.b = nn.Parameter(torch.zeros(3 * hidden))
        self.w_c = None if context_features is None else _normal(context_features, 3 * hidden)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``W x + b`` for every gate, ``[..., 3n]`` (all time steps at once, as attn_jax does)."""
        return x @ self.w_x + self.b

    def cell(self, h: torch.Tensor, x_proj: torch.Tensor) -> torch.Tensor:
        """One step from the previous state and the input projection ``[B, 3n]``."""
        n = self.n
        zr = torch.sigmoid(x_proj[:, : 2 * n] + h @ self.u[:, : 2 * n])
        z, r = zr[:, :n], zr[:, n:]
        candidate = torch.tanh(x_proj[:, 2 * n :] + (r * h) @ self.u[:, 2 * n :])
        return (1.0 - z) * h + z * candidate

    def scan(self, x_proj: torch.Tensor, mask: torch.Tensor, *, reverse: bool = False):
        """``(states [B, S, n], final [B, n])``; masked steps carry the state (attn_jax ``gru_scan``)."""
        batch, steps = x_proj.shape[:2]
        h = x_proj.new_zeros(batch, self.n)
        states: list[torch.Tensor] = [None] * steps  # type: ignore[list-item]
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        for t in order:
            h = torch.where(mask[:, t, None], self.cell(h, x_proj[:, t]), h)
            states[t] = h
        return torch.stack(states, dim=1), h


class TorchRNNsearch(nn.Module):
    """RNNsearch (additive scorer) in PyTorch with ``attn_jax.models.RNNsearch``'s parameters and equations.

    Args:
      src_vocab, tgt_vocab: vocabulary sizes ``K_x``, ``K_y``.
      embed, hidden, maxout, align: ``m``, ``n``, ``l``, ``n'`` as in ``attn_jax.models.RNNConfig``.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, embed: int, hidden: int, maxout: int, align: int):
        super().__init__()
        m, n, lo, a = embed, hidden, maxout, align
        self.n, self.lo = n, lo
        self.src_embed = _normal(src_vocab, m)
        self.tgt_embed = _normal(tgt_vocab, m)
        self.enc_fwd = _GRU(m, n)
        self.enc_bwd = _GRU(m, n)
        self.w_s = _normal(n, n)
        self.b_s = nn.Parameter(torch.zeros(n))
        self.dec = _GRU(m, n, context_features=2 * n)
        # Additive scorer: fan-in scaled as attn_jax.attention.init_additive_params.
        self.att_w_q = nn.Parameter(torch.randn(n, a) / n**0.5)
        self.att_w_k = nn.Parameter(torch.randn(2 * n, a) / (2 * n) ** 0.5)
        self.att_v = nn.Parameter(torch.randn(a) / a**0.5)
        self.att_b = nn.Parameter(torch.zeros(a))
        # Deep output: [in, l·2] with each maxout pair adjacent (attn_jax's [in, l, 2] row-major).
        self.u_o = _normal(n, 2 * lo)
        self.v_o = _normal(m, 2 * lo)
        self.c_o = _normal(2 * n, 2 * lo)
        self.b_o = nn.Parameter(torch.zeros(2 * lo))
        self.w_o = _normal(lo, tgt_vocab)
        self.b_w = nn.Parameter(torch.zeros(tgt_vocab))

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor):
        """``(memory [B, S, 2n], keys [B, S, A], s_0 [B, n])``: annotations, ``U_a h_j + b`` and the first state."""
        x = F.embedding(src, self.src_embed)  # [B, S, m]
        fwd, _ = self.enc_fwd.scan(self.enc_fwd.project(x), src_mask)
        bwd, backward_first = self.enc_bwd.scan(self.enc_bwd.project(x), src_mask, reverse=True)
        memory = torch.cat([fwd, bwd], dim=-1) * src_mask[..., None]  # [B, S, 2n], zero at padding
        keys = memory @ self.att_w_k + self.att_b  # U_a h_j + b, once per batch: [B, S, A]
        return memory, keys, torch.tanh(backward_first @ self.w_s + self.b_s)

    def step(self, memory, keys, src_mask, s, prev):
        """One decoder step: ``(logits [B, V], s_i [B, n], weights [B, S])`` from ``s_{i-1}`` and ``y_{i-1}``."""
        emb = F.embedding(prev, self.tgt_embed)  # [B, m]
        energies = torch.tanh((s @ self.att_w_q)[:, None, :] + keys) @ self.att_v  # [B, S]
        weights = torch.softmax(energies.masked_fill(~src_mask, torch.finfo(torch.float32).min), dim=-1)
        ctx = torch.einsum("bs,bsd->bd", weights, memory)
        pre = s @ self.u_o + emb @ self.v_o + ctx @ self.c_o + self.b_o
        readout = pre.view(pre.shape[0], self.lo, 2).amax(dim=-1)
        new_s = self.dec.cell(s, self.dec.project(emb) + ctx @ self.dec.w_c)
        return readout @ self.w_o + self.b_w, new_s, weights

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: logits ``[B, T, V]`` (float32)."""
        memory, keys, s = self.encode(src, src_mask)

        emb = F.embedding(tgt_in, self.tgt_embed)  # [B, T, m]
        emb_proj = self.dec.project(emb)  # [B, T, 3n]: every W E y_{i-1} + b in one matmul
        fill = torch.finfo(torch.float32).min
        states, contexts = [], []
        for i in range(tgt_in.shape[1]):
            energies = torch.tanh((s @ self.att_w_q)[:, None, :] + keys) @ self.att_v  # [B, S]
            weights = torch.softmax(energies.masked_fill(~src_mask, fill), dim=-1)
            ctx = torch.einsum("bs,bsd->bd", weights, memory)  # c_i: [B, 2n]
            states.append(s)
            contexts.append(ctx)
            s = self.dec.cell(s, emb_proj[:, i] + ctx @ self.dec.w_c)
        s_prev = torch.stack(states, dim=1)  # [B, T, n]: s_{i-1}, as the deep output reads it
        ctx = torch.stack(contexts, dim=1)  # [B, T, 2n]
        pre = s_prev @ self.u_o + emb @ self.v_o + ctx @ self.c_o + self.b_o  # [B, T, 2l]
        readout = pre.view(*pre.shape[:-1], self.lo, 2).amax(dim=-1)  # maxout over adjacent pairs
        return readout @ self.w_o + self.b_w


class TorchRNNsearchFused(nn.Module):
    """RNNsearch as a PyTorch user would write it: the same architecture and sizes, PyTorch's fused recurrent layers.

    The encoder is one bidirectional ``nn.GRU`` over a packed batch (``pack_padded_sequence``: padding is never
    computed, annotations are zero there), the decoder an ``nn.GRUCell`` over ``[E y_{i-1}; c_i]``, the scorer and
    the deep output ``nn.Linear`` layers. It is the speed peer of bench row 4, not a numerical one: ``nn.GRU``
    applies the reset gate after ``U`` (``r ∘ (U h + b)``) and carries a second bias per gate, so its parameter
    count is a little larger (reported) and its losses are not expected to equal attn_jax's.
    :class:`TorchRNNsearch` (the paper's GRU written out) stays the numerical peer.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, embed: int, hidden: int, maxout: int, align: int):
        super().__init__()
        m, n, lo, a = embed, hidden, maxout, align
        self.lo = lo
        self.src_embed = nn.Embedding(src_vocab, m)
        self.tgt_embed = nn.Embedding(tgt_vocab, m)
        self.encoder = nn.GRU(m, n, batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(n, n)
        self.att_q = nn.Linear(n, a, bias=False)
        self.att_k = nn.Linear(2 * n, a)
        self.att_v = nn.Linear(a, 1, bias=False)
        self.decoder = nn.GRUCell(m + 2 * n, n)
        self.readout = nn.Linear(n + m + 2 * n, 2 * lo)  # U_o s + V_o E y + C_o c + b_o as one matmul
        self.out = nn.Linear(lo, tgt_vocab)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: logits ``[B, T, V]`` (float32)."""
        steps = src.shape[1]
        lengths = src_mask.sum(dim=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.src_embed(src), lengths, batch_first=True, enforce_sorted=False
        )
        out, h_n = self.encoder(packed)
        memory, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=steps)  # [B, S, 2n]
        s = torch.tanh(self.init_state(h_n[1]))  # the backward GRU's state at word 1
        keys = self.att_k(memory)  # [B, S, A]
        emb = self.tgt_embed(tgt_in)  # [B, T, m]
        fill = torch.finfo(torch.float32).min
        states, contexts = [], []
        for i in range(tgt_in.shape[1]):
            energies = self.att_v(torch.tanh(self.att_q(s)[:, None, :] + keys)).squeeze(-1)  # [B, S]
            weights = torch.softmax(energies.masked_fill(~src_mask, fill), dim=-1)
            ctx = torch.bmm(weights[:, None, :], memory).squeeze(1)  # [B, 2n]
            states.append(s)
            contexts.append(ctx)
            s = self.decoder(torch.cat([emb[:, i], ctx], dim=-1), s)
        pre = self.readout(torch.cat([torch.stack(states, 1), emb, torch.stack(contexts, 1)], dim=-1))
        readout = pre.view(*pre.shape[:-1], self.lo, 2).amax(dim=-1)  # maxout over adjacent pairs
        return self.out(readout)


def param_count(model: nn.Module) -> int:
    """Number of scalar parameters."""
    return sum(p.numel() for p in model.parameters())


def load_jax_params(model: TorchRNNsearch, params: dict) -> None:
    """Copy an ``attn_jax`` RNNsearch parameter dict (``nnx.to_pure_dict``, NumPy or JAX arrays) into ``model``."""

    def put(param: nn.Parameter, value) -> None:
        array = np.asarray(value, np.float32).reshape(tuple(param.shape))
        with torch.no_grad():
            param.copy_(torch.from_numpy(array.copy()))

    def gru(module: _GRU, p: dict) -> None:
        for name in ("w_x", "u", "b", "w_c"):
            if name in p:
                put(getattr(module, name), p[name])

    put(model.src_embed, params["src_embed"]["embedding"])
    put(model.tgt_embed, params["tgt_embed"]["embedding"])
    gru(model.enc_fwd, params["encoder"]["forward"]["params"])
    gru(model.enc_bwd, params["encoder"]["backward"]["params"])
    put(model.w_s, params["init_state"]["w_s"])
    put(model.b_s, params["init_state"]["b_s"])
    gru(model.dec, params["decoder"]["params"])
    att = params["attention"]["params"]
    for name in ("w_q", "w_k", "v", "b"):
        put(getattr(model, f"att_{name}"), att[name])
    out = params["output"]["params"]
    for name in ("u_o", "v_o", "c_o", "b_o", "w_o", "b_w"):
        put(getattr(model, name), out[name])


def token_loss(logits: torch.Tensor, tgt_out: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
    """``Σ NLL / Σ tokens`` over the real target tokens (``attn_jax.train`` objective, no smoothing)."""
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), reduction="none")
    mask = tgt_mask.reshape(-1).to(nll.dtype)
    return (nll * mask).sum() / mask.sum().clamp_min(1.0)


def make_train_step(model: nn.Module, *, learning_rate: float, clip_norm: float, eps: float = 1e-8):
    """A ``step(src, src_mask, tgt_in, tgt_out, tgt_mask) -> loss`` closure: Adam with global-norm clipping."""
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate, eps=eps)

    def step(src, src_mask, tgt_in, tgt_out, tgt_mask) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = token_loss(model(src, src_mask, tgt_in), tgt_out, tgt_mask)
        loss.backward()
        if clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        return float(loss.detach())

    return step


@torch.inference_mode()
def beam_search(
    model: TorchRNNsearch,
    src,
    src_mask,
    *,
    beam_size: int,
    max_length: int,
    alpha: float = 0.6,
    bos_id: int = 1,
    eos_id: int = 2,
    pad_id: int = 0,
):
    """A batched beam search as a PyTorch user would write it (eager, fairseq-style): the peer of
    ``attn_jax.decoding.beam_search`` in the benchmark. Same rules: the encoder once per sentence, ``K``
    hypotheses per sentence extended by every word, a ``</s>`` among the ``K`` best extensions finishes a
    hypothesis (scored ``log P / ((5 + |Y|) / 6)^α``), the ``K`` best others stay alive with their decoder states
    and attention history reordered by back-pointers, ``</s>`` forced at ``max_length``, stop when no alive
    hypothesis can beat the best finished one. Returns ``(tokens [B, L], scores [B])`` of the best hypothesis.
    """
    batch, k = src.shape[0], beam_size
    memory, keys, s = model.encode(src, src_mask)
    memory, keys, s = (x.repeat_interleave(k, dim=0) for x in (memory, keys, s))
    mask = src_mask.repeat_interleave(k, dim=0)
    alive_lp = torch.full((batch, k), float("-inf"))
    alive_lp[:, 0] = 0.0
    tokens = torch.full((batch, k, max_length), pad_id, dtype=torch.long)
    history = torch.zeros(batch, k, max_length, src.shape[1])
    best_score = torch.full((batch,), float("-inf"))
    best_tokens = torch.full((batch, max_length), pad_id, dtype=torch.long)
    prev = torch.full((batch * k,), bos_id, dtype=torch.long)
    offsets = (torch.arange(batch) * k)[:, None]
    for t in range(max_length):
        logits, s, weights = model.step(memory, keys, mask, s, prev)
        logp = torch.log_softmax(logits, dim=-1)
        vocab = logp.shape[-1]
        logp[:, pad_id] = logp[:, bos_id] = float("-inf")
        if t + 1 == max_length:  # </s> is forced at the limit
            eos = logp[:, eos_id].clone()
            logp.fill_(float("-inf"))
            logp[:, eos_id] = eos
        history[:, :, t] = weights.view(batch, k, -1)
        cand = (alive_lp[..., None] + logp.view(batch, k, vocab)).view(batch, k * vocab)
        top_lp, top = cand.topk(2 * k, dim=1)
        is_eos = top % vocab == eos_id
        lp_norm = ((5.0 + t + 1) / 6.0) ** alpha
        eos_rank = is_eos & (torch.arange(2 * k) < k)  # a </s> among the K best extensions finishes
        eos_score = torch.where(eos_rank, top_lp / lp_norm, torch.tensor(float("-inf")))
        score, pos = eos_score.max(dim=1)
        better = score > best_score
        if better.any():
            beams = top.gather(1, pos[:, None])[:, 0] // vocab
            rows = torch.arange(batch)[better]
            best_tokens[rows] = tokens[rows, beams[better]]
            best_tokens[rows, t] = eos_id
            best_score = torch.where(better, score, best_score)
        keep_lp, keep = torch.where(is_eos, torch.tensor(float("-inf")), top_lp).topk(k, dim=1)
        flat = top.gather(1, keep)
        beams, words = flat // vocab, flat % vocab
        tokens = tokens.gather(1, beams[..., None].expand(-1, -1, max_length)).clone()
        tokens[:, :, t] = words
        history = history.gather(1, beams[..., None, None].expand(-1, -1, max_length, history.shape[-1]))
        rows = (offsets + beams).view(-1)
        s = s.index_select(0, rows)
        prev = words.view(-1)
        max_lp = ((5.0 + max_length) / 6.0) ** alpha
        alive_lp = torch.where(
            (keep_lp.max(dim=1).values / max_lp <= best_score)[:, None], torch.tensor(float("-inf")), keep_lp
        )
        if not torch.isfinite(alive_lp).any():
            break
    return best_tokens, best_score
