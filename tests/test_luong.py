"""Luong's dot / general / concat / location scores and global attention against float64 loop references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from attn_jax.attention._additive import additive_scores, init_additive_params, project_keys
from attn_jax.attention._luong import (
    concat_scores,
    dot_scores,
    general_scores,
    init_general_params,
    init_location_params,
    location_scores,
    luong_attention,
)
from attn_jax.attention._softmax import assert_valid_attention_weights
from tests.reference.core import context_ref, softmax_ref
from tests.reference.scorers import (
    additive_energies_ref,
    concat_scores_ref,
    dot_scores_ref,
    general_scores_ref,
    location_scores_ref,
    rel_err,
)
from tests.tolerance import assert_close_f32

B, T, S, DQ, DK, DV, A, SMAX = 3, 5, 7, 11, 13, 9, 15, 17
LENGTHS = np.array([7, 4, 0])
SCORERS = ["dot", "general", "concat", "location"]
# Longest float32 summation chain from inputs to the context (concat: W_k h̄ over Dk, v·tanh over A, the softmax
# denominator and the context over S): the reduction length for comparing two float32 programs.
REDUCTION = DK + A + 2 * S


def _params(name, key):
    if name == "dot":
        return {}
    if name == "general":
        return init_general_params(key, DQ, DK)
    if name == "concat":
        return init_additive_params(key, DQ, DK, A, use_bias=False)  # Luong's bias-free v_aᵀ tanh(W_a[h; h̄])
    return init_location_params(key, DQ, SMAX)


def _score(name, params, q, k):
    if name == "dot":
        return dot_scores(q, k)
    if name == "general":
        return general_scores(params, q, k)
    if name == "concat":
        return concat_scores(params, q, k)
    return location_scores(params, q, k.shape[-2])


def _score_ref(name, params, q, k):
    p = {n: np.asarray(x, np.float64) for n, x in params.items()}
    if name == "dot":
        return dot_scores_ref(q, k)
    if name == "general":
        return general_scores_ref(q, k, p["w"])
    if name == "concat":
        return concat_scores_ref(q, k, p["w_q"], p["w_k"], p["v"])
    return location_scores_ref(q, p["w"], k.shape[-2])


@functools.cache
def _score_jit(name):
    """One scorer, jitted (tests avoid eager op-by-op dispatch, which compiles every primitive separately)."""
    return jax.jit(lambda p, q, k: _score(name, p, q, k))


@functools.cache
def _attn(name):
    """``(context, weights)`` for one scorer, jitted once per scorer (and per shape)."""
    return jax.jit(lambda p, q, k, v, m: luong_attention(_score(name, p, q, k), v, m, return_weights=True))


def _inputs(name, rng, b=B, t=T, s=S):
    dk = DQ if name == "dot" else DK  # dot needs equal widths
    q = rng.normal(size=(b, t, DQ)).astype(np.float32)
    k = rng.normal(size=(b, s, dk)).astype(np.float32)
    v = rng.normal(size=(b, s, DV)).astype(np.float32)
    return q, k, v


def _length_mask(lengths, s=S):
    return (jnp.arange(s)[None, :] < jnp.asarray(lengths)[:, None])[:, None, :]  # [B, 1, S]


# --- hand-computed cases ------------------------------------------------------------------------------------


def test_hand_computed_scores():
    q = jnp.array([[1.0, 2.0]])
    k = jnp.array([[3.0, 4.0], [1.0, 0.0], [0.0, -1.0]])
    # dot: 1·3 + 2·4 = 11, 1·1 + 0 = 1, 0 - 2 = -2 (no 1/√D scaling).
    np.testing.assert_array_equal(dot_scores(q, k), [[11.0, 1.0, -2.0]])
    # general with W = [[0, 1], [2, 0]]: W h̄ = (h̄_2, 2 h̄_1) -> (4, 6), (0, 2), (-1, 0); h_tᵀ W h̄ = 16, 4, -1.
    w = jnp.array([[0.0, 1.0], [2.0, 0.0]])
    np.testing.assert_array_equal(general_scores({"w": w}, q, k), [[16.0, 4.0, -1.0]])
    # location with W_a [Dq=2, Smax=4]: W_aᵀ h_t = (1·1 + 2·0, 1·0 + 2·1, 1·1 + 2·1, 1·(-1) + 2·3)
    # = (1, 2, 3, 5), of which the first S = 3 are used.
    w_loc = jnp.array([[1.0, 0.0, 1.0, -1.0], [0.0, 1.0, 1.0, 3.0]])
    np.testing.assert_array_equal(location_scores({"w": w_loc}, q, 3), [[1.0, 2.0, 3.0]])
    # luong_attention on the seed lesson's energies: weights 0.786, 0.175, 0.039 (three decimals).
    ctx, wts = luong_attention(jnp.array([[2.0, 0.5, -1.0]]), k, return_weights=True)
    np.testing.assert_allclose(wts, [[0.786, 0.175, 0.039]], atol=6e-4)
    np.testing.assert_allclose(ctx, [[0.786 * 3 + 0.175, 0.786 * 4 - 0.039]], atol=4e-3)


def test_concat_is_additive_in_float64():
    # Luong's concatenated form v_aᵀ tanh(W_a [h_t; h̄_s]) equals Bahdanau's split form vᵀ tanh(W h_t + U h̄_s)
    # with W_a = [W; U] (row-stacked): checked on the two independent float64 references.
    rng = np.random.default_rng(5)
    q, k = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 6, 5))
    w_q, w_k, v, b = rng.normal(size=(4, 7)), rng.normal(size=(5, 7)), rng.normal(size=7), rng.normal(size=7)
    np.testing.assert_allclose(
        concat_scores_ref(q, k, w_q, w_k, v, b), additive_energies_ref(q, k, w_q, w_k, v, b), rtol=1e-12
    )


# --- float64 references -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCORERS)
def test_matches_float64_reference(name, key, rng):
    params = _params(name, key)
    q, k, v = _inputs(name, rng)
    mask = _length_mask(LENGTHS)
    scores = _score_jit(name)(params, q, k)
    e_ref = _score_ref(name, params, q, k)
    assert scores.dtype == jnp.float32
    assert rel_err(scores, e_ref) < 1e-5
    ctx, w = _attn(name)(params, q, k, v, mask)
    w_ref = softmax_ref(e_ref, mask)
    assert rel_err(w, w_ref) < 1e-5
    assert rel_err(ctx, context_ref(w_ref, v)) < 1e-5
    assert_valid_attention_weights(w, mask)


def test_concat_with_bias_and_broadcast_batch(key, rng):
    params = init_additive_params(key, DQ, DK, A)
    params["b"] = jnp.asarray(rng.normal(size=A), jnp.float32)
    q = rng.normal(size=(2, B, T, DQ)).astype(
        np.float32
    )  # extra leading axis, broadcast against keys [B, ...]
    _, k, _ = _inputs("concat", rng)
    e = _score_jit("concat")(params, q, k)
    p = {n: np.asarray(x, np.float64) for n, x in params.items()}
    assert rel_err(e, concat_scores_ref(q, k, p["w_q"], p["w_k"], p["v"], p["b"])) < 1e-5
    # concat_scores *is* additive_scores(p, q, project_keys(p, k)): the same program, so bitwise.
    np.testing.assert_array_equal(
        e, jax.jit(lambda p, q, k: additive_scores(p, q, project_keys(p, k)))(params, q, k)
    )


@pytest.mark.numerics
def test_location_scores_ignore_padded_length(key, rng):
    # The location score of position s does not depend on how far the batch is padded.
    params = _params("location", key)
    q = rng.normal(size=(B, T, DQ)).astype(np.float32)
    loc = jax.jit(location_scores, static_argnums=2)
    # Two programs (W_aᵀ h_t over 4 or 17 columns): float32 rounding of the sum over Dq may differ.
    assert_close_f32(loc(params, q, 4), loc(params, q, SMAX)[..., :4], reduction=DQ)


# --- properties ---------------------------------------------------------------------------------------------


@st.composite
def _padded_batch(draw):
    # Fixed shapes (each new one compiles); examples vary scorer, lengths, content and params. T = 4 != S = 7,
    # so normalising over the target axis cannot pass.
    b, t, s = 3, 4, 7
    lengths = np.array(draw(st.lists(st.sampled_from([0, 3, s]), min_size=b, max_size=b)))
    return draw(st.sampled_from(SCORERS)), b, t, s, lengths, draw(st.integers(0, 2**31 - 1))


@pytest.mark.numerics
@settings(max_examples=16)
@given(_padded_batch())
def test_padding_properties(case):
    name, b, t, s, lengths, seed = case
    rng = np.random.default_rng(seed)
    params = _params(name, jax.random.key(seed % 1000))
    q, k, v = _inputs(name, rng, b, t, s)
    mask = _length_mask(lengths, s)
    ctx, w = _attn(name)(params, q, k, v, mask)
    assert_valid_attention_weights(w, mask)
    assert np.all(np.isfinite(ctx)) and np.all(np.asarray(ctx)[lengths == 0] == 0.0)

    pad = np.arange(s)[None, :] >= lengths[:, None]
    k2, v2 = k.copy(), v.copy()
    k2[pad] = 1e3 * rng.normal(size=k2[pad].shape)
    v2[pad] = 1e3 * rng.normal(size=v2[pad].shape)
    ctx2, w2 = _attn(name)(params, q, k2, v2, mask)
    # The same compiled program, and padded keys contribute exact zeros (masked logits -> weight 0, 0 · v = 0):
    # bitwise equal.
    np.testing.assert_array_equal(w2, w)
    np.testing.assert_array_equal(ctx2, ctx)

    for i, n in enumerate(lengths):
        if n:  # padded vs truncated: two programs
            ctx_t, w_t = _attn(name)(params, q[i], k[i, :n], v[i, :n], None)
            assert_close_f32(w[i, :, :n], w_t, reduction=REDUCTION)
            assert_close_f32(ctx[i], ctx_t, reduction=REDUCTION)


@pytest.mark.parametrize("name", SCORERS)
def test_fully_masked_rows_and_grads(name, key, rng):
    params = _params(name, key)
    q, k, v = _inputs(name, rng)
    mask = np.ones((B, T, S), bool)
    mask[0, 2] = False
    mask[1] = False
    empty = ~mask.any(-1)

    def loss(p, q, k, v):
        ctx, w = luong_attention(_score(name, p, q, k), v, mask, return_weights=True)
        return jnp.sum(ctx**2) + jnp.sum(w * jnp.arange(S))

    ctx, w = _attn(name)(params, q, k, v, mask)
    assert np.all(np.asarray(w)[empty] == 0.0) and np.all(np.asarray(ctx)[empty] == 0.0)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(params, q, k, v)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    assert np.all(np.asarray(grads[1])[1] == 0) and np.all(np.asarray(grads[3])[1] == 0)


# --- transformations ----------------------------------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize("name", SCORERS)
def test_jit_and_vmap(name, key, rng):
    params = _params(name, key)
    q, k, v = _inputs(name, rng)
    mask = _length_mask(LENGTHS)
    f = lambda p, q, k, v, m: luong_attention(_score(name, p, q, k), v, m, return_weights=True)
    eager = f(params, q, k, v, mask)
    assert_close_f32(_attn(name)(params, q, k, v, mask), eager, reduction=REDUCTION)
    vmapped = jax.jit(jax.vmap(f, in_axes=(None, 0, 0, 0, 0)))(params, q, k, v, mask)
    for i in range(B):
        one = _attn(name)(params, q[i], k[i], v[i], mask[i])
        assert_close_f32(tuple(x[i] for x in vmapped), one, reduction=REDUCTION)


@pytest.mark.parametrize("name", SCORERS)
def test_check_grads(name, key, rng):
    params = _params(name, key)
    q, k, v = _inputs(name, rng)
    mask = _length_mask(LENGTHS)
    f = lambda p, q, k, v, m: luong_attention(_score(name, p, q, k), v, m, return_weights=True)
    # float32 finite differences: eps=1e-3 leaves ~1e-4 relative rounding noise; tolerance 1e-2.
    g = jax.jit(lambda p, q, k, v: f(p, q[:2, :3], k[:2], v[:2], mask[:2])[0])
    check_grads(g, (params, q, k, v), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


# --- low precision ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dot", "general"])
@pytest.mark.parametrize(
    "dtype, ctx_tol",
    [
        # Products of bf16/fp16 inputs are exact in float32 and accumulated there, so the weights keep float32
        # accuracy; the context is rounded once to the output dtype (2^-8 bf16, 2^-11 fp16; tolerance ~2x).
        (jnp.bfloat16, 1e-2),
        (jnp.float16, 2e-3),
    ],
)
def test_low_precision_large_energies(name, dtype, ctx_tol, key, rng):
    params = {n: x.astype(dtype) for n, x in _params(name, key).items()}
    q, k, v = (
        jnp.asarray(3.0 * x, dtype) for x in _inputs(name, rng)
    )  # energies of tens: fp16 sums overflow
    mask = _length_mask(LENGTHS)
    ctx, w = _attn(name)(params, q, k, v, mask)
    e_ref = _score_ref(name, params, q, k)
    assert np.max(np.abs(e_ref)) > 50.0
    assert ctx.dtype == dtype and np.all(np.isfinite(np.asarray(ctx, np.float32)))
    assert rel_err(_score_jit(name)(params, q, k), e_ref) < 1e-5
    w_ref = softmax_ref(e_ref, mask)
    assert_valid_attention_weights(w, mask)
    assert np.max(np.abs(np.asarray(w) - w_ref)) < 1e-4
    assert rel_err(np.asarray(ctx, np.float32), context_ref(w_ref, v)) < ctx_tol


# --- errors -------------------------------------------------------------------------------------------------


def test_errors_name_the_shapes(key, rng):
    q, k, v = _inputs("general", rng)
    with pytest.raises(ValueError, match=r"query \[3, 5, 11\] vs keys \[3, 7, 13\]"):
        dot_scores(q, k)
    with pytest.raises(ValueError, match=r"keys have 12 features.*Dk = 13"):
        general_scores(init_general_params(key, DQ, DK), q, k[..., :12])
    with pytest.raises(ValueError, match=r"query has 10 features.*Dq = 11"):
        general_scores(init_general_params(key, DQ, DK), q[..., :10], k)
    with pytest.raises(ValueError, match=r"source_length 18 is outside \[1, Smax = 17\].*\[11, 17\]"):
        location_scores(init_location_params(key, DQ, SMAX), q, SMAX + 1)
    with pytest.raises(ValueError, match=r"static int"):
        location_scores(init_location_params(key, DQ, SMAX), q, 3.0)
    with pytest.raises(ValueError, match=r"scores \[3, 5, 7\].*values \[3, 6, 9\].*disagree on S"):
        luong_attention(jnp.zeros((B, T, S)), v[:, :6])
    with pytest.raises(ValueError, match=r"mask of shape \[3, 7, 5\].*\[3, 5, 7\]"):
        luong_attention(jnp.zeros((B, T, S)), v, jnp.ones((B, S, T), bool))
    with pytest.raises(ValueError, match=r"batch axes \[2\].*\[3\]"):
        dot_scores(q[:2], q)
