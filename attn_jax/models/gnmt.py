"""GNMT: the deep LSTM encoder–decoder with residual connections and attention of Wu et al. (2016), §3.

Wu et al., "Google's Neural Machine Translation System: Bridging the Gap between Human and Machine Translation",
arXiv:1609.08144, 2016, with the choices of its reference re-implementation tf/nmt (``gnmt_model.py``,
``attention_architecture="gnmt_v2"``) where the paper leaves them open. ``n`` = ``hidden``, ``r`` =
``residual_start``, ``L_e``/``L_d`` the encoder/decoder depths.

Encoder (§3.2, figure 3), over the real words of a right-padded source::

    x⁰_j = E_x x_j                                                          word embedding, width m
    →h_j = LSTM_fw(→h_{j-1}, x⁰_j),   ←h_j = LSTM_bw(←h_{j+1}, x⁰_j)       layer 1 is bidirectional
    x¹_j = [→h_j; ←h_j]                                                     2n
    x²_j = LSTM_2(x¹_j)                                                     2n -> n
    x^l_j = LSTM_l(x^{l-1}_j) + x^{l-1}_j  if l ≥ r,  else LSTM_l(x^{l-1}_j)   l = 3 .. L_e, n -> n

The backward LSTM skips padding, so it starts at each sentence's true last word; outputs at padding are zero.
The attention memory is the top layer ``x^{L_e}`` (width ``n``); its key half ``W_k x^{L_e}_j`` is computed once
in :meth:`GNMT.encode`.

Decoder (§3.1–3.2, figure 1) at target position ``i`` with previous word ``y_{i-1}``; ``a_i`` is the attention
context, ``ỹ^l_i`` the output of decoder layer ``l``::

    h¹_i = LSTM_1(h¹_{i-1}; [E_y y_{i-1}; a_{i-1}]),  a_0 = 0              the bottom ("attention") layer
    α_ij = softmax_j(score(h¹_i, x^{L_e}_j)),  a_i = Σ_j α_ij x^{L_e}_j    the query is h¹_i
    ỹ¹_i = h¹_i
    h^l_i = LSTM_l(h^l_{i-1}; [ỹ^{l-1}_i; a_i])                            l = 2 .. L_d
    ỹ^l_i = h^l_i + ỹ^{l-1}_i  if l ≥ r,  else h^l_i                      the residual skips a_i
    p(y_i | y_<i, x) = softmax(W_o ỹ^{L_d}_i + b_o)

with ``score(q, k) = vᵀ tanh(W_q q + W_k k + b)`` (``attention="additive"``) or its weight-normalised form
``g · v/‖v‖`` (``"normed_additive"``, tf/nmt's ``normed_bahdanau``, the GNMT default).

Where the query sits. The paper computes the context of step ``i`` from "the output from the bottom decoder
layer" of step ``i-1`` and feeds it to every layer of step ``i``. Here, as in tf/nmt (the attention wrapper on the
bottom cell), the bottom layer of step ``i`` reads the context computed from ``h¹_{i-1}`` (called ``a_{i-1}``
above) — exactly the paper's input for that layer — and its new output ``h¹_i`` then queries the attention
again; layers ``2 .. L_d`` read that fresher context ``a_i`` (tf/nmt's ``gnmt_v2``; the paper's wiring, which
feeds them ``a_{i-1}`` too, is tf/nmt's ``gnmt``). The attention weights returned are ``α_i``, the ones of the
query ``h¹_i``. Because no layer above the bottom one feeds back into it, teacher forcing runs the bottom layer
and the attention as one ``lax.scan`` over time, then every upper layer over the whole target — the
structure GNMT pipelines across devices.

Uniform stacks. Encoder layers ``r .. L_e`` are identical ``n -> n`` residual LSTMs, and so are decoder layers
``r .. L_d`` (input ``[n; n]``); each stack stores its params once with a leading ``layers`` axis and runs as a
``lax.scan`` over layers of a ``lax.scan`` over time (:meth:`GNMT._run_stack`), or through
``attn_jax.parallel.pipelined_stack`` when ``pipeline_stages > 1``. Layers ``2 .. r-1`` are kept one by one.

Where the paper is silent or this code departs from it: the decoder starts from zero states (tf/nmt passes the
encoder's final states with ``pass_hidden_state``; zeros keep the decoder independent of the encoder depth);
the softmax layer reads the top decoder output only, as tf/nmt's output layer does, and has a bias (tf/nmt
has none); no dropout (tf/nmt: 0.2) and no layer splitting of the bidirectional layer across devices;
parameters ``U(-0.1, 0.1)`` (tf/nmt's ``init_weight``), forget-gate bias 1, other biases 0, the attention's
initialised as in ``attn_jax.attention._additive``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attn_jax.models.interface import EncoderOutput, check_remat, check_source, check_tokens, layer_params
from attn_jax.models.presets import canonicalize_dtypes
from attn_jax.nn._params import partitioned, unwrap
from attn_jax.nn._remat import remat_scan_body
from attn_jax.nn.attention import AdditiveAttention
from attn_jax.nn.lstm import (
    INIT_SCALE,
    LSTMCell,
    LSTMStack,
    LSTMState,
    lstm_cell,
    lstm_input_projection,
    zero_lstm_state,
)
from attn_jax.nn.recurrent import linear
from attn_jax.typing import Array, Bool, Float, Int

__all__ = [
    "GNMT",
    "GNMT_ATTENTIONS",
    "GNMTConfig",
    "GNMTDecoderState",
    "gnmt_cpu_config",
    "gnmt_wmt14_config",
]

GNMTAttention = Literal["normed_additive", "additive"]
GNMT_ATTENTIONS: tuple[str, ...] = ("normed_additive", "additive")


@dataclasses.dataclass(frozen=True)
class GNMTConfig:
    """Sizes and options of GNMT (Wu et al. 2016); see the module docstring for the equations.

    Attributes:
      src_vocab: source vocabulary size (GNMT: 32k shared wordpieces).
      tgt_vocab: target vocabulary size.
      embed: ``m``, word-embedding width (GNMT: 1024).
      hidden: ``n``, LSTM width of every encoder direction and decoder layer (GNMT: 1024).
      encoder_layers: ``L_e ≥ 2``, counting the bidirectional layer once (GNMT: 8).
      decoder_layers: ``L_d ≥ 1`` (GNMT: 8).
      residual_start: ``r ≥ 3``: layers ``r`` and above have residual connections (GNMT: 3). The encoder's
        second layer maps ``2n -> n`` and cannot be residual; ``r`` above a stack's depth means no residuals.
      attention: ``normed_additive`` (tf/nmt's normalised Bahdanau, the GNMT default) or ``additive``.
      align: alignment width of the additive scorer (GNMT: 1024).
      pipeline_stages: ``1``: the uniform stacks run as plain scans. ``> 1``: they run through
        ``attn_jax.parallel.pipelined_stack`` over the mesh axis ``stage`` (the model must then be called under
        ``jax.set_mesh`` with such an axis); each non-empty stack's depth must divide evenly into the stages.
      remat: what each time step of every LSTM scan, and each layer of the uniform stacks, keeps for the
        backward pass (``jax.checkpoint``): ``"none"``, ``"full"`` (only its inputs: a step's state, a layer's
        input sequence), ``"dots_saveable"`` or ``"dots_with_no_batch_dims_saveable"`` (see
        ``attn_jax.models.interface.REMAT_POLICIES``). With ``pipeline_stages > 1`` the uniform stacks are
        not rematerialised (the pipeline schedules them); the other layers are.
      param_dtype: dtype the parameters are stored in.
      dtype: compute dtype of matmul operands and activations (``bfloat16`` for mixed precision; LSTM states,
        attention logits, softmax and output logits stay float32).
    """

    src_vocab: int = 32000
    tgt_vocab: int = 32000
    embed: int = 1024
    hidden: int = 1024
    encoder_layers: int = 8
    decoder_layers: int = 8
    residual_start: int = 3
    attention: GNMTAttention = "normed_additive"
    align: int = 1024
    pipeline_stages: int = 1
    remat: str = "none"
    param_dtype: str = "float32"
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("src_vocab", "tgt_vocab", "embed", "hidden", "align", "pipeline_stages"):
            _check_int(name, getattr(self, name), 1)
        _check_int("encoder_layers", self.encoder_layers, 2)
        _check_int("decoder_layers", self.decoder_layers, 1)
        _check_int("residual_start", self.residual_start, 3)
        check_remat("gnmt config", self.remat)
        if self.attention not in GNMT_ATTENTIONS:
            raise ValueError(
                f"GNMT config: attention must be one of {', '.join(GNMT_ATTENTIONS)}; got {self.attention!r}"
            )
        for side, depth in (("encoder", self.encoder_stack_layers), ("decoder", self.decoder_stack_layers)):
            if depth and depth % self.pipeline_stages:
                raise ValueError(
                    f"GNMT config: the {side}'s {depth} residual layers do not split into "
                    f"pipeline_stages={self.pipeline_stages} equal stages"
                )
        canonicalize_dtypes(self, "GNMT config")

    @property
    def arch(self) -> str:
        """``"gnmt"`` (the trainer's and the CLI's name for this model)."""
        return "gnmt"

    @property
    def encoder_stack_layers(self) -> int:
        """Encoder layers ``r .. L_e``: the stacked, residual ones (0 if ``r > L_e``)."""
        return max(0, self.encoder_layers - self.residual_start + 1)

    @property
    def decoder_stack_layers(self) -> int:
        """Decoder layers ``r .. L_d``: the stacked, residual ones (0 if ``r > L_d``)."""
        return max(0, self.decoder_layers - self.residual_start + 1)

    def replace(self, **changes) -> GNMTConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"GNMT config: {name} must be an int >= {low}, got {value!r}")


def gnmt_wmt14_config(src_vocab: int = 32000, tgt_vocab: int = 32000, **overrides) -> GNMTConfig:
    """Wu et al. (2016) on WMT'14: 8 encoder and 8 decoder LSTM layers of 1024 units, 1024-wide embeddings and
    attention, residual connections from layer 3, 32k wordpieces.

    >>> gnmt_wmt14_config().encoder_stack_layers
    6
    """
    base = dict(embed=1024, hidden=1024, align=1024, encoder_layers=8, decoder_layers=8, residual_start=3)
    return GNMTConfig(src_vocab=src_vocab, tgt_vocab=tgt_vocab, **{**base, **overrides})


def gnmt_cpu_config(src_vocab: int, tgt_vocab: int, **overrides) -> GNMTConfig:
    """A CPU-sized GNMT: embeddings, LSTMs and attention 64 wide, 4 + 4 layers, residuals from layer 3.

    >>> gnmt_cpu_config(100, 120).decoder_stack_layers
    2
    """
    base = dict(embed=64, hidden=64, align=64, encoder_layers=4, decoder_layers=4, residual_start=3)
    return GNMTConfig(src_vocab=src_vocab, tgt_vocab=tgt_vocab, **{**base, **overrides})


class GNMTDecoderState(NamedTuple):
    """The GNMT decoder's state between target positions; float32, every leaf batch-leading.

    Attributes:
      bottom: layer 1's ``(h¹_{i-1}, c¹_{i-1})``, each ``[B, n]``.
      plain: layers ``2 .. r-1``'s states, one :class:`LSTMState` ``[B, n]`` per layer (often one or none).
      stack: layers ``r .. L_d``'s states stacked as ``[B, L_d - r + 1, n]``; ``None`` without residual layers.
      context: the previous attention context ``a_{i-1}`` ``[B, n]`` (zeros before the first word).
    """

    bottom: LSTMState
    plain: tuple[LSTMState, ...]
    stack: LSTMState | None
    context: Float[Array, "B n"]


# --------------------------------------------------------------------------------------------- layer functions


def _encoder_layer(params, state: LSTMState, inputs, *, dtype):
    """One residual encoder layer at one position: ``x + LSTM(x)``; padding keeps the state. ``inputs = (x, mask)``."""
    x, m = inputs
    new = lstm_cell(params, state, lstm_input_projection(params, x, dtype=dtype), dtype=dtype)
    new = LSTMState(*(jnp.where(m[..., None], a, b) for a, b in zip(new, state, strict=True)))
    return new, (x + new.h, m)


def _decoder_layer(params, state: LSTMState, inputs, *, dtype, residual: bool):
    """One upper decoder layer at one position, ``inputs = (ỹ^{l-1}_i, a_i)``; passes ``a_i`` through."""
    below, ctx = inputs
    new = lstm_cell(params, state, lstm_input_projection(params, below, ctx, dtype=dtype), dtype=dtype)
    return new, (below + new.h if residual else new.h, ctx)


def _stacked_scan(layer_fn, stacked_params, init_carry, xs, remat: str = "none"):
    """``lax.scan`` over layers of ``lax.scan`` over time: ``(top outputs [T, ...], final carries [L, ...])``.

    ``stacked_params`` is a plain pytree or an ``nnx.State`` of ``nnx.Param``s (``LSTMStack.param_state``),
    whose logical names let :func:`~attn_jax.models.interface.layer_params` gather each layer under fsdp.

    ``remat`` makes each layer and each of its time steps a ``jax.checkpoint``
    (:func:`~attn_jax.nn._remat.remat_scan_body`): the backward pass keeps the layer's input sequence,
    recomputes its time scan, and within that keeps one state per step.
    """

    def one_layer(inputs, layer):
        params, carry = layer
        params = layer_params(params)  # the ambient hook: under fsdp, this layer's weights gathered whole
        if isinstance(params, nnx.State):
            params = nnx.to_pure_dict(params)
        step = remat_scan_body(functools.partial(layer_fn, params), remat)
        carry, outputs = jax.lax.scan(step, carry, inputs)
        return outputs, carry

    return jax.lax.scan(remat_scan_body(one_layer, remat), xs, (stacked_params, init_carry))


def _uniform_embedding(vocab: int, features: int, *, param_dtype, dtype, rngs: nnx.Rngs) -> nnx.Embed:
    """A word-embedding table ``[V, m]`` (logical axes ``vocab, embed``), ``U(-0.1, 0.1)`` as tf/nmt."""

    def init(key, shape, dt):
        return jax.random.uniform(key, shape, jnp.float32, -INIT_SCALE, INIT_SCALE).astype(dt)

    init = nnx.with_partitioning(init, ("vocab", "embed"), eager_sharding=False)
    return nnx.Embed(vocab, features, dtype=dtype, param_dtype=param_dtype, embedding_init=init, rngs=rngs)


class GNMT(nnx.Module):
    """Wu et al. (2016) GNMT; implements the step interface of ``attn_jax.models.interface``.

    Params (logical names in brackets): ``src_embed``/``tgt_embed`` ``[V, m]`` (vocab, embed);
    ``encoder_forward``/``encoder_backward`` LSTMs ``m -> n``; ``encoder_plain`` layers ``2 .. r-1``;
    ``encoder_stack`` layers ``r .. L_e`` stacked (layers, ...); ``attention`` (additive, ``hidden -> align``,
    ``context -> align``); ``decoder_bottom`` (``m`` plus context ``n``); ``decoder_plain``; ``decoder_stack``;
    ``output`` ``w [n, V]`` (hidden_in, vocab), ``b [V]`` (vocab). LSTM kernels are ``[in, 4, n]`` with ``n``
    named ``hidden``.

    >>> cfg = GNMTConfig(src_vocab=11, tgt_vocab=13, embed=4, hidden=6, align=5, encoder_layers=3,
    ...                  decoder_layers=3)
    >>> model = GNMT(cfg, rngs=nnx.Rngs(0))
    >>> logits, attn = model(jnp.ones((2, 7), jnp.int32), jnp.ones((2, 7), bool), jnp.ones((2, 3), jnp.int32))
    >>> logits.shape, attn.shape
    ((2, 3, 13), (2, 3, 7))
    """

    def __init__(self, config: GNMTConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, GNMTConfig):
            raise ValueError(f"GNMT needs a GNMTConfig, got {type(config).__name__}")
        self.config = config
        m, n, r = config.embed, config.hidden, config.residual_start
        pd, cd = jnp.dtype(config.param_dtype), jnp.dtype(config.dtype)
        kw = dict(param_dtype=pd, rngs=rngs)
        self.src_embed = _uniform_embedding(config.src_vocab, m, dtype=cd, **kw)
        self.tgt_embed = _uniform_embedding(config.tgt_vocab, m, dtype=cd, **kw)

        self.encoder_forward = LSTMCell(m, n, input_axis="embed", dtype=cd, **kw)
        self.encoder_backward = LSTMCell(m, n, input_axis="embed", dtype=cd, **kw)
        self.encoder_plain = nnx.List(
            [
                LSTMCell(2 * n if layer == 2 else n, n, input_axis="hidden_in", dtype=cd, **kw)
                for layer in range(2, min(r, config.encoder_layers + 1))
            ]
        )
        depth = config.encoder_stack_layers
        self.encoder_stack = nnx.data(LSTMStack(depth, n, n, **kw) if depth else None)

        self.attention = AdditiveAttention(
            n, n, config.align, normalize=config.attention == "normed_additive", **kw
        )
        self.decoder_bottom = LSTMCell(m, n, context_features=n, input_axis="embed", dtype=cd, **kw)
        self.decoder_plain = nnx.List(
            [
                LSTMCell(n, n, context_features=n, input_axis="hidden_in", dtype=cd, **kw)
                for _ in range(2, min(r, config.decoder_layers + 1))
            ]
        )
        depth = config.decoder_stack_layers
        self.decoder_stack = nnx.data(LSTMStack(depth, n, n, context_features=n, **kw) if depth else None)

        w = jax.random.uniform(rngs.params(), (n, config.tgt_vocab), jnp.float32, -INIT_SCALE, INIT_SCALE)
        self.output = nnx.Dict(
            w=partitioned(w.astype(pd), ("hidden_in", "vocab")),
            b=partitioned(jnp.zeros((config.tgt_vocab,), pd), ("vocab",)),
        )

    # ------------------------------------------------------------------------------------------------ stacks

    def _run_stack(self, layer_fn, stack: LSTMStack, init_carry, xs, *, pipeline: bool = True):
        """Every layer of a uniform stack over a time-major sequence: ``(ys [T, ...], final carries [L, ...])``.

        ``layer_fn(params_l, carry_l, x_t) -> (carry_l, y_t)`` is one layer at one position (``x_t``/``y_t``
        pytrees); ``stack``'s params and ``init_carry`` lead with the layer axis, ``xs`` with time. With
        ``config.pipeline_stages > 1`` (and ``pipeline``) the layers are pipelined over the ambient mesh's
        ``stage`` axis by ``attn_jax.parallel.pipelined_stack``; otherwise a scan over layers of a scan over time.
        """
        if pipeline and self.config.pipeline_stages > 1:
            from attn_jax.parallel import pipelined_stack  # lazy: only pipelined runs need parallel/

            return pipelined_stack(layer_fn, stack.stacked(), init_carry, xs)
        return _stacked_scan(layer_fn, stack.param_state(), init_carry, xs, remat=self.config.remat)

    # ----------------------------------------------------------------------------------------------- encoder

    def encode(self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"]) -> EncoderOutput:
        """The top encoder layer ``x^{L_e}`` ``[B, S, n]`` (compute dtype, zero at padding) and its keys."""
        check_source(src, src_mask)
        emb, remat = self.src_embed(src), self.config.remat  # [B, S, m]
        fwd, _ = self.encoder_forward.scan(self.encoder_forward.project_inputs(emb), src_mask, remat=remat)
        bwd, _ = self.encoder_backward.scan(
            self.encoder_backward.project_inputs(emb), src_mask, reverse=True, remat=remat
        )
        x = jnp.concatenate([fwd, bwd], axis=-1)  # [B, S, 2n], float32
        for layer in self.encoder_plain:
            x, _ = layer.scan(layer.project_inputs(x), src_mask, remat=remat)  # [B, S, n]
        if self.encoder_stack is not None:
            depth, batch = self.encoder_stack.num_layers, src.shape[0]
            xs = (jnp.moveaxis(x, 1, 0), jnp.moveaxis(src_mask, 1, 0))  # time-major [S, B, n], [S, B]
            layer_fn = functools.partial(_encoder_layer, dtype=self.config.dtype)
            init = zero_lstm_state((depth, batch), self.config.hidden)
            (top, _), _ = self._run_stack(layer_fn, self.encoder_stack, init, xs)
            x = jnp.moveaxis(top, 0, 1)  # [B, S, n]
        # Carried states at padding copy a real word's output; zero them so nothing can read a pad by accident.
        memory = jnp.where(src_mask[..., None], x, 0.0).astype(self.config.dtype)
        return EncoderOutput(
            memory=memory, keys=self.attention.project_keys(memory), mask=src_mask, summary=None
        )

    # ----------------------------------------------------------------------------------------------- decoder

    def init_decoder_state(self, enc: EncoderOutput) -> GNMTDecoderState:
        """Zero states for every layer and a zero context ``a_0``."""
        batch, n = enc.mask.shape[0], self.config.hidden
        stack = None
        if self.decoder_stack is not None:
            stack = zero_lstm_state((batch, self.decoder_stack.num_layers), n)
        return GNMTDecoderState(
            bottom=zero_lstm_state((batch,), n),
            plain=tuple(zero_lstm_state((batch,), n) for _ in self.decoder_plain),
            stack=stack,
            context=jnp.zeros((batch, n), jnp.float32),
        )

    def _bottom_step(
        self,
        enc: EncoderOutput,
        state: LSTMState,
        context: Float[Array, "B n"],
        emb_proj: Float[Array, "B 4 n"],
    ) -> tuple[LSTMState, Float[Array, "B n"], Float[Array, "B S"]]:
        """``h¹_i`` from ``[E y_{i-1}; a_{i-1}]`` (``emb_proj = W E y_{i-1} + b``), then ``(a_i, α_i)`` for it."""
        x_proj = emb_proj + self.decoder_bottom.project_inputs(None, context, bias=False)
        state = self.decoder_bottom(state, x_proj)
        ctx, weights = self.attention.step(state.h.astype(self.config.dtype), enc.keys, enc.memory, enc.mask)
        return state, ctx.astype(jnp.float32), weights

    def _upper_layers(
        self,
        plain: tuple[LSTMState, ...],
        stack: LSTMState | None,
        below: Float[Array, "T B n"],
        ctx: Float[Array, "T B n"],
        *,
        pipeline: bool,
    ) -> tuple[Float[Array, "T B n"], tuple[LSTMState, ...], LSTMState | None]:
        """Layers ``2 .. L_d`` over time-major ``(ỹ¹, a)``: ``(ỹ^{L_d}, plain states, stacked states [B, L, n])``."""
        dtype, new_plain = self.config.dtype, []
        for layer, state in zip(self.decoder_plain, plain, strict=True):
            fn = functools.partial(_decoder_layer, unwrap(layer.params), dtype=dtype, residual=False)
            state, (below, _) = jax.lax.scan(remat_scan_body(fn, self.config.remat), state, (below, ctx))
            new_plain.append(state)
        if self.decoder_stack is not None:
            fn = functools.partial(_decoder_layer, dtype=dtype, residual=True)
            init = jax.tree.map(lambda s: jnp.moveaxis(s, 1, 0), stack)  # [L, B, n]
            (below, _), stack = self._run_stack(fn, self.decoder_stack, init, (below, ctx), pipeline=pipeline)
            stack = jax.tree.map(lambda s: jnp.moveaxis(s, 0, 1), stack)  # back to batch-leading [B, L, n]
        return below, tuple(new_plain), stack

    def _logits(self, top: Float[Array, "... n"]) -> Float[Array, "... V"]:
        """``W_o ỹ^{L_d} + b_o``, float32."""
        p = unwrap(self.output)
        return linear(top, p["w"], self.config.dtype) + p["b"].astype(jnp.float32)

    def decode_step(
        self, enc: EncoderOutput, state: GNMTDecoderState, prev_tokens: Int[Array, " B"]
    ) -> tuple[Float[Array, "B V"], GNMTDecoderState, Float[Array, "B S"]]:
        """One target position: ``(logits [B, V] float32, new state, attention α_i [B, S] float32)``.

        The uniform stack runs as a plain scan here even when ``pipeline_stages > 1``: a wavefront over one
        position has nothing to overlap.
        """
        check_tokens("prev_tokens", prev_tokens, enc.mask.shape[0], rank=1)
        emb = self.tgt_embed(prev_tokens)  # [B, m]
        bottom, ctx, weights = self._bottom_step(
            enc, state.bottom, state.context, self.decoder_bottom.project_inputs(emb)
        )
        top, plain, stack = self._upper_layers(
            state.plain, state.stack, bottom.h[None], ctx[None], pipeline=False
        )
        new_state = GNMTDecoderState(bottom=bottom, plain=plain, stack=stack, context=ctx)
        return self._logits(top[0]), new_state, weights

    def __call__(
        self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"], tgt_in: Int[Array, "B T"]
    ) -> tuple[Float[Array, "B T V"], Float[Array, "B T S"]]:
        """Teacher forcing: float32 ``(logits [B, T, V], bottom-layer attention [B, T, S])``, no loop over time.

        The bottom layer and the attention run as one ``lax.scan`` over the target; the layers above read only
        its outputs, so each then runs over the whole target (the stack: :meth:`_run_stack`).
        """
        check_source(src, src_mask)
        check_tokens("tgt_in", tgt_in, src.shape[0], rank=2)
        enc = self.encode(src, src_mask)
        state = self.init_decoder_state(enc)
        emb_proj = self.decoder_bottom.project_inputs(self.tgt_embed(tgt_in))  # [B, T, 4, n], one matmul

        def bottom(carry, e_proj):
            lstm, ctx = carry
            lstm, ctx, weights = self._bottom_step(enc, lstm, ctx, e_proj)
            return (lstm, ctx), (lstm.h, ctx, weights)

        _, (h1, ctx, weights) = jax.lax.scan(
            remat_scan_body(bottom, self.config.remat),
            (state.bottom, state.context),
            jnp.moveaxis(emb_proj, 1, 0),
        )
        top, _, _ = self._upper_layers(state.plain, state.stack, h1, ctx, pipeline=True)  # [T, B, n]
        return self._logits(jnp.moveaxis(top, 0, 1)), jnp.moveaxis(weights, 0, 1)
