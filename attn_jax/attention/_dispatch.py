"""Choosing and running an implementation of :func:`dot_product_attention` on checked operands.

Three implementations compute the same function: ``"xla"`` (the plain path, ``_plain.py``), ``"chunked"``
(FlashAttention-style blocks in pure JAX, ``_chunked.py``) and ``"cudnn"`` (``_cudnn.py``). The choice for
``implementation=None`` depends only on shapes, dtypes, the device and which operands are given, never on
values, so it is the same inside and outside ``jit``.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from attn_jax.attention._chunked import _chunked_attention
from attn_jax.attention._cudnn import CUDNN_GQA, cudnn_attention, cudnn_unsupported, cudnn_window
from attn_jax.attention._masks import lengths_mask
from attn_jax.attention._padding import allowed_pairs, zero_dead_inputs
from attn_jax.attention._plain import is_static, plain_attention

Implementation = Literal["xla", "chunked", "cudnn"]

# One head's logits at which None picks "chunked": 64 MiB of float32 logits per head, of which the plain backward
# holds 2-4 copies. Below it XLA's fused matmul-softmax beats a loop over small blocks.
_CHUNKED_MIN_LOGITS = 4096 * 4096
# On the CPU the blocked kernel's 512 x 512 blocks stay in cache: from T·S = 512² on it is as fast as the plain
# path or faster, in O(T + S) memory (timings: experiments/benchmarks/README.md).
_CHUNKED_MIN_LOGITS_CPU = 512 * 512


def _chunked_min_logits() -> int:
    """One head's ``T·S`` from which ``implementation=None`` picks ``"chunked"`` on this backend."""
    return _CHUNKED_MIN_LOGITS_CPU if jax.default_backend() == "cpu" else _CHUNKED_MIN_LOGITS


def choose_implementation(
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
    """The ``implementation=None`` rule: ``(choice, why not "cudnn")``.

    ``"xla"`` when the weights are returned or normalised by sparsemax/entmax. Else ``"cudnn"`` when it
    applies with no mask and no bias (padding as lengths is fine; a mask, or a window reaching right of
    non-causal queries, would reach cuDNN as a dense ``[..., T, S]`` operand). Else ``"chunked"`` when one
    head's logits hold at least ``4096 × 4096`` entries (``512 × 512`` on the CPU) and ``scale`` is static.
    Else ``"xla"``.
    """
    if return_weights:
        return "xla", "return_weights=True needs the weights, which only 'xla' forms"
    if normalizer != "softmax":
        return "xla", f"normalizer={normalizer!r} thresholds the weights, which only 'xla' forms"
    reason = CUDNN_GQA if grouped else cudnn_unsupported(query, key, value, bias, logits_shape)
    if reason is None and mask is not None:
        reason = (
            "a boolean mask would reach cuDNN as a dense [..., T, S] bias; pass padding as "
            "query_lengths=/key_lengths= (padding_lengths converts a padding mask, outside jit)"
        )
    if reason is None and bias is not None:
        reason = "a bias is a dense [..., T, S] operand for cuDNN; implementation='cudnn' runs it anyway"
    if reason is None and not cudnn_window(window, causal):
        reason = (
            f"cuDNN's sliding window has no right side, and local_window={window} reaches right of non-causal "
            "queries: it would reach cuDNN as a dense [..., T, S] bias; implementation='cudnn' runs it anyway"
        )
    if reason is None:
        return "cudnn", None
    if is_static(scale) and logits_shape[-2] * logits_shape[-1] >= _chunked_min_logits():
        return "chunked", reason
    return "xla", reason


def run_implementation(
    implementation: Implementation,
    query,
    key,
    value,
    mask,
    bias,
    logits_shape,
    *,
    lengths,
    scale,
    causal,
    window,
    return_weights,
    normalizer,
    grouped,
):
    """Run ``implementation`` on checked operands: padding as a mask, unread rows zeroed, then the kernel.

    Every path but cuDNN reads the lengths as the pairs they allow, a ``[..., T|1, S|1]`` mask; cuDNN takes
    the lengths themselves. The rows no pair reads may hold anything, NaN included, so they are zeroed before
    any product, on every path.
    """
    user_mask = mask
    padding = lengths_mask(*lengths, *logits_shape[-2:])
    if padding is not None:
        mask = padding if mask is None else jnp.logical_and(mask, padding)
    query, key, value = zero_dead_inputs(
        query, key, value, mask, bias, logits_shape, causal=causal, window=window
    )
    if implementation == "chunked":
        return _chunked_attention(
            logits_shape, query, key, value, mask, bias, causal=causal, scale=scale, window=window
        )
    if implementation == "cudnn":
        return cudnn_attention(
            query,
            key,
            value,
            user_mask,
            bias,
            logits_shape,
            scale=scale,
            causal=causal,
            lengths=lengths,
            allowed=allowed_pairs(mask, bias),
            window=window,
        )
    return plain_attention(
        query,
        key,
        value,
        mask,
        bias,
        logits_shape,
        scale=scale,
        causal=causal,
        window=window,
        return_weights=return_weights,
        normalizer=normalizer,
        grouped=grouped,
    )
