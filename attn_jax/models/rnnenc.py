"""RNNenc: the RNN encoder–decoder of Cho et al. (2014), the baseline ("RNNencdec") of Bahdanau et al. (2015).

The whole source sentence is squeezed into one fixed vector ``c``; there is no attention. Sizes as RNNsearch
(Bahdanau et al.: "the encoder and decoder of the RNNencdec have 1000 hidden units each").

Encoder (Cho et al. 2014, §2.2 and appendix A.1.1): a single forward GRU over the embedded source,
``h_j = GRU(h_{j-1}, E x_j)``, ``h_0 = 0``; padding is skipped, so ``h_{T_x}`` is the state at each sentence's
true last word. The summary is ``c = tanh(V h_{T_x} + b_V)`` (Cho et al.'s ``c = tanh(V h⟨N⟩)``), ``c ∈ R^n``.

Decoder: Cho et al.'s initial state ``s_0 = tanh(W_s c + b_s)`` (their ``h'⟨0⟩ = tanh(V' c)``), then the
*same* decoder as RNNsearch with the fixed ``c`` in place of ``c_i`` at every step, in the GRU gates and in
the deep output::

    s_i = GRU(s_{i-1}; E y_{i-1}, c)       s̃_i = tanh(W E y_{i-1} + U[r_i ∘ s_{i-1}] + C c)
    t_i = maxout_2(U_o s_{i-1} + V_o E y_{i-1} + C_o c),   p(y_i | ·) = softmax(W_o t_i)

Intra-attention encoder (``intra_attention=True``; off by default, which leaves the model exactly as above): the
encoder GRU becomes an LSTMN-style intra-attention GRU (Cheng, Dong & Lapata 2016, with a GRU;
``attn_jax.nn.intra``), ``h_j = GRU(E x_j, h̃_j)`` with ``h̃_j = Σ_{k<j} s_{jk} h_k`` an additive-attention summary
(width ``n'``, ``align``) of the states already produced; ``c`` is still read from the state at the last real word.

Two deliberate choices, so that the two models differ only in how the context is formed: the reset gate is
applied as in Bahdanau's decoder (``U[r ∘ s]``; Cho et al.'s decoder writes ``r ∘ (U s + C c)``), and the deep
output reads ``s_{i-1}`` as in Bahdanau's appendix A.2.2 (Cho et al. read the new state).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attn_jax.models.interface import EncoderOutput, RNNDecoderState, check_source, check_tokens
from attn_jax.models.presets import RNNConfig
from attn_jax.models.rnnsearch import make_embedding, normal_param
from attn_jax.nn._params import partitioned, unwrap
from attn_jax.nn._remat import remat_scan_body
from attn_jax.nn.intra import IntraGRU
from attn_jax.nn.recurrent import GRUCell, MaxoutOutput, linear
from attn_jax.typing import Array, Bool, Float, Int

__all__ = ["RNNenc"]


class RNNenc(nnx.Module):
    """Cho et al. (2014) encoder–decoder with a fixed context vector; implements the step interface.

    ``decode_step`` and ``__call__`` return ``None`` for the attention.

    >>> from attn_jax.models.presets import RNNConfig
    >>> cfg = RNNConfig(src_vocab=11, tgt_vocab=13, arch="rnnenc", embed=4, hidden=6, maxout=3, align=5)
    >>> logits, attn = RNNenc(cfg, rngs=nnx.Rngs(0))(jnp.ones((2, 7), jnp.int32), jnp.ones((2, 7), bool),
    ...                                              jnp.ones((2, 3), jnp.int32))
    >>> logits.shape, attn is None
    ((2, 3, 13), True)
    """

    def __init__(self, config: RNNConfig, *, rngs: nnx.Rngs):
        if config.arch != "rnnenc":
            raise ValueError(f"RNNenc needs config.arch == 'rnnenc', got {config.arch!r}")
        self.config = config
        m, n, lo = config.embed, config.hidden, config.maxout
        pd, cd = jnp.dtype(config.param_dtype), jnp.dtype(config.dtype)
        self.src_embed = make_embedding(config.src_vocab, m, param_dtype=pd, dtype=cd, rngs=rngs)
        self.tgt_embed = make_embedding(config.tgt_vocab, m, param_dtype=pd, dtype=cd, rngs=rngs)
        if config.intra_attention:
            self.encoder = IntraGRU(m, n, config.align, param_dtype=pd, dtype=cd, rngs=rngs)
        else:
            self.encoder = GRUCell(m, n, param_dtype=pd, dtype=cd, rngs=rngs)
        self.summary = nnx.Dict(
            w_v=normal_param(rngs.params(), (n, n), ("hidden_in", "hidden"), pd),
            b_v=partitioned(jnp.zeros((n,), pd), ("hidden",)),
        )
        self.init_state = nnx.Dict(
            w_s=normal_param(rngs.params(), (n, n), ("hidden_in", "hidden"), pd),
            b_s=partitioned(jnp.zeros((n,), pd), ("hidden",)),
        )
        self.decoder = GRUCell(m, n, context_features=n, param_dtype=pd, dtype=cd, rngs=rngs)
        self.output = MaxoutOutput(n, m, n, lo, config.tgt_vocab, param_dtype=pd, dtype=cd, rngs=rngs)

    def encode(self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"]) -> EncoderOutput:
        """``c = tanh(V h_{T_x} + b_V)`` ``[B, n]`` (float32) as ``summary``; no memory, no keys."""
        check_source(src, src_mask)
        emb, remat = self.src_embed(src), self.config.remat
        if self.config.intra_attention:
            _, last = self.encoder(emb, src_mask, remat=remat)
        else:
            _, last = self.encoder.scan(self.encoder.project_inputs(emb), src_mask, remat=remat)
        p = unwrap(self.summary)
        c = jnp.tanh(linear(last, p["w_v"], self.config.dtype) + p["b_v"].astype(jnp.float32))
        return EncoderOutput(memory=None, keys=None, mask=src_mask, summary=c)

    def init_decoder_state(self, enc: EncoderOutput) -> RNNDecoderState:
        """``s_0 = tanh(W_s c + b_s)``."""
        p = unwrap(self.init_state)
        s0 = jnp.tanh(linear(enc.summary, p["w_s"], self.config.dtype) + p["b_s"].astype(jnp.float32))
        return RNNDecoderState(hidden=s0, feed=None)

    def decode_step(
        self, enc: EncoderOutput, state: RNNDecoderState, prev_tokens: Int[Array, " B"]
    ) -> tuple[Float[Array, "B V"], RNNDecoderState, None]:
        """One target position: ``(logits [B, V] float32, new state, None)``."""
        check_tokens("prev_tokens", prev_tokens, enc.mask.shape[0], rank=1)
        emb = self.tgt_embed(prev_tokens)
        s_prev = state.hidden
        s_new = self.decoder(s_prev, self.decoder.project_inputs(emb, enc.summary))
        logits = self.output.logits(self.output.readout(s_prev, emb, enc.summary))
        return logits, RNNDecoderState(hidden=s_new, feed=None), None

    def __call__(
        self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"], tgt_in: Int[Array, "B T"]
    ) -> tuple[Float[Array, "B T V"], None]:
        """Teacher forcing: ``(logits [B, T, V] float32, None)``; the recurrence is one ``lax.scan``."""
        check_source(src, src_mask)
        check_tokens("tgt_in", tgt_in, src.shape[0], rank=2)
        enc = self.encode(src, src_mask)
        emb = self.tgt_embed(tgt_in)  # [B, T, m]
        context = enc.summary[:, None, :]  # [B, 1, n]: the same c at every position
        x_proj = self.decoder.project_inputs(emb, context)  # [B, T, 3, n]; nothing here depends on the state
        s0 = self.init_decoder_state(enc).hidden

        def body(s_prev, x):
            return self.decoder(s_prev, x), s_prev

        body = remat_scan_body(body, self.config.remat)
        _, s_prev = jax.lax.scan(body, s0, jnp.moveaxis(x_proj, 1, 0))
        s_prev = jnp.moveaxis(s_prev, 0, 1)  # [B, T, n]: s_{i-1} for every position i
        readout = self.output.readout(s_prev, emb, jnp.broadcast_to(context, s_prev.shape))
        return self.output.logits(readout), None
