r"""Sparse alternatives to softmax for attention weights: sparsemax and 1.5-entmax, with their exact Jacobians.

Both map scores ``z`` to a probability vector that can hold exact zeros, so an alignment can ignore source words
outright instead of giving each a small positive weight:

* **sparsemax** (Martins & Astudillo, "From Softmax to Sparsemax", ICML 2016): the Euclidean projection of ``z``
  onto the simplex, ``p = argmin_{p ∈ Δ} ‖p − z‖² = [z − τ]₊``;
* **1.5-entmax** (Peters, Niculae & Martins, "Sparse Sequence-to-Sequence Models", ACL 2019):
  ``p = argmax_{p ∈ Δ} pᵀz + H^T_{1.5}(p) = [z/2 − τ]₊²``, between softmax (α = 1) and sparsemax (α = 2) in
  sparsity.

The threshold ``τ`` is found exactly by sorting (Martins & Astudillo, algorithm 1; Peters et al., algorithm 2),
not by bisection. The backward passes are the closed forms (``jax.custom_vjp``), so reverse mode never
differentiates through the sort: with ``s`` the support indicator (sparsemax) or ``s = √p`` (entmax),

.. math:: \frac{\partial \ell}{\partial z} = s \odot \Big(g - \frac{\sum_j s_j g_j}{\sum_j s_j}\Big)

Both follow the numerics policy of ``_softmax.py``: computed in float32 whatever the input dtype;
:func:`masked_normalize` gives masked positions exactly 0 and a fully masked row all zeros with finite gradients.
Forward-mode autodiff (``jax.jvp``) is not defined for a ``custom_vjp``; use reverse mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attn_jax.attention._checks import check_mask, shape_str
from attn_jax.attention._padding import zero_masked_keys
from attn_jax.attention._softmax import attend, masked_softmax, weighted_context
from attn_jax.typing import Array, Bool, Float

__all__ = ["NORMALIZERS", "check_normalizer", "entmax15", "masked_normalize", "sparsemax"]

NORMALIZERS: tuple[str, ...] = ("softmax", "sparsemax", "entmax15")
"""The accepted ``normalizer=`` names: ``"softmax"`` (the default everywhere), ``"sparsemax"``, ``"entmax15"``."""


def check_normalizer(normalizer) -> str:
    """Return ``normalizer`` if it is one of :data:`NORMALIZERS`, else raise a ``ValueError`` naming them."""
    if not isinstance(normalizer, str) or normalizer not in NORMALIZERS:
        raise ValueError(f"normalizer must be one of {', '.join(map(repr, NORMALIZERS))}; got {normalizer!r}")
    return normalizer


def _descending(z: Float[Array, "... S"]) -> Float[Array, "... S"]:
    """``z`` sorted largest first along the last axis."""
    return -jnp.sort(-z, axis=-1)


def _sparsemax_forward(z: Float[Array, "... S"]) -> Float[Array, "... S"]:
    """Sparsemax over the last axis of float32 ``z`` (Martins & Astudillo 2016, algorithm 1)."""
    z = z - jnp.max(z, axis=-1, keepdims=True)  # shift-invariant; keeps the cumulative sums small
    zs = _descending(z)
    k = jnp.arange(1, z.shape[-1] + 1, dtype=jnp.float32)
    cs = jnp.cumsum(zs, axis=-1)
    # k(z) = max{k : 1 + k z_(k) > Σ_{j<=k} z_(j)}; the condition holds exactly for k = 1..k(z)
    size = jnp.sum(1.0 + k * zs > cs, axis=-1, keepdims=True)
    tau = (jnp.take_along_axis(cs, size - 1, axis=-1) - 1.0) / size.astype(jnp.float32)
    return jnp.maximum(z - tau, 0.0)


@jax.custom_vjp
def _sparsemax_last(z: Float[Array, "... S"]) -> Float[Array, "... S"]:
    """Sparsemax over the last axis of float32 ``z`` with the closed-form VJP."""
    return _sparsemax_forward(z)


def _sparsemax_fwd(z):
    p = _sparsemax_forward(z)
    return p, p


def _sparsemax_bwd(p, g):
    # J = diag(s) − s sᵀ/|S| with s the support indicator: g minus its mean over the support, on the support
    s = (p > 0).astype(jnp.float32)
    mean = jnp.sum(g * s, axis=-1, keepdims=True) / jnp.sum(s, axis=-1, keepdims=True)
    return (s * (g - mean),)


_sparsemax_last.defvjp(_sparsemax_fwd, _sparsemax_bwd)


def _entmax15_forward(z: Float[Array, "... S"]) -> Float[Array, "... S"]:
    """1.5-entmax over the last axis of float32 ``z`` (Peters et al. 2019, algorithm 2, exact by sorting)."""
    x = z / 2
    x = x - jnp.max(x, axis=-1, keepdims=True)  # τ ∈ [−1, 0): the support's values are O(1), no cancellation
    xs = _descending(x)
    rho = jnp.arange(1, z.shape[-1] + 1, dtype=jnp.float32)
    mean = jnp.cumsum(xs, axis=-1) / rho
    mean_sq = jnp.cumsum(xs * xs, axis=-1) / rho
    # τ_k solves Σ_{j<=k} (x_(j) − τ)² = 1 for the top k: τ_k = mean_k − √((1 − k·var_k) / k)
    delta = (1.0 - rho * (mean_sq - mean * mean)) / rho
    tau = mean - jnp.sqrt(jnp.maximum(delta, 0.0))
    size = jnp.sum(tau <= xs, axis=-1, keepdims=True)
    tau_star = jnp.take_along_axis(tau, size - 1, axis=-1)
    return jnp.square(jnp.maximum(x - tau_star, 0.0))


@jax.custom_vjp
def _entmax15_last(z: Float[Array, "... S"]) -> Float[Array, "... S"]:
    """1.5-entmax over the last axis of float32 ``z`` with the closed-form VJP."""
    return _entmax15_forward(z)


def _entmax15_fwd(z):
    p = _entmax15_forward(z)
    return p, p


def _entmax15_bwd(p, g):
    # Peters et al. 2019, §3: J = diag(s) − s sᵀ / Σ s with s = √p (p^{2−α} for α = 1.5)
    s = jnp.sqrt(p)
    q = jnp.sum(g * s, axis=-1, keepdims=True) / jnp.sum(s, axis=-1, keepdims=True)
    return (s * (g - q),)


_entmax15_last.defvjp(_entmax15_fwd, _entmax15_bwd)


def _apply(last_axis_fn, x, axis: int, name: str):
    """Run ``last_axis_fn`` over ``axis`` of ``x`` in float32; return the result in ``x``'s dtype."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} needs floating-point scores, got dtype {x.dtype}")
    if x.ndim == 0:
        raise ValueError(f"{name} needs at least one axis to normalise over, got shape {shape_str(x)}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{name}: axis {axis} is out of range for shape {shape_str(x)}")
    if x.shape[axis] == 0:
        return x
    z = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    return jnp.moveaxis(last_axis_fn(z), -1, axis).astype(x.dtype)


def sparsemax(x: Float[Array, "... S"], axis: int = -1) -> Float[Array, "... S"]:
    r"""Sparsemax: the Euclidean projection of ``x`` onto the probability simplex along ``axis``.

    .. math:: \operatorname{sparsemax}(z) = \arg\min_{p \in \Delta} \|p - z\|^2 = [z - \tau(z)]_+, \qquad
        \tau = \frac{\sum_{j \le k(z)} z_{(j)} - 1}{k(z)}, \quad
        k(z) = \max\{k : 1 + k z_{(k)} > \textstyle\sum_{j \le k} z_{(j)}\}

    Martins & Astudillo, "From Softmax to Sparsemax: A Sparse Model of Attention and Multi-Label
    Classification", ICML 2016 (algorithm 1, by sorting; the Jacobian of their eq. 12 as the ``custom_vjp``:
    ``g`` minus its mean over the support, on the support). Entries at or below ``τ`` get exactly 0.

    Args:
      x: finite scores ``[..., S]``, any float dtype (computed in float32).
      axis: the axis normalised over.

    Returns:
      weights of ``x``'s shape and dtype: non-negative, summing to 1 over ``axis``, with exact zeros.

    >>> sparsemax(jnp.array([1.0, 0.5, -1.0]))
    Array([0.75, 0.25, 0.  ], dtype=float32)
    """
    return _apply(_sparsemax_last, x, axis, "sparsemax")


def entmax15(x: Float[Array, "... S"], axis: int = -1) -> Float[Array, "... S"]:
    r"""1.5-entmax along ``axis``: sparse like sparsemax, smoother like softmax.

    .. math:: \operatorname{entmax}_{1.5}(z) = \arg\max_{p \in \Delta} p^\top z + H^T_{1.5}(p)
        = \big[\tfrac{z}{2} - \tau\big]_+^2, \qquad \textstyle\sum_j [\tfrac{z_j}{2} - \tau]_+^2 = 1

    Peters, Niculae & Martins, "Sparse Sequence-to-Sequence Models", ACL 2019: ``τ`` exactly by sorting
    (their algorithm 2), and the Jacobian ``diag(s) − s sᵀ / Σ s`` with ``s = √p`` as the ``custom_vjp``.

    Args:
      x: finite scores ``[..., S]``, any float dtype (computed in float32).
      axis: the axis normalised over.

    Returns:
      weights of ``x``'s shape and dtype: non-negative, summing to 1 over ``axis``, with exact zeros.

    >>> [round(float(w), 3) for w in entmax15(jnp.array([1.0, 0.5, -1.0]))]
    [0.674, 0.326, 0.0]
    """
    return _apply(_entmax15_last, x, axis, "entmax15")


def masked_normalize(
    logits: Float[Array, "... T S"],
    mask: Bool[Array, "... T S"] | None = None,
    axis: int = -1,
    *,
    normalizer: str = "softmax",
) -> Float[Array, "... T S"]:
    """Normalise ``logits`` over ``axis`` with softmax, sparsemax or 1.5-entmax under a boolean mask; float32.

    ``normalizer="softmax"`` is exactly :func:`masked_softmax` (the same program). For ``"sparsemax"`` and
    ``"entmax15"`` the policy is the same: masked positions get exactly 0, a row with no valid key gets all
    zeros, gradients are finite everywhere and exactly 0 for masked logits. Masked logits are replaced by a
    value below every threshold (``max − 4 − |max|`` over the row's valid logits), never by ``finfo.min``,
    whose sums in the sorted cumulative sum would overflow; a ``-inf`` logit counts as masked.

    Args:
      logits: energies ``[..., T, S]``, any float dtype (computed in float32).
      mask: boolean, broadcastable to ``logits``; True = may attend. ``None`` attends everywhere. A float or
        integer mask is refused (``ValueError``).
      axis: the axis normalised over (the source axis, the last one, in attention).
      normalizer: one of :data:`NORMALIZERS`; anything else is a ``ValueError`` naming them.

    Returns:
      float32 weights of ``logits``' shape; each row with a valid key sums to 1 over ``axis``.

    >>> e = jnp.array([[2.0, 0.5, -1.0]])
    >>> masked_normalize(e, jnp.array([[True, True, False]]), normalizer="sparsemax")
    Array([[1., 0., 0.]], dtype=float32)
    """
    name = check_normalizer(normalizer)
    if name == "softmax":
        return masked_softmax(logits, mask, axis)
    fn = sparsemax if name == "sparsemax" else entmax15
    logits = jnp.asarray(logits, jnp.float32)
    check_mask(mask, logits.shape, what="logits")
    # exp(-inf) = 0 in a softmax: the sparse normalisers treat -inf as masked (NaN != -inf: a NaN stays visible)
    valid = logits != -jnp.inf
    if mask is not None:
        valid = valid & jnp.broadcast_to(mask, logits.shape)
    top = jnp.max(jnp.where(valid, logits, -jnp.inf), axis=axis, keepdims=True)
    top = jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))  # 0 for a row with no valid key
    # top − 4 is below both thresholds (sparsemax: τ >= max − 1; entmax: τ >= max/2 − 1); − |top| keeps the
    # gap representable in float32 when the logits are large
    weights = fn(jnp.where(valid, logits, top - 4.0 - jnp.abs(top)), axis)
    return jnp.where(valid, weights, 0.0)


def attend_normalized(
    logits: Float[Array, "... T S"],
    values: Float[Array, "... S Dv"],
    mask: Bool[Array, "... T S"] | None = None,
    *,
    normalizer: str = "softmax",
) -> tuple[Float[Array, "... T Dv"], Float[Array, "... T S"]]:
    """``attend`` with a choice of normaliser: ``(context, float32 weights)``; ``"softmax"`` is ``attend`` itself."""
    name = check_normalizer(normalizer)
    if name == "softmax":
        return attend(logits, values, mask)
    weights = masked_normalize(logits, mask, -1, normalizer=name)
    # a value row no query may attend (padding) gets weight 0, but 0 · NaN is NaN: zero it first
    return weighted_context(weights, zero_masked_keys(values, mask)), weights
