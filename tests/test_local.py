"""Luong's local attention (local-m, local-p) against float64 loop references, hand cases and properties.

No peer library implements it, so the hand-computed windows below and the loop reference are the ground truth.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from attn_jax.attention._local import (
    init_local_p_params,
    local_attention,
    local_window_mask,
    monotonic_centers,
    predictive_centers,
)
from attn_jax.attention._luong import dot_scores
from attn_jax.attention._softmax import assert_valid_attention_weights
from tests.reference.core import softmax_ref
from tests.reference.scorers import local_ref, monotonic_centers_ref, predictive_centers_ref, rel_err
from tests.tolerance import assert_close_f32

B, T, S, DQ, DV, A, D = 3, 5, 9, 11, 7, 15, 2
LENGTHS = np.array([9, 4, 0])
# Longest float32 summation chain (the centre's v_pᵀ tanh(W_p h) over Dq and A, the softmax and context over S):
# the reduction length for comparing two float32 programs.
REDUCTION = DQ + A + 2 * S


@functools.cache
def _local(window, gaussian):
    """Jitted ``(context, weights)`` for one (window, gaussian) setting; compiled once per shape."""
    return jax.jit(
        lambda e, v, p, m: local_attention(
            e, v, p, window=window, mask=m, gaussian=gaussian, return_weights=True
        )
    )


_centers_p = jax.jit(predictive_centers)


def _length_mask(lengths, s=S):
    return (jnp.arange(s)[None, :] < jnp.asarray(lengths)[:, None])[:, None, :]  # [B, 1, S]


def _inputs(rng, b=B, t=T, s=S):
    scores = (3.0 * rng.normal(size=(b, t, s))).astype(np.float32)
    values = rng.normal(size=(b, s, DV)).astype(np.float32)
    return scores, values


def _gaussian(centers, s, window):
    """``exp(-(s - p_t)² / (2σ²))``, σ = D/2, as ``[..., T, S]`` in float64."""
    offset = np.arange(s)[None, :] - np.asarray(centers, np.float64)[..., None]
    return np.exp(-(offset**2) / (2 * (window / 2) ** 2))


# --- hand-computed cases ------------------------------------------------------------------------------------


def test_hand_computed_local_m_and_local_p():
    scores = jnp.arange(7.0)[None]  # e_s = s
    values = jnp.eye(7)  # the context is the weight vector itself
    # local-m, p = 3, D = 1: window {2, 3, 4}; softmax(2, 3, 4) = (e^-2, e^-1, 1) / (e^-2 + e^-1 + 1)
    # = (0.090031, 0.244728, 0.665241), zero elsewhere.
    ctx, w = _local(1, False)(scores, values, jnp.array([3.0]), None)
    expected_m = [0, 0, 0.090031, 0.244728, 0.665241, 0, 0]
    np.testing.assert_allclose(w[0], expected_m, atol=1e-6)
    np.testing.assert_allclose(ctx[0], expected_m, atol=1e-6)
    # local-p, p = 2.6, D = 1 (σ = 0.5): window around round(2.6) = 3 is again {2, 3, 4}; the softmax above is
    # multiplied by exp(-(s - 2.6)² / 0.5) = exp(-0.72), exp(-0.32), exp(-3.92) = 0.486752, 0.726149, 0.019841
    # -> (0.043823, 0.177709, 0.013199); the row sums to 0.234731, not 1 (Luong's Gaussian is not renormalised).
    _, w = _local(1, True)(scores, values, jnp.array([2.6]), None)
    np.testing.assert_allclose(w[0], [0, 0, 0.043823, 0.177709, 0.013199, 0, 0], atol=1e-6)
    # Window clipped at the ends: p = 0, D = 2 -> {0, 1, 2}; p = 6.4 -> round 6 -> {4, 5, 6}.
    np.testing.assert_array_equal(
        local_window_mask(jnp.array([0.0, 6.4, 2.5]), 7, window=2),
        [[1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1, 0]],  # round(2.5) = 3 (half up)
    )
    # A padding mask inside the window: p = 3, D = 1, key 4 padded -> softmax(2, 3) = (0.268941, 0.731059).
    _, w = _local(1, False)(scores, values, jnp.array([3.0]), jnp.arange(7)[None] < 4)
    np.testing.assert_allclose(w[0], [0, 0, 0.268941, 0.731059, 0, 0, 0], atol=1e-6)


def test_centers_hand_cases():
    np.testing.assert_array_equal(monotonic_centers(4), [0, 1, 2, 3])
    np.testing.assert_array_equal(
        monotonic_centers(4, jnp.array([2, 9, 0])), [[0, 1, 1, 1], [0, 1, 2, 3], [0, 0, 0, 0]]
    )
    # Zero predictor: sigmoid(0) = 1/2, so p_t = (len - 1) / 2: the middle valid position.
    zero = {"w_p": jnp.zeros((2, 3)), "v_p": jnp.zeros(3)}
    np.testing.assert_array_equal(
        _centers_p(zero, jnp.ones((2, 4, 2)), jnp.array([9, 1])), [[4.0] * 4, [0.0] * 4]
    )
    # v_pᵀ tanh(W_p h) = 1 · tanh(atanh(0.5)) · 2 = 1 -> p = 8 · sigmoid(1) = 8 · 0.731059 = 5.848469.
    one = {"w_p": jnp.array([[np.arctanh(0.5)]]), "v_p": jnp.array([2.0])}
    np.testing.assert_allclose(_centers_p(one, jnp.ones((1, 1)), 9), [5.848469], rtol=1e-6)


# --- float64 references -------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_centers_match_reference(key, rng):
    lengths = np.array([9, 4, 0])
    np.testing.assert_array_equal(monotonic_centers(T, lengths), monotonic_centers_ref(T, lengths))
    params = init_local_p_params(key, DQ, A)
    q = rng.normal(size=(B, T, DQ)).astype(np.float32)
    p = _centers_p(params, q, lengths)
    p_ref = predictive_centers_ref(q, params["w_p"], params["v_p"], lengths)
    assert p.dtype == jnp.float32 and p.shape == (B, T)
    assert rel_err(p, p_ref) < 1e-5
    assert_close_f32(predictive_centers(params, q, lengths), p, reduction=DQ + A)  # eager == jit
    assert np.all(p >= 0) and np.all(p <= np.maximum(lengths - 1, 0)[:, None])
    # An int length is broadcast to every sentence.
    assert (
        rel_err(_centers_p(params, q, 6), predictive_centers_ref(q, params["w_p"], params["v_p"], 6)) < 1e-5
    )


@pytest.mark.parametrize("gaussian", [False, True], ids=["local_m", "local_p"])
def test_matches_float64_reference(gaussian, key, rng):
    scores, values = _inputs(rng)
    mask = _length_mask(LENGTHS)
    if gaussian:
        params = init_local_p_params(key, DQ, A)
        centers = _centers_p(params, rng.normal(size=(B, T, DQ)).astype(np.float32), LENGTHS)
    else:
        centers = monotonic_centers(T, LENGTHS)
    ctx, w = _local(D, gaussian)(scores, values, centers, mask)
    ctx_ref, w_ref = local_ref(scores, values, centers, D, mask, gaussian)
    assert rel_err(w, w_ref) < 1e-5
    assert rel_err(ctx, ctx_ref) < 1e-5
    assert ctx.dtype == jnp.float32 and w.dtype == jnp.float32


# --- properties ---------------------------------------------------------------------------------------------


@st.composite
def _case(draw):
    lengths = np.array(draw(st.lists(st.integers(0, S), min_size=B, max_size=B)))
    centers = np.array(draw(st.lists(st.floats(-2.0, S + 1.0, width=32), min_size=B * T, max_size=B * T)))
    return (
        lengths,
        centers.reshape(B, T).astype(np.float32),
        draw(st.integers(1, 3)),
        draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=20)
@given(_case())
def test_window_properties(case):
    lengths, centers, window, seed = case
    rng = np.random.default_rng(seed)
    scores, values = _inputs(rng)
    mask = np.asarray(_length_mask(lengths))
    in_window = np.abs(np.arange(S) - np.floor(centers + 0.5)[..., None]) <= window
    allowed = in_window & mask  # [B, T, S]

    # local-m: zero outside the window and on padding; each row with an allowed key sums to 1 over the SOURCE
    # axis (T = 5 != S = 9); a row whose window holds no valid key is all zeros.
    ctx_m, w_m = _local(window, False)(scores, values, centers, mask)
    assert np.all(np.asarray(w_m)[~in_window] == 0.0)
    assert_valid_attention_weights(w_m, allowed)
    assert np.all(np.asarray(ctx_m)[~allowed.any(-1)] == 0.0)

    # local-p: exactly softmax-in-window times the Gaussian.
    _, w_p = _local(window, True)(scores, values, centers, mask)
    expected = softmax_ref(scores, allowed) * _gaussian(centers, S, window)
    np.testing.assert_allclose(w_p, expected, rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(w_p).sum(-1) <= 1.0 + 1e-6)

    # Scores and values outside window ∩ mask are invisible.
    scores2, values2 = scores.copy(), values.copy()
    scores2[~allowed] = 1e4 * rng.normal(size=scores2[~allowed].shape)
    values2[np.arange(S)[None, :] >= lengths[:, None]] = 1e3
    ctx_m2, w_m2 = _local(window, False)(scores2, values2, centers, mask)
    # The same compiled program, and what it may not see contributes exact zeros: bitwise equal.
    np.testing.assert_array_equal(w_m2, w_m)
    np.testing.assert_array_equal(ctx_m2, ctx_m)

    assert rel_err(w_m, local_ref(scores, values, centers, window, mask, False)[1]) < 1e-5


@pytest.mark.numerics
def test_padded_equals_truncated(rng):
    scores, values = _inputs(rng)
    centers = monotonic_centers(T, LENGTHS)
    ctx, w = _local(D, True)(scores, values, centers, _length_mask(LENGTHS))
    n = int(LENGTHS[1])
    ctx_t, w_t = _local(D, True)(scores[1, :, :n], values[1, :n], centers[1], None)
    assert_close_f32((w[1, :, :n], ctx[1]), (w_t, ctx_t), reduction=REDUCTION)  # two programs
    assert np.all(np.asarray(w[1, :, n:]) == 0) and np.all(np.asarray(w[2]) == 0)


# --- gradients ----------------------------------------------------------------------------------------------


def test_gradient_reaches_centers_only_through_the_gaussian(rng):
    scores, values = _inputs(rng)
    # > 0.05 from every rounding boundary, and every window of sentences 1 and 2 holds a valid key (length 4).
    centers = np.array(
        [[0.3, 1.2, 2.9, 4.1, 5.6], [0.3, 1.2, 2.9, 1.6, 3.4], [0.3, 1.2, 2.9, 4.1, 5.6]], np.float32
    )
    mask = _length_mask(LENGTHS)

    def loss(p, gaussian):
        return jnp.sum(local_attention(scores, values, p, window=D, mask=mask, gaussian=gaussian) ** 2)

    g_p = jax.jit(jax.grad(lambda p: loss(p, True)))(centers)
    g_m = jax.jit(jax.grad(lambda p: loss(p, False)))(centers)
    assert np.all(np.asarray(g_m) == 0.0)  # the window itself is piecewise constant in p_t
    assert np.all(np.asarray(g_p)[:2] != 0.0) and np.all(np.asarray(g_p)[2] == 0.0)  # sentence 3 is empty
    # float32 finite differences (eps=1e-3 stays inside one window; ~1e-4 rounding noise, tolerance 1e-2).
    check_grads(
        jax.jit(lambda p: loss(p, True)), (centers,), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2
    )
    # local-m w.r.t. scores and values.
    f_m = jax.jit(lambda e, v: local_attention(e, v, centers, window=D, mask=mask, gaussian=False))
    check_grads(f_m, (scores, values), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


def test_local_p_end_to_end_grads(key, rng):
    # Position predictor -> centres -> local attention over dot scores: the predictor's params get gradients.
    params = init_local_p_params(key, DQ, A)
    q = rng.normal(size=(B, T, DQ)).astype(np.float32)
    k = rng.normal(size=(B, S, DQ)).astype(np.float32)
    v = rng.normal(size=(B, S, DV)).astype(np.float32)
    mask = _length_mask(LENGTHS)

    def f(params, q, k, v):
        p = predictive_centers(params, q, LENGTHS)
        return local_attention(dot_scores(q, k), v, p, window=D, mask=mask, gaussian=True)

    p = np.asarray(_centers_p(params, q, LENGTHS))
    assert np.min(np.abs(p - np.floor(p) - 0.5)) > 0.02, "finite differences would cross a window boundary"
    check_grads(jax.jit(f), (params, q, k, v), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)
    grads = jax.jit(jax.grad(lambda pr: jnp.sum(f(pr, q, k, v) ** 2)))(params)
    assert all(np.all(np.isfinite(g)) and np.any(g != 0) for g in jax.tree.leaves(grads))


def test_fully_masked_rows_finite_grads(rng):
    scores, values = _inputs(rng)
    centers = np.full((B, T), 20.0, np.float32)  # every window beyond the sentence
    centers[0, 0] = 1.0
    mask = _length_mask(LENGTHS)

    def loss(e, v, p):
        return jnp.sum(local_attention(e, v, p, window=D, mask=mask, gaussian=True) ** 2)

    ctx, w = _local(D, True)(scores, values, centers, mask)
    assert np.all(np.asarray(w)[:, 1:] == 0) and np.all(np.asarray(ctx)[:, 1:] == 0) and np.any(w[0, 0] != 0)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(scores, values, centers)
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.all(np.asarray(grads[0])[:, 1:] == 0)


# --- transformations ----------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_jit_and_vmap(rng):
    scores, values = _inputs(rng)
    centers = (monotonic_centers(T, LENGTHS) + 0.3).astype(jnp.float32)
    mask = _length_mask(LENGTHS)
    f = lambda e, v, p, m: local_attention(e, v, p, window=D, mask=m, gaussian=True, return_weights=True)
    eager = f(scores, values, centers, mask)
    assert_close_f32(_local(D, True)(scores, values, centers, mask), eager, reduction=REDUCTION)
    vmapped = jax.jit(jax.vmap(f))(scores, values, centers, mask)
    for i in range(B):
        one = _local(D, True)(scores[i], values[i], centers[i], mask[i])
        assert_close_f32(tuple(x[i] for x in vmapped), one, reduction=REDUCTION)


# --- low precision ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, ctx_tol",
    [
        # Scores are upcast to float32 for the softmax and the Gaussian, so the weights keep float32 accuracy
        # relative to the (rounded) inputs; only the context is rounded to the output dtype (2^-8, 2^-11).
        (jnp.bfloat16, 1e-2),
        (jnp.float16, 2e-3),
    ],
)
def test_low_precision_large_scores(dtype, ctx_tol, rng):
    scores, values = _inputs(rng)
    scores = jnp.asarray(30.0 * scores, dtype)  # energies of ~100: exp overflows fp16 and bf16 sums lose them
    values = jnp.asarray(values, dtype)
    centers = monotonic_centers(T, LENGTHS) + 0.3
    mask = _length_mask(LENGTHS)
    ctx, w = _local(D, True)(scores, values, centers, mask)
    assert ctx.dtype == dtype and w.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(ctx, np.float32))) and np.all(np.isfinite(w))
    ctx_ref, w_ref = local_ref(scores, values, centers, D, mask, True)
    assert np.max(np.abs(np.asarray(w) - w_ref)) < 1e-5
    assert rel_err(np.asarray(ctx, np.float32), ctx_ref) < ctx_tol


# --- errors -------------------------------------------------------------------------------------------------


def test_errors_name_the_shapes(key, rng):
    scores, values = _inputs(rng)
    centers = monotonic_centers(T)
    with pytest.raises(ValueError, match=r"window \(the half-width D\) must be >= 0, got -1"):
        local_attention(scores, values, centers, window=-1, gaussian=False)
    with pytest.raises(ValueError, match=r"static int"):
        local_attention(scores, values, centers, window=2.0, gaussian=False)
    with pytest.raises(ValueError, match=r"gaussian=True needs window >= 1"):
        local_attention(scores, values, centers, window=0, gaussian=True)
    with pytest.raises(ValueError, match=r"scores \[3, 5, 9\].*values \[3, 8, 7\].*disagree on S"):
        local_attention(scores, values[:, :8], centers, window=D, gaussian=False)
    with pytest.raises(ValueError, match=r"centers \[4\] must broadcast.*\[3, 5\]"):
        local_attention(scores, values, centers[:4], window=D, gaussian=False)
    with pytest.raises(ValueError, match=r"mask of shape \[3, 9, 5\].*\[3, 5, 9\]"):
        local_attention(scores, values, centers, window=D, mask=jnp.ones((B, S, T), bool), gaussian=False)
    with pytest.raises(ValueError, match=r"query_length must be a non-negative int"):
        monotonic_centers(-1)
    with pytest.raises(ValueError, match=r"source_lengths must be integers"):
        monotonic_centers(T, jnp.array([3.0, 4.0]))
    params = init_local_p_params(key, DQ, A)
    with pytest.raises(ValueError, match=r"query has 10 features.*w_p \[11, 15\]"):
        predictive_centers(params, jnp.ones((B, T, DQ - 1)), 5)
    with pytest.raises(ValueError, match=r"source_lengths \[2\].*\[3\]"):
        predictive_centers(params, jnp.ones((B, T, DQ)), jnp.array([5, 6]))
