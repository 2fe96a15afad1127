"""The float32 tolerance helper fails for real differences and passes for rounding-level ones."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from tests.tolerance import EPS32, FLOOR, assert_close_f32, f32_tol


def test_formula():
    assert EPS32 == 2.0**-23
    assert f32_tol(1) == f32_tol(100) == FLOOR == 1e-5  # short reductions: the floor
    assert f32_tol(4096) == pytest.approx(8 * 2.0**-23 * 64)  # 6.1e-5
    assert all(f32_tol(n) <= f32_tol(n + 1) for n in range(1, 2000))
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="positive int"):
            f32_tol(bad)


# 1e-4 only for short reductions: at n = 4096 the tolerance is 6.1e-5 of each entry plus 6.1e-5 of the scale.
@pytest.mark.parametrize("n, rel", [(1, 1e-3), (7, 1e-3), (4096, 1e-3), (1, 1e-4), (100, 1e-4)])
def test_fails_for_a_real_difference(n, rel):
    desired = np.random.default_rng(0).normal(size=(5, 9)).astype(np.float32)
    off = desired.copy()
    off[2, 3] += rel * np.abs(desired).max()  # one entry off by `rel` of the array's size
    with pytest.raises(AssertionError, match="float32 tolerance"):
        assert_close_f32(off, desired, reduction=n)
    everywhere = desired * np.float32(1 + rel)
    with pytest.raises(AssertionError):
        assert_close_f32(everywhere, desired, reduction=n)


@pytest.mark.parametrize("n", [7, 128, 4096])
def test_passes_for_float32_sums_in_different_orders(n):
    # The same 64 sums of n float32 terms, in the three orders a CPU may pick: sequential, NumPy's pairwise, and
    # exactly rounded (float64, then one rounding). Positive terms (a softmax denominator) and mixed signs.
    x = np.random.default_rng(n).normal(size=(64, n)).astype(np.float32)
    for terms in (x, np.abs(x), x * np.exp(x)):
        sequential = np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]
        pairwise = np.sum(terms, axis=1, dtype=np.float32)
        exact = np.sum(terms.astype(np.float64), axis=1).astype(np.float32)
        assert_close_f32(sequential, pairwise, reduction=n)
        assert_close_f32(sequential, exact, reduction=n)
        assert_close_f32(pairwise, exact, reduction=n)


def test_passes_for_a_few_ulps_of_transcendentals_through_a_softmax():
    # tanh and exp a few ulps apart (as two vectorised approximations are), then a softmax over logits of ~10.
    rng = np.random.default_rng(1)
    logits = (10 * np.tanh(rng.normal(size=(32, 17)))).astype(np.float32)
    ulps = rng.integers(-4, 5, size=logits.shape)
    nudged = (logits * (1 + ulps * EPS32)).astype(np.float32)

    def softmax(e):
        z = np.exp(e - e.max(-1, keepdims=True), dtype=np.float32)
        return z / z.sum(-1, keepdims=True, dtype=np.float32)

    assert_close_f32(softmax(nudged), softmax(logits), reduction=17)


def test_entries_near_zero_are_judged_against_the_array_scale():
    desired = np.array([1.0, -0.5, 1e-3], np.float32)  # the last entry: a sum that cancelled
    assert_close_f32(desired + np.array([0, 0, 5e-7], np.float32), desired, reduction=7)  # elementwise 5e-4
    with pytest.raises(AssertionError):
        assert_close_f32(desired + np.array([0, 0, 1e-4], np.float32), desired, reduction=7)
    # An explicit scale replaces max|desired|.
    with pytest.raises(AssertionError):
        assert_close_f32(desired + np.array([0, 0, 5e-7], np.float32), desired, reduction=7, scale=1e-3)


def test_all_zero_desired_must_match_exactly():
    zeros = np.zeros((3, 4), np.float32)
    assert_close_f32(zeros, zeros, reduction=7)
    with pytest.raises(AssertionError):
        assert_close_f32(zeros + np.float32(1e-30), zeros, reduction=7)


def test_non_finite_entries_match_exactly_and_do_not_set_the_scale():
    desired = np.array([-np.inf, 1.0, np.nan], np.float32)
    assert_close_f32(desired, desired, reduction=7)
    with pytest.raises(AssertionError):  # an infinite entry must not make every finite difference pass
        assert_close_f32(np.array([-np.inf, 2.0, np.nan], np.float32), desired, reduction=7)
    with pytest.raises(AssertionError):
        assert_close_f32(np.array([0.0, 1.0, np.nan], np.float32), desired, reduction=7)


def test_pytrees_leaf_by_leaf():
    a = {"w": np.ones((2, 3), np.float32), "b": None, "g": (jnp.zeros(2), jnp.full((1,), 100.0))}
    assert_close_f32(a, a, reduction=3)
    b = {"w": np.ones((2, 3), np.float32), "b": None, "g": (jnp.zeros(2), jnp.full((1,), 100.1))}
    with pytest.raises(AssertionError, match="leaf 2 of 3"):
        assert_close_f32(b, a, reduction=3)
    with pytest.raises(AssertionError, match="structures differ"):
        assert_close_f32({"w": a["w"]}, a, reduction=3)
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_close_f32(np.ones(3), np.ones(4), reduction=3)


def test_refuses_low_precision():
    x = jnp.ones(3, jnp.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        assert_close_f32(x, x, reduction=3)
    assert math.isfinite(f32_tol(10**6))
