r"""Fused additive energies ``vᵀ tanh(q_i + k_j)`` whose backward pass recomputes the tanh instead of saving it.

Reverse-mode autodiff of the plain form ``einsum(tanh(q[..., :, None, :] + k[..., None, :, :]), v)`` keeps the
``[..., T, S, A]`` tanh tensor alive until the backward pass: 800 MB per layer in float32 at the sizes of
Bahdanau, Cho & Bengio (2015) (B=80, T=S=50, A=1000), and inside RNNsearch's decoder ``lax.scan`` one
``[B, S, A]`` slice per step, stacked over all ``T`` steps. :func:`fused_additive_scores` is a
``jax.custom_vjp`` whose residuals are only its inputs ``(q, k, v)``; the backward recomputes
``t = tanh(q_i + k_j)`` and forms

.. math:: \partial q_i = \sum_j \bar e_{ij}\, v \odot (1 - t_{ij}^2), \quad
    \partial k_j = \sum_i \bar e_{ij}\, v \odot (1 - t_{ij}^2), \quad
    \partial v = \sum_{ij} \bar e_{ij}\, t_{ij}.

In a scan over decoder steps the residuals are then the per-step ``q`` (``[B, A]``) plus the loop-invariant
``k``/``v``, which ``lax.scan`` does not stack. When ``T·S·A`` is large (the all-queries form), forward and
backward walk over blocks of ``block_size`` queries, so the transient tensor is ``[..., block, S, A]``.

Cost: one extra ``tanh`` over ``[..., T, S, A]`` in the backward. Limitation: ``custom_vjp`` has no forward-mode
rule, so ``jax.jvp``/``jax.jacfwd`` through this function raise; use the naive scorer (``fused=False`` in
``attn_jax.attention._additive``) for forward-mode.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from attn_jax.attention._checks import (
    check_broadcastable,
    check_min_rank,
    check_rank,
    positive_int,
    shape_str,
)
from attn_jax.typing import Array, Float

__all__ = ["fused_additive_scores"]

# Default block: at most this many float32 elements in one [..., block, S, A] tensor (4 MiB); the backward of
# a block holds a few such tensors at once.
_BLOCK_ELEMENTS = 1 << 20


def _unbroadcast(x: Array, shape: tuple[int, ...]) -> Array:
    """Sum ``x`` over the axes that broadcasting added to or stretched in ``shape``."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1
    )
    return jnp.sum(x, axis=axes).reshape(shape) if axes else x


def _tanh_grid(q: Float[Array, "... T A"], k: Float[Array, "... S A"]) -> Float[Array, "... T S A"]:
    """``tanh(q_i + k_j)`` for every pair, float32."""
    return jnp.tanh(q[..., :, None, :] + k[..., None, :, :])


def _energies(q, k, v) -> Float[Array, "... T S"]:
    """Forward of one block: a multiply-and-reduce (not a dot) so XLA can fuse the tanh into the reduction."""
    return jnp.sum(_tanh_grid(q, k) * v, axis=-1)


def _block_grads(q, k, v, g):
    """``(dq, dk, dv)`` of one block of queries, each reduced to its operand's shape."""
    t = _tanh_grid(q, k)  # [..., T, S, A]
    d = (g[..., None] * v) * (1.0 - t * t)
    dq = _unbroadcast(jnp.sum(d, axis=-2), q.shape)
    dk = _unbroadcast(jnp.sum(d, axis=-3), k.shape)
    dv = jnp.sum(g[..., None] * t, axis=tuple(range(t.ndim - 1)))
    return dq, dk, dv


def _to_blocks(x: Array, block: int) -> Array:
    """``[..., T, F] -> [n, ..., block, F]``, zero-padding ``T`` up to ``n·block``."""
    t = x.shape[-2]
    n = -(-t // block)
    pad = [(0, 0)] * x.ndim
    pad[-2] = (0, n * block - t)
    x = jnp.pad(x, pad).reshape(x.shape[:-2] + (n, block, x.shape[-1]))
    return jnp.moveaxis(x, -3, 0)


def _from_blocks(x: Array, t: int) -> Array:
    """Inverse of :func:`_to_blocks`: ``[n, ..., block, F] -> [..., T, F]``."""
    x = jnp.moveaxis(x, 0, -3)
    return x.reshape(x.shape[:-3] + (-1, x.shape[-1]))[..., :t, :]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _scores(q, k, v, block: int):
    """float32 energies; ``block`` queries at a time when ``block < T``."""
    if block >= q.shape[-2]:
        return _energies(q, k, v)
    blocks = jax.lax.map(lambda qb: _energies(qb, k, v), _to_blocks(q, block))
    return _from_blocks(blocks, q.shape[-2])


def _scores_fwd(q, k, v, block):
    # The residuals are the inputs only: no [..., T, S, A] tensor outlives the forward pass.
    return _scores(q, k, v, block), (q, k, v)


def _scores_bwd(block, res, g):
    q, k, v = res
    if block >= q.shape[-2]:
        return _block_grads(q, k, v, g)

    def body(carry, xs):
        dk, dv = carry
        dq_b, dk_b, dv_b = _block_grads(xs[0], k, v, xs[1])
        return (dk + dk_b, dv + dv_b), dq_b

    # Padded queries get a zero cotangent, so they add nothing to dk and dv.
    (dk, dv), dq = jax.lax.scan(
        body, (jnp.zeros_like(k), jnp.zeros_like(v)), (_to_blocks(q, block), _to_blocks(g, block))
    )
    return _from_blocks(dq, q.shape[-2]), dk, dv


_scores.defvjp(_scores_fwd, _scores_bwd)


def fused_additive_scores(
    q_proj: Float[Array, "... T A"],
    k_proj: Float[Array, "... S A"],
    v: Float[Array, " A"],
    bias: Float[Array, " A"] | None = None,
    *,
    block_size: int | None = None,
) -> Float[Array, "... T S"]:
    r"""Additive energies ``e_ij = vᵀ tanh(q_i + k_j + b)`` with a memory-lean, tanh-recomputing backward.

    .. math:: e_{ij} = \sum_a v_a \tanh(q_{ia} + k_{ja} + b_a)

    Bahdanau, Cho & Bengio 2015, appendix A.1.2, with ``q_i = W_a s_{i-1}`` and ``k_j = U_a h_j`` already
    projected. The value equals the plain formula; the gradient is a ``jax.custom_vjp`` whose only residuals
    are the inputs, so reverse mode never stores the ``[..., T, S, A]`` tanh (see the module docstring).
    Everything is computed and accumulated in float32; gradients are returned in the inputs' dtypes. For
    weight-normalised ``v`` (tf/nmt ``normed_bahdanau``) pass the effective ``g · v / ‖v‖``. Forward-mode
    autodiff (``jax.jvp``) is not supported.

    Args:
      q_proj: projected queries ``[..., T, A]``.
      k_proj: projected keys ``[..., S, A]``; leading axes broadcast against ``q_proj``'s.
      v: the scoring vector ``[A]``.
      bias: optional ``b [A]`` added inside the tanh.
      block_size: queries per block; default: as many as keep one ``[..., block, S, A]`` float32 tensor
        within 2**20 elements, split evenly. A step of a decoder scan (``T = 1``) is always one block.

    Returns:
      float32 energies ``[..., T, S]`` (leading axes broadcast).

    >>> q, k, v = jnp.zeros((2, 3)), jnp.ones((4, 3)), jnp.ones(3)
    >>> e = fused_additive_scores(q, k, v)
    >>> e.shape, round(float(e[0, 0]), 4)  # 3 · tanh(1)
    ((2, 4), 2.2848)
    >>> jax.grad(lambda v: fused_additive_scores(q, k, v).sum())(v).tolist()  # 8 · tanh(1) each
    [6.092..., 6.092..., 6.092...]
    """
    check_min_rank("q_proj", q_proj, 2)
    check_min_rank("k_proj", k_proj, 2)
    check_rank("v", v, 1)
    a = jnp.shape(v)[0]
    if jnp.shape(q_proj)[-1] != a or jnp.shape(k_proj)[-1] != a:
        raise ValueError(
            f"q_proj {shape_str(q_proj)}, k_proj {shape_str(k_proj)} and v {shape_str(v)} disagree on the "
            "alignment width A (their last axes)"
        )
    if bias is not None and jnp.shape(bias) != (a,):
        raise ValueError(f"bias must have shape [{a}], got {shape_str(bias)}")
    batch = check_broadcastable(
        ["q_proj batch axes", "k_proj batch axes"], [jnp.shape(q_proj)[:-2], jnp.shape(k_proj)[:-2]]
    )
    t, s = jnp.shape(q_proj)[-2], jnp.shape(k_proj)[-2]
    if block_size is None and t == 1:  # a decoder step, whatever the batch (symbolic under jax.export)
        block_size = 1
    elif block_size is None:
        widest = max(1, _BLOCK_ELEMENTS // max(1, math.prod(batch) * s * a))
        block_size = -(-t // -(-t // widest)) if t else 1  # equal blocks: the least padding
    else:
        block_size = positive_int("block_size", block_size)
    q = jnp.asarray(q_proj, jnp.float32)
    if bias is not None:
        q = q + jnp.asarray(bias, jnp.float32)  # outside the custom_vjp: db = Σ dq comes from autodiff
    return _scores(q, jnp.asarray(k_proj, jnp.float32), jnp.asarray(v, jnp.float32), min(block_size, t))
