"""The one tolerance for comparing two float32 programs that agree mathematically (policy: tests/conftest.py).

Two such programs (jit vs eager, padded vs truncated, fused vs plain, vmap vs loop, sharded vs single device,
traced vs static, ours vs a float32 peer) round differently: XLA sums in an order set by the vector width of the
CPU (16 float32 lanes with AVX-512, 8 with AVX2, 4 with SSE) and by fusion, contracts some multiply-adds into FMAs
and not others, and evaluates exp/tanh/log with vectorised approximations a few ulps from each other. So the
difference between them is float32 rounding, and this module states how large rounding may be, once:

    tol(n) = max(FLOOR, C · eps32 · √n),  eps32 = 2⁻²³ ≈ 1.19e-7,  C = 8,  FLOOR = 1e-5
    pass iff  |actual − desired| ≤ tol(n) · (max|desired| + |desired|)  for every entry

* ``n`` (``reduction``) is the number of float32 terms summed on the longest chain from inputs to the output
  (the sum of the lengths of the chained reductions: a projection over D, then a softmax and a context over S:
  D + 2S). Reordering a sum of n terms changes it by about eps32 · √n times the size of its terms: the rounding
  errors of the n additions are independent and add like a random walk (Higham, *Accuracy and Stability of
  Numerical Algorithms*, 2002, §2.8 and §4.2; Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019). The worst-case
  bound n · eps32 is never reached on test data and would hide real bugs for long sums. C = 8 covers the two
  programs' independent errors (√2) with a margin of ~5 standard deviations over the largest of thousands of
  compared entries.
* ``FLOOR`` = 1e-5 (~84 ulps) covers the short-reduction regime, where the differences come from elsewhere: a few
  ulps of exp/tanh/log amplified by the softmax (a logit error δ becomes a relative weight error δ, and
  δ ≈ eps32 · |logit|, ~10 ulps for logits of ~10) through a handful of chained stages (projection, tanh,
  softmax, context). It equals the tolerance the float64-reference comparisons use in float32, so two float32
  programs are never held closer to each other than each is to the truth. The floor wins while n ≲ 110.
* The absolute part, ``tol · max|desired|`` per array (or ``tol · scale``), judges every entry against the size of
  the array: float32 rounding of a sum is relative to its terms, not to its result, so entries that are sums of
  cancelling terms (gradients, FlashAttention's dS = P(dP − D), a context near zero) would fail a purely
  elementwise rtol by chance. Measured: a traced-vs-static ``scale`` context entry of 0.009 moved by 2.5e-7 on
  AVX-512 (elementwise 1.2e-5, 6e-7 of the array's largest entry). An all-zero ``desired`` must match exactly.

A real bug moves results by far more: a wrong mask, scale or axis by O(1), a dropped bias term by ~1e-1, a 1e-3
relative error fails (tests/test_tolerance.py checks both sides).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2⁻²³: the spacing of float32 numbers at 1
C = 8
FLOOR = 1e-5


def f32_tol(reduction: int) -> float:
    """Relative tolerance between two float32 programs whose longest summation chain has ``reduction`` terms."""
    if not isinstance(reduction, int | np.integer) or reduction < 1:
        raise ValueError(f"reduction must be a positive int (terms summed), got {reduction!r}")
    return max(FLOOR, C * EPS32 * math.sqrt(reduction))


def _as_float(x, what):
    a = np.asarray(x)
    if jnp.issubdtype(a.dtype, jnp.floating) and jnp.finfo(a.dtype).bits < 32:  # bfloat16 is not kind "f"
        raise TypeError(
            f"{what} is {a.dtype}: f32 tolerances do not apply; state a low-precision one with a why"
        )
    return a.astype(np.float64)


def assert_close_f32(actual, desired, *, reduction: int, scale: float | None = None, err_msg: str = ""):
    """Assert two float32 programs' results (arrays or pytrees of them) agree to float32 rounding.

    Args:
      actual, desired: arrays, or pytrees with the same structure (compared leaf by leaf; ``None`` leaves must
        match).
      reduction: terms summed on the longest chain from inputs to the output (see the module docstring).
      scale: the magnitude the absolute tolerance is relative to; default ``max|desired|`` over the finite entries
        of each leaf (inf and NaN must sit at the same places in both, as in ``assert_allclose``). Pass it
        when the array's own maximum is not the size of the terms that were summed (e.g. an array that is all
        near zero by cancellation).
      err_msg: prefixed to the failure message.
    """
    tol = f32_tol(reduction)
    a_leaves, a_tree = jax.tree.flatten(actual)
    d_leaves, d_tree = jax.tree.flatten(desired)
    if a_tree != d_tree:
        raise AssertionError(f"{err_msg}: pytree structures differ: {a_tree} vs {d_tree}")
    for i, (a, d) in enumerate(zip(a_leaves, d_leaves, strict=True)):
        a, d = _as_float(a, "actual"), _as_float(d, "desired")
        if a.shape != d.shape:
            raise AssertionError(f"{err_msg}: leaf {i} shapes differ: {a.shape} vs {d.shape}")
        # Non-finite entries (a -inf score of an empty slot) must match exactly and do not set the scale.
        finite = np.abs(d[np.isfinite(d)])
        size = float(np.max(finite, initial=0.0)) if scale is None else float(scale)
        where = f"leaf {i + 1} of {len(a_leaves)}: " if len(a_leaves) > 1 else ""
        np.testing.assert_allclose(
            a,
            d,
            rtol=tol,
            atol=tol * size,
            err_msg=f"{err_msg} {where}float32 tolerance {tol:.2g} (reduction {reduction}) relative to each "
            f"entry and to the scale {size:.3g}",
        )
