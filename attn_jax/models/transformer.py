"""The Transformer encoder–decoder of Vaswani et al. (2017), "Attention Is All You Need", on attn_jax's core.

Every attention is the library's multi-head attention (``attn_jax.attention._multihead``: ``project_heads``
→ ``dot_product_attention`` with a boolean mask → ``project_output``); masks and positions come from
``_masks`` and ``_positional``. Layers are stacked on a leading ``layers`` axis and run with one
``lax.scan`` per stack, so compile time does not grow with depth. With ``d = d_model``::

    x_0   = Dropout(E[w]·√d + PE)                     §3.4, §3.5, §5.4 (PE omitted with RoPE)
    post-LN (the paper):  x ← LayerNorm(x + Dropout(Sublayer(x)))
    pre-LN:               x ← x + Dropout(Sublayer(LayerNorm(x))),   one more LayerNorm after each stack
    encoder layer:  self-attention (padded keys masked) → FFN
    decoder layer:  causal self-attention → cross-attention over the encoder output → FFN
    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2            §3.3
    logits = y W_out + b_out                          W_out = E_tgtᵀ when the softmax is tied (§3.4)

Choices where the paper is silent or this code departs from it:

* Positions: ``sinusoidal`` (the paper's interleaved sin/cos, computed in float32 from integer positions in
  every code path, so teacher forcing and cached decoding add identical vectors), ``learned`` (one table per side,
  ``N(0, 0.02²)``, ``max_length`` rows) or ``rope`` (RoFormer's rotary embedding on the queries and keys of
  both **self**-attentions, nothing added to the embeddings; cross-attention gets no rotation, source and
  target positions being incomparable), ``alibi`` (Press et al. 2022: nothing added to the embeddings; each
  head ``h`` of both **self**-attentions adds ``-m_h·|i - j|`` to its scaled logits, ``m_h`` the paper's
  geometric slopes; symmetric in the encoder, where the paper's causal ``i - j`` has no side to choose) or
  ``relative`` (Shaw et al. 2018: nothing added to the embeddings; every **self**-attention layer learns key
  and value vectors ``a^K, a^V`` for the clipped distance ``clip(j - i, ±max_relative_positions)``, shared by
  its heads: ``e_ij = q_i(k_j + a^K_ij)ᵀ/√K``, ``z_i = Σ_j α_ij(v_j + a^V_ij)``). Cross-attention gets neither,
  as in both papers (Press et al. apply ALiBi to self-attention only; Shaw et al. to self-attention only):
  source and target positions are incomparable. All three relative kinds compute the bias/rotation from integer
  positions, so a cached decoding step at position ``t`` uses exactly teacher forcing's values for ``t``.
* Initialisation: embeddings with standard deviation ``d^{-1/2}`` (fairseq/tensor2tensor, so ``E·√d`` has
  unit scale and a tied softmax gives O(1) logits); attention kernels from ``init_multi_head_params`` (LeCun
  normal); FFN and untied output kernels LeCun normal (Flax's ``Dense`` default). These normals are truncated
  at ±2σ with σ corrected for the cut. Biases 0, LayerNorm scale 1; an output bias is always present. LayerNorm
  ``ε = 1e-6``.
* Dropout (§5.4, ``P_drop``) on the embedding sums and on every sub-layer output before the residual add;
  none on attention weights or inside the FFN (the paper names only these two). It is on only when a
  ``dropout_rng`` key is passed to ``__call__``/``intermediates`` — the model holds no RNG state, so the
  trainer's parameter dict is the whole model state and evaluation is deterministic by default.
* Padding: padded source keys are masked everywhere; the encoder output is set to 0 at padding (as
  RNNsearch's annotations), so it is invariant to what padding holds and how much of it there is. The target
  needs no padding mask: with right padding the causal mask already hides padded keys from real queries.
* Numerics: the residual stream and LayerNorm statistics are float32; matmul operands are in the compute
  ``dtype`` with float32 accumulation; attention logits and softmax are float32 (the core's policy); the
  decoder's key/value cache is in the compute dtype; logits are float32.

Incremental decoding (:meth:`Transformer.decode_step`): :meth:`Transformer.encode` runs the encoder once and
precomputes every decoder layer's cross-attention keys and values; the decoder state holds each layer's
self-attention keys and values of the positions decoded so far in a static ``[B, L_dec, G, C, K]`` buffer
(``C`` = ``cache_length``, default ``max_length``; ``G`` = ``num_kv_heads``, ``H`` by default) and the next
position. With grouped-query attention (Ainslie et al. 2023, ``num_kv_heads = G < H``) every attention's key
and value projections have ``G`` heads, each shared by ``H / G`` query heads, so this cache and the
precomputed cross-attention keys/values are ``H / G`` times smaller. A step projects only the new
position, writes its key/value into slot ``t`` and attends the buffer under the length mask ``j ≤ t``, so no
earlier position is recomputed: a step costs the projections of one position plus ``O(C·d)`` of masked
attention per layer (static shapes for ``jit``), instead of re-running the decoder over the whole prefix. Decoding past ``C`` positions cannot be right, so it returns NaN
logits rather than silently reusing a slot; size ``cache_length`` (or ``max_length``) to at least the
decoder's output length (``attn_jax.decoding.output_length``). A decoding loop steps
:meth:`Transformer.for_decoding`'s form, which keeps one cache array per layer: inside a ``while`` loop,
slicing a layer out of the stacked buffer copies it at every step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_jax.attention._alibi import alibi_bias, alibi_slopes
from attn_jax.attention._checks import positive_int
from attn_jax.attention._dot_product import dot_product_attention
from attn_jax.attention._gqa import group_operands, merge_groups
from attn_jax.attention._masks import (
    key_padding_mask,
    make_causal_mask,
    make_padding_mask,
    make_segment_mask,
    segment_positions,
)
from attn_jax.attention._multihead import init_multi_head_params, project_heads, project_output
from attn_jax.attention._normalizers import NORMALIZERS
from attn_jax.attention._plain import dot_product_scores
from attn_jax.attention._positional import (
    init_learned_positions,
    learned_positions,
    rotary_embedding,
    sinusoidal_positions,
)
from attn_jax.attention._relative import (
    init_relative_embeddings,
    relative_attention,
    relative_position_index,
)
from attn_jax.attention._softmax import masked_softmax, weighted_context
from attn_jax.models.interface import (
    EncoderOutput,
    check_remat,
    check_source,
    check_tokens,
    layer_params,
    remat_layer,
)
from attn_jax.models.presets import canonicalize_dtypes
from attn_jax.nn._params import partitioned, unwrap, wrap
from attn_jax.typing import Array, Bool, Float, Int

__all__ = [
    "NORMS",
    "POSITIONS",
    "SHARINGS",
    "Transformer",
    "TransformerConfig",
    "TransformerDecoderLayer",
    "TransformerDecoderState",
    "TransformerDecodingState",
    "TransformerDecoding",
    "TransformerEncoderLayer",
    "TransformerIntermediates",
    "transformer_base_config",
    "transformer_cpu_config",
]

Norm = Literal["pre", "post"]
Positions = Literal["sinusoidal", "sinusoidal_halves", "learned", "rope", "alibi", "relative"]
Sharing = Literal["none", "decoder", "all"]
NORMS: tuple[str, ...] = ("pre", "post")
POSITIONS: tuple[str, ...] = ("sinusoidal", "sinusoidal_halves", "learned", "rope", "alibi", "relative")
SHARINGS: tuple[str, ...] = ("none", "decoder", "all")
# The FFN's nonlinearity: the paper's ReLU, GELU exact (erf) or tanh-approximated, and swish (SiLU, OPUS-MT's).
ACTIVATIONS: dict[str, object] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "swish": jax.nn.silu,
}
_QKV = ("query", "key", "value")
_TRUNCATED_NORMAL_STD = 0.87962566103423978  # std of a unit normal truncated to [-2, 2]


# --------------------------------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes and options of the Transformer; the defaults are the paper's base model (Table 3).

    Attributes:
      src_vocab: source vocabulary size.
      tgt_vocab: target vocabulary size.
      arch: always ``"transformer"`` (so ``config.arch`` dispatches like :class:`~attn_jax.models.RNNConfig`).
      d_model: ``d``, the width of embeddings and of the residual stream (paper: 512).
      heads: ``H`` (paper: 8); ``d_model`` must be divisible by it (head width ``K = d / H``).
      num_kv_heads: ``G``, the key/value heads of every attention (grouped-query attention, Ainslie et al.
        2023; ``1`` is multi-query attention): must divide ``heads``; ``0`` (the default) means ``heads``,
        ordinary multi-head attention.
      d_ff: inner width of the position-wise FFN (paper: 2048).
      encoder_layers: ``N``, the encoder's layers (paper: 6).
      decoder_layers: ``N``, the decoder's layers (paper: 6).
      dropout: ``P_drop`` on embeddings and sub-layer outputs, in ``[0, 1)`` (paper: 0.1).
      norm: ``"post"`` (the paper: LayerNorm after each residual add) or ``"pre"`` (before each sub-layer,
        plus a final LayerNorm per stack; trains without warm-up tricks).
      positions: ``"sinusoidal"`` (the paper), ``"sinusoidal_halves"`` (the same values, sines then cosines:
        Marian's layout), ``"learned"``, ``"rope"``, ``"alibi"`` or ``"relative"`` (see the module docstring).
      max_length: longest target sequence the decoder's cache holds by default, and with learned positions the
        rows of each position table (the longest source and target).
      max_relative_positions: ``k``, the clipping distance of ``"relative"`` positions (Shaw et al. 2018 used
        16; OpenNMT-py's ``max_relative_positions``): each self-attention learns ``2k + 1`` key and value
        vectors per layer. Ignored by the other position kinds.
      normalizer: what turns every attention's logits (encoder self-, decoder self- and cross-attention, all
        heads) into weights: ``"softmax"`` (the paper), ``"sparsemax"`` (Martins & Astudillo 2016) or
        ``"entmax15"`` (1.5-entmax, Peters et al. 2019; Correia et al. 2019 use it in Transformers), which can
        give keys exactly zero weight (``attn_jax.masked_normalize``); padded and future keys keep exactly 0.
      share_embeddings: ``"none"``; ``"decoder"`` ties the target embedding and the pre-softmax projection
        (§3.4); ``"all"`` also uses it as the source embedding (the paper's setting, which needs a joint
        source–target vocabulary, hence equal sizes).
      activation: the FFN's nonlinearity: ``"relu"`` (the paper), ``"gelu"`` (exact), ``"gelu_tanh"`` or
        ``"swish"`` (``x·σ(x)``, the OPUS-MT models').
      layer_norm_eps: the ``ε`` of every LayerNorm (``1e-6`` here; PyTorch and Marian checkpoints use ``1e-5``).
      scale_embeddings: multiply token embeddings by ``√d`` (§3.4); False for checkpoints trained without it.
      remat: what each layer keeps for the backward pass (activation rematerialisation, ``jax.checkpoint``):
        ``"none"`` keeps everything; ``"full"`` keeps only the layer's input and recomputes the rest;
        ``"dots_saveable"`` keeps matmul outputs; ``"dots_with_no_batch_dims_saveable"`` keeps only the
        matmuls without batch dimensions (the projections, not the attention scores). Gradients are the same;
        less memory costs recomputation.
      param_dtype: dtype the parameters are stored in.
      dtype: compute dtype of matmul operands and activations entering them (``"bfloat16"`` for mixed
        precision); the residual stream, LayerNorm, softmax and logits stay float32.
    """

    src_vocab: int = 37000
    tgt_vocab: int = 37000
    arch: Literal["transformer"] = "transformer"
    d_model: int = 512
    heads: int = 8
    num_kv_heads: int = 0
    d_ff: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    dropout: float = 0.1
    norm: Norm = "post"
    positions: Positions = "sinusoidal"
    max_length: int = 256
    max_relative_positions: int = 16
    share_embeddings: Sharing = "decoder"
    normalizer: str = "softmax"
    activation: str = "relu"
    layer_norm_eps: float = 1e-6
    scale_embeddings: bool = True
    remat: str = "none"
    param_dtype: str = "float32"
    dtype: str = "float32"

    def __post_init__(self):
        for name in (
            "src_vocab",
            "tgt_vocab",
            "d_model",
            "heads",
            "d_ff",
            "encoder_layers",
            "decoder_layers",
            "max_length",
            "max_relative_positions",
        ):
            object.__setattr__(self, name, positive_int(f"transformer config: {name}", getattr(self, name)))
        if self.arch != "transformer":
            raise ValueError(f"transformer config: arch must be 'transformer', got {self.arch!r}")
        if self.d_model % self.heads:
            raise ValueError(
                f"transformer config: d_model ({self.d_model}) must be divisible by heads ({self.heads})"
            )
        g = self.num_kv_heads
        if isinstance(g, bool) or not isinstance(g, int | np.integer) or g < 0 or (g and self.heads % g):
            raise ValueError(
                f"transformer config: num_kv_heads must be 0 (= heads) or a positive int dividing heads "
                f"({self.heads}), got {g!r}"
            )
        if (
            isinstance(self.dropout, bool)
            or not isinstance(self.dropout, int | float)
            or not 0 <= self.dropout < 1
        ):
            raise ValueError(f"transformer config: dropout must be a number in [0, 1), got {self.dropout!r}")
        for name, allowed in (("norm", NORMS), ("positions", POSITIONS), ("share_embeddings", SHARINGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"transformer config: {name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}"
                )
        check_remat("transformer config", self.remat)
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"transformer config: activation must be one of {', '.join(ACTIVATIONS)}; got {self.activation!r}"
            )
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1:
            raise ValueError(f"transformer config: layer_norm_eps must be a number in (0, 1), got {eps!r}")
        if not isinstance(self.scale_embeddings, bool | np.bool_):
            raise ValueError(
                f"transformer config: scale_embeddings must be a bool, got {self.scale_embeddings!r}"
            )
        if self.normalizer not in NORMALIZERS:
            raise ValueError(
                f"transformer config: normalizer must be one of {', '.join(NORMALIZERS)}; got {self.normalizer!r}"
            )
        if self.positions == "relative" and self.normalizer != "softmax":
            raise ValueError(
                f"transformer config: relative positions take the softmax only (attn_jax.relative_attention has no "
                f"normalizer); got normalizer {self.normalizer!r}"
            )
        if self.positions.startswith("sinusoidal") and self.d_model % 2:
            raise ValueError(
                f"transformer config: sinusoidal positions need an even d_model, got {self.d_model}"
            )
        if self.positions == "rope" and (self.d_model // self.heads) % 2:
            raise ValueError(
                f"transformer config: rope needs an even head width d_model / heads, got "
                f"{self.d_model} / {self.heads} = {self.d_model // self.heads}"
            )
        if self.share_embeddings == "all" and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                f"transformer config: share_embeddings='all' needs one joint vocabulary, but src_vocab "
                f"({self.src_vocab}) != tgt_vocab ({self.tgt_vocab}); use 'decoder' or 'none'"
            )
        canonicalize_dtypes(self, "transformer config")
        object.__setattr__(self, "dropout", float(self.dropout))
        object.__setattr__(self, "layer_norm_eps", float(self.layer_norm_eps))
        object.__setattr__(self, "scale_embeddings", bool(self.scale_embeddings))

    @property
    def head_dim(self) -> int:
        """``K = d_model / heads``."""
        return self.d_model // self.heads

    @property
    def kv_heads(self) -> int:
        """``G``, the key/value heads: ``num_kv_heads``, or ``heads`` when it is 0."""
        return self.num_kv_heads or self.heads

    def replace(self, **changes) -> TransformerConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


def transformer_base_config(src_vocab: int = 37000, tgt_vocab: int = 37000, **overrides) -> TransformerConfig:
    """Vaswani et al. (2017) base model: ``d = 512``, 8 heads, ``d_ff = 2048``, 6 + 6 layers, dropout 0.1,
    post-LN, sinusoidal positions, tied target embedding and softmax.

    The paper also ties the source embedding (``share_embeddings="all"``) because its vocabulary is one joint
    37 000-token BPE; pass that override when the vocabularies really are one.

    >>> transformer_base_config().d_ff
    2048
    """
    base = dict(
        d_model=512,
        heads=8,
        d_ff=2048,
        encoder_layers=6,
        decoder_layers=6,
        dropout=0.1,
        norm="post",
        positions="sinusoidal",
        share_embeddings="decoder",
    )
    return TransformerConfig(src_vocab=src_vocab, tgt_vocab=tgt_vocab, **{**base, **overrides})


def transformer_cpu_config(src_vocab: int, tgt_vocab: int, **overrides) -> TransformerConfig:
    """A CPU-sized preset for the built-in corpus and demos: ``d = 64``, 4 heads, ``d_ff = 256``, 2 + 2 layers,
    pre-LN (stable without a long warm-up), dropout 0.1.

    >>> transformer_cpu_config(100, 120).d_model
    64
    """
    base = dict(
        d_model=64,
        heads=4,
        d_ff=256,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.1,
        norm="pre",
        positions="sinusoidal",
        share_embeddings="decoder",
    )
    return TransformerConfig(src_vocab=src_vocab, tgt_vocab=tgt_vocab, **{**base, **overrides})


# ---------------------------------------------------------------------------------------------- pytrees


class TransformerDecoderState(NamedTuple):
    """The incremental decoder's state between steps (batch-leading, static shapes).

    Attributes:
      keys: ``[B, L_dec, G, C, K]`` self-attention keys of the positions decoded so far, per decoder layer
        (RoPE already applied; ``G`` = the config's ``kv_heads``); slots ``≥ position`` are unused.
      values: ``[B, L_dec, G, C, K]`` the matching values.
      position: ``[B]`` int32, the index of the next target position (0 before BOS is fed).
    """

    keys: Float[Array, "B Ld G C K"]
    values: Float[Array, "B Ld G C K"]
    position: Int[Array, " B"]


class TransformerIntermediates(NamedTuple):
    """Everything :meth:`Transformer.intermediates` exposes for tests and plots (float32).

    Attributes:
      encoder: ``[B, L_enc, S, D]`` the residual stream after each encoder layer (before the final pre-LN).
      decoder: ``[B, L_dec, T, D]`` the residual stream after each decoder layer (before the final pre-LN).
      cross_attention: ``[B, L_dec, H, T, S]`` every decoder layer's cross-attention weights, all heads.
      logits: ``[B, T, V]``.
    """

    encoder: Float[Array, "B Le S D"]
    decoder: Float[Array, "B Ld T D"]
    cross_attention: Float[Array, "B Ld H T S"]
    logits: Float[Array, "B T V"]


# ------------------------------------------------------------------------------------ the functional core


def _layer_norm(p: dict, x: Float[Array, "... D"], eps: float) -> Float[Array, "... D"]:
    """LayerNorm (Ba et al. 2016) over the last axis, statistics and output in float32."""
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps)
    return y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)


def _dense(x: Float[Array, "... I"], w: Float[Array, "I O"], b: Float[Array, " O"]) -> Float[Array, "... O"]:
    """``x w + b`` with operands in ``x``'s dtype and float32 accumulation; float32 result."""
    y = jnp.einsum("...i,io->...o", x, w.astype(x.dtype), preferred_element_type=jnp.float32)
    return y + b.astype(jnp.float32)


def _ffn(p: dict, x: Float[Array, "... D"], activation: str = "relu") -> Float[Array, "... D"]:
    """``f(x W_1 + b_1) W_2 + b_2`` (§3.3; ``f = max(0, ·)`` in the paper), returned in ``x``'s dtype."""
    h = ACTIVATIONS[activation](_dense(x, p["w_1"], p["b_1"])).astype(x.dtype)
    return _dense(h, p["w_2"], p["b_2"]).astype(x.dtype)


def _dropout(x: Array, rate: float, keep: Bool[Array, "..."] | None) -> Array:
    """Inverted dropout with a precomputed keep-mask; the identity when ``keep`` is None."""
    if keep is None:
        return x
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def _attend_heads(
    p_out: dict,
    q: Float[Array, "B H T K"],
    k: Float[Array, "B G S K"],
    v: Float[Array, "B G S K"],
    mask: Bool[Array, "..."],
    positional: _Relative | Float[Array, "..."] | None = None,
    normalizer: str = "softmax",
) -> tuple[Float[Array, "B T D"], Float[Array, "B H T S"]]:
    """Scaled dot-product attention per head, then ``Concat(heads) W^O``: ``(out, weights)``.

    ``G < H`` key/value heads: grouped-query attention, each shared by ``H / G`` query heads (never repeated).
    ``positional``: an ALiBi bias ``[..., H, T, S]`` added to the logits, or Shaw et al.'s tables and index.
    """
    groups = k.shape[-3]
    kv_heads = None if groups == q.shape[-3] else groups
    if isinstance(positional, _Relative):
        ctx, weights = relative_attention(
            q, k, v, mask, positional.keys, positional.values, positional.index, num_kv_heads=kv_heads
        )
    else:
        ctx, weights = dot_product_attention(
            q,
            k,
            v,
            mask,
            bias=positional,
            return_weights=True,
            num_kv_heads=kv_heads,
            normalizer=normalizer,
        )
    return project_output(p_out, ctx), weights


def _attend_clean(
    p_out: dict,
    q: Float[Array, "B H T K"],
    k: Float[Array, "B G S K"],
    v: Float[Array, "B G S K"],
    mask: Bool[Array, "B 1 T|1 S"],
) -> tuple[Float[Array, "B T D"], Float[Array, "B H T S"]]:
    """:func:`_attend_heads` (softmax, no positional term) for keys and values whose masked rows are zero.

    :func:`dot_product_attention` zeroes every key and value row no query reads, so that NaN in padding
    cannot reach a result. A decoding step's cache and cross-attention keys are zero there already
    (:class:`TransformerDecoding` makes them so, once, before the loop). Zeroing them again costs one pass
    over every layer's cache at every step. This path skips it and computes the same products.
    """
    heads, groups = q.shape[-3], k.shape[-3]
    if groups != heads:  # grouped-query attention: [B, G, H/G, T, K] against [B, G, 1, S, K]
        q, k, v, mask, _, _ = group_operands(q, k, v, mask, None, (), groups, heads // groups)
    weights = masked_softmax(dot_product_scores(q, k), mask)
    ctx = weighted_context(weights, v)
    if groups != heads:
        ctx, weights = merge_groups(ctx), merge_groups(weights)
    return project_output(p_out, ctx), weights


def _project_step(p: dict, x: Float[Array, "B 1 D"]) -> Float[Array, "B H 1 K"]:
    """``project_heads`` of one position as a plain ``[B, D] × [D, H·K]`` product, float32 accumulation.

    XLA computes ``project_heads``' ``[B, H, T, K]`` output from the kernel transposed to ``[H, K, D]``. Inside
    a decoding loop it transposes the loop-invariant kernel again at every step. This form needs no transpose.
    """
    kernel = p["kernel"]
    d, heads, k = kernel.shape
    dtype = x.dtype
    y = jnp.dot(x[:, 0], kernel.reshape(d, heads * k).astype(dtype), preferred_element_type=jnp.float32)
    if "bias" in p:
        y = y + p["bias"].astype(jnp.float32).reshape(heads * k)
    return y.reshape(x.shape[0], heads, 1, k).astype(dtype)


class _Relative(NamedTuple):
    """One self-attention layer's relative tables ``[2k + 1, K]`` and the rows index ``[..., T, S]``."""

    keys: Array
    values: Array
    index: Array


def _positional(c: TransformerConfig, p_layer: dict, query_positions, key_positions):
    """A self-attention's ALiBi bias, relative tables + index, or None for the other position kinds."""
    if c.positions == "alibi":
        return alibi_bias(alibi_slopes(c.heads), query_positions, key_positions)
    if c.positions == "relative":
        index = relative_position_index(query_positions, key_positions, c.max_relative_positions)
        return _Relative(p_layer["keys"], p_layer["values"], index)
    return None


def _self_attention(
    p: dict,
    x: Float[Array, "B T D"],
    mask: Bool[Array, "..."],
    rope: bool,
    positional=None,
    normalizer: str = "softmax",
    rope_positions=None,
) -> tuple[Float[Array, "B T D"], Float[Array, "B H T T"]]:
    """Multi-head self-attention over all positions of ``x`` (RoPE on queries and keys when ``rope``, at
    ``rope_positions`` ``[B, T]`` when given (packed rows), else ``0..T-1``; an ALiBi bias or relative tables in
    ``positional``)."""
    q, k, v = (project_heads(p[n], x) for n in _QKV)  # [B, H, T, K], [B, G, T, K], [B, G, T, K]
    if rope and rope_positions is not None:
        q, k = (
            rotary_embedding(q, rope_positions[:, None, :]),
            rotary_embedding(k, rope_positions[:, None, :]),
        )
    elif rope:
        q, k = rotary_embedding(q), rotary_embedding(k)
    return _attend_heads(p["out"], q, k, v, mask, positional, normalizer)


def _sublayer(c: TransformerConfig, p_norm: dict, x, fn, rate: float, keep):
    """A residual sub-layer: ``LN(x + Drop(fn(x)))`` (post) or ``x + Drop(fn(LN(x)))`` (pre).

    ``fn`` maps compute-dtype activations to ``(output, aux)``; returns ``(x, aux)`` with ``x`` float32.
    """
    h = _layer_norm(p_norm, x, c.layer_norm_eps) if c.norm == "pre" else x
    out, aux = fn(h.astype(jnp.dtype(c.dtype)))
    x = x + _dropout(out.astype(jnp.float32), rate, keep)
    if c.norm == "post":
        x = _layer_norm(p_norm, x, c.layer_norm_eps)
    return x, aux


def _mask(masks, i):
    return None if masks is None else masks[i]


class _Packed(NamedTuple):
    """Segment ids and per-segment positions of packed rows (see :meth:`Transformer.__call__`)."""

    src_segments: Int[Array, "B S"]
    tgt_segments: Int[Array, "B T"]
    src_positions: Int[Array, "B S"]
    tgt_positions: Int[Array, "B T"]


def _packed(src, tgt_in, src_segments, tgt_segments, src_positions, tgt_positions) -> _Packed | None:
    """The packed-row arguments checked and completed (positions from the ids), or None when not packed."""
    if src_segments is None and tgt_segments is None:
        if src_positions is not None or tgt_positions is not None:
            raise ValueError(
                "src_positions/tgt_positions are for packed rows: pass src_segments and tgt_segments"
            )
        return None
    if src_segments is None or tgt_segments is None:
        raise ValueError(
            "packed rows need both src_segments and tgt_segments (target pair n reads source pair n)"
        )
    pieces = {}
    for name, x, ref in (
        ("src_segments", src_segments, src),
        ("tgt_segments", tgt_segments, tgt_in),
        ("src_positions", src_positions, src),
        ("tgt_positions", tgt_positions, tgt_in),
    ):
        if x is None:
            continue
        if jnp.shape(x) != jnp.shape(ref) or not jnp.issubdtype(jnp.asarray(x).dtype, jnp.integer):
            raise ValueError(
                f"{name} must be integers of the tokens' shape {list(jnp.shape(ref))}, got "
                f"{jnp.asarray(x).dtype} {list(jnp.shape(x))}"
            )
        pieces[name] = jnp.asarray(x)
    return _Packed(
        src_segments=pieces["src_segments"],
        tgt_segments=pieces["tgt_segments"],
        src_positions=pieces.get("src_positions", segment_positions(pieces["src_segments"])),
        tgt_positions=pieces.get("tgt_positions", segment_positions(pieces["tgt_segments"])),
    )


# ------------------------------------------------------------------------------------------------ layers


def _layer_init(config: TransformerConfig, rngs, params, side: str) -> tuple[dict, dict]:
    """A layer's plain parameters and their logical axis names: ``params`` as given, or drawn from ``rngs``.

    ``params`` is one layer's, or a stack's with a leading ``layers`` axis (told apart by the rank of the FFN
    norm's scale). Drawn parameters are one layer of a one-layer model, so they follow the model's initialisers.
    """
    if (rngs is None) == (params is None):
        raise ValueError(f"Transformer{side.title()}Layer needs rngs or params, exactly one of them")
    if params is None:
        one = config.replace(encoder_layers=1, decoder_layers=1)
        params = jax.tree.map(lambda a: a[0], _init_params(rngs.params(), one)[side])
    stacked = np.ndim(params["ffn_norm"]["scale"]) == 2
    return params, _STACK_NAMES if stacked else _LAYER_NAMES


def _layer_params(layer: nnx.Module, names: tuple[str, ...]) -> dict:
    """The plain pytree of a layer's parameters, keyed by sub-layer (``relative`` only when present)."""
    return {n: unwrap(getattr(layer, n)) for n in names if hasattr(layer, n)}


def _scan_layers(stack: nnx.Module, body, carry, xs, remat: str = "none"):
    """``lax.scan`` of ``body(layer, carry, x)`` over the layers of ``stack``, whose parameters have a leading
    ``layers`` axis: one layer is traced and compiled, whatever the depth.

    ``remat`` names a ``attn_jax.models.interface.REMAT_POLICIES`` entry: each layer is then a
    ``jax.checkpoint``, its activations recomputed in the backward pass instead of kept.
    """
    graphdef, state = nnx.split(stack)

    def step(carry, slices):
        state, x = slices
        return body(nnx.merge(graphdef, layer_params(state)), carry, x)

    step = remat_layer(step, remat)

    return jax.lax.scan(step, carry, (state, xs))


class TransformerEncoderLayer(nnx.Module):
    """One encoder layer (§3.1): self-attention over the source, then the FFN, each a residual sub-layer.

    A sub-layer is ``LN(x + Dropout(f(x)))`` with ``norm="post"`` (the paper's) or ``x + Dropout(f(LN(x)))``
    with ``"pre"``. The parameters are ``attention``, ``attention_norm``, ``ffn``, ``ffn_norm`` and, with
    ``positions="relative"``, Shaw et al.'s ``relative`` key and value tables. :class:`Transformer` holds all
    its encoder layers as one such module whose parameters have a leading ``layers`` axis, and scans over it.

    Args:
      config: the model's :class:`TransformerConfig`.
      rngs: draws the parameters as the Transformer draws its layers'.
      params: plain arrays instead: one layer's, or a stack's with a leading ``layers`` axis.

    >>> cfg = TransformerConfig(src_vocab=11, tgt_vocab=13, d_model=8, heads=2, d_ff=16, max_length=8)
    >>> layer = TransformerEncoderLayer(cfg, rngs=nnx.Rngs(0))
    >>> layer(jnp.ones((2, 5, 8)), jnp.ones((2, 1, 1, 5), bool)).shape
    (2, 5, 8)
    """

    _NAMES = ("attention", "attention_norm", "ffn", "ffn_norm", "relative")

    def __init__(
        self, config: TransformerConfig, *, rngs: nnx.Rngs | None = None, params: dict | None = None
    ):
        self.config = config
        params, names = _layer_init(config, rngs, params, "encoder")
        for name in self._NAMES:
            if name in params:
                setattr(self, name, nnx.Dict(wrap(params[name], names[name])))

    def __call__(
        self,
        x: Float[Array, "B S D"],
        mask: Bool[Array, "B 1 S|1 S"],
        *,
        keep: Bool[Array, "2 B S D"] | None = None,
        rope_positions: Int[Array, "B S"] | None = None,
    ) -> Float[Array, "B S D"]:
        """The float32 residual stream ``x`` through both sub-layers.

        Args:
          x: ``[B, S, D]`` float32.
          mask: True where a query may attend a key (padding, and segments of packed rows).
          keep: the dropout keep-masks of the two sub-layers; ``None``: no dropout.
          rope_positions: the RoPE positions of packed rows; ``None``: ``0..S-1``.
        """
        c = self.config
        p = _layer_params(self, self._NAMES)
        src_pos = jnp.arange(x.shape[1])
        positional = _positional(c, p.get("relative"), src_pos, src_pos)
        rope = c.positions == "rope"

        def attention(h):
            return (
                _self_attention(p["attention"], h, mask, rope, positional, c.normalizer, rope_positions)[0],
                None,
            )

        def ffn(h):
            return _ffn(p["ffn"], h, c.activation), None

        x, _ = _sublayer(c, p["attention_norm"], x, attention, c.dropout, _mask(keep, 0))
        x, _ = _sublayer(c, p["ffn_norm"], x, ffn, c.dropout, _mask(keep, 1))
        return x


class TransformerDecoderLayer(nnx.Module):
    """One decoder layer (§3.1): causal self-attention, cross-attention over the encoder output, then the FFN.

    Each is a residual sub-layer, post- or pre-LN as in :class:`TransformerEncoderLayer`. The parameters are
    ``self_attention``, ``cross_attention``, ``ffn``, a norm for each (``self_attention_norm``, ...) and, with
    ``positions="relative"``, the ``relative`` tables of the self-attention. The cross-attention's keys and
    values come precomputed (``kv``), once per source for every decoder layer. ``__call__`` runs all target
    positions (teacher forcing); :meth:`step` runs one position against a key/value cache.

    Args:
      config: the model's :class:`TransformerConfig`.
      rngs: draws the parameters as the Transformer draws its layers'.
      params: plain arrays instead: one layer's, or a stack's with a leading ``layers`` axis.

    >>> cfg = TransformerConfig(src_vocab=11, tgt_vocab=13, d_model=8, heads=2, d_ff=16, max_length=8)
    >>> layer = TransformerDecoderLayer(cfg, rngs=nnx.Rngs(0))
    >>> kv = jnp.ones((2, 2, 2, 5, 4))  # [B, keys|values, G, S, K]
    >>> y, weights = layer(jnp.ones((2, 3, 8)), kv, make_causal_mask(3), jnp.ones((2, 1, 1, 5), bool))
    >>> y.shape, weights.shape
    ((2, 3, 8), (2, 2, 3, 5))
    """

    _NAMES = (
        "self_attention",
        "self_attention_norm",
        "cross_attention",
        "cross_attention_norm",
        "ffn",
        "ffn_norm",
        "relative",
    )

    def __init__(
        self, config: TransformerConfig, *, rngs: nnx.Rngs | None = None, params: dict | None = None
    ):
        self.config = config
        params, names = _layer_init(config, rngs, params, "decoder")
        for name in self._NAMES:
            if name in params:
                setattr(self, name, nnx.Dict(wrap(params[name], names[name])))

    def __call__(
        self,
        y: Float[Array, "B T D"],
        kv: Float[Array, "B 2 G S K"],
        self_mask: Bool[Array, "B|1 1 T T"],
        cross_mask: Bool[Array, "B 1 T|1 S"],
        *,
        keep: Bool[Array, "3 B T D"] | None = None,
        rope_positions: Int[Array, "B T"] | None = None,
    ) -> tuple[Float[Array, "B T D"], Float[Array, "B H T S"]]:
        """Teacher forcing over all target positions: ``(y, cross-attention weights)``.

        Args:
          y: ``[B, T, D]`` float32, the residual stream.
          kv: this layer's precomputed cross-attention keys (``kv[:, 0]``) and values (``kv[:, 1]``).
          self_mask: the self-attention's mask (causal, and segments of packed rows).
          cross_mask: the cross-attention's mask (source padding, and segments of packed rows).
          keep: the dropout keep-masks of the three sub-layers; ``None``: no dropout.
          rope_positions: the RoPE positions of packed rows; ``None``: ``0..T-1``.
        """
        c = self.config
        p = _layer_params(self, self._NAMES)
        tgt_pos = jnp.arange(y.shape[1])
        positional = _positional(c, p.get("relative"), tgt_pos, tgt_pos)
        rope = c.positions == "rope"

        def self_attention(h):
            out = _self_attention(
                p["self_attention"], h, self_mask, rope, positional, c.normalizer, rope_positions
            )
            return out[0], None

        y, weights, _ = self._sublayers(p, y, self_attention, (kv[:, 0], kv[:, 1]), cross_mask, keep)
        return y, weights

    def step(
        self,
        y: Float[Array, "B 1 D"],
        kv: tuple[Float[Array, "B G S K"], Float[Array, "B G S K"]],
        cache: tuple[Float[Array, "B G C K"], Float[Array, "B G C K"]],
        position: Int[Array, " B"],
        cross_mask: Bool[Array, "B 1 1 S"],
        clean: bool = False,
    ):
        """One target position ``t`` from the cache: ``(y, cross-attention weights [B, H, 1, S], new cache)``.

        ``kv`` is this layer's cross-attention keys and values, ``cache`` its self-attention ones. The new position's key and value are scattered into slot
        ``t``, one row each, so a step writes ``B`` slots rather than the whole cache. The query attends slots
        ``0..t``: teacher forcing's row ``t``, without recomputing earlier positions. A position past the
        cache writes nothing. ``clean``: the cache's slots past ``t`` and ``kv``'s padded rows are zero, so
        softmax attention without positional terms skips zeroing them (:func:`_attend_clean`).
        """
        c = self.config
        p = _layer_params(self, self._NAMES)
        cache_k, cache_v = cache
        capacity = cache_k.shape[2]
        rows = jnp.arange(position.shape[0])
        visible = make_padding_mask(position + 1, capacity)[:, None, None, :]  # [B, 1, 1, C]: keys j <= t
        # query position t over cache slots 0..C-1: teacher forcing's row t (masked slots get weight 0)
        positional = _positional(c, p.get("relative"), position[:, None], jnp.arange(capacity)[None, :])
        pa = p["self_attention"]

        def self_attention(h):
            q, k, v = (_project_step(pa[n], h) for n in _QKV)  # [B, H, 1, K], [B, G, 1, K], [B, G, 1, K]
            if c.positions == "rope":
                q = rotary_embedding(q, position[:, None, None])
                k = rotary_embedding(k, position[:, None, None])
            keys = cache_k.at[rows, :, position].set(k[:, :, 0].astype(cache_k.dtype), mode="drop")
            values = cache_v.at[rows, :, position].set(v[:, :, 0].astype(cache_v.dtype), mode="drop")
            if lean:
                out, _ = _attend_clean(pa["out"], q, keys, values, visible)
            else:
                out, _ = _attend_heads(pa["out"], q, keys, values, visible, positional, c.normalizer)
            return out, (keys, values)

        lean = clean and positional is None and c.normalizer == "softmax"
        return self._sublayers(p, y, self_attention, kv, cross_mask, None, project=_project_step, lean=lean)

    def _sublayers(self, p, y, self_attention, kv, cross_mask, keep, project=project_heads, lean=False):
        """Self-attention (``self_attention(h) -> (out, aux)``), cross-attention on ``kv`` (keys, values, each
        ``[B, G, S, K]``), FFN: ``(y, weights, aux)``. ``project`` computes the cross-attention's queries;
        ``lean``: ``kv``'s padded rows are zero (:func:`_attend_clean`)."""
        c = self.config

        def cross_attention(h):
            q = project(p["cross_attention"]["query"], h)  # [B, H, T, K]
            if lean:
                return _attend_clean(p["cross_attention"]["out"], q, kv[0], kv[1], cross_mask)
            return _attend_heads(
                p["cross_attention"]["out"], q, kv[0], kv[1], cross_mask, normalizer=c.normalizer
            )

        def ffn(h):
            return _ffn(p["ffn"], h, c.activation), None

        y, aux = _sublayer(c, p["self_attention_norm"], y, self_attention, c.dropout, _mask(keep, 0))
        y, weights = _sublayer(c, p["cross_attention_norm"], y, cross_attention, c.dropout, _mask(keep, 1))
        y, _ = _sublayer(c, p["ffn_norm"], y, ffn, c.dropout, _mask(keep, 2))
        return y, weights, aux


# ------------------------------------------------------------------------------------------------ module


class Transformer(nnx.Module):
    """Vaswani et al. (2017) Transformer encoder–decoder implementing the step interface of
    ``attn_jax.models.interface`` (see the module docstring for the equations and choices).

    >>> cfg = TransformerConfig(src_vocab=11, tgt_vocab=13, d_model=8, heads=2, d_ff=16,
    ...                         encoder_layers=1, decoder_layers=2, max_length=8)
    >>> model = Transformer(cfg, rngs=nnx.Rngs(0))
    >>> logits, attn = model(jnp.ones((2, 7), jnp.int32), jnp.ones((2, 7), bool), jnp.ones((2, 3), jnp.int32))
    >>> logits.shape, attn.shape
    ((2, 3, 13), (2, 3, 7))
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"Transformer needs a TransformerConfig, got {type(config).__name__}")
        self.config = config
        c = config

        p = _init_params(rngs.params(), c)
        self.tgt_embed = partitioned(p["tgt_embed"], ("vocab", "embed"))
        self.src_embed = nnx.data(
            partitioned(p["src_embed"], ("vocab", "embed")) if "src_embed" in p else None
        )
        self.src_positions, self.tgt_positions = (
            nnx.data(partitioned(p[name], (None, "embed")) if name in p else None)
            for name in ("src_positions", "tgt_positions")
        )
        # every layer in one module, parameters stacked on a leading "layers" axis: one scan per stack
        self.encoder = TransformerEncoderLayer(c, params=p["encoder"])
        self.decoder = TransformerDecoderLayer(c, params=p["decoder"])
        pre = c.norm == "pre"
        self.encoder_norm = nnx.data(nnx.Dict(wrap(_norm_params(c), _NORM_NAMES)) if pre else None)
        self.decoder_norm = nnx.data(nnx.Dict(wrap(_norm_params(c), _NORM_NAMES)) if pre else None)
        self.output = nnx.Dict(wrap(p["output"], {"kernel": ("embed", "vocab"), "bias": ("vocab",)}))

    # ------------------------------------------------------------------------------------------- helpers

    def _embed(
        self, table, positions_table, tokens: Int[Array, "B T"], positions, keep
    ) -> Float[Array, "B T D"]:
        """``Dropout(E[w]·√d + PE)`` in float32 (``√d`` unless ``scale_embeddings`` is off); ``positions`` is
        ``[B or 1, T]`` int."""
        c = self.config
        x = jnp.take(table, tokens, axis=0).astype(jnp.float32)
        if c.scale_embeddings:
            x = x * math.sqrt(c.d_model)
        if c.positions in ("sinusoidal", "sinusoidal_halves"):
            layout = "halves" if c.positions == "sinusoidal_halves" else "interleaved"
            x = x + sinusoidal_positions(positions, c.d_model, layout=layout)
        elif c.positions == "learned":
            x = x + learned_positions(positions_table, positions).astype(jnp.float32)
        return _dropout(x, c.dropout, keep)

    def _check_inputs(self, src, src_mask, tgt_in) -> None:
        """One-line ValueErrors for the teacher-forced inputs, before any computation."""
        check_source(src, src_mask)
        check_tokens("tgt_in", tgt_in, src.shape[0], rank=2)
        self._check_length("src", src.shape[1])
        self._check_length("tgt_in", tgt_in.shape[1])

    def _check_length(self, name: str, length: int) -> None:
        if self.config.positions == "learned" and length > self.config.max_length:
            raise ValueError(
                f"{name} has {length} positions but the learned position table has max_length="
                f"{self.config.max_length} rows"
            )

    def _logits(self, y: Float[Array, "... D"]) -> Float[Array, "... V"]:
        """``y W_out + b`` in float32 (``W_out = E_tgtᵀ`` when tied)."""
        dtype = jnp.dtype(self.config.dtype)
        y = y.astype(dtype)
        if self.config.share_embeddings == "none":
            w = self.output["kernel"][...]
            logits = jnp.einsum("...d,dv->...v", y, w.astype(dtype), preferred_element_type=jnp.float32)
        else:
            e = self.tgt_embed[...]
            logits = jnp.einsum("...d,vd->...v", y, e.astype(dtype), preferred_element_type=jnp.float32)
        return logits + self.output["bias"][...].astype(jnp.float32)

    def _keep_masks(self, key, src_shape, tgt_shape):
        """Dropout keep-masks ``([1 + 2·L_enc, B, S, D], [1 + 3·L_dec, B, T, D])`` (the embedding's, then each
        layer's sub-layers'), or ``(None, None)`` without a key or at rate 0.

        One Bernoulli draw for the whole pass, split: every random call is a threefry program XLA compiles
        (~2 s each on a CPU), which would otherwise dominate a small model's compile time.
        """
        c = self.config
        if key is None or c.dropout == 0.0:
            return None, None
        enc_shape = (1 + 2 * c.encoder_layers, *src_shape, c.d_model)
        dec_shape = (1 + 3 * c.decoder_layers, *tgt_shape, c.d_model)
        n_enc = math.prod(enc_shape)
        keep = jax.random.bernoulli(key, 1.0 - c.dropout, (n_enc + math.prod(dec_shape),))
        return keep[:n_enc].reshape(enc_shape), keep[n_enc:].reshape(dec_shape)

    # ------------------------------------------------------------------------------------------- encoder

    def _encode(self, src, src_mask, keep, collect: bool, packed: _Packed | None = None):
        c = self.config
        dtype = jnp.dtype(c.dtype)
        check_source(src, src_mask)
        self._check_length("src", src.shape[1])
        table = self.tgt_embed[...] if self.src_embed is None else self.src_embed[...]
        positions = self.src_positions[...] if self.src_positions is not None else None
        pos = src.shape[1] if c.positions == "learned" else jnp.arange(src.shape[1])[None, :]
        if packed is not None:
            pos = packed.src_positions  # [B, S], restarting in every segment
        x = self._embed(table, positions, src, pos, _mask(keep, 0))  # [B, S, D] float32
        mask = key_padding_mask(src_mask)[:, None]  # [B, 1, 1, S]: padded keys hidden from every head
        if packed is not None:  # [B, 1, S, S]: and only keys of the query's own segment
            mask = jnp.logical_and(mask, make_segment_mask(packed.src_segments, packed.src_segments)[:, None])
        rope_pos = None if packed is None else packed.src_positions

        def layer(encoder_layer, x, keep):  # keep: [2, B, S, D] or None
            x = encoder_layer(x, mask, keep=keep, rope_positions=rope_pos)
            return x, (x if collect else None)

        if keep is not None:
            keep = keep[1:].reshape(c.encoder_layers, 2, *keep.shape[1:])
        x, per_layer = _scan_layers(self.encoder, layer, x, keep, remat=c.remat)
        if self.encoder_norm is not None:
            x = _layer_norm(unwrap(self.encoder_norm), x, c.layer_norm_eps)
        memory = jnp.where(src_mask[..., None], x, 0.0).astype(dtype)  # zero at padding
        # Every decoder layer's cross-attention keys and values, once per source batch: [B, L_dec, G, S, K]. The
        # stacked kernels pass the layer hook here (a fully sharded run gathers all layers' at once).
        graphdef, cross = nnx.split(self.decoder.cross_attention)
        cross = unwrap(nnx.merge(graphdef, layer_params(cross)))
        k, v = (
            jax.vmap(project_heads, in_axes=(0, None), out_axes=1)(cross[n], memory) for n in ("key", "value")
        )
        enc = EncoderOutput(memory=memory, keys=jnp.stack([k, v], axis=2), mask=src_mask, summary=None)
        return enc, (None if per_layer is None else jnp.moveaxis(per_layer, 0, 1))

    def encode(self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"]) -> EncoderOutput:
        """Run the encoder once; precompute every decoder layer's cross-attention keys and values.

        Returns an :class:`~attn_jax.models.interface.EncoderOutput` with ``memory`` ``[B, S, D]`` (the
        encoder output in the compute dtype, zero at padding), ``keys`` ``[B, L_dec, 2, G, S, K]`` (``keys[:,
        l, 0]`` layer ``l``'s cross-attention keys, ``keys[:, l, 1]`` its values; one batch-leading array so
        ``repeat_batch``/``gather_batch`` tile it for beam search), ``mask`` and ``summary=None``.
        """
        return self._encode(src, src_mask, None, collect=False)[0]

    # ------------------------------------------------------------------------------------------- decoder

    def _decode(self, enc: EncoderOutput, tgt_in, keep, collect: bool, packed: _Packed | None = None):
        """Teacher-forced decoder over all positions: ``(final y [B, T, D], per-layer ys)``."""
        c = self.config
        t = tgt_in.shape[1]
        self._check_length("tgt_in", t)
        positions = self.tgt_positions[...] if self.tgt_positions is not None else None
        pos = t if c.positions == "learned" else jnp.arange(t)[None, :]
        if packed is not None:
            pos = packed.tgt_positions  # [B, T], restarting in every segment
        y = self._embed(self.tgt_embed[...], positions, tgt_in, pos, _mask(keep, 0))
        causal = make_causal_mask(t)  # [T, T], broadcast over batch and heads
        cross_mask = key_padding_mask(enc.mask)[:, None]  # [B, 1, 1, S]
        if packed is not None:  # target pair n sees its own earlier tokens and source pair n only
            tgt_seg, src_seg = packed.tgt_segments, packed.src_segments
            causal = jnp.logical_and(causal, make_segment_mask(tgt_seg, tgt_seg)[:, None])  # [B, 1, T, T]
            cross_mask = jnp.logical_and(
                cross_mask, make_segment_mask(tgt_seg, src_seg)[:, None]
            )  # [B, 1, T, S]
        rope_pos = None if packed is None else packed.tgt_positions

        def layer(decoder_layer, y, xs):
            kv, keep = xs  # keep: [3, B, T, D] or None
            y, w = decoder_layer(y, kv, causal, cross_mask, keep=keep, rope_positions=rope_pos)
            return y, ((w, y) if collect else jnp.mean(w, axis=1))  # heads averaged: [B, T, S]

        if keep is not None:
            keep = keep[1:].reshape(c.decoder_layers, 3, *keep.shape[1:])
        y, per_layer = _scan_layers(
            self.decoder, layer, y, (jnp.moveaxis(enc.keys, 1, 0), keep), remat=c.remat
        )
        if self.decoder_norm is not None:
            y = _layer_norm(unwrap(self.decoder_norm), y, c.layer_norm_eps)
        return y, per_layer

    def init_decoder_state(
        self, enc: EncoderOutput, cache_length: int | None = None
    ) -> TransformerDecoderState:
        """An empty key/value cache of ``cache_length`` (default ``config.max_length``) positions, position 0."""
        c = self.config
        cache_length = c.max_length if cache_length is None else cache_length
        cache_length = positive_int("cache_length", cache_length)
        batch = enc.mask.shape[0]
        shape = (batch, c.decoder_layers, c.kv_heads, int(cache_length), c.head_dim)
        zeros = jnp.zeros(shape, jnp.dtype(c.dtype))
        return TransformerDecoderState(keys=zeros, values=zeros, position=jnp.zeros((batch,), jnp.int32))

    def decoder_layers(self) -> list[TransformerDecoderLayer]:
        """The decoder's layers, one module each, sliced from the stacked parameters.

        :meth:`decode_step` runs them one after another. A decoding loop calls :meth:`for_decoding` instead,
        which slices them once before the loop: XLA keeps a slice of a loop-invariant weight inside a
        ``while`` body, copying every weight at every step.
        """
        graphdef, state = nnx.split(self.decoder)
        return [
            nnx.merge(graphdef, layer_params(jax.tree.map(lambda a, i=i: a[i], state)))
            for i in range(self.config.decoder_layers)
        ]

    def for_decoding(self) -> TransformerDecoding:
        """This model with its decoder layers sliced once: call it before a decoding loop, step inside it."""
        return TransformerDecoding(self, self.decoder_layers())

    def decode_step(
        self,
        enc: EncoderOutput,
        state: TransformerDecoderState,
        prev_tokens: Int[Array, " B"],
    ) -> tuple[Float[Array, "B V"], TransformerDecoderState, Float[Array, "B S"]]:
        """One target position from the cache: ``(logits [B, V] float32, new state, attention [B, S])``.

        The attention is the last decoder layer's cross-attention averaged over heads (what beam search and
        the heatmaps use). Logits are NaN once ``state.position`` reaches the cache length. A decoding loop
        steps :meth:`for_decoding`'s form instead, which holds each layer's cache as its own array.
        """
        c = self.config
        batch = enc.mask.shape[0]
        capacity = state.keys.shape[3]
        if state.keys.shape != (batch, c.decoder_layers, c.kv_heads, capacity, c.head_dim):
            raise ValueError(
                f"state.keys has shape {list(state.keys.shape)}, expected [B, L_dec, G, C, K] = "
                f"{[batch, c.decoder_layers, c.kv_heads, capacity, c.head_dim]}"
            )
        n = c.decoder_layers
        kv = tuple((enc.keys[:, i, 0], enc.keys[:, i, 1]) for i in range(n))
        caches = tuple((state.keys[:, i], state.values[:, i]) for i in range(n))
        logits, caches, attn = self._step(
            self.decoder_layers(), kv, caches, enc.mask, state.position, prev_tokens
        )
        keys, values = (jnp.stack([kv_i[j] for kv_i in caches], axis=1) for j in (0, 1))
        return logits, TransformerDecoderState(keys, values, state.position + 1), attn

    def _step(self, layers, kv, caches, src_mask, pos, prev_tokens, clean=False):
        """One position through ``layers``, each with its cross keys/values ``kv[i]`` and cache ``caches[i]``:
        ``(logits [B, V], new caches, last layer's head-averaged cross-attention [B, S])``. ``clean``: see
        :meth:`TransformerDecoderLayer.step`."""
        c = self.config
        check_tokens("prev_tokens", prev_tokens, src_mask.shape[0], rank=1)
        capacity = caches[0][0].shape[2]
        positions = self.tgt_positions[...] if self.tgt_positions is not None else None
        y = self._embed(self.tgt_embed[...], positions, prev_tokens[:, None], pos[:, None], None)  # [B, 1, D]
        cross_mask = key_padding_mask(src_mask)[:, None]  # [B, 1, 1, S]
        new = []
        for decoder_layer, kv_i, cache in zip(layers, kv, caches, strict=True):
            y, w, cache = decoder_layer.step(y, kv_i, cache, pos, cross_mask, clean)
            new.append(cache)
        if self.decoder_norm is not None:
            y = _layer_norm(unwrap(self.decoder_norm), y, c.layer_norm_eps)
        # Past the cache: loudly wrong. NaN in y makes every logit of the row NaN, at the cost of a [B, D]
        # select rather than a pass over the [B, V] logits.
        y = jnp.where((pos < capacity)[:, None, None], y, jnp.nan)
        return self._logits(y[:, 0]), tuple(new), jnp.mean(w[:, :, 0], axis=1)

    # ------------------------------------------------------------------------------------ teacher forcing

    def __call__(
        self,
        src: Int[Array, "B S"],
        src_mask: Bool[Array, "B S"],
        tgt_in: Int[Array, "B T"],
        *,
        dropout_rng: jax.Array | None = None,
        src_segments: Int[Array, "B S"] | None = None,
        tgt_segments: Int[Array, "B T"] | None = None,
        src_positions: Int[Array, "B S"] | None = None,
        tgt_positions: Int[Array, "B T"] | None = None,
    ) -> tuple[Float[Array, "B T V"], Float[Array, "B T S"]]:
        """Teacher forcing: float32 ``(logits [B, T, V], last decoder layer's cross-attention [B, T, S])``.

        The attention is averaged over heads. ``dropout_rng`` (a PRNG key) switches dropout on; without it
        the model is deterministic.

        Packed rows (several pairs per row, as in the Flax ``wmt`` example): ``src_segments`` and
        ``tgt_segments`` give each position's pair (``1, 2, ...``; 0 on padding; pair ``n`` of the target
        belongs to pair ``n`` of the source). Encoder self-attention stays within a segment, decoder
        self-attention is causal within a segment, and cross-attention reads the source segment of the same
        id (:func:`~attn_jax.attention.make_segment_mask`). Positions restart in every segment:
        ``src_positions``/``tgt_positions``, by default :func:`~attn_jax.attention.segment_positions` of the
        ids. Every pair then gets the logits it would get alone. Without segments the pass is unchanged.
        """
        self._check_inputs(src, src_mask, tgt_in)
        packed = _packed(src, tgt_in, src_segments, tgt_segments, src_positions, tgt_positions)
        enc_keep, dec_keep = self._keep_masks(dropout_rng, src.shape, tgt_in.shape)
        enc, _ = self._encode(src, src_mask, enc_keep, collect=False, packed=packed)
        y, weights = self._decode(enc, tgt_in, dec_keep, collect=False, packed=packed)
        return self._logits(y), weights[-1]

    def intermediates(
        self,
        src: Int[Array, "B S"],
        src_mask: Bool[Array, "B S"],
        tgt_in: Int[Array, "B T"],
        *,
        dropout_rng: jax.Array | None = None,
    ) -> TransformerIntermediates:
        """The teacher-forced pass with every layer's output and every cross-attention head kept."""
        self._check_inputs(src, src_mask, tgt_in)
        enc_keep, dec_keep = self._keep_masks(dropout_rng, src.shape, tgt_in.shape)
        enc, enc_layers = self._encode(src, src_mask, enc_keep, collect=True)
        y, (weights, dec_layers) = self._decode(enc, tgt_in, dec_keep, collect=True)
        return TransformerIntermediates(
            encoder=enc_layers,
            decoder=jnp.moveaxis(dec_layers, 0, 1),
            cross_attention=jnp.moveaxis(weights, 0, 1),
            logits=self._logits(y),
        )

    def cross_attention_weights(
        self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"], tgt_in: Int[Array, "B T"]
    ) -> Float[Array, "B Ld H T S"]:
        """Every decoder layer's cross-attention weights, all heads, float32 ``[B, L_dec, H, T, S]`` (heatmaps)."""
        return self.intermediates(src, src_mask, tgt_in).cross_attention


class TransformerDecodingState(NamedTuple):
    """:class:`TransformerDecoding`'s decoder state: every decoder layer's cache as its own array.

    A stacked ``[B, L_dec, G, C, K]`` cache costs a copy per layer and step inside a ``while`` loop: slicing
    layer ``l`` out of a batch-leading stack is strided. One array per layer is read and written in place.

    Attributes:
      keys: ``L_dec`` arrays ``[B, G, C, K]``, each layer's self-attention keys (RoPE applied).
      values: ``L_dec`` arrays ``[B, G, C, K]``, the matching values.
      position: ``[B]`` int32, the index of the next target position.
    """

    keys: tuple[Float[Array, "B G C K"], ...]
    values: tuple[Float[Array, "B G C K"], ...]
    position: Int[Array, " B"]


class TransformerDecoding:
    """A :class:`Transformer` prepared for a decoding loop: its layers and caches split once, outside the loop.

    The decoder layers are sliced from the stacked parameters once. :meth:`encode` splits the cross-attention
    keys and values per layer, and :meth:`init_decoder_state` gives one cache array per layer
    (:class:`TransformerDecodingState`). Inside a ``while`` loop XLA copies a slice of a stacked array at every
    step, so none is taken there. Every other attribute is the model's own. The searches in
    ``attn_jax.decoding`` build one (``Transformer.for_decoding``) inside their traced function.

    :meth:`encode` zeroes the padded cross-attention rows once, and a cache from :meth:`init_decoder_state`
    is zero past each row's position. So :meth:`decode_step` skips the per-step zeroing of unread rows
    that :func:`attn_jax.dot_product_attention` does. Step a state this object made, not one built by hand.
    """

    def __init__(self, model: Transformer, layers: list[TransformerDecoderLayer]):
        self.model = model
        self.layers = layers

    def encode(self, src: Int[Array, "B S"], src_mask: Bool[Array, "B S"]) -> EncoderOutput:
        """:meth:`Transformer.encode`, with ``keys`` one ``(keys, values)`` pair of ``[B, G, S, K]`` arrays per
        decoder layer, their padded rows zero."""
        enc = self.model.encode(src, src_mask)
        live = enc.mask[:, None, :, None]  # [B, 1, S, 1]
        kv = tuple(
            tuple(jnp.where(live, enc.keys[:, i, j], 0) for j in (0, 1)) for i in range(len(self.layers))
        )
        return enc._replace(keys=kv)

    def init_decoder_state(
        self, enc: EncoderOutput, cache_length: int | None = None
    ) -> TransformerDecodingState:
        """Empty per-layer caches of ``cache_length`` (default ``config.max_length``) positions, position 0."""
        state = self.model.init_decoder_state(enc, cache_length)
        n = len(self.layers)
        return TransformerDecodingState(
            keys=tuple(state.keys[:, i] for i in range(n)),
            values=tuple(state.values[:, i] for i in range(n)),
            position=state.position,
        )

    def decode_step(self, enc: EncoderOutput, state: TransformerDecodingState, prev_tokens: Int[Array, " B"]):
        """:meth:`Transformer.decode_step` on the sliced layers and per-layer caches."""
        caches = tuple(zip(state.keys, state.values, strict=True))
        logits, caches, attn = self.model._step(
            self.layers, enc.keys, caches, enc.mask, state.position, prev_tokens, clean=True
        )
        keys, values = (tuple(kv[j] for kv in caches) for j in (0, 1))
        return logits, TransformerDecodingState(keys, values, state.position + 1), attn

    def __getattr__(self, name: str):
        return getattr(self.model, name)


# -------------------------------------------------------------------------------------------- parameters

_MHA_NAMES = {
    "query": {"kernel": ("embed", "heads", "kv"), "bias": ("heads", "kv")},
    "key": {"kernel": ("embed", "heads", "kv"), "bias": ("heads", "kv")},
    "value": {"kernel": ("embed", "heads", "kv"), "bias": ("heads", "kv")},
    "out": {"kernel": ("heads", "kv", "embed"), "bias": ("embed",)},
}
_NORM_NAMES = {"scale": ("embed",), "bias": ("embed",)}
_FFN_NAMES = {"w_1": ("embed", "mlp"), "b_1": ("mlp",), "w_2": ("mlp", "embed"), "b_2": ("embed",)}


def _stacked_names(names):
    """Prefix every logical-name tuple with ``layers``."""
    if isinstance(names, dict):
        return {k: _stacked_names(v) for k, v in names.items()}
    return ("layers", *names)


# One layer's logical axis names; a stack's have "layers" in front.
_LAYER_NAMES = {
    "attention": _MHA_NAMES,
    "self_attention": _MHA_NAMES,
    "cross_attention": _MHA_NAMES,
    "attention_norm": _NORM_NAMES,
    "self_attention_norm": _NORM_NAMES,
    "cross_attention_norm": _NORM_NAMES,
    "ffn": _FFN_NAMES,
    "ffn_norm": _NORM_NAMES,
    "relative": {"keys": (None, "kv"), "values": (None, "kv")},
}
_STACK_NAMES = _stacked_names(_LAYER_NAMES)


def _norm_params(c: TransformerConfig, *lead: int) -> dict:
    """LayerNorm ``{"scale": 1, "bias": 0}``, ``[*lead, D]``."""
    shape = (*lead, c.d_model)
    return {"scale": jnp.ones(shape, c.param_dtype), "bias": jnp.zeros(shape, c.param_dtype)}


def _init_params(key, c: TransformerConfig) -> dict:
    """Every parameter as plain arrays, from two random draws (three with learned or relative positions).

    Attention: ``init_multi_head_params`` (LeCun normal) for all ``L_enc + 2·L_dec`` attentions at once.
    Everything else comes from one flat truncated-normal draw (±2σ, σ corrected for the cut), split and scaled:
    embeddings σ = d^{-1/2}; ``W_1``, ``W_2`` and the untied output kernel LeCun, σ = fan_in^{-1/2}. Every
    random call is a threefry program XLA compiles, so fewer calls make a much cheaper jitted initialiser.
    """
    pd, d, f = jnp.dtype(c.param_dtype), c.d_model, c.d_ff
    n_enc, n_dec = c.encoder_layers, c.decoder_layers
    k_attn, k_dense, k_pos = jax.random.split(key, 3)
    # num_kv_heads=None when it is H: the very draw of ordinary multi-head attention
    kv_heads = None if c.kv_heads == c.heads else c.kv_heads
    attn = jax.vmap(lambda k: init_multi_head_params(k, c.heads, d, dtype=pd, num_kv_heads=kv_heads))(
        jax.random.split(k_attn, n_enc + 2 * n_dec)
    )

    def rows(lo, hi):
        return jax.tree.map(lambda a: a[lo:hi], attn)

    specs = {"tgt_embed": ((c.tgt_vocab, d), d)}
    if c.share_embeddings != "all":
        specs["src_embed"] = ((c.src_vocab, d), d)
    if c.share_embeddings == "none":
        specs["output"] = ((d, c.tgt_vocab), d)
    specs.update(
        enc_w_1=((n_enc, d, f), d),
        enc_w_2=((n_enc, f, d), f),
        dec_w_1=((n_dec, d, f), d),
        dec_w_2=((n_dec, f, d), f),
    )
    sizes = [math.prod(shape) for shape, _ in specs.values()]
    flat = jax.random.truncated_normal(k_dense, -2.0, 2.0, (sum(sizes),), jnp.float32)
    dense = {
        name: (piece.reshape(shape) / (math.sqrt(fan_in) * _TRUNCATED_NORMAL_STD)).astype(pd)
        for (name, (shape, fan_in)), piece in zip(
            specs.items(), jnp.split(flat, np.cumsum(sizes)[:-1]), strict=True
        )
    }

    def ffn(prefix, n):
        return {
            "w_1": dense[f"{prefix}_w_1"],
            "b_1": jnp.zeros((n, f), pd),
            "w_2": dense[f"{prefix}_w_2"],
            "b_2": jnp.zeros((n, d), pd),
        }

    params = {
        "tgt_embed": dense["tgt_embed"],
        "encoder": {
            "attention": rows(0, n_enc),
            "attention_norm": _norm_params(c, n_enc),
            "ffn": ffn("enc", n_enc),
            "ffn_norm": _norm_params(c, n_enc),
        },
        "decoder": {
            "self_attention": rows(n_enc, n_enc + n_dec),
            "self_attention_norm": _norm_params(c, n_dec),
            "cross_attention": rows(n_enc + n_dec, n_enc + 2 * n_dec),
            "cross_attention_norm": _norm_params(c, n_dec),
            "ffn": ffn("dec", n_dec),
            "ffn_norm": _norm_params(c, n_dec),
        },
        "output": {"bias": jnp.zeros((c.tgt_vocab,), pd)},
    }
    if "src_embed" in dense:
        params["src_embed"] = dense["src_embed"]
    if "output" in dense:
        params["output"]["kernel"] = dense["output"]
    if c.positions == "learned":
        tables = jax.vmap(lambda k: init_learned_positions(k, c.max_length, d, dtype=pd))(
            jax.random.split(k_pos, 2)
        )
        params["src_positions"], params["tgt_positions"] = tables[0], tables[1]
    if c.positions == "relative":
        # Shaw et al.'s a^K and a^V for every self-attention layer: [L_enc + L_dec, 2, 2k + 1, K]
        tables = jax.vmap(
            lambda k: init_relative_embeddings(k, c.max_relative_positions, c.head_dim, dtype=pd)
        )(jax.random.split(k_pos, 2 * (n_enc + n_dec))).reshape(n_enc + n_dec, 2, -1, c.head_dim)
        params["encoder"]["relative"] = {"keys": tables[:n_enc, 0], "values": tables[:n_enc, 1]}
        params["decoder"]["relative"] = {"keys": tables[n_enc:, 0], "values": tables[n_enc:, 1]}
    return params
