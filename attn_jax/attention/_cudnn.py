"""The ``"cudnn"`` path of :func:`dot_product_attention`: ``jax.nn.dot_product_attention(implementation="cudnn")``.

cuDNN flash attention runs on a CUDA GPU, for bfloat16 or float16 inputs with ``Kv == K`` and ``K`` a multiple
of 8 (at most 128, or 256 from Hopper on). It rounds the weights to the input dtype before multiplying the
values, so it agrees with ``"xla"`` to that dtype's precision. The adapter keeps this library's policy:

* a query with no allowed key gets a zero context (cuDNN averages all values there);
* padding given as lengths reaches cuDNN as its sequence lengths (its padding mask, no ``[T, S]`` array);
* a boolean mask reaches it as a dense ``[..., T, S]`` mask;
* a sliding window with no right side (``right == 0``, or ``causal``) reaches it as ``local_window_size``;
  any other window is ANDed into that dense mask.

Grouped-query attention is not handed to cuDNN: its key/value heads would have to be repeated, or the batch
re-laid out as ``[B, T, H, K]``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from attn_jax.attention._masks import make_causal_mask, sliding_window_mask
from attn_jax.attention._padding import allowed_pairs
from attn_jax.attention._plain import scale_or_default

CUDNN_GQA = (
    "grouped-query attention (num_kv_heads) is not handed to cuDNN here (its key/value heads would have to be "
    "repeated or the batch re-laid out as [B, T, H, K]); use 'xla' or 'chunked'"
)


def _cuda_device():
    """The first CUDA device, or None (CPU, TPU, ROCm)."""
    if jax.default_backend() != "gpu":
        return None
    device = jax.devices()[0]
    return device if "cuda" in getattr(device.client, "platform_version", "").lower() else None


def cudnn_unsupported(query, key, value, bias, logits_shape) -> str | None:
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


def cudnn_window(window, causal) -> bool:
    """Whether cuDNN's sliding window (``left`` back to the query itself, nothing right) can carry ``window``."""
    return window is None or causal or window[1] == 0


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


def cudnn_attention(
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
        if cudnn_window(window, causal):
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
        scale=scale_or_default(scale, width),
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
