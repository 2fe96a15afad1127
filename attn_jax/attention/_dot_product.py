"""Scaled dot-product attention (Vaswani et al. 2017) over any leading batch axes; heads are a batch axis.

Layout is ``[..., T, K]`` for queries and ``[..., S, K]`` for keys — with heads, ``[B, H, T, K]``. (``jax.nn``
and Flax use ``[B, T, H, K]``; transpose when comparing.) Numerics follow ``_softmax.py``: logits in float32,
masked softmax over the source axis, context accumulated in float32 and returned in the value's dtype.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from attn_jax.attention._checks import (
    check_broadcastable,
    check_floating,
    check_mask,
    check_min_rank,
    shape_str,
)
from attn_jax.attention._chunked import _check_inputs, _chunked_attention
from attn_jax.attention._masks import lengths_mask, make_causal_mask, sliding_window, sliding_window_mask
from attn_jax.attention._normalizers import attend_normalized, check_normalizer
from attn_jax.attention._padding import allowed_pairs, zero_dead_inputs
from attn_jax.attention._softmax import attend, masked_softmax
from attn_jax.typing import Array, ArrayLike, Bool, Float, Int

Implementation = Literal["xla", "chunked", "cudnn"]


def _check_qk(query, keys) -> tuple[int, ...]:
    """Validate query/key ranks, widths and batch axes; return the logits shape ``[..., T, S]``."""
    check_min_rank("query", query, 2)
    check_min_rank("key", keys, 2)
    check_floating("query", query)
    check_floating("key", keys)
    if np.shape(query)[-1] != np.shape(keys)[-1]:
        raise ValueError(
            "query and key must have the same width K (last axis): "
            f"query {shape_str(query)}, key {shape_str(keys)}"
        )
    batch = check_broadcastable(
        ["query batch axes", "key batch axes"], [np.shape(query)[:-2], np.shape(keys)[:-2]]
    )
    return batch + (np.shape(query)[-2], np.shape(keys)[-2])


def _scale(scale: float | None, width: int) -> float:
    """``1/√K`` unless given."""
    return 1.0 / math.sqrt(width) if scale is None else scale


def dot_product_scores(
    query: Float[Array, "... T K"], keys: Float[Array, "... S K"], *, scale: float | None = None
) -> Float[Array, "... T S"]:
    r"""Scaled dot-product energies ``e_ij = scale · q_i · k_j`` in float32.

    .. math:: e_{ij} = \frac{q_i^\top k_j}{\sqrt{K}}

    Vaswani et al. 2017, "Attention Is All You Need", eq. 1. With ``scale=1.0`` this is Luong et al. 2015's
    unscaled ``dot`` score. The products are accumulated in float32 (``preferred_element_type``), so bf16/fp16
    inputs are multiplied exactly and never overflow.

    Args:
      query: ``[..., T, K]``.
      keys: ``[..., S, K]``; leading axes broadcast against ``query``'s.
      scale: multiplier of the dot products; ``None`` means ``1/√K``.

    Returns:
      float32 energies ``[..., T, S]``.

    >>> dot_product_scores(jnp.ones((2, 4)), jnp.ones((3, 4)))  # 4 / sqrt(4)
    Array([[2., 2., 2.],
           [2., 2., 2.]], dtype=float32)
    """
    _check_qk(query, keys)
    dtype = jnp.result_type(query, keys)
    logits = jnp.einsum(
        "...tk,...sk->...ts",
        jnp.asarray(query, dtype),
        jnp.asarray(keys, dtype),
        preferred_element_type=jnp.float32,
    )
    return logits.astype(jnp.float32) * jnp.float32(_scale(scale, np.shape(query)[-1]))


def dot_product_attention(
    query: Float[Array, "... T K"],
    key: Float[Array, "... S K"],
    value: Float[Array, "... S Kv"],
    mask: Bool[Array, "... T S"] | None = None,
    *,
    bias: Float[Array, "... T S"] | None = None,
    scale: float | None = None,
    return_weights: bool = False,
    causal: bool = False,
    implementation: Implementation | None = None,
    query_lengths: Int[ArrayLike, "..."] | None = None,
    key_lengths: Int[ArrayLike, "..."] | None = None,
    local_window: int | tuple[int, int] | None = None,
    num_kv_heads: int | None = None,
    normalizer: str = "softmax",
) -> Float[Array, "... T Kv"] | tuple[Float[Array, "... T Kv"], Float[Array, "... T S"]]:
    r"""Scaled dot-product attention ``softmax(QKᵀ/√K + bias) V`` with a boolean mask.

    .. math:: \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\Big(\frac{Q K^\top}{\sqrt{K}} + b\Big) V

    Vaswani et al. 2017, "Attention Is All You Need", §3.2.1. The softmax runs over the source (key) axis
    through :func:`attend`: masked keys get weight exactly 0, and a query whose keys are *all* masked gets
    zero weights and a zero context with finite gradients. (``jax.nn.dot_product_attention`` and
    ``flax.nnx.dot_product_attention`` instead return the uniform average of *all* values for such a row.)
    Heads are a leading batch axis: ``[B, H, T, K]``.

    Padded content cannot leak: on every implementation, the query, key and value rows that no pair reads (a
    key masked for every query, a query masked from every key) are zeroed before any product, so a NaN or ±inf
    stored there changes no output and no gradient, whose entries for those rows are exactly 0 (``jax.nn``
    and PyTorch return NaN there). A bias entry of ``-inf`` forbids its pair exactly like a masked entry: a row
    of them gets a zero context and zero, finite gradients on every implementation.

    Three implementations compute the same function:

    * ``"xla"`` — the plain path: the ``[..., T, S]`` logits and weights in float32; the reference the others
      are tested against, and the only one that can ``return_weights``. In the common case (no
      ``return_weights``, a static ``scale``, and ``query``, ``key``, ``value`` with the same batch axes) its
      derivative is hand-written (a ``jax.custom_jvp`` whose transpose is FlashAttention's backward,
      ``dS = P ∘ (dP − rowsum(dO ∘ O))``, Dao et al. 2022): one fewer ``[T, S]`` pass than autodiff of the
      softmax, the same values, and forward mode still works; otherwise plain autodiff of this path;
    * ``"chunked"`` — :func:`chunked_dot_product_attention`: FlashAttention-style blocks in pure JAX, memory
      ``O((T + S)·K)`` instead of ``O(T·S)`` per head; first-order reverse mode only, static ``scale``;
    * ``"cudnn"`` — ``jax.nn.dot_product_attention(implementation="cudnn")`` (cuDNN flash attention) on a
      CUDA GPU, for bfloat16/float16 with ``Kv == K``, ``K`` a multiple of 8 (≤ 128, ≤ 256 from Hopper on);
      the weights are rounded to the input dtype before multiplying the values, so it agrees with ``"xla"``
      to that dtype's precision. Fully masked rows are zeroed to keep this function's policy. Padding given
      as ``query_lengths``/``key_lengths`` reaches cuDNN as its sequence lengths (``query_seq_lengths``,
      ``key_value_seq_lengths``): its padding mask, no ``[T, S]`` array. A boolean ``mask`` reaches it as a
      dense ``[..., T, S]`` bias. A ``local_window`` reaches it as ``local_window_size`` (cuDNN's sliding
      window) when it has no right side (``right == 0``, or ``causal``); a window that reaches right of a
      non-causal query is ANDed into that dense mask instead.

    ``None`` picks: ``"xla"`` when ``return_weights``; else ``"cudnn"`` when it applies with no mask and no
    bias (padding as lengths is fine; a boolean mask, or a window reaching right of non-causal queries, would
    be expanded to a ``[.., T, S]`` bias for cuDNN);
    else ``"chunked"`` when one head's logits would hold at least ``4096 × 4096`` entries (on the CPU:
    ``512 × 512``, where its cache-sized blocks, one head after another, beat the plain path by 1.4-1.9×) and
    ``scale`` is static; else ``"xla"``. Pass ``implementation="xla"`` for forward-mode or higher-order
    derivatives at those sizes. :func:`dot_product_implementation` says which, and why not cuDNN.

    Padding as lengths, not a mask: ``query_lengths=q, key_lengths=k`` means exactly the mask
    ``(i < q) ∧ (j < k)`` (ANDed with ``mask``, ``bias`` and ``causal``), so every implementation gives the
    same answer as with that mask; an NMT batch passes the lengths it pads to. A mask built by
    :func:`make_attention_mask`/:func:`key_padding_mask` from lengths converts back with
    :func:`padding_lengths` outside ``jit`` (whether a mask is a padding mask depends on its values, so this
    function never guesses it from a mask).

    Sliding-window (local) attention: ``local_window=(left, right)`` lets query ``i`` attend only keys
    ``i - left <= j <= i + right`` (ANDed with ``mask``, ``bias``, ``causal`` and the lengths), exactly
    ``jax.nn.dot_product_attention``'s ``local_window_size`` (Beltagy et al. 2020, "Longformer"): top-left
    aligned, an int ``w`` means ``(w, w)``, and with ``causal=True`` it is ``left`` keys back and the query
    itself. ``"xla"`` applies it as :func:`sliding_window_mask`; ``"chunked"`` skips the key blocks outside
    every window of a query block, so its cost grows with ``left + right`` instead of ``S``. A query whose
    window holds no allowed key (``i - left >= S``, or all its window padded) gets the zero context of a fully
    masked row.

    Grouped-query attention (Ainslie et al. 2023, "GQA"; multi-query attention, Shazeer 2019, when
    ``num_kv_heads=1``): with ``num_kv_heads=G``, axis -3 is the head axis, ``query`` ``[..., H, T, K]`` and
    ``key``/``value`` ``[..., G, S, K|Kv]`` with ``H % G == 0``, and query head ``h`` reads key/value head
    ``h // (H / G)`` (consecutive groups of ``H / G`` query heads share one, as in ``jax.nn``'s GQA). Masks,
    biases and lengths are shaped for the ``H`` query heads (``[..., H|1, T, S]``). The repeated keys and values
    are never materialised: the queries are viewed as ``[..., G, H/G, T, K]`` and each key/value head broadcasts
    over its group (a size-1 axis that the products contract without copying), on ``"xla"`` (with its
    hand-written derivative in the common case above) and ``"chunked"`` alike, in both passes. ``"cudnn"``
    refuses it (``ValueError``) and ``None`` never picks it for it (when ``H > G``). ``num_kv_heads=H`` is
    ordinary multi-head attention, the very same program as ``None``.

    Sparse weights: ``normalizer="sparsemax"`` (Martins & Astudillo 2016) or ``"entmax15"`` (1.5-entmax, Peters
    et al. 2019) replaces the softmax over the source axis by :func:`attn_jax.masked_normalize`, which can give
    keys exactly zero weight; masks, ``-inf`` biases, windows, lengths and fully masked rows keep the policy
    above (masked keys exactly 0, a row with no allowed key a zero context, finite gradients). Only ``"xla"``
    forms the weights they threshold: ``None`` picks it, ``"chunked"``/``"cudnn"`` are a ``ValueError``. Their
    derivatives are closed-form ``custom_vjp`` rules: reverse mode only. ``"softmax"`` (the default) is the
    program described above, unchanged.

    Args:
      query: ``[..., T, K]``.
      key: ``[..., S, K]``.
      value: ``[..., S, Kv]``; the context takes its dtype.
      mask: boolean, True = may attend, broadcastable to ``[..., T, S]``; ``None`` attends everywhere.
      bias: additive float bias broadcastable to ``[..., T, S]`` (relative positions, ALiBi), added to the
        scaled logits in float32 before masking.
      scale: logit multiplier; ``None`` means ``1/√K``.
      return_weights: also return the float32 weights (``"xla"`` only).
      causal: also mask key ``j > i`` for query ``i``, as ``make_causal_mask(T, S)`` (top-left aligned, like
        ``jax.nn``'s ``is_causal``); ``"chunked"`` and ``"cudnn"`` skip the masked blocks.
      implementation: ``"xla"``, ``"chunked"``, ``"cudnn"`` or ``None`` (choose as above).
      query_lengths: integer ``[...]``, shaped like a mask's batch axes (NumPy-broadcast against the logits'
        batch axes from the right: ``[B, 1]`` for ``[B, H, T, K]`` queries): query ``i`` is real iff
        ``i < query_lengths``; a padded query gets a zero context. ``None``: every query is real.
      key_lengths: the same for keys and values: key ``j`` may be attended iff ``j < key_lengths``.
      local_window: ``(left, right)`` non-negative ints (static), or one int ``w`` for ``(w, w)``: query ``i``
        may attend key ``j`` only if ``i - left <= j <= i + right``. ``None``: no window.
      num_kv_heads: ``G``, the key/value heads on axis -3 of ``key`` and ``value`` (grouped-query attention,
        above); ``None``: ``key``/``value`` batch axes broadcast against ``query``'s as usual.
      normalizer: ``"softmax"`` (the paper's), ``"sparsemax"`` or ``"entmax15"`` (above); anything else is a
        ``ValueError`` naming the three.

    Returns:
      the context ``[..., T, Kv]`` in ``value``'s dtype, or ``(context, weights [..., T, S] float32)`` when
      ``return_weights`` (with ``num_kv_heads``: ``[..., H, T, Kv]`` and ``[..., H, T, S]``).

    Raises:
      ValueError: mismatched widths or lengths, non-broadcasting batch axes, a mask or bias that does not
        broadcast to the logits, a non-boolean mask, or non-integer lengths or lengths that do not broadcast
        to the batch axes (the message names the shapes); a ``local_window`` that is not a non-negative int or
        a pair of them; an unknown
        ``implementation``, ``return_weights`` with ``"chunked"``/``"cudnn"``, or ``"cudnn"`` where cuDNN
        does not apply (no CUDA GPU, float32 inputs, grouped-query attention, ...; the message says why), or
        with a ``normalizer`` other than ``"softmax"``; an unknown ``normalizer``; a
        ``num_kv_heads`` that is not a positive int dividing ``H``, or that ``key``/``value`` do not have on
        axis -3.

    >>> q = jnp.array([[1.0, 0.0]]); k = jnp.array([[1.0, 0.0], [0.0, 1.0]]); v = jnp.array([[1.0], [3.0]])
    >>> dot_product_attention(q, k, v, jnp.array([[True, False]]))
    Array([[1.]], dtype=float32)
    >>> dot_product_attention(q, k, v, key_lengths=jnp.array(1))  # the same padding, as a length
    Array([[1.]], dtype=float32)
    >>> dot_product_attention(q, k, v, local_window=(0, 0))  # query 0 sees key 0 only
    Array([[1.]], dtype=float32)
    >>> dot_product_attention(jnp.ones((4, 3, 2)), jnp.ones((2, 5, 2)), jnp.ones((2, 5, 1)), num_kv_heads=2).shape
    (4, 3, 1)
    >>> q2 = jnp.array([[4.0, 0.0]])  # logits 2√2 and 0: sparsemax gives the second key exactly 0
    >>> dot_product_attention(q2, k, v, normalizer="sparsemax", return_weights=True)[1]
    Array([[1., 0.]], dtype=float32)
    """
    if num_kv_heads is not None:
        return _grouped_attention(
            query,
            key,
            value,
            mask,
            bias=bias,
            scale=scale,
            return_weights=return_weights,
            causal=causal,
            implementation=implementation,
            query_lengths=query_lengths,
            key_lengths=key_lengths,
            local_window=local_window,
            num_kv_heads=num_kv_heads,
            normalizer=normalizer,
        )
    return _attention(
        query,
        key,
        value,
        mask,
        bias=bias,
        scale=scale,
        return_weights=return_weights,
        causal=causal,
        implementation=implementation,
        query_lengths=query_lengths,
        key_lengths=key_lengths,
        local_window=local_window,
        normalizer=normalizer,
    )


def _attention(
    query,
    key,
    value,
    mask,
    *,
    bias,
    scale,
    return_weights,
    causal,
    implementation,
    query_lengths,
    key_lengths,
    local_window,
    normalizer="softmax",
    grouped=False,
):
    """:func:`dot_product_attention` without ``num_kv_heads``; ``grouped``: operands from :func:`_group_operands`."""
    check_normalizer(normalizer)
    logits_shape = _check_inputs(query, key, value, mask, bias)
    _check_lengths(query_lengths, key_lengths, logits_shape)
    window = sliding_window(local_window)
    if implementation not in (None, "xla", "chunked", "cudnn"):
        raise ValueError(f"implementation must be 'xla', 'chunked', 'cudnn' or None, got {implementation!r}")
    _check_sparse_implementation(normalizer, implementation)
    if implementation is None and normalizer != "softmax":
        implementation = "xla"  # the only path that forms the weights a sparse normaliser needs
    if implementation is None:
        implementation, _ = _choose_implementation(
            query,
            key,
            value,
            mask,
            bias,
            logits_shape,
            scale=scale,
            return_weights=return_weights,
            causal=causal,
            window=window,
        )
    if implementation != "xla" and return_weights:
        raise ValueError(
            f"return_weights=True needs implementation='xla'; {implementation!r} never forms the weights"
        )
    if implementation == "cudnn":
        reason = _cudnn_unsupported(query, key, value, bias, logits_shape)
        if reason is not None:
            raise ValueError(f"implementation='cudnn' does not apply: {reason}")
    # cuDNN takes the lengths themselves; every other use needs the pairs they allow, a [..., T|1, S|1] mask.
    user_mask = mask
    padding = lengths_mask(query_lengths, key_lengths, *logits_shape[-2:])
    if padding is not None:
        mask = padding if mask is None else jnp.logical_and(mask, padding)
    # Rows no pair reads (padding) may hold anything, NaN included: zero them before any product, on every path.
    query, key, value = zero_dead_inputs(
        query, key, value, mask, bias, logits_shape, causal=causal, window=window
    )
    if implementation == "chunked":
        return _chunked_attention(
            logits_shape, query, key, value, mask, bias, causal=causal, scale=scale, window=window
        )
    if implementation == "cudnn":
        return _cudnn_attention(
            query,
            key,
            value,
            user_mask,
            bias,
            logits_shape,
            scale=scale,
            causal=causal,
            lengths=(query_lengths, key_lengths),
            allowed=allowed_pairs(mask, bias),
            window=window,
        )

    # The plain XLA path: every other implementation must match this one, which stays the reference.
    if bias is not None:
        # a -inf bias entry forbids its pair like a masked entry (a row of them gets zeros, as "chunked" gives)
        mask = allowed_pairs(mask, bias)
    if causal:
        causal_mask = make_causal_mask(logits_shape[-2], logits_shape[-1])
        mask = causal_mask if mask is None else jnp.logical_and(mask, causal_mask)
    if window is not None:
        window_mask = sliding_window_mask(logits_shape[-2], logits_shape[-1], window)
        mask = window_mask if mask is None else jnp.logical_and(mask, window_mask)
    batch = np.shape(query)[:-2]
    same_batch = np.shape(key)[:-2] == batch == np.shape(value)[:-2]
    # grouped-query keys/values broadcast over each group's query heads (query holds the whole batch): the products
    # contract the size-1 group axis without copying, in this derivative as in autodiff's
    same_batch = same_batch or (grouped and batch == tuple(logits_shape[:-2]))
    if normalizer != "softmax":
        # sparsemax / 1.5-entmax: the weights by sorting with their closed-form VJP (reverse mode only)
        logits = dot_product_scores(query, key, scale=scale)
        if bias is not None:
            logits = logits + jnp.asarray(bias, jnp.float32)
        logits = jnp.broadcast_to(logits, logits_shape)
        context, weights = attend_normalized(logits, value, mask, normalizer=normalizer)
        return (context, weights) if return_weights else context
    if not return_weights and _is_static(scale) and same_batch:
        # the same forward as below with FlashAttention's derivative: fwd+bwd ~20-25% faster at T = S = 256 on
        # CPU, one or two fewer [T, S] temporaries
        return _plain_attention(scale, query, key, value, mask, None if bias is None else jnp.asarray(bias))
    logits = dot_product_scores(query, key, scale=scale)
    if bias is not None:
        logits = logits + jnp.asarray(bias, jnp.float32)
    # A value (or mask) with more batch axes than query/key widens the weights; a no-op otherwise.
    logits = jnp.broadcast_to(logits, logits_shape)
    context, weights = attend(logits, value, mask)
    return (context, weights) if return_weights else context


def _check_sparse_implementation(normalizer, implementation) -> None:
    """Raise unless ``implementation`` can normalise with ``normalizer`` (only ``"xla"`` forms sparse weights)."""
    if normalizer != "softmax" and implementation in ("chunked", "cudnn"):
        raise ValueError(
            f"normalizer={normalizer!r} needs implementation='xla' (or None): {implementation!r} computes a "
            "streaming softmax and never forms the weights that sparsemax/entmax15 threshold"
        )


def _is_static(scale) -> bool:
    """Whether ``scale`` is None or a Python/NumPy number (not a traced or array value)."""
    return scale is None or isinstance(scale, int | float | np.number)


def _plain_forward(scale, query, key, value, mask, bias):
    """The plain path's float32 ``(weights, context)``: the operations of :func:`dot_product_attention`."""
    logits = dot_product_scores(query, key, scale=scale)
    if bias is not None:
        logits = logits + jnp.asarray(bias, jnp.float32)
    weights = masked_softmax(logits, mask)
    # weighted_context without its final cast: the float32 context is the derivative's residual O
    context = jnp.einsum("...ts,...sd->...td", weights, value.astype(jnp.float32))
    return weights, context


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _plain_attention(scale, query, key, value, mask, bias):
    """The plain path's context (``query``, ``key``, ``value`` share batch axes) with a hand-written derivative."""
    return _plain_forward(scale, query, key, value, mask, bias)[1].astype(value.dtype)


def _plain_attention_jvp(scale, primals, tangents):
    """``dO = (P∘dS) V − rowsum(P∘dS)·O + P dV`` with ``dS = scale·(dQ Kᵀ + Q dKᵀ) + dB``, in float32.

    The softmax's derivative is ``dP = P∘dS − P·rowsum(P∘dS)``; multiplying it by ``V`` turns the second term
    into ``rowsum(P∘dS)·O``. JAX transposes this rule into FlashAttention's backward (Dao et al. 2022, App. B.2):
    the cotangent of ``rowsum(P∘dS)`` is ``−rowsum(dO∘O)``, a ``[T, Kv]`` product, instead of autodiff's
    ``rowsum(P∘dP)`` over ``[T, S]``, so ``dS = P∘(dP − rowsum(dO∘O))`` takes one ``[T, S]`` pass.
    Masked entries have ``P = 0`` exactly, so they (and fully masked rows) get zero, finite derivatives.
    """
    query, key, value, mask, bias = primals
    d_query, d_key, d_value, _, d_bias = (
        None if isinstance(t, SymbolicZero) else t for t in tangents
    )  # the mask is boolean: no tangent
    weights, context = _plain_forward(scale, query, key, value, mask, bias)
    f32 = jnp.float32
    d_logits = None  # [..., T, S]
    if d_query is not None or d_key is not None:
        dtype = jnp.result_type(query, key)  # dot_product_scores' input dtype
        q, k = (jnp.asarray(x, dtype).astype(f32) for x in (query, key))
        parts = []
        if d_query is not None:
            parts.append(jnp.einsum("...tk,...sk->...ts", jnp.asarray(d_query, dtype).astype(f32), k))
        if d_key is not None:
            parts.append(jnp.einsum("...tk,...sk->...ts", q, jnp.asarray(d_key, dtype).astype(f32)))
        d_logits = functools.reduce(jnp.add, parts) * f32(_scale(scale, np.shape(query)[-1]))
    if d_bias is not None:
        d_bias = d_bias.astype(f32)
        d_logits = d_bias if d_logits is None else d_logits + d_bias
    d_context = None
    if d_logits is not None:
        p_ds = weights * d_logits  # [..., T, S]
        rows = jnp.sum(p_ds, axis=-1, keepdims=True)  # [..., T, 1]
        d_context = jnp.einsum("...ts,...sd->...td", p_ds, value.astype(f32)) - rows * context
    if d_value is not None:
        from_value = jnp.einsum("...ts,...sd->...td", weights, d_value.astype(f32))
        d_context = from_value if d_context is None else d_context + from_value
    out = context.astype(value.dtype)
    return out, d_context.astype(out.dtype)


_plain_attention.defjvp(_plain_attention_jvp, symbolic_zeros=True)


# --- grouped-query attention: H query heads over G key/value heads, as a broadcast instead of a repeat ----------


def _check_kv_heads(query, key, value, num_kv_heads) -> int:
    """Validate ``num_kv_heads`` against the head axes (-3) of the operands; return the group size ``H / G``."""
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int | np.integer) or num_kv_heads < 1:
        raise ValueError(f"num_kv_heads must be a positive int (key/value heads), got {num_kv_heads!r}")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if np.ndim(x) < 3:
            raise ValueError(
                f"num_kv_heads={num_kv_heads} needs a head axis: {name} must be [..., heads, length, width], "
                f"got shape {shape_str(x)}"
            )
    heads = np.shape(query)[-3]
    for name, x in (("key", key), ("value", value)):
        if np.shape(x)[-3] != num_kv_heads:
            raise ValueError(
                f"num_kv_heads={num_kv_heads} but {name} {shape_str(x)} has {np.shape(x)[-3]} heads on axis -3 "
                "(key and value are [..., num_kv_heads, S, K])"
            )
    if heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads ({num_kv_heads}) must divide the query's heads H ({heads}, axis -3 of query "
            f"{shape_str(query)}): each key/value head serves H / num_kv_heads query heads"
        )
    return heads // num_kv_heads


def _grouped_logits_shape(query, key, value, mask, bias) -> tuple[int, ...]:
    """The ``[..., H, T, S]`` logits shape of a grouped call; raise if ``mask``/``bias`` do not broadcast to it."""
    batch = check_broadcastable(
        ["query batch axes", "key batch axes", "value batch axes"],
        [np.shape(query)[:-3], np.shape(key)[:-3], np.shape(value)[:-3]],
    )
    logits_shape = batch + tuple(np.shape(query)[-3:-1]) + (np.shape(key)[-2],)
    check_mask(mask, logits_shape, what="grouped-query attention logits [..., H, T, S]")
    if bias is not None:
        try:
            widened = tuple(np.broadcast_shapes(np.shape(bias), logits_shape))
        except ValueError:
            widened = None
        if widened != logits_shape:
            raise ValueError(
                f"bias of shape {shape_str(np.shape(bias))} does not broadcast to the grouped-query attention "
                f"logits [..., H, T, S] of shape {shape_str(logits_shape)}"
            )
    return logits_shape


def _split_head_axis(x, axis: int, groups: int, repeats: int):
    """Axis ``axis`` (counted from the end) of size ``H`` or 1 becomes ``(G, H/G)`` or ``(1, 1)``; None stays."""
    if x is None or np.ndim(x) < -axis:
        return x  # no head axis: it broadcasts over both new axes
    x = jnp.asarray(x)
    i = x.ndim + axis
    split = (groups, repeats) if x.shape[i] != 1 else (1, 1)
    return jnp.reshape(x, x.shape[:i] + split + x.shape[i + 1 :])


def _group_operands(query, key, value, mask, bias, lengths, num_kv_heads, repeats):
    """Queries ``[..., G, H/G, T, K]``, keys/values ``[..., G, 1, S, K]``; masks, biases, lengths split alike."""
    query = jnp.asarray(query)
    query = jnp.reshape(query, query.shape[:-3] + (num_kv_heads, repeats) + query.shape[-2:])
    key, value = (jnp.expand_dims(jnp.asarray(x), -3) for x in (key, value))  # a size-1 axis: no copy
    mask, bias = (_split_head_axis(x, -3, num_kv_heads, repeats) for x in (mask, bias))
    lengths = tuple(_split_head_axis(x, -1, num_kv_heads, repeats) for x in lengths)
    return query, key, value, mask, bias, lengths


_CUDNN_GQA = (
    "grouped-query attention (num_kv_heads) is not handed to cuDNN here (its key/value heads would have to be "
    "repeated or the batch re-laid out as [B, T, H, K]); use 'xla' or 'chunked'"
)


def _grouped_attention(
    query,
    key,
    value,
    mask,
    *,
    bias,
    scale,
    return_weights,
    causal,
    implementation,
    query_lengths,
    key_lengths,
    local_window,
    num_kv_heads,
    normalizer="softmax",
):
    """:func:`dot_product_attention` with ``num_kv_heads``: group the operands, attend, merge the heads back."""
    check_normalizer(normalizer)
    _check_sparse_implementation(normalizer, implementation)
    repeats = _check_kv_heads(query, key, value, num_kv_heads)
    logits_shape = _grouped_logits_shape(query, key, value, mask, bias)
    _check_lengths(query_lengths, key_lengths, logits_shape)
    options = dict(
        scale=scale,
        return_weights=return_weights,
        causal=causal,
        local_window=local_window,
        normalizer=normalizer,
    )
    if repeats == 1:  # one query head per key/value head: plain multi-head attention, the same program
        return dot_product_attention(
            query,
            key,
            value,
            mask,
            bias=bias,
            implementation=implementation,
            query_lengths=query_lengths,
            key_lengths=key_lengths,
            **options,
        )
    if implementation == "cudnn":
        raise ValueError(f"implementation='cudnn' does not apply: {_CUDNN_GQA}")
    if implementation is None and normalizer != "softmax":
        implementation = "xla"
    q, k, v, m, b, (ql, kl) = _group_operands(
        query, key, value, mask, bias, (query_lengths, key_lengths), num_kv_heads, repeats
    )
    if implementation is None:
        implementation, _ = _choose_implementation(
            q,
            k,
            v,
            m,
            b,
            logits_shape[:-3] + (num_kv_heads, repeats) + logits_shape[-2:],
            scale=scale,
            return_weights=return_weights,
            causal=causal,
            window=sliding_window(local_window),
            grouped=True,
        )
    out = _attention(
        q,
        k,
        v,
        m,
        bias=b,
        implementation=implementation,
        query_lengths=ql,
        key_lengths=kl,
        grouped=True,
        **options,
    )

    def merge(x):  # [..., G, H/G, T, X] -> [..., H, T, X]
        return jnp.reshape(x, x.shape[:-4] + (num_kv_heads * repeats,) + x.shape[-2:])

    return (merge(out[0]), merge(out[1])) if return_weights else merge(out)


# One head's logits at which None picks "chunked": 64 MiB of float32 logits per head, of which the plain backward
# holds 2-4 copies. Below it XLA's fused matmul-softmax beats a loop over small blocks.
_CHUNKED_MIN_LOGITS = 4096 * 4096
# On the CPU the blocked kernel's 512 x 512 blocks stay in cache: from T·S = 512² on it is as fast as the plain
# path or faster, in O(T + S) memory (timings: experiments/benchmarks/README.md).
_CHUNKED_MIN_LOGITS_CPU = 512 * 512


def _chunked_min_logits() -> int:
    """One head's ``T·S`` from which ``implementation=None`` picks ``"chunked"`` on this backend."""
    return _CHUNKED_MIN_LOGITS_CPU if jax.default_backend() == "cpu" else _CHUNKED_MIN_LOGITS


def _choose_implementation(
    query,
    key,
    value,
    mask,
    bias,
    logits_shape,
    *,
    scale,
    return_weights,
    causal=False,
    window=None,
    grouped=False,
    normalizer="softmax",
) -> tuple[Implementation, str | None]:
    """The ``implementation=None`` rule of :func:`dot_product_attention`: ``(choice, why not "cudnn")``."""
    if return_weights:
        return "xla", "return_weights=True needs the weights, which only 'xla' forms"
    if normalizer != "softmax":
        return "xla", f"normalizer={normalizer!r} thresholds the weights, which only 'xla' forms"
    reason = _CUDNN_GQA if grouped else _cudnn_unsupported(query, key, value, bias, logits_shape)
    if reason is None and mask is not None:
        reason = (
            "a boolean mask would reach cuDNN as a dense [..., T, S] bias; pass padding as "
            "query_lengths=/key_lengths= (padding_lengths converts a padding mask, outside jit)"
        )
    if reason is None and bias is not None:
        reason = "a bias is a dense [..., T, S] operand for cuDNN; implementation='cudnn' runs it anyway"
    if reason is None and not _cudnn_window(window, causal):
        reason = (
            f"cuDNN's sliding window has no right side, and local_window={window} reaches right of non-causal "
            "queries: it would reach cuDNN as a dense [..., T, S] bias; implementation='cudnn' runs it anyway"
        )
    if reason is None:
        return "cudnn", None
    if _is_static(scale) and logits_shape[-2] * logits_shape[-1] >= _chunked_min_logits():
        return "chunked", reason
    return "xla", reason


def dot_product_implementation(
    query: Float[Array, "... T K"],
    key: Float[Array, "... S K"],
    value: Float[Array, "... S Kv"],
    mask: Bool[Array, "... T S"] | None = None,
    *,
    bias: Float[Array, "... T S"] | None = None,
    scale: float | None = None,
    return_weights: bool = False,
    query_lengths: Int[ArrayLike, "..."] | None = None,
    key_lengths: Int[ArrayLike, "..."] | None = None,
    causal: bool = False,
    local_window: int | tuple[int, int] | None = None,
    num_kv_heads: int | None = None,
    normalizer: str = "softmax",
) -> tuple[Implementation, str | None]:
    r"""Which implementation :func:`dot_product_attention` picks for these operands, and why not cuDNN.

    The choice of ``implementation=None`` depends only on shapes, dtypes, the device and which operands are
    given (never on values), so it is the same inside and outside ``jit``; record it next to a run's results
    when it matters, e.g. that a masked NMT batch ran on ``"xla"`` because its padding came as a mask.

    Args:
      query, key, value, mask, bias, scale, return_weights, query_lengths, key_lengths, causal,
        local_window, num_kv_heads, normalizer: as for :func:`dot_product_attention` (checked the same way).

    Returns:
      ``(implementation, reason)``: ``"xla"``, ``"chunked"`` or ``"cudnn"``, and one line saying why cuDNN
      was not chosen (``None`` when it was).

    >>> q = jnp.ones((2, 8, 8), jnp.bfloat16)
    >>> dot_product_implementation(q, q, q)[1].startswith("it needs a CUDA GPU")  # on a CPU
    True
    """
    check_normalizer(normalizer)
    if num_kv_heads is not None and _check_kv_heads(query, key, value, num_kv_heads) > 1:
        logits_shape = _grouped_logits_shape(query, key, value, mask, bias)
        _check_lengths(query_lengths, key_lengths, logits_shape)
        repeats = np.shape(query)[-3] // num_kv_heads
        query, key, value, mask, bias, _ = _group_operands(
            query, key, value, mask, bias, (None, None), num_kv_heads, repeats
        )
        return _choose_implementation(
            query,
            key,
            value,
            mask,
            bias,
            logits_shape[:-3] + (num_kv_heads, repeats) + logits_shape[-2:],
            scale=scale,
            return_weights=return_weights,
            causal=causal,
            window=sliding_window(local_window),
            grouped=True,
            normalizer=normalizer,
        )
    logits_shape = _check_inputs(query, key, value, mask, bias)
    _check_lengths(query_lengths, key_lengths, logits_shape)
    return _choose_implementation(
        query,
        key,
        value,
        mask,
        bias,
        logits_shape,
        scale=scale,
        return_weights=return_weights,
        causal=causal,
        window=sliding_window(local_window),
        normalizer=normalizer,
    )


def _check_lengths(query_lengths, key_lengths, logits_shape) -> None:
    """Raise unless each given length array is integer and broadcasts to the batch axes ``logits_shape[:-2]``."""
    batch = tuple(logits_shape[:-2])
    for name, lengths in (("query_lengths", query_lengths), ("key_lengths", key_lengths)):
        if lengths is None:
            continue
        dtype = jnp.asarray(lengths).dtype
        if not jnp.issubdtype(dtype, jnp.integer):
            raise ValueError(f"{name} must be integers, got dtype {dtype} (shape {shape_str(lengths)})")
        try:
            widened = tuple(np.broadcast_shapes(np.shape(lengths), batch))
        except ValueError:
            widened = None
        if widened != batch:
            raise ValueError(
                f"{name} of shape {shape_str(np.shape(lengths))} does not broadcast to the batch axes "
                f"{shape_str(batch)} of the logits {shape_str(tuple(logits_shape))} (shape it like a mask's "
                "batch axes: [B, 1] for [B, H, T, K] queries)"
            )


def _cuda_device():
    """The first CUDA device, or None (CPU, TPU, ROCm)."""
    if jax.default_backend() != "gpu":
        return None
    device = jax.devices()[0]
    return device if "cuda" in getattr(device.client, "platform_version", "").lower() else None


def _cudnn_unsupported(query, key, value, bias, logits_shape) -> str | None:
    """Why cuDNN flash attention cannot run these operands, or None if it can."""
    device = _cuda_device()
    if device is None:
        return f"it needs a CUDA GPU, but JAX's default backend is {jax.default_backend()!r}"
    dtypes = {jnp.asarray(x).dtype for x in (query, key, value)}
    if len(dtypes) != 1 or dtypes & {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)} != dtypes:
        return f"query, key and value must all be bfloat16 or all float16, got {sorted(map(str, dtypes))}"
    width, width_v = np.shape(query)[-1], np.shape(value)[-1]
    if width != width_v:
        return f"it needs value width Kv == key width K, got Kv {width_v} and K {width}"
    capability = tuple(int(c) for c in str(getattr(device, "compute_capability", "0.0")).split("."))
    max_width = 256 if capability >= (9, 0) else 128
    if width % 8 or width > max_width:
        return f"the head width K must be a multiple of 8 and at most {max_width}, got {width}"
    if bias is not None and (logits_shape[-2] % 2 or logits_shape[-1] % 2):
        return f"with a bias its backward pass needs even T and S, got T {logits_shape[-2]}, S {logits_shape[-1]}"
    return None


def _cudnn_seq_lengths(lengths, batch, t, s):
    """``(query_seq_lengths, key_value_seq_lengths)`` int32 ``[N]`` for cuDNN, or ``(None, None)``.

    Clipped to ``[0, T]``/``[0, S]`` (``i < q`` means the same for any ``q >= T``). A batch element with no key
    gets one (zeroed) key and no query instead: the same empty set of pairs, in the form cuDNN is built
    for (padded queries), rather than a softmax over zero keys; its rows are zeroed afterwards anyway.
    """
    query_lengths, key_lengths = lengths
    if query_lengths is None and key_lengths is None:
        return None, None

    def per_element(x, length):  # [...] -> [N] int32
        if x is None:
            return jnp.full((math.prod(batch),), length, jnp.int32)
        x = jnp.clip(jnp.asarray(x), 0, length).astype(jnp.int32)
        return jnp.broadcast_to(x, batch).reshape(-1)

    q, k = per_element(query_lengths, t), per_element(key_lengths, s)
    return jnp.where(k == 0, 0, q), jnp.maximum(k, 1)


def _cudnn_window(window, causal) -> bool:
    """Whether cuDNN's sliding window (``left`` back to the query itself, nothing right) can carry ``window``."""
    return window is None or causal or window[1] == 0


def _cudnn_attention(
    query,
    key,
    value,
    mask,
    bias,
    logits_shape,
    *,
    scale,
    causal,
    lengths=(None, None),
    allowed=None,
    window=None,
):
    """``jax.nn.dot_product_attention(implementation="cudnn")`` on ``[N, T, 1, K]``, fully masked rows zeroed.

    ``mask`` is the caller's boolean mask, ``lengths`` the ``(query_lengths, key_lengths)`` handed to cuDNN
    as sequence lengths, and ``allowed`` every pair they (with ``bias``) allow, for the zeroing. A
    ``window = (left, right)`` with no right side reaches cuDNN as its sliding window (``left``, then the causal
    bound, which equals the window's there), any other as part of the dense mask.
    """
    batch, (t, s) = logits_shape[:-2], logits_shape[-2:]
    n = math.prod(batch)
    width = np.shape(query)[-1]
    query_seq_lengths, key_value_seq_lengths = _cudnn_seq_lengths(lengths, batch, t, s)

    def heads_last(x, length):  # [..., L, K] -> [N, L, 1, K]: one "head" per batch element, no transpose
        return jnp.broadcast_to(x, batch + (length, width)).reshape(n, length, 1, width)

    def per_logit(x):  # a mask or bias -> [1 or N, 1, T, S] (cuDNN wants the full T and S axes)
        x = jnp.reshape(x, (1,) * (len(logits_shape) - np.ndim(x)) + np.shape(x))
        if all(d == 1 for d in x.shape[:-2]):
            return jnp.broadcast_to(x, x.shape[:-2] + (t, s)).reshape(1, 1, t, s)
        return jnp.broadcast_to(x, logits_shape).reshape(n, 1, t, s)

    dtype = jnp.asarray(query).dtype
    if allowed is None:
        allowed = allowed_pairs(mask, bias)
    local_window_size, is_causal = None, causal
    if window is not None:
        window_mask = sliding_window_mask(t, s, window)
        if _cudnn_window(window, causal):
            # band (left, 0) == causal AND band (left, anything): cuDNN's mask types with a window are the causal ones
            local_window_size, is_causal = (window[0], 0), True
        else:
            mask = window_mask if mask is None else jnp.logical_and(mask, window_mask)
        allowed = window_mask if allowed is None else jnp.logical_and(allowed, window_mask)
    if bias is not None:
        # a row of -inf would give NaN (exp(-inf - -inf)); jax.nn's own fill for masked pairs instead, and such
        # rows are zeroed below like fully masked ones
        bias = jnp.asarray(bias)
        bias = jnp.where(bias == -jnp.inf, float(-0.7 * jnp.finfo(dtype).max), bias)
    out = jax.nn.dot_product_attention(
        heads_last(query, t),
        heads_last(key, s),
        heads_last(value, s),
        bias=None if bias is None else per_logit(jnp.asarray(bias, dtype)),
        mask=None if mask is None else per_logit(mask),
        scale=_scale(scale, width),
        is_causal=is_causal,
        query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths,
        local_window_size=local_window_size,
        implementation="cudnn",
    ).reshape(batch + (t, width))
    if allowed is not None:  # cuDNN averages all values for a query with no valid key; this library gives 0
        live = allowed
        if causal:
            live = jnp.logical_and(live, make_causal_mask(t, s))
        live = jnp.broadcast_to(live, logits_shape).any(-1)
        out = jnp.where(live[..., None], out, jnp.zeros((), out.dtype))
    return out
