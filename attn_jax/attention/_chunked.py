"""Memory-efficient scaled dot-product attention: FlashAttention-style blocks in pure JAX.

The plain path (:func:`attn_jax.attention.dot_product_attention` with ``implementation="xla"``) builds the
``[..., T, S]`` logits and keeps them, the weights and their cotangent alive for the backward pass: memory
``O(T·S)`` per head. This path never materialises a ``T × S`` array:

* **forward** — for each query block (``lax.map``), a loop over key/value blocks keeps a running max ``m``,
  a running normaliser ``l`` and a running context ``acc`` in float32 (the online softmax of Milakov &
  Gimelshein 2018, as in Dao et al. 2022); it saves only the float32 context ``O`` and the per-query
  log-sum-exp ``L = m + log l``;
* **backward** (a ``jax.custom_vjp``) — FlashAttention-2 (Dao 2023, Alg. 2): for each key/value block, a loop
  over query blocks recomputes ``P = exp(S − L)`` from ``q, k`` and accumulates ``dV += Pᵀ dO``,
  ``dP = dO Vᵀ``, ``dS = P ∘ (dP − rowsum(dO ∘ O))``, ``dQ += dS K·scale``, ``dK += dSᵀ Q·scale``.

Memory is ``O(T·K + S·K + block_q·block_k)`` per batch element. Numerics follow ``_softmax.py``: products and
the softmax in float32, masked logits filled with ``finfo(float32).min``, masked keys weigh exactly 0, a query
whose keys are all masked gets a zero context and zero gradients, and the context is returned in the value's
dtype. The blocked softmax cannot reuse :func:`masked_softmax` (it never sees a whole row), so it applies
the same policy itself. Rows that no pair reads (padding) are zeroed before the kernel (``_padding.py``), so
NaN or ±inf stored there reaches neither the context nor any gradient.

Causal attention skips the key blocks that lie entirely in a query block's future for real: the loops run
over a *dynamic* range of block indices (``lax.fori_loop`` with a traced bound, i.e. a ``while`` loop), so
a causal ``T = S`` call does about half the block products of a non-causal one, in both passes. The bound
depends only on block indices, never on data, so it stays a loop bound under ``vmap``. A sliding window
(``local_window``) bounds the same loops from both sides: query block ``i`` runs over the key blocks that meet
``[i·bq − left, i·bq + bq − 1 + right]`` only, and the backward's key block ``j`` over the query blocks that
meet ``[j·bk − right, j·bk + bk − 1 + left]``, so the work grows with the window, not with ``S``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from attn_jax.attention._checks import (
    check_broadcastable,
    check_floating,
    check_mask,
    check_min_rank,
    positive_int,
    shape_str,
)
from attn_jax.attention._masks import sliding_window
from attn_jax.attention._padding import zero_dead_inputs
from attn_jax.attention._softmax import _FILL
from attn_jax.typing import Array, Bool, Float


class _Config(NamedTuple):
    """Static description of one blocked call (hashable: the custom_vjp's non-differentiable argument)."""

    q_len: int  # T before padding
    kv_len: int  # S before padding
    q_block: int
    kv_block: int
    scale: float
    causal: bool
    # (left, right): key j is visible to query i iff i - left <= j <= i + right
    window: tuple[int, int] | None = None


# --- the kernel, on one batch element: q [Tp, K], k [Sp, K], v [Sp, Kv], mask [Tm, Sm], bias [Tb, Sb] ---------
# Tp, Sp are multiples of the block sizes; mask/bias trailing axes are either 1 (broadcast) or Tp / Sp.


def _tile(x, i, j, cfg: _Config):
    """Block ``(i, j)`` of a mask or bias whose trailing axes are each 1 (broadcast) or padded-full."""
    rows, cols = x.shape
    start = (i * cfg.q_block if rows > 1 else 0, j * cfg.kv_block if cols > 1 else 0)
    size = (cfg.q_block if rows > 1 else 1, cfg.kv_block if cols > 1 else 1)
    return lax.dynamic_slice(x, start, size), start, size


def _block_logits(cfg: _Config, q_i, k_j, mask, bias, i, j):
    """Float32 logits of block ``(i, j)``, with non-attendable entries (mask, causal, key padding) at FILL."""
    s = jnp.einsum("tk,sk->ts", q_i, k_j, preferred_element_type=jnp.float32).astype(jnp.float32)
    s = s * jnp.float32(cfg.scale)
    if bias is not None:
        s = s + _tile(bias, i, j, cfg)[0]
    valid = None
    cols = j * cfg.kv_block + jnp.arange(cfg.kv_block)[None, :]  # [1, bk]
    if cfg.causal:
        rows = i * cfg.q_block + jnp.arange(cfg.q_block)[:, None]  # [bq, 1]
        valid = cols <= rows
    if cfg.window is not None:
        rows = i * cfg.q_block + jnp.arange(cfg.q_block)[:, None]  # [bq, 1]
        left, right = cfg.window
        inside = (cols >= rows - left) & (cols <= rows + right)
        valid = inside if valid is None else valid & inside
    if cfg.kv_len % cfg.kv_block:  # padded keys exist
        valid = cols < cfg.kv_len if valid is None else valid & (cols < cfg.kv_len)
    if mask is not None:
        m = _tile(mask, i, j, cfg)[0]
        valid = m if valid is None else valid & m
    if valid is not None:
        valid = jnp.broadcast_to(valid, s.shape)
        s = jnp.where(valid, s, _FILL)
    return s, valid


def _kv_stop(cfg: _Config, i, num_kv: int):
    """One past the last key block that query block ``i`` can see (all of them unless causal or windowed)."""
    stop = num_kv
    if cfg.causal:
        # key block j is visible iff its first key j·bk <= the block's last row i·bq + bq - 1
        stop = jnp.minimum(num_kv, (i * cfg.q_block + cfg.q_block - 1) // cfg.kv_block + 1)
    if cfg.window is not None:
        # ... and iff its first key j·bk <= the block's last row + right
        last = i * cfg.q_block + cfg.q_block - 1 + cfg.window[1]
        stop = jnp.minimum(stop, last // cfg.kv_block + 1)
    return stop


def _kv_start(cfg: _Config, i):
    """The first key block that query block ``i`` can see: 0 unless a window ends before the sequence does."""
    if cfg.window is None:
        return 0
    # key block j is visible iff its last key j·bk + bk - 1 >= the block's first row i·bq - left
    return jnp.maximum(0, (i * cfg.q_block - cfg.window[0]) // cfg.kv_block)


def _q_start(cfg: _Config, j, num_q: int):
    """The first query block that can see key block ``j`` (the same visibility rule as :func:`_kv_stop`)."""
    start = 0
    if cfg.causal:
        start = jnp.minimum(num_q, (j * cfg.kv_block) // cfg.q_block)
    if cfg.window is not None:
        # query block i sees key block j iff its last row i·bq + bq - 1 >= j·bk - right
        start = jnp.maximum(start, (j * cfg.kv_block - cfg.window[1]) // cfg.q_block)
    return start


def _q_stop(cfg: _Config, j, num_q: int):
    """One past the last query block that can see key block ``j`` (the rule of :func:`_kv_start`)."""
    if cfg.window is None:
        return num_q
    # query block i sees key block j iff its first row i·bq <= the block's last key j·bk + bk - 1 + left
    return jnp.minimum(num_q, (j * cfg.kv_block + cfg.kv_block - 1 + cfg.window[0]) // cfg.q_block + 1)


def _forward(cfg: _Config, q, k, v, mask, bias):
    """``(O [Tp, Kv], L [Tp])``: the float32 context and the log-sum-exp of each query's valid logits."""
    num_q, num_kv = q.shape[0] // cfg.q_block, k.shape[0] // cfg.kv_block
    width_v = v.shape[-1]

    def query_block(i):
        q_i = lax.dynamic_slice_in_dim(q, i * cfg.q_block, cfg.q_block)

        def key_block(j, carry):
            m, total, acc = carry
            k_j = lax.dynamic_slice_in_dim(k, j * cfg.kv_block, cfg.kv_block)
            v_j = lax.dynamic_slice_in_dim(v, j * cfg.kv_block, cfg.kv_block).astype(jnp.float32)
            s, valid = _block_logits(cfg, q_i, k_j, mask, bias, i, j)
            m_new = jnp.maximum(m, s.max(-1))  # >= FILL, so finite: no inf - inf
            p = jnp.exp(s - m_new[:, None])
            if valid is not None:
                p = jnp.where(valid, p, 0.0)  # FILL - FILL = 0 would otherwise give weight 1
            correction = jnp.exp(m - m_new)
            total = correction * total + p.sum(-1)
            acc = correction[:, None] * acc + jnp.einsum("ts,sv->tv", p, v_j)
            return m_new, total, acc

        init = (
            jnp.full((cfg.q_block,), _FILL, jnp.float32),
            jnp.zeros((cfg.q_block,), jnp.float32),
            jnp.zeros((cfg.q_block, width_v), jnp.float32),
        )
        m, total, acc = lax.fori_loop(_kv_start(cfg, i), _kv_stop(cfg, i, num_kv), key_block, init)
        # total >= 1 iff the query saw a valid key (its max contributes exp(0)); otherwise zero context by policy.
        live = total > 0
        safe_total = jnp.where(live, total, 1.0)
        out = jnp.where(live[:, None], acc / safe_total[:, None], 0.0)
        lse = jnp.where(
            live, m + jnp.log(safe_total), 0.0
        )  # any finite value does for dead rows: their P is 0
        return out, lse

    out, lse = lax.map(query_block, jnp.arange(num_q))  # [nq, bq, Kv], [nq, bq]
    return out.reshape(-1, width_v), lse.reshape(-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg: _Config, q, k, v, mask, bias):
    """Blocked attention of one batch element: float32 context ``[Tp, Kv]``."""
    return _forward(cfg, q, k, v, mask, bias)[0]


def _flash_fwd(cfg: _Config, q, k, v, mask, bias):
    out, lse = _forward(cfg, q, k, v, mask, bias)
    return out, (q, k, v, mask, bias, out, lse)


def _flash_bwd(cfg: _Config, residuals, d_out):
    """FlashAttention-2's backward: recompute each block's P from the saved log-sum-exp."""
    q, k, v, mask, bias, out, lse = residuals
    num_q, num_kv = q.shape[0] // cfg.q_block, k.shape[0] // cfg.kv_block
    bq, bk, scale = cfg.q_block, cfg.kv_block, jnp.float32(cfg.scale)
    d_out = d_out.astype(jnp.float32)
    delta = jnp.sum(d_out * out, axis=-1)  # [Tp]: rowsum(dO ∘ O) = Σ_s P dP
    dq0 = jnp.zeros((num_q, bq, q.shape[-1]), jnp.float32)
    dbias0 = None if bias is None else jnp.zeros(bias.shape, jnp.float32)

    def key_block(carry, j):
        dq, dbias = carry
        k_j = lax.dynamic_slice_in_dim(k, j * bk, bk)
        v_j = lax.dynamic_slice_in_dim(v, j * bk, bk).astype(jnp.float32)

        def query_block(i, inner):
            dk_j, dv_j, dq, dbias = inner
            q_i = lax.dynamic_slice_in_dim(q, i * bq, bq)
            do_i = lax.dynamic_slice_in_dim(d_out, i * bq, bq)
            lse_i = lax.dynamic_slice_in_dim(lse, i * bq, bq)
            delta_i = lax.dynamic_slice_in_dim(delta, i * bq, bq)
            s, valid = _block_logits(cfg, q_i, k_j, mask, bias, i, j)
            p = jnp.exp(s - lse_i[:, None])
            if valid is not None:
                p = jnp.where(valid, p, 0.0)
            dv_j = dv_j + jnp.einsum("ts,tv->sv", p, do_i)
            dp = jnp.einsum("tv,sv->ts", do_i, v_j)
            ds = p * (dp - delta_i[:, None])  # cotangent of the logits block
            dq_i = lax.dynamic_index_in_dim(dq, i, keepdims=False)
            dq_i = dq_i + jnp.einsum("ts,sk->tk", ds, k_j.astype(jnp.float32)) * scale
            dq = lax.dynamic_update_index_in_dim(dq, dq_i, i, 0)  # not .at[].add: a scatter under vmap
            dk_j = dk_j + jnp.einsum("ts,tk->sk", ds, q_i.astype(jnp.float32)) * scale
            if dbias is not None:
                old, start, size = _tile(dbias, i, j, cfg)
                # a broadcast bias axis receives the sum of the block over that axis
                tile = ds.sum(axis=tuple(a for a in (0, 1) if size[a] == 1), keepdims=True)
                dbias = lax.dynamic_update_slice(dbias, old + tile, start)
            return dk_j, dv_j, dq, dbias

        init = (
            jnp.zeros((bk, k.shape[-1]), jnp.float32),
            jnp.zeros((bk, v.shape[-1]), jnp.float32),
            dq,
            dbias,
        )
        dk_j, dv_j, dq, dbias = lax.fori_loop(
            _q_start(cfg, j, num_q), _q_stop(cfg, j, num_q), query_block, init
        )
        return (dq, dbias), (dk_j, dv_j)

    (dq, dbias), (dk, dv) = lax.scan(key_block, (dq0, dbias0), jnp.arange(num_kv))
    dq = dq.reshape(q.shape).astype(q.dtype)
    dk = dk.reshape(k.shape).astype(k.dtype)
    dv = dv.reshape(v.shape).astype(v.dtype)
    return dq, dk, dv, None, dbias  # the boolean mask has no cotangent


_flash.defvjp(_flash_fwd, _flash_bwd)


# --- batching and padding ------------------------------------------------------------------------------------


# The platforms on which :func:`_over_batch` loops over the batch axes (``lax.map``); all others vmap them.
_LOOP_PLATFORMS: tuple[str, ...] = ("cpu",)


def _over_batch(fn, batch: tuple[int, ...], *xs):
    """``fn`` over the leading ``batch`` axes; size-1 (broadcast) operands are not copied.

    Every non-None operand has ``len(batch)`` leading axes, each of size 1 or the batch size. A broadcast
    operand (a key shared by all heads, a padding mask shared by all queries) is passed unmapped, so no
    broadcast copy is made and its cotangent is summed over the batch.

    On accelerators the batch is ``vmap``-ped: one kernel over every (batch, head) at once. On the CPU it is a
    loop (``lax.map``), one batch element after another: a vmapped block step touches every head's block at
    once (32 heads × a 512 × 512 float32 block = 32 MiB, far beyond the cache), a mapped one touches one block
    (1 MiB), which keeps it in cache (timings: benchmark row 1, ``experiments/benchmarks/bench.py --rows 1``).

    The choice follows the platform the program is lowered for (``lax.platform_dependent``), not the machine
    that traces it: a program exported on a CPU for a GPU (``jax.export``) vmaps.
    """
    loop, vmap = (functools.partial(_map_batch, looped, fn, batch) for looped in (True, False))
    if not batch or not _LOOP_PLATFORMS:
        return vmap(*xs)
    return lax.platform_dependent(*xs, default=vmap, **dict.fromkeys(_LOOP_PLATFORMS, loop))


def _map_batch(loop: bool, fn, batch: tuple[int, ...], *xs):
    """:func:`_over_batch` as a loop (``lax.map``) over the batch axes, or vmapped."""
    if not batch:
        return fn(*xs)
    mapped = [x is not None and x.shape[0] != 1 for x in xs]
    inner = [None if x is None else (x if m else x[0]) for x, m in zip(xs, mapped, strict=True)]
    rest = functools.partial(_map_batch, loop, fn, batch[1:])
    if not any(mapped):  # a batch axis of size 1 everywhere
        return rest(*inner)[None]
    if not loop:
        return jax.vmap(rest, in_axes=tuple(0 if m else None for m in mapped))(*inner)

    def one(sliced):  # the mapped operands' slices; the broadcast ones are closed over
        it = iter(sliced)
        return rest(*[next(it) if m else x for x, m in zip(inner, mapped, strict=True)])

    return lax.map(one, tuple(x for x, m in zip(inner, mapped, strict=True) if m))


def _lead(x, ndim: int):
    """Prepend size-1 axes up to ``ndim``."""
    return jnp.reshape(x, (1,) * (ndim - np.ndim(x)) + np.shape(x))


def _pad_axis(x, axis: int, size: int, value):
    """Pad ``axis`` of ``x`` at the end up to ``size`` with ``value`` (a no-op when already there)."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _pad_trailing(x, length: tuple[int, int], padded: tuple[int, int], value):
    """Pad a mask/bias's ``[T, S]`` axes to the block multiples, leaving broadcast (size-1) axes alone."""
    for axis, n, n_pad in ((-2, length[0], padded[0]), (-1, length[1], padded[1])):
        if x.shape[axis] == n and n != 1:
            x = _pad_axis(x, axis, n_pad, value)
    return x


# --- boundary ------------------------------------------------------------------------------------------------


def _check_inputs(query, key, value, mask, bias) -> tuple[int, ...]:
    """Validate the operands of a dot-product attention; return the logits shape ``[..., T, S]``."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        check_min_rank(name, x, 2)
        check_floating(name, x)
    if np.shape(query)[-1] != np.shape(key)[-1]:
        raise ValueError(
            "query and key must have the same width K (last axis): "
            f"query {shape_str(query)}, key {shape_str(key)}"
        )
    if np.shape(key)[-2] != np.shape(value)[-2]:
        raise ValueError(
            "key and value must have the same length S (axis -2): "
            f"key {shape_str(key)}, value {shape_str(value)}"
        )
    check_broadcastable(["query batch axes", "key batch axes"], [np.shape(query)[:-2], np.shape(key)[:-2]])
    batch = check_broadcastable(
        ["query batch axes", "key batch axes", "value batch axes"],
        [np.shape(query)[:-2], np.shape(key)[:-2], np.shape(value)[:-2]],
    )
    logits_shape = batch + (np.shape(query)[-2], np.shape(key)[-2])
    check_mask(mask, logits_shape)
    if bias is not None:
        check_floating("bias", bias)
        try:
            widened = tuple(np.broadcast_shapes(np.shape(bias), logits_shape))
        except ValueError:
            widened = None
        if widened != logits_shape:
            raise ValueError(
                f"bias of shape {shape_str(np.shape(bias))} does not broadcast to the attention logits "
                f"[..., T, S] of shape {shape_str(logits_shape)}"
            )
    return logits_shape


def _static_scale(scale, width: int) -> float:
    """``1/√K`` unless given; the blocked kernel needs it as a Python number (it is not differentiated)."""
    if scale is None:
        return 1.0 / math.sqrt(width)
    try:
        return float(scale)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise ValueError(
            "chunked attention needs a static scale (a Python number), got a traced value; "
            "use implementation='xla' to differentiate through the scale"
        ) from None


def chunked_dot_product_attention(
    query: Float[Array, "... T K"],
    key: Float[Array, "... S K"],
    value: Float[Array, "... S Kv"],
    mask: Bool[Array, "... T S"] | None = None,
    *,
    bias: Float[Array, "... T S"] | None = None,
    causal: bool = False,
    local_window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    query_chunk: int = 512,
    key_chunk: int = 512,
) -> Float[Array, "... T Kv"]:
    r"""Scaled dot-product attention in blocks, never materialising the ``[T, S]`` logits (forward or backward).

    .. math:: \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\Big(\frac{Q K^\top}{\sqrt{K}} + b\Big) V,
        \quad \text{computed blockwise: } m \leftarrow \max(m, \max_j e_{ij}),\;
        \ell \leftarrow e^{m_{\text{old}} - m}\ell + \textstyle\sum_j e^{e_{ij} - m},\;
        o \leftarrow e^{m_{\text{old}} - m} o + \textstyle\sum_j e^{e_{ij} - m} v_j

    Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness"; Dao 2023,
    "FlashAttention-2" (the backward pass, Alg. 2); Rabe & Staats 2021, "Self-attention Does Not Need
    O(n²) Memory". Same layout, masking policy and numerics as :func:`dot_product_attention` (which it matches
    to float32 rounding and reaches through ``implementation="chunked"``): a query whose keys are all masked
    gets a zero context and zero, finite gradients. Memory ``O(T·K + S·Kv + query_chunk·key_chunk)`` per
    batch element instead of ``O(T·S)``. Lengths that are not multiples of the chunk sizes are padded
    internally and the padding masked. With ``causal=True``, key blocks entirely in a query block's future
    are skipped (not computed and masked), in both passes; with ``local_window=(left, right)`` so are the key
    blocks entirely outside every query's window ``[i - left, i + right]``, so the cost is
    ``O(T·(left + right + chunk))`` instead of ``O(T·S)``.

    Differentiable to first order in reverse mode (``grad``, ``vjp``) through a ``jax.custom_vjp``: forward
    mode (``jvp``, ``jacfwd``) and second derivatives are not supported, and ``scale`` is a static constant. A full ``[..., T, S]``
    ``bias`` that is shared across batch axes gets a per-batch-element cotangent before ``vmap`` sums it.

    Args:
      query: ``[..., T, K]``.
      key: ``[..., S, K]``; leading axes broadcast against ``query``'s (a broadcast key is not copied).
      value: ``[..., S, Kv]``; the context takes its dtype.
      mask: boolean, True = may attend, broadcastable to ``[..., T, S]``; ``None`` attends everywhere.
      bias: additive float bias broadcastable to ``[..., T, S]``, added to the scaled logits in float32.
      causal: also mask key ``j > i`` for query ``i`` (``make_causal_mask(T, S)``: top-left aligned).
      local_window: ``(left, right)`` static non-negative ints, or one int ``w`` for ``(w, w)``: also mask the
        keys outside ``i - left <= j <= i + right`` (:func:`sliding_window_mask`; ANDed with ``causal``).
      scale: logit multiplier, a Python number; ``None`` means ``1/√K``.
      query_chunk: queries per block (clipped to ``T``).
      key_chunk: keys per block (clipped to ``S``).

    Returns:
      the context ``[..., T, Kv]`` in ``value``'s dtype.

    Raises:
      ValueError: the shape errors of :func:`dot_product_attention`, a non-positive chunk size, a traced
        ``scale``, or a ``local_window`` that is not a non-negative int or pair of them.

    >>> q = k = jnp.zeros((4, 2)); v = jnp.arange(4.0)[:, None]  # uniform weights over the visible keys
    >>> chunked_dot_product_attention(q, k, v, causal=True, query_chunk=2, key_chunk=3)[:, 0]
    Array([0. , 0.5, 1. , 1.5], dtype=float32)
    """
    logits_shape = _check_inputs(query, key, value, mask, bias)
    q_chunk = positive_int("query_chunk", query_chunk)
    kv_chunk = positive_int("key_chunk", key_chunk)
    window = sliding_window(local_window)
    # Rows no pair reads (padding) may hold anything, NaN included: zero them before any product.
    query, key, value = zero_dead_inputs(
        query, key, value, mask, bias, logits_shape, causal=bool(causal), window=window
    )
    return _chunked_attention(
        logits_shape,
        query,
        key,
        value,
        mask,
        bias,
        causal=causal,
        window=window,
        scale=scale,
        query_chunk=q_chunk,
        key_chunk=kv_chunk,
    )


def _chunked_attention(
    logits_shape, query, key, value, mask, bias, *, causal, scale, window=None, query_chunk=512, key_chunk=512
):
    """:func:`chunked_dot_product_attention` on checked operands whose unread rows are already zero."""
    q_chunk = positive_int("query_chunk", query_chunk)
    kv_chunk = positive_int("key_chunk", key_chunk)
    scale = _static_scale(scale, np.shape(query)[-1])
    batch, (t, s) = logits_shape[:-2], logits_shape[-2:]
    value = jnp.asarray(value)
    if t == 0 or s == 0:  # no keys: every query is fully masked, so its context is zero by policy
        return jnp.zeros(batch + (t, value.shape[-1]), value.dtype)

    bq, bk = min(q_chunk, t), min(kv_chunk, s)
    t_pad, s_pad = -(-t // bq) * bq, -(-s // bk) * bk
    cfg = _Config(q_len=t, kv_len=s, q_block=bq, kv_block=bk, scale=scale, causal=bool(causal), window=window)
    ndim = len(batch) + 2
    dtype = jnp.result_type(query, key)
    # Padded queries see ordinary keys and are sliced off (their cotangent is 0); padded keys are masked.
    q = _pad_axis(_lead(jnp.asarray(query, dtype), ndim), -2, t_pad, 0)
    k = _pad_axis(_lead(jnp.asarray(key, dtype), ndim), -2, s_pad, 0)
    v = _pad_axis(_lead(value, ndim), -2, s_pad, 0)
    if mask is not None:
        mask = _pad_trailing(_lead(jnp.asarray(mask), ndim), (t, s), (t_pad, s_pad), False)
    if bias is not None:
        bias = _pad_trailing(_lead(jnp.asarray(bias, jnp.float32), ndim), (t, s), (t_pad, s_pad), 0.0)
    out = _over_batch(functools.partial(_flash, cfg), batch, q, k, v, mask, bias)  # [..., Tp, Kv] f32
    return out[..., :t, :].astype(value.dtype)
