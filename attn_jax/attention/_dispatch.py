"""Choosing and running an implementation of :func:`dot_product_attention` on checked operands.

Four implementations compute the same function: ``"xla"`` (the plain path, ``_plain.py``), ``"chunked"``
(FlashAttention-style blocks in pure JAX, ``_chunked.py``), ``"cudnn"`` (``_cudnn.py``) and ``"pallas"`` (a
Pallas kernel, ``_pallas.py``). The choices for ``implementation=None`` and ``"auto"`` depend only on shapes,
dtypes, the device and which operands are given, never on values, so they are the same inside and outside
``jit``.
"""

from __future__ import annotations

import logging
from typing import Literal

import jax
import jax.numpy as jnp

from attn_jax.attention._chunked import _chunked_attention
from attn_jax.attention._cudnn import CUDNN_GQA, cudnn_attention, cudnn_unsupported, cudnn_window
from attn_jax.attention._masks import lengths_mask
from attn_jax.attention._padding import allowed_pairs, zero_dead_inputs
from attn_jax.attention._pallas import pallas_attention, pallas_unsupported
from attn_jax.attention._plain import is_static, plain_attention

Implementation = Literal["xla", "chunked", "cudnn", "pallas"]
IMPLEMENTATIONS: tuple[Implementation, ...] = ("xla", "chunked", "cudnn", "pallas")

_LOG = logging.getLogger("attn_jax.attention")
_AUTO_REPORTED: set[tuple[str, str]] = set()  # each (choice, reason) of "auto" is logged once per process

# One head's logits at which None picks "chunked": 64 MiB of float32 logits per head, of which the plain backward
# holds 2-4 copies. Below it XLA's fused matmul-softmax beats a loop over small blocks.
_CHUNKED_MIN_LOGITS = 4096 * 4096
# On the CPU the blocked kernel is as fast as the plain path or faster from T·S = 512² on, in O(T + S) memory
# (timings: experiments/benchmarks/README.md).
_CHUNKED_MIN_LOGITS_CPU = 512 * 512


# On the CPU, full (non-causal, unwindowed) attention takes query blocks of up to 1024 rows, keys 512 a block.
# The forward then runs half the loop steps of 512-row blocks, and XLA's thread pool joins once per step, so
# the gain does not hang on one cache size. Its 1024 x 512 float32 block (2 MiB) lives in L3 on x86 server CPUs.
# Causal and windowed calls keep 512 rows: a larger block skips fewer blocks in the future or outside the window.
_CPU_QUERY_CHUNK = 1024
_QUERY_CHUNK = 512


def query_chunk(t: int, causal: bool, window) -> int:
    """Queries per block of the ``"chunked"`` path on this backend.

    1024 on the CPU for full attention, unless ``T`` needs more padding to 1024 rows than to 512 (``T = 1536``);
    512 otherwise. A block of more rows than ``T`` is clipped to ``T``.
    """
    if jax.default_backend() != "cpu" or causal or window is not None:
        return _QUERY_CHUNK
    padded_to_1024, padded_to_512 = (-(-t // n) * n for n in (_CPU_QUERY_CHUNK, _QUERY_CHUNK))
    return _CPU_QUERY_CHUNK if t <= _CPU_QUERY_CHUNK or padded_to_1024 <= padded_to_512 else _QUERY_CHUNK


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
    reason = _why_not_cudnn(
        query, key, value, mask, bias, logits_shape, causal=causal, window=window, grouped=grouped
    )
    if reason is None:
        return "cudnn", None
    if is_static(scale) and logits_shape[-2] * logits_shape[-1] >= _chunked_min_logits():
        return "chunked", reason
    return "xla", reason


def _why_not_cudnn(query, key, value, mask, bias, logits_shape, *, causal, window, grouped) -> str | None:
    """Why ``implementation=None`` does not pick cuDNN for these operands, or None when it does."""
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
    return reason


def choose_auto(
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
) -> tuple[Implementation, str]:
    """The ``implementation="auto"`` rule: ``(choice, why)``, by device first.

    On a GPU, ``"cudnn"`` where ``implementation=None`` would pick it, else ``"pallas"``. On a TPU,
    ``"pallas"``. On the CPU, ``"chunked"``. Where the choice does not apply (a mask or a bias for
    ``"pallas"``, a traced ``scale``), the next of ``"chunked"`` and ``"xla"`` that does. ``"xla"`` whenever
    the weights are returned or sparse. The reason is one line and always given.
    """
    if return_weights or normalizer != "softmax":
        return choose_implementation(
            query,
            key,
            value,
            mask,
            bias,
            logits_shape,
            scale=scale,
            return_weights=return_weights,
            normalizer=normalizer,
        )
    backend = _backend()
    device = {"gpu": "a GPU", "tpu": "a TPU", "cpu": "the CPU"}.get(backend, f"the {backend!r} backend")
    if backend == "gpu":
        cudnn = _why_not_cudnn(
            query, key, value, mask, bias, logits_shape, causal=causal, window=window, grouped=grouped
        )
        if cudnn is None:
            return "cudnn", "on a CUDA GPU 'auto' runs cuDNN flash attention"
        not_pallas = pallas_unsupported(mask, bias, scale)
        if not_pallas is None:
            return "pallas", f"on a GPU 'auto' runs the Pallas kernel where cuDNN does not apply: {cudnn}"
    elif backend == "tpu":
        not_pallas = pallas_unsupported(mask, bias, scale)
        if not_pallas is None:
            return "pallas", "on a TPU 'auto' runs the Pallas kernel"
    else:
        not_pallas = None
    if is_static(scale):
        if not_pallas is None:
            return "chunked", f"on {device} 'auto' runs 'chunked', FlashAttention blocks in pure JAX"
        return (
            "chunked",
            f"on {device} 'auto' runs 'chunked': the Pallas kernel does not apply, as {not_pallas}",
        )
    return "xla", f"on {device} 'auto' runs 'xla': 'chunked' and 'pallas' need a static scale"


def _backend() -> str:
    """JAX's default backend: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (one place for the tests to fake it)."""
    return jax.default_backend()


def report_auto(choice: str, reason: str) -> None:
    """Log ``implementation="auto"``'s choice on ``attn_jax.attention`` at INFO, once per distinct line."""
    if (choice, reason) not in _AUTO_REPORTED:
        _AUTO_REPORTED.add((choice, reason))
        _LOG.info("dot_product_attention: %s", reason)


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

    Every path but cuDNN and Pallas reads the lengths as the pairs they allow, a ``[..., T|1, S|1]`` mask;
    cuDNN and Pallas take the lengths themselves. The rows no pair reads may hold anything, NaN included, so they are zeroed before
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
            logits_shape,
            query,
            key,
            value,
            mask,
            bias,
            causal=causal,
            scale=scale,
            window=window,
            query_chunk=query_chunk(logits_shape[-2], causal, window),
        )
    if implementation == "pallas":
        return pallas_attention(
            query, key, value, logits_shape, lengths=lengths, scale=scale, causal=causal, window=window
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
