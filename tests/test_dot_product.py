"""Scaled dot-product attention: float64 reference, peers (jax.nn, Flax), masking properties, transforms,
dtypes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from attn_jax.attention._dot_product import dot_product_attention, dot_product_scores
from attn_jax.attention._softmax import assert_valid_attention_weights, masked_softmax
from tests.reference.masks_dot import dot_attention_ref, dot_scores_ref
from tests.tolerance import assert_close_f32

# Odd, distinct sizes so that a swapped axis cannot pass: B=3, H=2, T=5, S=7, K=11, Kv=3.
B, H, T, S, K, KV = 3, 2, 5, 7, 11, 3
# float32 comparisons: rtol 1e-5 as the house rule; atol 1e-6 absorbs float32 rounding of entries near zero
# (outputs here are O(1), float32 eps is 1.2e-7, and sums run over at most 11 terms).
RTOL, ATOL = 1e-5, 1e-6
# Two float32 programs (jit vs eager, padded vs truncated, ours vs jax.nn/Flax) are compared with
# tests.tolerance.assert_close_f32 over the longest summation chain: logits over K, softmax and context over S.
REDUCTION = K + 2 * S


def _normal(rng, shape, scale=1.0, dtype=np.float32):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _mask(rng, shape, p=0.6):
    return rng.random(shape) < p


def _inputs(rng, kv=KV):
    return (
        _normal(rng, (B, H, T, K)),
        _normal(rng, (B, H, S, K)),
        _normal(rng, (B, H, S, kv)),
    )


def _masks_with_a_valid_key(rng, shape):
    """Random mask where every row keeps at least one key (peers disagree on fully masked rows)."""
    m = _mask(rng, shape)
    m[..., 0] |= ~m.any(-1)
    return m


# (batch axes, T, S, K, Kv): a few fixed shape families, so that hypothesis varies values and masks without
# paying one XLA compilation per example.
SHAPES = [((), 1, 1, 2, 1), ((2,), 4, 6, 3, 4), ((3, 2), 5, 3, 2, 1), ((1,), 3, 5, 3, 2)]


@st.composite
def attention_cases(draw):
    """Random inputs of a drawn shape family and a random mask (any density; it may mask whole rows)."""
    batch, t, s, k, kv = draw(st.sampled_from(SHAPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    q, key, v = _normal(rng, batch + (t, k)), _normal(rng, batch + (s, k)), _normal(rng, batch + (s, kv))
    mask = _mask(rng, batch + (t, s), p=draw(st.sampled_from([0.3, 0.7, 1.0])))
    return q, key, v, mask


_attention = jax.jit(dot_product_attention, static_argnames="return_weights")


@jax.jit
def _grads(q, k, v, mask):
    return jax.grad(lambda q, k, v: dot_product_attention(q, k, v, mask).sum(), argnums=(0, 1, 2))(q, k, v)


# --- float64 reference --------------------------------------------------------------------------------------


def test_scores_match_reference(rng):
    q, k = _normal(rng, (B, T, K)), _normal(rng, (S, K))  # key batch axes broadcast
    np.testing.assert_allclose(dot_product_scores(q, k), dot_scores_ref(q, k), rtol=RTOL, atol=ATOL)
    # Luong's unscaled `dot` score
    np.testing.assert_allclose(
        dot_product_scores(q, k, scale=1.0), dot_scores_ref(q, k, 1.0), rtol=RTOL, atol=ATOL
    )
    assert dot_product_scores(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16)).dtype == jnp.float32


def test_attention_matches_reference(rng):
    q, k, v = _inputs(rng)
    mask = _mask(rng, (B, 1, T, S))  # broadcast over heads
    mask[0, 0, 1] = False  # one fully masked row
    bias = _normal(rng, (H, T, S))
    ctx, w = dot_product_attention(q, k, v, mask, bias=bias, scale=0.37, return_weights=True)
    ctx_ref, w_ref = dot_attention_ref(q, k, v, mask, bias=bias, scale=0.37)
    np.testing.assert_allclose(w, w_ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ctx, ctx_ref, rtol=RTOL, atol=ATOL)
    assert ctx.dtype == jnp.float32 and w.dtype == jnp.float32
    assert np.all(np.asarray(ctx)[0, :, 1] == 0.0)
    ctx_plain = dot_product_attention(q, k, v)
    np.testing.assert_allclose(ctx_plain, dot_attention_ref(q, k, v)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.numerics
def test_value_batch_axes_may_widen(rng):
    # shared query/keys, several value sets: weights broadcast to the value's batch axes
    q, k, v = _normal(rng, (T, K)), _normal(rng, (S, K)), _normal(rng, (B, S, KV))
    ctx, w = dot_product_attention(q, k, v, _masks_with_a_valid_key(rng, (B, T, S)), return_weights=True)
    assert w.shape == (B, T, S)
    for b in range(B):
        assert_close_f32(
            ctx[b], dot_product_attention(q, k, v[b], jnp.asarray(w[b] > 0)), reduction=REDUCTION
        )


# --- peers --------------------------------------------------------------------------------------------------


def _to_bthk(x):
    return jnp.swapaxes(x, -3, -2)  # [B, H, T, K] <-> [B, T, H, K]


@pytest.mark.numerics
@pytest.mark.parametrize("masked", [False, True])
def test_matches_jax_nn_and_flax(rng, masked):
    q, k, v = _inputs(rng, kv=K)  # jax.nn needs Kv == K
    mask = _masks_with_a_valid_key(rng, (B, H, T, S)) if masked else None
    ours = dot_product_attention(q, k, v, mask)
    jax_nn = _to_bthk(jax.nn.dot_product_attention(_to_bthk(q), _to_bthk(k), _to_bthk(v), mask=mask))
    flax_ = _to_bthk(nnx.dot_product_attention(_to_bthk(q), _to_bthk(k), _to_bthk(v), mask=mask))
    assert_close_f32(ours, jax_nn, reduction=REDUCTION)
    assert_close_f32(ours, flax_, reduction=REDUCTION)


@pytest.mark.numerics
def test_fully_masked_rows_peers_average_padding_we_give_zeros(rng):
    """Fully masked query rows: ours -> exact zeros; jax.nn and Flax -> the mean of *all* values (padding
    included).

    Both peers fill masked logits with a large negative number and softmax, so a row with no valid key becomes
    uniform over every key. We zero it instead (see _softmax.py). If a peer upgrade changes this, update the
    docstring of dot_product_attention.
    """
    q, k, v = _inputs(rng, kv=K)
    mask = _masks_with_a_valid_key(rng, (B, H, T, S))
    mask[1, 0, 2] = False
    mask[2, 1, :] = False  # a whole head
    ours = np.asarray(dot_product_attention(q, k, v, mask))
    jax_nn = np.asarray(
        _to_bthk(jax.nn.dot_product_attention(_to_bthk(q), _to_bthk(k), _to_bthk(v), mask=mask))
    )
    flax_ = np.asarray(_to_bthk(nnx.dot_product_attention(_to_bthk(q), _to_bthk(k), _to_bthk(v), mask=mask)))
    dead = ~mask.any(-1)  # [B, H, T]
    assert np.all(ours[dead] == 0.0)
    mean_v = np.broadcast_to(v.mean(-2, keepdims=True), ours.shape)
    assert_close_f32(jax_nn[dead], mean_v[dead], reduction=REDUCTION)
    assert_close_f32(flax_[dead], mean_v[dead], reduction=REDUCTION)
    assert_close_f32(ours[~dead], jax_nn[~dead], reduction=REDUCTION)


# --- properties ---------------------------------------------------------------------------------------------


@given(attention_cases())
def test_weights_normalised_over_source_and_padded_keys_zero(case):
    q, k, v, mask = case
    ctx, w = _attention(q, k, v, mask, return_weights=True)
    assert_valid_attention_weights(w, mask)
    w = np.asarray(w)
    assert np.all(w[~mask] == 0.0)  # exactly, not approximately
    assert np.all(np.asarray(ctx)[~mask.any(-1)] == 0.0)
    ctx_ref, w_ref = dot_attention_ref(q, k, v, mask)
    np.testing.assert_allclose(w, w_ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ctx, ctx_ref, rtol=RTOL, atol=ATOL)


def test_weight_check_catches_softmax_over_target_axis(rng):
    """The classic bug: normalising over the target axis. With T != S it must fail the source-axis check."""
    q, k, _ = _inputs(rng)
    logits = dot_product_scores(q, k)
    assert_valid_attention_weights(masked_softmax(logits, axis=-1))
    with pytest.raises(AssertionError, match="source"):
        assert_valid_attention_weights(masked_softmax(logits, axis=-2))


@given(attention_cases())
@settings(max_examples=10)
def test_fully_masked_rows_zero_output_and_finite_grads(case):
    q, k, v, mask = case
    mask = mask.copy()
    mask[..., 0, :] = False  # the first query sees nothing
    out = _attention(q, k, v, mask)
    assert np.all(np.asarray(out)[..., 0, :] == 0.0)
    grads = _grads(q, k, v, mask)
    for g in grads:
        assert np.all(np.isfinite(g))
    assert np.all(np.asarray(grads[0])[..., 0, :] == 0.0)  # a dead query has no influence


@given(attention_cases())
@settings(max_examples=10)
def test_invariant_to_content_of_padded_keys(case):
    q, k, v, _ = case
    rng = np.random.default_rng(1)
    s = k.shape[-2]
    lengths = rng.integers(0, s + 1, size=k.shape[:-2])
    valid = np.arange(s) < lengths[..., None]  # [..., S]
    mask = np.broadcast_to(valid[..., None, :], q.shape[:-1] + (s,))
    k2 = np.where(valid[..., None], k, _normal(rng, k.shape, 1e4))
    v2 = np.where(valid[..., None], v, _normal(rng, v.shape, 1e4))
    c1, w1 = _attention(q, k, v, mask, return_weights=True)
    c2, w2 = _attention(q, k2, v2, mask, return_weights=True)
    # The same compiled program, and padded keys contribute exact zeros: bitwise equal.
    np.testing.assert_array_equal(c1, c2)
    np.testing.assert_array_equal(w1, w2)


@pytest.mark.numerics
@given(st.integers(1, 6), st.integers(0, 2**31 - 1))
@settings(max_examples=10)
def test_padded_equals_truncated(valid_len, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _inputs(rng)
    mask = np.arange(S) < valid_len  # [S], broadcasts to [B, H, T, S]
    padded = _attention(q, k, v, mask)
    truncated = _attention(q, k[..., :valid_len, :], v[..., :valid_len, :])
    assert_close_f32(padded, truncated, reduction=REDUCTION)


# --- transforms ---------------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_jit_equals_eager_and_vmap_equals_loop(rng):
    q, k, v = _inputs(rng)
    mask = _mask(rng, (B, H, T, S))
    f = functools.partial(dot_product_attention, return_weights=True)
    eager = f(q, k, v, mask)
    jitted = jax.jit(f)(q, k, v, mask)
    assert_close_f32(eager, jitted, reduction=REDUCTION)
    # vmap over the batch axis, with the key/value shared across the batch in one variant
    batched = jax.vmap(f)(q, k, v, mask)
    shared = jax.vmap(f, in_axes=(0, None, None, 0))(q, k[0], v[0], mask)
    for i in range(B):
        loop = f(q[i], k[i], v[i], mask[i])
        loop_shared = f(q[i], k[0], v[0], mask[i])
        assert_close_f32(tuple(x[i] for x in batched), loop, reduction=REDUCTION)
        assert_close_f32(tuple(x[i] for x in shared), loop_shared, reduction=REDUCTION)


def test_check_grads(rng):
    q, k, v = (_normal(rng, s) for s in [(2, 3, 4), (2, 5, 4), (2, 5, 3)])
    mask = _mask(rng, (2, 3, 5))
    mask[0, 1] = False  # gradients through a fully masked row too
    bias = _normal(rng, (3, 5))
    f = jax.jit(lambda q, k, v, bias: dot_product_attention(q, k, v, mask, bias=bias))
    # float32 finite differences (x64 is off globally and the softmax is float32 by policy): eps 1e-3 keeps
    # the truncation error ~1e-6 and the rounding error ~1e-7/1e-3 = 1e-4, far inside 1e-2.
    check_grads(f, (q, k, v, bias), order=2, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


# --- low precision ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,tol",
    [
        # Tolerances are relative to max|reference|. The logits are exact (bf16/fp16 products are exact in
        # float32, the reference uses the same rounded inputs), so the error is the final rounding of the
        # context to the input dtype: bf16 keeps 8 mantissa bits (2^-9 ~ 2e-3 relative; 1e-2 leaves room),
        # fp16 keeps 11 bits (2^-12 ~ 2.4e-4; 1e-3 leaves room).
        (jnp.bfloat16, 1e-2),
        (jnp.float16, 1e-3),
    ],
)
def test_low_precision_large_logits(rng, dtype, tol):
    # |logits| reach ~60: exp(60) ~ 1e26 overflows float16 (max 65504) if the softmax ran in the input dtype.
    q, k, v = _normal(rng, (B, H, T, 16), 20.0), _normal(rng, (B, H, S, 16)), _normal(rng, (B, H, S, KV))
    mask = _mask(rng, (B, 1, T, S))
    mask[0, 0, 0] = False
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
    ctx, w = dot_product_attention(q, k, v, mask, return_weights=True)
    assert ctx.dtype == dtype and w.dtype == jnp.float32
    assert np.abs(dot_product_scores(q, k)).max() > 50.0
    ctx64, w64 = (np.asarray(x, np.float64) for x in (ctx, w))
    assert np.all(np.isfinite(ctx64)) and np.all(np.isfinite(w64))
    ctx_ref, w_ref = dot_attention_ref(*(np.asarray(x, np.float64) for x in (q, k, v)), mask)
    assert np.abs(ctx64 - ctx_ref).max() <= tol * np.abs(ctx_ref).max()
    # the weights are float32 from exact logits: float32 accuracy, up to exp's amplification of logit rounding
    np.testing.assert_allclose(w64, w_ref, rtol=1e-4, atol=1e-5)
    assert_valid_attention_weights(w, mask)
    grads = _grads(q, k, v, mask)
    assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)


# --- errors -------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_with_shapes(rng):
    q, k, v = _inputs(rng)
    with pytest.raises(ValueError, match=r"same width K.*query \[3, 2, 5, 11\], key \[3, 2, 7, 4\]"):
        dot_product_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match=r"same length S.*key \[3, 2, 7, 11\], value \[3, 2, 6, 3\]"):
        dot_product_attention(q, k, v[..., :6, :])
    with pytest.raises(ValueError, match=r"query batch axes \[3, 2\], key batch axes \[2, 2\]"):
        dot_product_attention(q, k[:2], v[:2])
    with pytest.raises(ValueError, match=r"mask of shape \[3, 2, 5, 6\] does not broadcast.*\[3, 2, 5, 7\]"):
        dot_product_attention(q, k, v, jnp.ones((B, H, T, 6), bool))
    with pytest.raises(ValueError, match="mask must be boolean"):
        dot_product_attention(q, k, v, jnp.ones((B, H, T, S)))
    with pytest.raises(ValueError, match=r"bias of shape \[4, 5, 7\] does not broadcast"):
        dot_product_attention(q, k, v, bias=jnp.zeros((4, T, S)))
    with pytest.raises(ValueError, match=r"query must have at least 2 axes, got shape \[11\]"):
        dot_product_scores(q[0, 0, 0], k)
    with pytest.raises(ValueError, match="query must be floating point"):
        dot_product_scores(jnp.ones((T, K), jnp.int32), k)
