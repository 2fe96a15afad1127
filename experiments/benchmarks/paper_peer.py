"""RNNsearch in PyTorch, written only from Bahdanau, Cho and Bengio (ICLR 2015).

This is a second, independent peer. It follows these parts of the paper:

- Section 3.1 and Appendix A.2.2: the decoder, s_i = f(s_{i-1}, y_{i-1}, c_i), with
  c_i = sum_j alpha_ij h_j, alpha_ij = softmax_j(e_ij) and e_ij = a(s_{i-1}, h_j).
- Section 3.2 and Appendix A.2.1: the encoder. A forward and a backward GRU share one source
  embedding E and have their own weights. The annotation is h_j = [fwd h_j; bwd h_j], size 2n.
- Appendix A.1.1 and A.2: the gated unit. Its candidate is tanh(W x + U [r o s] + C c), and
  its update is s_i = (1 - z_i) o s_{i-1} + z_i o s~_i.
- Appendix A.1.2: the alignment model v_a^T tanh(W_a s_{i-1} + U_a h_j). U_a h_j is computed
  once per sentence, before the decoder loop.
- Appendix A.2.2: s_0 = tanh(W_s bwd h_1). The deep output is t~_i = U_o s_{i-1} + V_o E y_{i-1}
  + C_o c_i. Then t_i = [max(t~_{i,2j-1}, t~_{i,2j})]_{j=1..l} (adjacent pairs), and the logits
  are W_o t_i.
- Appendix B.1: the initialisation. Recurrent matrices are random orthogonal, one n x n block
  per gate. W_a and U_a are N(0, 0.001^2). v_a and all biases are zero. Every other weight
  matrix, the embeddings included, is N(0, 0.01^2).

Padding. The source is right-padded, so the real tokens form a prefix and src_mask marks them.
The fused encoder reads the source through pack_padded_sequence. The backward GRU therefore
starts at each sentence's last real token, and bwd h_1 is the state after the whole sentence.
The paper-cell encoder masks instead: at a padded position the state is carried unchanged.
Both give zero annotations at padded positions. The attention logits there are set to the
dtype's most negative value before the softmax, so those positions get zero weight. Target
padding only affects the logits at padded positions, and loss_fn leaves them out.

The output layer's state. Eq. (4) writes p(y_i | ...) = g(y_{i-1}, s_i, c_i). Appendix A.2.2
builds the output from "the decoder state s_{i-1}", with t~_i = U_o s_{i-1} + ... This file
follows A.2.2 by default (readout="prev"). The output at step i then reads s_{i-1}, c_i and
y_{i-1}. The state s_i only feeds step i + 1, so the last update is skipped. readout="new"
gives the Eq. (4) reading, where the output reads s_i.

The GRU cell. The paper's unit applies the reset gate before the recurrent matrix: U [r o s].
nn.GRU and nn.GRUCell apply it after the matrix: r o (U s + b_hn). Two other differences are
only a change of parameters:

- nn.GRUCell's input [E y_{i-1}; c_i] times its W_ih is W E y_{i-1} + C c_i, with W_ih = [W | C].
- PyTorch's update gate is the paper's 1 - z, since sigmoid(-x) = 1 - sigmoid(x).
  Negating that gate's weights and biases maps one onto the other.

The reset placement is a real difference. r o (U s) equals U (r o s) for all r and s only when
U is diagonal. So nn.GRUCell is not the paper's function: it is the "reset after" GRU that
cuDNN computes. gru="torch" is the default. It uses a fused bidirectional nn.GRU (packed) and
an nn.GRUCell. gru="paper" uses PaperGRUCell for both the encoder and the decoder. That cell
computes A.1.1 exactly, and its encoder runs a Python loop over time.

Choices the paper leaves open, and what this file picks:

- Biases. The paper leaves them out "to make the equations less cluttered", so they exist.
  This file has one bias per gate pre-activation: 3n per paper GRU. nn.GRU has 6n, from
  b_ih and b_hh. It also has b_s (n) for s_0 and one n' bias inside the alignment tanh, which
  sits in U_a. There is one 2l bias on t~_i, in U_o, and one K_y bias on the logits. v_a has
  no bias, since a constant shift cancels in the softmax.
- y_0. The caller supplies it as tgt_in[:, 0], for example a BOS id. Its embedding is learnt.
- Source and target embeddings are separate. They have different vocabularies.
- No padding_idx. Padded tokens never reach a real output: packing or masking in the encoder,
  the attention mask, and the loss mask keep them out.
- No dropout and no weight noise. Section 4.2 and Appendix B use neither.
- The loss is the mean token cross-entropy over real target tokens. The paper maximises the
  sum of sentence log-likelihoods.
- The optimiser is Adam with global gradient-norm clipping, because the benchmark uses it.
  Appendix B.2 used Adadelta (eps 1e-6, rho 0.95), minibatches of 80 and a gradient norm
  renormalised to at most 1.

Parameter count. The appendix matrices and their sizes are:

- E_x (m x K_x) and E_y (m x K_y).
- Per encoder direction: W, W_z, W_r (n x m) and U, U_z, U_r (n x n).
- Decoder: W, W_z, W_r (n x m), U, U_z, U_r (n x n), C, C_z, C_r (n x 2n) and W_s (n x n).
- Alignment: W_a (n' x n), U_a (n' x 2n) and v_a (n').
- Output: U_o (2l x n), V_o (2l x m), C_o (2l x 2n) and W_o (K_y x l).

Together they give

    weights = (K_x + K_y) m + 9 n m + 16 n^2 + 3 n n' + n' + 6 l n + 2 l m + l K_y.

With the biases above, add 10 n + n' + 2 l + K_y for gru="paper", and 9 n more for gru="torch".
For the paper's sizes (K = 30000, m = 620, n = 1000, l = 500, n' = 1000) the weights come to
80,401,000. The smoke run below checks the formula against the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class PaperGRUCell(nn.Module):
    """The paper's gated unit (A.1.1), with the reset gate before the recurrent matrix.

    s' = (1 - z) o s + z o tanh(W x + U (r o s)), z = sigmoid(W_z x + U_z s), r = sigmoid(W_r x + U_r s).
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.inp = nn.Linear(input_size, 3 * hidden_size)  # rows [W_z; W_r; W], one bias per gate
        self.gates = nn.Linear(hidden_size, 2 * hidden_size, bias=False)  # [U_z; U_r]
        self.cand = nn.Linear(hidden_size, hidden_size, bias=False)  # U

    def step(self, x_proj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One update from a precomputed self.inp(x)."""
        xz, xr, xc = x_proj.chunk(3, dim=-1)
        hz, hr = self.gates(h).chunk(2, dim=-1)
        z = torch.sigmoid(xz + hz)
        r = torch.sigmoid(xr + hr)
        cand = torch.tanh(xc + self.cand(r * h))
        return h + z * (cand - h)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.step(self.inp(x), h)


class PaperRNNsearch(nn.Module):
    """RNNsearch: a bidirectional GRU encoder and an attentive GRU decoder with a maxout deep output.

    embed = m, hidden = n, maxout = l, align = n'. The module docstring gives the padding scheme,
    the gru and readout options, and how nn.GRUCell relates to the paper's unit.
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        embed: int,
        hidden: int,
        maxout: int,
        align: int,
        *,
        gru: str = "torch",
        readout: str = "prev",
    ):
        super().__init__()
        if gru not in ("torch", "paper"):
            raise ValueError(f"gru must be 'torch' or 'paper', not {gru!r}")
        if readout not in ("prev", "new"):
            raise ValueError(f"readout must be 'prev' or 'new', not {readout!r}")
        m, n, lo, na = embed, hidden, maxout, align
        self.gru, self.readout, self.hidden, self.maxout = gru, readout, n, lo

        self.src_embed = nn.Embedding(src_vocab, m)  # E_x, shared by both directions (A.2.1)
        self.tgt_embed = nn.Embedding(tgt_vocab, m)  # E_y
        if gru == "torch":
            self.encoder = nn.GRU(m, n, batch_first=True, bidirectional=True)
            self.dec_cell = nn.GRUCell(m + 2 * n, n)
        else:
            self.enc_fwd = PaperGRUCell(m, n)
            self.enc_bwd = PaperGRUCell(m, n)
            self.dec_cell = PaperGRUCell(m + 2 * n, n)
        self.W_s = nn.Linear(n, n)  # s_0 = tanh(W_s bwd h_1)
        self.W_a = nn.Linear(n, na, bias=False)
        self.U_a = nn.Linear(2 * n, na)  # holds the alignment bias
        self.v_a = nn.Linear(na, 1, bias=False)
        self.U_o = nn.Linear(n, 2 * lo)  # holds the bias of t~_i
        self.V_o = nn.Linear(m, 2 * lo, bias=False)
        self.C_o = nn.Linear(2 * n, 2 * lo, bias=False)
        self.W_o = nn.Linear(lo, tgt_vocab)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Appendix B.1 initialisation."""
        n = self.hidden
        recurrent = ("weight_hh", "gates.weight", "cand.weight")
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "bias" in name or name.startswith("v_a."):
                    nn.init.zeros_(p)
                elif any(key in name for key in recurrent):
                    for block in p.split(n, dim=0):  # one orthogonal n x n matrix per gate
                        nn.init.orthogonal_(block)
                elif name.startswith(("W_a.", "U_a.")):
                    nn.init.normal_(p, 0.0, 0.001)
                else:
                    nn.init.normal_(p, 0.0, 0.01)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Annotations h [B, S, 2n] (zero at padding) and bwd h_1 [B, n]."""
        x = self.src_embed(src)
        B, S, _ = x.shape
        n = self.hidden
        if self.gru == "torch":
            lengths = src_mask.sum(dim=1).cpu()
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, h_n = self.encoder(packed)
            ann, _ = pad_packed_sequence(out, batch_first=True, total_length=S)
            return ann, h_n[1]  # the backward direction's final state is bwd h_1
        keep = src_mask.unsqueeze(-1).to(x.dtype)
        xf, xb = self.enc_fwd.inp(x), self.enc_bwd.inp(x)
        hf = x.new_zeros(B, n)
        hb = x.new_zeros(B, n)
        fwd, bwd = [], [None] * S
        for j in range(S):
            hf = hf + keep[:, j] * (self.enc_fwd.step(xf[:, j], hf) - hf)
            fwd.append(hf * keep[:, j])
        for j in reversed(range(S)):
            hb = hb + keep[:, j] * (self.enc_bwd.step(xb[:, j], hb) - hb)
            bwd[j] = hb * keep[:, j]
        return torch.cat([torch.stack(fwd, 1), torch.stack(bwd, 1)], dim=-1), hb

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits [B, T, K_y]. tgt_in[:, i] is y_i, with y_0 first."""
        ann, bwd_h1 = self.encode(src, src_mask)
        pre_att = self.U_a(ann)  # U_a h_j, once per sentence (A.1.2)
        neg = torch.finfo(pre_att.dtype).min
        pad = ~src_mask
        emb = self.tgt_embed(tgt_in)  # E y_{i-1} for i = 1..T
        T = emb.shape[1]
        s = torch.tanh(self.W_s(bwd_h1))  # s_0
        states, contexts = [], []
        for i in range(T):
            e = self.v_a(torch.tanh(self.W_a(s).unsqueeze(1) + pre_att)).squeeze(-1)  # e_ij, [B, S]
            alpha = torch.softmax(e.masked_fill(pad, neg), dim=-1)
            c = torch.bmm(alpha.unsqueeze(1), ann).squeeze(1)  # c_i, [B, 2n]
            contexts.append(c)
            if self.readout == "prev":
                states.append(s)  # s_{i-1}
                if i == T - 1:
                    break  # s_T feeds no output
            s = self.dec_cell(torch.cat([emb[:, i], c], dim=-1), s)
            if self.readout == "new":
                states.append(s)  # s_i
        t_tilde = self.U_o(torch.stack(states, 1)) + self.V_o(emb) + self.C_o(torch.stack(contexts, 1))
        t = t_tilde.unflatten(-1, (self.maxout, 2)).amax(dim=-1)  # max over (2j-1, 2j)
        return self.W_o(t)


def loss_fn(logits: torch.Tensor, tgt_out: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy over real target tokens."""
    nll = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), reduction="none")
    mask = tgt_mask.flatten().to(nll.dtype)
    return (nll * mask).sum() / mask.sum()


def make_train_step(model: nn.Module, lr: float, clip_norm: float):
    """Return step(src, src_mask, tgt_in, tgt_out, tgt_mask) -> float. Each call does one Adam step."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)

    def step(src, src_mask, tgt_in, tgt_out, tgt_mask) -> float:
        model.train()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(src, src_mask, tgt_in), tgt_out, tgt_mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
        opt.step()
        return loss.item()

    return step


def paper_param_count(
    src_vocab: int, tgt_vocab: int, m: int, n: int, lo: int, na: int, gru: str | None = None
) -> int:
    """The appendix weight count. gru="paper" or "torch" adds this file's biases."""
    weights = (src_vocab + tgt_vocab) * m + 9 * n * m + 16 * n * n + 3 * n * na + na
    weights += 6 * lo * n + 2 * lo * m + lo * tgt_vocab
    if gru is None:
        return weights
    biases = 10 * n + na + 2 * lo + tgt_vocab + (9 * n if gru == "torch" else 0)
    return weights + biases


def _smoke_batch(gen: torch.Generator, vocab: int, batch: int, max_len: int):
    """A copy task with ragged lengths, right-padded with 0. Ids 0..2 are PAD, BOS and EOS."""
    lengths = torch.randint(3, max_len + 1, (batch,), generator=gen)
    lengths[0] = max_len
    src = torch.zeros(batch, max_len, dtype=torch.long)
    tgt_in = torch.zeros(batch, max_len + 1, dtype=torch.long)
    tgt_out = torch.zeros(batch, max_len + 1, dtype=torch.long)
    for b, k in enumerate(lengths.tolist()):
        words = torch.randint(3, vocab, (k,), generator=gen)
        src[b, :k] = words
        tgt_in[b, 0] = 1
        tgt_in[b, 1 : k + 1] = words
        tgt_out[b, :k] = words
        tgt_out[b, k] = 2
    src_mask = torch.arange(max_len) < lengths[:, None]
    tgt_mask = torch.arange(max_len + 1) < (lengths[:, None] + 1)
    return src, src_mask, tgt_in, tgt_out, tgt_mask


if __name__ == "__main__":
    torch.set_num_threads(1)
    V, M, N, L, NA = 100, 16, 32, 16, 32
    for variant in ("torch", "paper"):
        torch.manual_seed(0)
        model = PaperRNNsearch(V, V, M, N, L, NA, gru=variant)
        count = sum(p.numel() for p in model.parameters())
        expected = paper_param_count(V, V, M, N, L, NA, gru=variant)
        print(
            f"gru={variant}: params {count}; paper weights {paper_param_count(V, V, M, N, L, NA)}"
            f" + biases = {expected}; match {count == expected}"
        )
        assert count == expected
        batch = _smoke_batch(torch.Generator().manual_seed(1), V, batch=8, max_len=12)
        step = make_train_step(model, lr=1e-2, clip_norm=1.0)
        losses = [step(*batch) for _ in range(20)]
        print("  loss " + " ".join(f"{x:.3f}" for x in losses))
        assert losses[-1] < losses[0], "loss did not fall"
    full = paper_param_count(30000, 30000, 620, 1000, 500, 1000)
    print(f"paper sizes (K 30000, m 620, n 1000, l 500, n' 1000): {full} weights")
