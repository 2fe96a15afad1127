"""The ``"pallas"`` path of :func:`dot_product_attention`: a FlashAttention kernel written in Pallas.

One kernel source runs on three back ends. ``lax.platform_dependent`` picks, for the platform a program is
lowered for, Triton on a GPU, Mosaic on a TPU, and Pallas' interpreter everywhere else (the CPU), which runs
the same kernel body as ordinary XLA operations. So the CPU tests check the kernel that accelerators compile.

* **forward** — a grid over (batch element, query block). Each program keeps the online softmax of Milakov &
  Gimelshein 2018 over the key blocks it can see: a running max ``m``, normaliser ``l`` and context ``acc``
  in float32. It writes the float32 context ``O`` and the log-sum-exp ``L = m + log l`` of each query.
* **backward** — FlashAttention-2 (Dao 2023, Alg. 2) as two kernels that recompute ``P = exp(S − L)``:
  one over (batch element, key block) accumulates ``dV += Pᵀ dO`` and ``dK += dSᵀ Q``, one over
  (batch element, query block) accumulates ``dQ += dS K``, with ``dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O))``.

It reads padding as lengths, ``causal`` and a sliding window: each is a comparison of positions inside the
kernel, so no ``[T, S]`` operand exists. Causal and windowed programs skip the blocks no pair reads. A
boolean mask or a bias is refused (:func:`pallas_unsupported`), never dropped.

Batch axes are flattened into the grid. Each operand keeps its own batch axes, size 1 where it broadcasts,
and the block index maps pick its row: a key shared by the heads, or by a group of query heads
(grouped-query attention, ``_gqa.py``), is read in place, never repeated. Its gradient is formed per query
batch element and summed outside the kernel.

Sizes: Triton needs power-of-two blocks, and its matrix products need at least 16 rows and columns. So the
blocks are powers of two from 16 (clipped to the padded lengths), and the head widths ``K`` and ``Kv`` are
zero-padded to a power of two from 16. Zero columns change no product; the padded output columns are sliced
off. ``T`` and ``S`` are padded to whole blocks: the padded keys and queries lie beyond the lengths, so the
kernel masks them like any padding.

Numerics follow ``_softmax.py``: products accumulate in float32, the softmax runs in float32, masked logits
are ``finfo(float32).min``, masked keys weigh exactly 0, and a query with no visible key gets a zero context
and zero gradients. For bfloat16 or float16 inputs the weights ``P`` and ``dS`` are rounded to that dtype
before they multiply ``V``, ``Q`` or ``K``, as FlashAttention and cuDNN do, so the result agrees with
``"xla"`` to that dtype's precision. Float32 inputs multiply in float32 throughout.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from attn_jax.attention._chunked import _lead, _pad_axis
from attn_jax.attention._plain import is_static

# Queries and keys per block of a default call. Triton and Mosaic both take 128 x 128 float32 blocks.
BLOCK_Q = 128
BLOCK_K = 128
# Triton's matrix products need at least 16 rows, columns and contracted terms.
_MIN_BLOCK = 16
# Python floats: a Pallas kernel may not capture array constants.
_FILL = float(np.finfo(np.float32).min)

PALLAS_OPERANDS = (
    "the Pallas kernel takes padding as query_lengths=/key_lengths=, causal= and local_window= only, "
    "and does not read a dense [..., T, S] operand"
)


class _Config(NamedTuple):
    """Static description of one kernel call (hashable: the custom_vjp's non-differentiable argument)."""

    batch: tuple[int, ...]  # the logits' batch axes, flattened into the grid
    q_batch: tuple[int, ...]  # each operand's own batch axes: the logits' or 1 (broadcast)
    k_batch: tuple[int, ...]
    v_batch: tuple[int, ...]
    block_q: int
    block_k: int
    scale: float
    causal: bool
    window: (
        tuple[int, int] | None
    )  # (left, right): key j is visible to query i iff i - left <= j <= i + right
    dtype: str  # the products' input dtype: float32, or the inputs' bfloat16/float16


def pallas_unsupported(mask, bias, scale) -> str | None:
    """Why the Pallas kernel cannot run these operands, or None if it can."""
    if mask is not None:
        return f"a boolean mask is given, but {PALLAS_OPERANDS}; use 'chunked' or 'xla'"
    if bias is not None:
        return f"a bias is given, but {PALLAS_OPERANDS}; use 'chunked' or 'xla'"
    if not is_static(scale):
        return "it needs a static scale (a Python number), got a traced value; use 'xla' to differentiate it"
    return None


# --- the kernels ---------------------------------------------------------------------------------------------
# Refs carry one batch element: q [Tp|bq, Kp], k [Sp|bk, Kp], v [Sp|bk, Kvp], lengths [1, 1] int32.


def _mm(a, b, dtype):
    """``a @ b`` with inputs in ``dtype`` and a float32 accumulator."""
    return lax.dot(a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _mm_nt(a, b, dtype):
    """``a @ bᵀ`` with inputs in ``dtype`` and a float32 accumulator."""
    dims = (((1,), (1,)), ((), ()))
    return lax.dot_general(a.astype(dtype), b.astype(dtype), dims, preferred_element_type=jnp.float32)


def _logits(cfg: _Config, q, k, row0, col0, q_len, kv_len):
    """Float32 logits of one block and the pairs it may attend; the others are at the fill value."""
    s = _mm_nt(q, k, cfg.dtype) * cfg.scale
    rows = row0 + lax.broadcasted_iota(jnp.int32, s.shape, 0)
    cols = col0 + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    valid = (rows < q_len) & (cols < kv_len)  # lengths, and the padding to whole blocks beyond them
    if cfg.causal:
        valid = valid & (cols <= rows)
    if cfg.window is not None:
        left, right = cfg.window
        valid = valid & (cols >= rows - left) & (cols <= rows + right)
    return jnp.where(valid, s, _FILL), valid


def _kv_range(cfg: _Config, i, num_kv: int):
    """The key blocks ``[lo, hi)`` that query block ``i`` can see (``lax.div``: Mosaic has no floor division)."""
    bq, bk = cfg.block_q, cfg.block_k
    lo, hi = 0, num_kv
    last_row = i * bq + bq - 1
    if cfg.causal:
        hi = jnp.minimum(hi, lax.div(last_row, bk) + 1)
    if cfg.window is not None:
        left, right = cfg.window
        hi = jnp.minimum(hi, lax.div(last_row + right, bk) + 1)
        lo = lax.div(jnp.maximum(i * bq - left, 0), bk)
    return lo, hi


def _q_range(cfg: _Config, j, num_q: int):
    """The query blocks ``[lo, hi)`` that can see key block ``j`` (the rule of :func:`_kv_range`)."""
    bq, bk = cfg.block_q, cfg.block_k
    lo, hi = 0, num_q
    if cfg.causal:
        lo = lax.div(j * bk, bq)
    if cfg.window is not None:
        left, right = cfg.window
        lo = jnp.maximum(lo, lax.div(jnp.maximum(j * bk - right, 0), bq))
        hi = jnp.minimum(hi, lax.div(j * bk + bk - 1 + left, bq) + 1)
    return lo, hi


def _forward_kernel(cfg: _Config, q_len_ref, kv_len_ref, q_ref, k_ref, v_ref, o_ref, lse_ref):
    """One query block against the key blocks it can see: the online softmax."""
    bq, bk = cfg.block_q, cfg.block_k
    i = pl_program_id(1)  # read outside the loop: the interpreter substitutes it at the top level only
    q_len, kv_len = q_len_ref[...], kv_len_ref[...]
    q = q_ref[...]

    def key_block(j, carry):
        m, total, acc = carry
        start = j * bk
        k = k_ref[pl_ds(start, bk), :]
        v = v_ref[pl_ds(start, bk), :]
        s, valid = _logits(cfg, q, k, i * bq, start, q_len, kv_len)
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))  # >= the fill value, so finite
        p = jnp.where(valid, jnp.exp(s - m_new), 0.0)  # fill - fill = 0 would otherwise weigh 1
        correction = jnp.exp(m - m_new)
        total = correction * total + p.sum(axis=-1, keepdims=True)
        acc = correction * acc + _mm(p, v, cfg.dtype)
        return m_new, total, acc

    init = (
        jnp.full((bq, 1), _FILL, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
        jnp.zeros((bq, o_ref.shape[-1]), jnp.float32),
    )
    m, total, acc = lax.fori_loop(*_kv_range(cfg, i, k_ref.shape[0] // bk), key_block, init)
    # total >= 1 iff the query saw a valid key (its max contributes exp(0)); otherwise zero context by policy.
    live = total > 0
    safe = jnp.where(live, total, 1.0)
    o_ref[...] = jnp.where(live, acc / safe, 0.0)
    lse_ref[...] = jnp.where(live, m + jnp.log(safe), 0.0)  # any finite value does for dead rows: P is 0


def _dkv_kernel(
    cfg: _Config, q_len_ref, kv_len_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref
):
    """One key block against the query blocks that see it: ``dK`` and ``dV``."""
    bq, bk = cfg.block_q, cfg.block_k
    j = pl_program_id(1)
    q_len, kv_len = q_len_ref[...], kv_len_ref[...]
    k, v = k_ref[...], v_ref[...]

    def query_block(i, carry):
        dk, dv = carry
        rows = pl_ds(i * bq, bq)
        q, do = q_ref[rows, :], do_ref[rows, :]
        s, valid = _logits(cfg, q, k, i * bq, j * bk, q_len, kv_len)
        p = jnp.where(valid, jnp.exp(s - lse_ref[rows, :]), 0.0)
        dv = dv + _mm(p.T, do, cfg.dtype)
        ds = p * (_mm_nt(do, v, cfg.dtype) - delta_ref[rows, :])  # the logits' cotangent, unscaled
        dk = dk + _mm(ds.T, q, cfg.dtype)
        return dk, dv

    init = (jnp.zeros(dk_ref.shape, jnp.float32), jnp.zeros(dv_ref.shape, jnp.float32))
    dk, dv = lax.fori_loop(*_q_range(cfg, j, q_ref.shape[0] // bq), query_block, init)
    dk_ref[...] = dk * cfg.scale
    dv_ref[...] = dv


def _dq_kernel(cfg: _Config, q_len_ref, kv_len_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref):
    """One query block against the key blocks it can see: ``dQ``."""
    bq, bk = cfg.block_q, cfg.block_k
    i = pl_program_id(1)
    q_len, kv_len = q_len_ref[...], kv_len_ref[...]
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

    def key_block(j, dq):
        cols = pl_ds(j * bk, bk)
        k, v = k_ref[cols, :], v_ref[cols, :]
        s, valid = _logits(cfg, q, k, i * bq, j * bk, q_len, kv_len)
        p = jnp.where(valid, jnp.exp(s - lse), 0.0)
        ds = p * (_mm_nt(do, v, cfg.dtype) - delta)
        return dq + _mm(ds, k, cfg.dtype)

    dq = lax.fori_loop(
        *_kv_range(cfg, i, k_ref.shape[0] // bk), key_block, jnp.zeros(dq_ref.shape, jnp.float32)
    )
    dq_ref[...] = dq * cfg.scale


def pl_program_id(axis: int):
    """``pl.program_id``, imported on first use so that ``import attn_jax`` does not load Pallas."""
    from jax.experimental import pallas as pl

    return pl.program_id(axis)


def pl_ds(start, size: int):
    """``pl.ds(start, size)`` with ``start`` declared a multiple of ``size`` (aligned slices for Mosaic)."""
    from jax.experimental import pallas as pl

    return pl.ds(pl.multiple_of(start, size), size)


# --- pallas_call on each platform ----------------------------------------------------------------------------


def _row(n, batch: tuple[int, ...], own: tuple[int, ...]):
    """The row of an operand with batch axes ``own`` that flat batch element ``n`` of ``batch`` reads."""
    if own == batch:
        return n
    row, stride, inner = 0, 1, 1
    for size, own_size in zip(reversed(batch), reversed(own), strict=True):
        if own_size != 1:
            index = n if inner == 1 else lax.div(n, inner)
            row = row + (index if inner * size == math.prod(batch) else lax.rem(index, size)) * stride
            stride *= own_size
        inner *= size
    return row


def _call(mode: str, kernel, grid, in_specs, out_specs, out_shape, name: str, width: int):
    """``pl.pallas_call`` compiled for ``mode`` (``"triton"``, ``"mosaic"``, ``"interpret"``); heads ``width`` wide."""
    from jax.experimental import pallas as pl

    params = {}
    if mode == "triton":
        from jax.experimental.pallas import triton as plgpu

        # 8 warps for wide heads, as jax's own Pallas attention for GPUs uses
        params = dict(compiler_params=plgpu.CompilerParams(num_warps=4 if width <= 64 else 8, num_stages=2))
    elif mode == "mosaic":
        from jax.experimental.pallas import tpu as pltpu

        params = dict(compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")))
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=mode == "interpret",
        name=name,
        **params,
    )


def _on_platform(fn, *args):
    """``fn(mode, *args)`` with the mode of the platform the program is lowered for."""
    modes = {name: functools.partial(fn, mode) for name, mode in (("cuda", "triton"), ("rocm", "triton"))}
    return lax.platform_dependent(
        *args, **modes, tpu=functools.partial(fn, "mosaic"), default=functools.partial(fn, "interpret")
    )


def _specs(cfg: _Config, q, k, v, *, q_whole: bool, kv_whole: bool):
    """BlockSpecs of ``(q_len, kv_len, q, k, v)`` over the grid ``(batch element, block)``."""
    from jax.experimental import pallas as pl

    def spec(x, own, rows, whole):
        size = x.shape[1] if whole else rows
        return pl.BlockSpec(
            (None, size, x.shape[2]),
            lambda n, b: (_row(n, cfg.batch, own), 0 if whole else b, 0),
        )

    length = pl.BlockSpec((None, 1, 1), lambda n, b: (n, 0, 0))
    return [
        length,
        length,
        spec(q, cfg.q_batch, cfg.block_q, q_whole),
        spec(k, cfg.k_batch, cfg.block_k, kv_whole),
        spec(v, cfg.v_batch, cfg.block_k, kv_whole),
    ]


def _forward_call(cfg: _Config, mode: str, q_len, kv_len, q, k, v):
    """``(O [N, Tp, Kvp], L [N, Tp, 1])`` in float32."""
    from jax.experimental import pallas as pl

    n, tp, width_v = math.prod(cfg.batch), q.shape[1], v.shape[2]
    rows = lambda width: pl.BlockSpec((None, cfg.block_q, width), lambda n, i: (n, i, 0))  # noqa: E731
    call = _call(
        mode,
        functools.partial(_forward_kernel, cfg),
        (n, tp // cfg.block_q),
        _specs(cfg, q, k, v, q_whole=False, kv_whole=True),
        [rows(width_v), rows(1)],
        [jax.ShapeDtypeStruct((n, tp, width_v), jnp.float32), jax.ShapeDtypeStruct((n, tp, 1), jnp.float32)],
        "attn_jax_flash_forward",
        q.shape[2],
    )
    return tuple(call(q_len, kv_len, q, k, v))


def _backward_call(cfg: _Config, mode: str, q_len, kv_len, q, k, v, do, lse, delta):
    """``(dQ, dK, dV)`` per flat batch element ``[N, ...]`` in float32."""
    from jax.experimental import pallas as pl

    n, tp, sp = math.prod(cfg.batch), q.shape[1], k.shape[1]
    widths = q.shape[2], v.shape[2]

    def per_element(length, block, width, whole):  # dO, L and Δ are per batch element like the output
        return pl.BlockSpec((None, length if whole else block, width), lambda n, b: (n, 0 if whole else b, 0))

    def residuals(whole):
        return [per_element(tp, cfg.block_q, w, whole) for w in (widths[1], 1, 1)]

    dkv = _call(
        mode,
        functools.partial(_dkv_kernel, cfg),
        (n, sp // cfg.block_k),
        _specs(cfg, q, k, v, q_whole=True, kv_whole=False) + residuals(True),
        [per_element(sp, cfg.block_k, w, False) for w in widths],
        [jax.ShapeDtypeStruct((n, sp, w), jnp.float32) for w in widths],
        "attn_jax_flash_dkv",
        widths[0],
    )(q_len, kv_len, q, k, v, do, lse, delta)
    dq = _call(
        mode,
        functools.partial(_dq_kernel, cfg),
        (n, tp // cfg.block_q),
        _specs(cfg, q, k, v, q_whole=False, kv_whole=True) + residuals(False),
        per_element(tp, cfg.block_q, widths[0], False),
        jax.ShapeDtypeStruct((n, tp, widths[0]), jnp.float32),
        "attn_jax_flash_dq",
        widths[0],
    )(q_len, kv_len, q, k, v, do, lse, delta)
    return dq, *dkv


def _sum_to(x, batch: tuple[int, ...], own: tuple[int, ...]):
    """Per-element gradients ``[N, L, W]`` summed over the axes where the operand broadcasts: ``[n_own, L, W]``."""
    if own == batch:
        return x
    x = x.reshape(batch + x.shape[1:])
    axes = tuple(a for a, (b, o) in enumerate(zip(batch, own, strict=True)) if o == 1 and b != 1)
    return x.sum(axis=axes).reshape((-1,) + x.shape[-2:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg: _Config, q_len, kv_len, q, k, v):
    """The kernel's float32 context ``[N, Tp, Kvp]``."""
    return _on_platform(functools.partial(_forward_call, cfg), q_len, kv_len, q, k, v)[0]


def _flash_fwd(cfg: _Config, q_len, kv_len, q, k, v):
    out, lse = _on_platform(functools.partial(_forward_call, cfg), q_len, kv_len, q, k, v)
    return out, (q_len, kv_len, q, k, v, out, lse)


def _flash_bwd(cfg: _Config, residuals, d_out):
    q_len, kv_len, q, k, v, out, lse = residuals
    d_out = d_out.astype(jnp.float32)
    delta = jnp.sum(d_out * out, axis=-1, keepdims=True)  # [N, Tp, 1]: rowsum(dO ∘ O) = Σ_s P dP
    grads = _on_platform(functools.partial(_backward_call, cfg), q_len, kv_len, q, k, v, d_out, lse, delta)
    dq, dk, dv = (
        _sum_to(g, cfg.batch, own).astype(x.dtype)
        for g, own, x in zip(grads, (cfg.q_batch, cfg.k_batch, cfg.v_batch), (q, k, v), strict=True)
    )
    return None, None, dq, dk, dv  # the lengths are integers: no cotangent


_flash.defvjp(_flash_fwd, _flash_bwd)


# --- the entry point -----------------------------------------------------------------------------------------


def _block(n: int, block: int) -> int:
    """A power-of-two block of at least 16 rows: ``block``, or less where ``n`` is shorter."""
    if block < _MIN_BLOCK or block & (block - 1):
        raise ValueError(f"Pallas blocks must be powers of two from {_MIN_BLOCK}, got {block}")
    return min(block, max(_MIN_BLOCK, pl_next_power_of_2(n)))


def pl_next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _lengths(lengths, batch: tuple[int, ...], t: int, s: int):
    """``(query_lengths, key_lengths)`` as int32 ``[N, 1, 1]``, clipped to ``[0, T]`` and ``[0, S]``."""

    def one(x, n):
        x = jnp.full((), n, jnp.int32) if x is None else jnp.clip(jnp.asarray(x), 0, n).astype(jnp.int32)
        return jnp.broadcast_to(x, batch).reshape(-1, 1, 1)

    return one(lengths[0], t), one(lengths[1], s)


def pallas_attention(
    query,
    key,
    value,
    logits_shape,
    *,
    lengths=(None, None),
    scale=None,
    causal=False,
    window=None,
    block_q=None,
    block_k=None,
):
    """The ``"pallas"`` path on checked operands whose unread rows are already zero (no mask, no bias).

    ``lengths`` are ``(query_lengths, key_lengths)`` shaped like the logits' batch axes (or broadcasting to
    them). Blocks default to :data:`BLOCK_Q` by :data:`BLOCK_K`.
    """
    reason = pallas_unsupported(None, None, scale)
    if reason is not None:
        raise ValueError(f"implementation='pallas' does not apply: {reason}")
    batch, (t, s) = tuple(logits_shape[:-2]), logits_shape[-2:]
    value = jnp.asarray(value)
    width, width_v = np.shape(query)[-1], value.shape[-1]
    if t == 0 or s == 0:  # no keys: every query is fully masked, so its context is zero by policy
        return jnp.zeros(batch + (t, width_v), value.dtype)
    dtype = jnp.result_type(query, key, value)
    bq = _block(t, BLOCK_Q if block_q is None else block_q)
    bk = _block(s, BLOCK_K if block_k is None else block_k)
    t_pad, s_pad = -(-t // bq) * bq, -(-s // bk) * bk
    ndim = len(batch) + 2

    def padded(x, length, width):  # [..., L, W] -> [n_own, length, width]: zero rows and columns at the end
        x = _lead(jnp.asarray(x, dtype), ndim)
        x = _pad_axis(_pad_axis(x, -2, length, 0), -1, max(_MIN_BLOCK, pl_next_power_of_2(width)), 0)
        return x.reshape((-1,) + x.shape[-2:]), tuple(x.shape[:-2])

    (q, q_batch), (k, k_batch), (v, v_batch) = (
        padded(query, t_pad, width),
        padded(key, s_pad, width),
        padded(value, s_pad, width_v),
    )
    cfg = _Config(
        batch=batch,
        q_batch=q_batch,
        k_batch=k_batch,
        v_batch=v_batch,
        block_q=bq,
        block_k=bk,
        scale=float(1.0 / math.sqrt(width) if scale is None else scale),
        causal=bool(causal),
        window=window,
        dtype=jnp.dtype(dtype).name if jnp.dtype(dtype).itemsize < 4 else "float32",
    )
    out = _flash(cfg, *_lengths(lengths, batch, t, s), q, k, v)  # [N, Tp, Kvp] float32
    return out.reshape(batch + out.shape[1:])[..., :t, :width_v].astype(value.dtype)
