"""Scaled dot-product attention (Vaswani et al. 2017) over any leading batch axes: the public entry points.

Layout is ``[..., T, K]`` for queries and ``[..., S, K]`` for keys: with heads, ``[B, H, T, K]``. (``jax.nn``
and Flax use ``[B, T, H, K]``; transpose when comparing.) Numerics follow ``_softmax.py``: logits in float32,
masked softmax over the source axis, context accumulated in float32 and returned in the value's dtype.

This module checks the inputs once and hands them on. ``_dispatch.py`` chooses and runs an implementation
(``_plain.py``, ``_chunked.py``, ``_cudnn.py``, ``_pallas.py``); ``_gqa.py`` views grouped-query operands so that every
implementation runs them unchanged.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import shape_str
from attn_jax.attention._chunked import _check_inputs
from attn_jax.attention._cudnn import CUDNN_GQA, cudnn_unsupported
from attn_jax.attention._dispatch import (
    IMPLEMENTATIONS,
    Implementation,
    choose_auto,
    choose_implementation,
    report_auto,
    run_implementation,
)
from attn_jax.attention._gqa import check_kv_heads, group_operands, grouped_logits_shape, merge_groups
from attn_jax.attention._masks import sliding_window
from attn_jax.attention._normalizers import check_normalizer
from attn_jax.attention._pallas import pallas_unsupported
from attn_jax.attention._plain import dot_product_scores
from attn_jax.typing import Array, ArrayLike, Bool, Float, Int

__all__ = ["Implementation", "dot_product_attention", "dot_product_implementation", "dot_product_scores"]


class _Checked(NamedTuple):
    """The operands of one call after :func:`_check_call`; grouped ones in ``_gqa.py``'s view."""

    query: Array
    key: Array
    value: Array
    mask: Array | None
    bias: Array | None
    lengths: tuple  # (query_lengths, key_lengths)
    logits_shape: tuple[int, ...]
    window: tuple[int, int] | None
    grouped: bool  # the operands are grouped-query views: merge the heads of the result


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


def _check_sparse_implementation(normalizer, implementation) -> None:
    """Raise unless ``implementation`` can normalise with ``normalizer`` (only ``"xla"`` forms sparse weights)."""
    if normalizer != "softmax" and implementation in ("chunked", "cudnn", "pallas"):
        raise ValueError(
            f"normalizer={normalizer!r} needs implementation='xla' (or None): {implementation!r} computes a "
            "streaming softmax and never forms the weights that sparsemax/entmax15 threshold"
        )


def _check_implementation(implementation) -> None:
    """Raise unless ``implementation`` names one, or is ``"auto"`` or None."""
    if implementation is not None and implementation != "auto" and implementation not in IMPLEMENTATIONS:
        names = ", ".join(repr(name) for name in IMPLEMENTATIONS)
        raise ValueError(f"implementation must be {names}, 'auto' or None, got {implementation!r}")


def _check_call(
    query, key, value, mask, bias, lengths, *, local_window, num_kv_heads, normalizer, implementation
) -> _Checked:
    """Every check of :func:`dot_product_attention`'s inputs, in one place; grouped operands come back viewed.

    With ``num_kv_heads`` the head axes, the mask and bias against ``[..., H, T, S]`` and the lengths are
    checked first; then the operands are viewed as ``_gqa.py`` describes (unless ``H == G``), and the view
    goes through the same checks of dtypes, widths and lengths as an ungrouped call.
    """
    check_normalizer(normalizer)
    grouped = False
    if num_kv_heads is not None:
        _check_sparse_implementation(normalizer, implementation)
        repeats = check_kv_heads(query, key, value, num_kv_heads)
        _check_lengths(*lengths, grouped_logits_shape(query, key, value, mask, bias))
        if repeats > 1:  # one query head per key/value head is plain multi-head attention, the same program
            if implementation == "cudnn":
                raise ValueError(f"implementation='cudnn' does not apply: {CUDNN_GQA}")
            _check_implementation(implementation)
            query, key, value, mask, bias, lengths = group_operands(
                query, key, value, mask, bias, lengths, num_kv_heads, repeats
            )
            grouped = True
    logits_shape = _check_inputs(query, key, value, mask, bias)
    if num_kv_heads is None:
        _check_lengths(*lengths, logits_shape)
    window = sliding_window(local_window)
    _check_implementation(implementation)
    _check_sparse_implementation(normalizer, implementation)
    return _Checked(query, key, value, mask, bias, tuple(lengths), logits_shape, window, grouped)


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
    implementation: Implementation | Literal["auto"] | None = None,
    query_lengths: Int[ArrayLike, "..."] | None = None,
    key_lengths: Int[ArrayLike, "..."] | None = None,
    local_window: int | tuple[int, int] | None = None,
    num_kv_heads: int | None = None,
    normalizer: str = "softmax",
) -> Float[Array, "... T Kv"] | tuple[Float[Array, "... T Kv"], Float[Array, "... T S"]]:
    r"""Scaled dot-product attention with a boolean mask, padding lengths, a window and grouped heads.

    .. math:: \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\Big(\frac{Q K^\top}{\sqrt{K}} + b\Big) V

    Vaswani et al. 2017, "Attention Is All You Need", §3.2.1. The softmax runs over the key axis. A masked
    key gets weight exactly 0. A query with no allowed key gets a zero context and finite gradients, where
    ``jax.nn.dot_product_attention`` averages all values. Rows that no pair reads are zeroed first, so a NaN
    stored in padding changes no output and no gradient. Every implementation computes this same function.

    Shapes: ``...`` batch axes (heads are one: ``[B, H, T, K]``), T queries, S keys, K key width, Kv value
    width, H query heads and G key/value heads (grouped-query attention, on axis -3).

    Args:
      query: ``[..., T, K]``.
      key: ``[..., S, K]``.
      value: ``[..., S, Kv]``; the context takes its dtype.
      mask: boolean, True = may attend, broadcastable to ``[..., T, S]``; ``None`` attends everywhere.
      bias: float, broadcastable to ``[..., T, S]``, added to the scaled logits; ``-inf`` forbids a pair.
      scale: logit multiplier; ``None`` means ``1/√K``.
      return_weights: also return the float32 weights (``"xla"`` only).
      causal: also mask key ``j > i`` for query ``i``, top-left aligned like ``jax.nn``'s ``is_causal``.
      implementation: ``"xla"``, ``"chunked"``, ``"cudnn"``, ``"pallas"``; ``"auto"`` for the choice by
        device (cuDNN on a GPU, Pallas on a TPU, chunked on the CPU); ``None`` for the choice by shape.
        :func:`dot_product_implementation` reports either choice and why.
      query_lengths: integers shaped like a mask's batch axes (``[B, 1]`` for ``[B, H, T, K]`` queries):
        query ``i`` is real iff ``i < query_lengths``. ``None``: every query is real.
      key_lengths: the same for keys: key ``j`` may be attended iff ``j < key_lengths``.
      local_window: ``(left, right)`` static non-negative ints, or ``w`` for ``(w, w)``: query ``i`` attends
        keys ``i - left <= j <= i + right`` only, like ``jax.nn``'s ``local_window_size``.
      num_kv_heads: ``G``: ``key`` and ``value`` are ``[..., G, S, K|Kv]``, each head shared by ``H / G``
        consecutive query heads. ``None``: batch axes broadcast as usual.
      normalizer: ``"softmax"``, or ``"sparsemax"`` / ``"entmax15"`` for sparse weights (``"xla"`` only).

    Returns:
      the context ``[..., T, Kv]`` in ``value``'s dtype, or ``(context, weights)`` with float32 weights
      ``[..., T, S]`` when ``return_weights``.

    Raises:
      ValueError: an operand or option does not fit, or the implementation does not apply; the message
        names the shapes, or says why.

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
    call = _check_call(
        query,
        key,
        value,
        mask,
        bias,
        (query_lengths, key_lengths),
        local_window=local_window,
        num_kv_heads=num_kv_heads,
        normalizer=normalizer,
        implementation=implementation,
    )
    if implementation is None:
        implementation, _ = _choose(call, scale, return_weights, causal, normalizer)
    elif implementation == "auto":
        implementation, why = _choose(call, scale, return_weights, causal, normalizer, auto=True)
        report_auto(implementation, why)
    if implementation != "xla" and return_weights:
        raise ValueError(
            f"return_weights=True needs implementation='xla'; {implementation!r} never forms the weights"
        )
    if implementation == "cudnn":
        reason = cudnn_unsupported(call.query, call.key, call.value, call.bias, call.logits_shape)
        if reason is not None:
            raise ValueError(f"implementation='cudnn' does not apply: {reason}")
    if implementation == "pallas":
        reason = pallas_unsupported(call.mask, call.bias, scale)
        if reason is not None:
            raise ValueError(f"implementation='pallas' does not apply: {reason}")
    out = run_implementation(
        implementation,
        call.query,
        call.key,
        call.value,
        call.mask,
        call.bias,
        call.logits_shape,
        lengths=call.lengths,
        scale=scale,
        causal=causal,
        window=call.window,
        return_weights=return_weights,
        normalizer=normalizer,
        grouped=call.grouped,
    )
    if not call.grouped:
        return out
    return (merge_groups(out[0]), merge_groups(out[1])) if return_weights else merge_groups(out)


def _choose(
    call: _Checked, scale, return_weights, causal, normalizer, auto=False
) -> tuple[Implementation, str | None]:
    """:func:`choose_implementation` (or, with ``auto``, :func:`choose_auto`) for checked operands."""
    return (choose_auto if auto else choose_implementation)(
        call.query,
        call.key,
        call.value,
        call.mask,
        call.bias,
        call.logits_shape,
        scale=scale,
        return_weights=return_weights,
        causal=causal,
        window=call.window,
        grouped=call.grouped,
        normalizer=normalizer,
    )


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
    implementation: Literal["auto"] | None = None,
) -> tuple[Implementation, str | None]:
    r"""Which implementation :func:`dot_product_attention` picks for these operands, and why not cuDNN.

    The choice of ``implementation=None`` depends only on shapes, dtypes, the device and which operands are
    given (never on values), so it is the same inside and outside ``jit``. Record it next to a run's results
    when it matters, e.g. that a masked NMT batch ran on ``"xla"`` because its padding came as a mask.

    ``"xla"`` forms the ``[..., T, S]`` weights; it is the reference, and the only one that returns or
    sparsifies them. ``"chunked"`` (:func:`chunked_dot_product_attention`) runs FlashAttention-style blocks
    in ``O((T + S)·K)`` memory per head; it needs a static ``scale`` and gives first-order reverse-mode
    derivatives only. ``"cudnn"`` is cuDNN flash attention on a CUDA GPU, for bfloat16/float16 with
    ``Kv == K``. ``"pallas"`` is a Pallas FlashAttention kernel (Triton on a GPU, Mosaic on a TPU,
    interpreted on the CPU); it takes padding as lengths, causal and a window, but no mask or bias.
    ``None`` picks ``"cudnn"`` where it applies with no mask and no bias (lengths are fine), else
    ``"chunked"`` from ``4096²`` logits per head (``512²`` on the CPU), else ``"xla"``; it never picks
    ``"pallas"``. ``"auto"`` picks by device: ``"cudnn"`` on a GPU where ``None`` would, else ``"pallas"``;
    ``"pallas"`` on a TPU; ``"chunked"`` on the CPU; then ``"chunked"`` or ``"xla"`` where those do not apply.
    ``dot_product_attention(implementation="auto")`` also logs its choice and reason once, at INFO on the
    ``attn_jax.attention`` logger.

    Args:
      query, key, value, mask, bias, scale, return_weights, query_lengths, key_lengths, causal,
        local_window, num_kv_heads, normalizer: as for :func:`dot_product_attention` (checked the same way).
      implementation: ``None`` for the rule of ``implementation=None``, ``"auto"`` for the rule of
        ``implementation="auto"``.

    Returns:
      ``(implementation, reason)``: ``"xla"``, ``"chunked"``, ``"cudnn"`` or ``"pallas"``, and one line.
      For ``None`` the line says why cuDNN was not chosen (``None`` when it was); for ``"auto"`` it says why
      this choice, and is always given.

    >>> q = jnp.ones((2, 8, 8), jnp.bfloat16)
    >>> dot_product_implementation(q, q, q)[1].startswith("it needs a CUDA GPU")  # on a CPU
    True
    >>> dot_product_implementation(q, q, q, implementation="auto")  # on a CPU
    ('chunked', "on the CPU 'auto' runs 'chunked', FlashAttention blocks in pure JAX")
    """
    if implementation not in (None, "auto"):
        raise ValueError(f"implementation must be 'auto' or None, got {implementation!r}")
    call = _check_call(
        query,
        key,
        value,
        mask,
        bias,
        (query_lengths, key_lengths),
        local_window=local_window,
        num_kv_heads=num_kv_heads,
        normalizer=normalizer,
        implementation=None,
    )
    return _choose(call, scale, return_weights, causal, normalizer, auto=implementation == "auto")
