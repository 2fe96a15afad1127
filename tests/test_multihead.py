"""Multi-head attention: per-head float64 reference, Flax NNX with copied weights, masks, properties, dtypes, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.flatten_util import ravel_pytree
from jax.test_util import check_grads

from attn_jax.attention._multihead import (
    init_multi_head_params,
    merge_heads,
    multi_head_attention,
    split_heads,
)
from attn_jax.attention._softmax import assert_valid_attention_weights
from tests.reference.masks_dot import multi_head_ref
from tests.tolerance import assert_close_f32

# Odd, distinct sizes: B=2, T=5, S=7, Dq=11, Dk=9, H=3, K=4 (qkv_features=12), Do=13.
B, T, S, DQ, DK, H, K, DO = 2, 5, 7, 11, 9, 3, 4, 13
# float32 vs float64: rtol 1e-5 (house rule); atol 1e-5 absorbs float32 rounding in the three projections,
# whose sums run over up to 12 O(1) terms (eps 1.2e-7 x 12 x a few = ~1e-5 near-zero entries).
RTOL, ATOL = 1e-5, 1e-5
# Two float32 programs (jit vs eager, padded vs truncated, ours vs Flax) are compared with
# tests.tolerance.assert_close_f32 over the longest summation chain: the input projection over Dq, logits over K,
# softmax and context over S, the output projection over H·K.
REDUCTION = DQ + K + 2 * S + H * K


def _params(seed=0, *, use_bias=True, cross=True, dtype=jnp.float32):
    """Params in the init_multi_head_params layout, drawn with NumPy (no per-shape PRNG compilation).

    Kernels ~ N(0, 1/fan_in) as LeCun init gives (logits O(1)); random, not zero, biases so that the reference
    checks where they are added.
    """
    rng = np.random.default_rng(seed)
    dk = DK if cross else DQ
    shapes = {"query": (DQ, H, K), "key": (dk, H, K), "value": (dk, H, K), "out": (H, K, DO)}
    p = {}
    for name, shape in shapes.items():
        fan_in = shape[0] if name != "out" else H * K
        p[name] = {"kernel": rng.standard_normal(shape) / np.sqrt(fan_in)}
        if use_bias:
            p[name]["bias"] = 0.5 * rng.standard_normal(shape[1:] if name != "out" else (DO,))
    return jax.tree.map(lambda x: jnp.asarray(x, dtype), p)


def _normal(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def _flax_mha(params, *, cross=True, use_bias=True):
    # eval_shape: build the module without running its initialisers; the weights are ours anyway
    m = nnx.eval_shape(
        lambda: nnx.MultiHeadAttention(
            H,
            DQ,
            qkv_features=H * K,
            out_features=DO,
            in_kv_features=DK if cross else None,
            use_bias=use_bias,
            decode=False,
            deterministic=True,
            rngs=nnx.Rngs(0),
        )
    )
    nnx.update(m, nnx.State(params))
    return m


_mha = jax.jit(multi_head_attention, static_argnames="return_weights")
_mha_grads = jax.jit(
    jax.grad(lambda p, xq, xkv, mask: multi_head_attention(p, xq, xkv, mask).sum(), argnums=(0, 1, 2))
)

# --- float64 reference and Flax -----------------------------------------------------------------------------


@pytest.mark.parametrize("head_axis", [False, True])
def test_matches_per_head_reference(key, rng, head_axis):
    """H heads == H independent single-head attentions (float64 loops), concatenated and projected."""
    p = _params(0)
    xq, xkv = _normal(rng, (B, T, DQ)), _normal(rng, (B, S, DK))
    mask = rng.random((B, H, T, S) if head_axis else (B, T, S)) < 0.6
    mask[0, ..., 1, :] = False  # a fully masked query
    out, w = _mha(p, xq, xkv, mask, return_weights=True)
    out_ref, w_ref = multi_head_ref(p, xq, xkv, mask)
    assert out.shape == (B, T, DO) and w.shape == (B, H, T, S)
    np.testing.assert_allclose(w, w_ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out, out_ref, rtol=RTOL, atol=ATOL)
    assert_valid_attention_weights(w, mask if head_axis else mask[:, None])


@pytest.mark.numerics
def test_self_attention_and_no_bias_match_reference(key, rng):
    p = _params(0, cross=False, use_bias=False)
    assert "bias" not in p["query"] and "bias" not in p["out"]
    x = _normal(rng, (B, T, DQ))
    np.testing.assert_allclose(_mha(p, x), multi_head_ref(p, x)[0], rtol=RTOL, atol=ATOL)
    assert_close_f32(_mha(p, x, x), _mha(p, x), reduction=REDUCTION)  # two traces: keys given or defaulted
    np.testing.assert_allclose(
        _mha(p, x, scale=0.3), multi_head_ref(p, x, scale=0.3)[0], rtol=RTOL, atol=ATOL
    )


@pytest.mark.numerics
@pytest.mark.parametrize(
    "cross,use_bias,mask_kind", [(True, True, "heads"), (False, True, "none"), (True, False, "T S")]
)
def test_matches_flax_nnx(key, rng, cross, use_bias, mask_kind):
    p = _params(0, cross=cross, use_bias=use_bias)
    xq = _normal(rng, (B, T, DQ))
    xkv = _normal(rng, (B, S, DK)) if cross else xq
    s = xkv.shape[-2]
    mask = None
    if mask_kind != "none":
        mask = rng.random((B, H, T, s) if mask_kind == "heads" else (B, T, s)) < 0.6
        mask[..., 0] = True  # Flax averages padding on fully masked rows; compare where both are defined
    ours = _mha(p, xq, xkv if cross else None, mask)
    flax_mask = None if mask is None else (mask if mask.ndim == 4 else mask[:, None])
    call = nnx.jit(lambda m, xq, xkv, mask: m(xq, xkv, mask=mask))  # one compilation, not one per op
    theirs = call(_flax_mha(p, cross=cross, use_bias=use_bias), xq, xkv if cross else None, flax_mask)
    assert_close_f32(ours, theirs, reduction=REDUCTION)


def test_init(key):
    p = init_multi_head_params(key, 4, 96, key_features=80, qkv_features=128, out_features=72)
    shapes = jax.tree.map(lambda x: x.shape, p)
    assert shapes == {
        "query": {"kernel": (96, 4, 32), "bias": (4, 32)},
        "key": {"kernel": (80, 4, 32), "bias": (4, 32)},
        "value": {"kernel": (80, 4, 32), "bias": (4, 32)},
        "out": {"kernel": (4, 32, 72), "bias": (72,)},
    }
    for name in p:
        assert np.all(np.asarray(p[name]["bias"]) == 0.0)
    # LeCun normal: variance 1/fan_in, fan_in = Dq / Dk for the input projections, H*K for the output one.
    # >= 6000 samples each: the sample std is within ~2% of the truth; 10% still tells 1/96 from 1/128 or 1/80.
    for name, fan_in in [("query", 96), ("key", 80), ("value", 80), ("out", 128)]:
        std = float(np.std(p[name]["kernel"]))
        assert abs(std * np.sqrt(fan_in) - 1.0) < 0.1, (name, std)
    keys = {n: float(p[n]["kernel"][0, 0, 0]) for n in p}
    assert len(set(keys.values())) == 4  # independent keys per projection
    assert p["query"]["kernel"].dtype == jnp.float32
    p16 = init_multi_head_params(
        key, 4, 96, key_features=80, qkv_features=128, out_features=72, dtype=jnp.bfloat16
    )
    assert p16["out"]["kernel"].dtype == jnp.bfloat16 and p16["out"]["bias"].dtype == jnp.bfloat16


def test_split_merge_heads(rng):
    x = _normal(rng, (B, T, H * K))
    y = split_heads(x, H)
    assert y.shape == (B, H, T, K)
    for h in range(H):
        np.testing.assert_array_equal(y[:, h], x[..., h * K : (h + 1) * K])
    np.testing.assert_array_equal(merge_heads(y), x)
    with pytest.raises(ValueError, match=r"\[2, 5, 12\] \(12\) is not divisible by num_heads \(5\)"):
        split_heads(x, 5)


# --- properties ---------------------------------------------------------------------------------------------


@st.composite
def mha_cases(draw):
    """Inputs of a drawn shape family and a random mask with or without a head axis."""
    batch, t, s, head_axis = draw(
        st.sampled_from([((B,), T, S, True), ((), 3, 4, False), ((2, 1), 1, 6, True)])
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    xq, xkv = _normal(rng, batch + (t, DQ)), _normal(rng, batch + (s, DK))
    mask_shape = batch + ((H,) if head_axis else ()) + (t, s)
    mask = rng.random(mask_shape) < draw(st.sampled_from([0.3, 0.8, 1.0]))
    return xq, xkv, mask


@given(mha_cases())
@settings(max_examples=15)
def test_property_weights_normalised_and_padded_keys_zero(case):
    xq, xkv, mask = case
    p = _params(3)
    out, w = _mha(p, xq, xkv, mask, return_weights=True)
    full_mask = np.broadcast_to(mask if mask.ndim == xq.ndim + 1 else mask[..., None, :, :], w.shape)
    assert_valid_attention_weights(w, full_mask)
    assert np.all(np.asarray(w)[~full_mask] == 0.0)
    out_ref, w_ref = multi_head_ref(p, xq, xkv, mask)
    np.testing.assert_allclose(w, w_ref, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(out, out_ref, rtol=RTOL, atol=ATOL)


@given(st.integers(0, 2**31 - 1))
@settings(max_examples=5)
def test_property_fully_masked_rows(seed):
    """A query that may attend nothing: zero context, so the output is exactly the out bias; finite grads."""
    rng = np.random.default_rng(seed)
    p = _params(seed)
    xq, xkv = _normal(rng, (B, T, DQ)), _normal(rng, (B, S, DK))
    mask = rng.random((B, T, S)) < 0.5
    mask[:, 2] = False
    out, w = _mha(p, xq, xkv, mask, return_weights=True)
    assert np.all(np.asarray(w)[:, :, 2] == 0.0)
    np.testing.assert_array_equal(out[:, 2], np.broadcast_to(p["out"]["bias"], (B, DO)))
    grads = _mha_grads(p, xq, xkv, mask)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


@pytest.mark.numerics
@given(st.lists(st.sampled_from([1, 4, S]), min_size=B, max_size=B), st.integers(0, 2**31 - 1))
@settings(max_examples=10)
def test_property_padding_content_and_truncation(lengths, seed):
    """Changing padded key/value inputs changes nothing; padded == truncated."""
    rng = np.random.default_rng(seed)
    p = _params(4)
    xq, xkv = _normal(rng, (B, T, DQ)), _normal(rng, (B, S, DK))
    valid = np.arange(S) < np.array(lengths)[:, None]  # [B, S]
    mask = np.broadcast_to(valid[:, None, :], (B, T, S))
    xkv2 = np.where(valid[..., None], xkv, _normal(rng, xkv.shape, 1e3))
    out = _mha(p, xq, xkv, mask)
    # The same compiled program, and padded keys contribute exact zeros: bitwise equal.
    np.testing.assert_array_equal(out, _mha(p, xq, xkv2, mask))
    for b, n in enumerate(lengths):
        truncated = _mha(p, xq[b], xkv[b, :n])  # another program
        assert_close_f32(out[b], truncated, reduction=REDUCTION)


# --- transforms ---------------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_jit_equals_eager_and_vmap_equals_loop(key, rng):
    p = _params(0)
    xq, xkv = _normal(rng, (B, T, DQ)), _normal(rng, (B, S, DK))
    mask = rng.random((B, H, T, S)) < 0.7
    f = functools.partial(multi_head_attention, return_weights=True)
    assert_close_f32(f(p, xq, xkv, mask), _mha(p, xq, xkv, mask, return_weights=True), reduction=REDUCTION)
    batched = jax.jit(jax.vmap(f, in_axes=(None, 0, 0, 0)))(p, xq, xkv, mask)
    for i in range(B):
        one = _mha(p, xq[i], xkv[i], mask[i], return_weights=True)
        assert_close_f32(tuple(x[i] for x in batched), one, reduction=REDUCTION)


def test_check_grads(rng):
    p = _params(5)
    xq, xkv = _normal(rng, (2, 3, DQ)), _normal(rng, (2, 4, DK))
    mask = rng.random((2, 3, 4)) < 0.6
    mask[0, 1] = False
    flat, unravel = ravel_pytree(p)  # one leaf instead of eight: fewer eager ops inside check_grads
    f = jax.jit(lambda flat, xq, xkv: multi_head_attention(unravel(flat), xq, xkv, mask))
    # float32 finite differences (x64 off globally; the softmax is float32 by policy): see test_dot_product.
    check_grads(f, (flat, xq, xkv), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


# --- low precision ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,tol",
    [
        # Relative to max|reference|; the reference runs in float64 on the *rounded* inputs and params. Unlike
        # the bare dot-product, the projected q, k, v are stored in the input dtype (as in Flax), so the logits
        # and the output projection carry that rounding: bf16 keeps 8 mantissa bits (2^-9 ~ 2e-3 per value;
        # observed 2.4e-3..4e-3 over seeds), fp16 keeps 11 (2^-12 ~ 2.4e-4; observed 3e-4..6e-4). Bounds: ~4x.
        (jnp.bfloat16, 1.5e-2),
        (jnp.float16, 2e-3),
    ],
)
def test_low_precision(key, rng, dtype, tol):
    p = _params(0, dtype=dtype)
    xq, xkv = (jnp.asarray(_normal(rng, s), dtype) for s in [(B, T, DQ), (B, S, DK)])
    mask = rng.random((B, T, S)) < 0.6
    mask[1, 3] = False
    out, w = _mha(p, xq, xkv, mask, return_weights=True)
    assert out.dtype == dtype and w.dtype == jnp.float32
    out64 = np.asarray(out, np.float64)
    assert np.all(np.isfinite(out64))
    assert_valid_attention_weights(w, mask[:, None])
    out_ref, _ = multi_head_ref(
        jax.tree.map(lambda x: np.asarray(x, np.float64), p), xq.astype(float), xkv.astype(float), mask
    )
    assert np.abs(out64 - out_ref).max() <= tol * np.abs(out_ref).max()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_large_logits_finite(key, rng, dtype):
    """Queries scaled so |logits| ~ 100 (exp overflows fp16/bf16 ranges long before): finite and valid."""
    p = _params(0)
    p["query"]["kernel"] = p["query"]["kernel"] * 30.0
    p = jax.tree.map(lambda x: x.astype(dtype), p)
    xq, xkv = (jnp.asarray(_normal(rng, s), dtype) for s in [(B, T, DQ), (B, S, DK)])
    mask = rng.random((B, H, T, S)) < 0.6
    mask[0, 1, 2] = False
    out, w = _mha(p, xq, xkv, mask, return_weights=True)
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    assert np.asarray(w).max() > 0.99  # logits this large make some rows one-hot
    assert_valid_attention_weights(w, mask)


# --- errors -------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_with_shapes(key, rng):
    with pytest.raises(ValueError, match=r"qkv_features \(10\) must be divisible by num_heads \(3\)"):
        init_multi_head_params(key, 3, 10)
    with pytest.raises(ValueError, match=r"qkv_features \(12\) must be divisible by num_heads \(5\)"):
        init_multi_head_params(key, 5, 8, qkv_features=12)
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        init_multi_head_params(key, 0, 8)
    p = _params(0)
    xq, xkv = _normal(rng, (B, T, DQ)), _normal(rng, (B, S, DK))
    with pytest.raises(
        ValueError, match=r"inputs_q \[2, 5, 10\] has width 10 but the query kernel \[11, 3, 4\]"
    ):
        multi_head_attention(p, xq[..., :10], xkv)
    with pytest.raises(
        ValueError, match=r"inputs_kv \[2, 5, 11\] has width 11 but the key/value kernels \[9, 3, 4\]"
    ):
        multi_head_attention(p, xq)  # self-attention with cross-attention params
    with pytest.raises(ValueError, match=r"mask \[7\] must have rank 3 .* or 4"):
        multi_head_attention(p, xq, xkv, np.ones((S,), bool))
    with pytest.raises(ValueError, match=r"mask \[1, 2, 3, 2, 5, 7\] must have rank 3"):
        multi_head_attention(p, xq, xkv, np.ones((1, 2, 3, B, T, S), bool))
    with pytest.raises(ValueError, match=r"mask of shape \[2, 4, 5, 7\] does not broadcast.*\[2, 3, 5, 7\]"):
        multi_head_attention(p, xq, xkv, np.ones((B, 4, T, S), bool))
    with pytest.raises(ValueError, match=r"inputs_q batch axes \[2\], inputs_kv batch axes \[3\]"):
        multi_head_attention(p, xq, _normal(rng, (3, S, DK)))
    bad = {**p, "out": {"kernel": jnp.zeros((H, K + 1, DO))}}
    with pytest.raises(ValueError, match=r"out kernel \[3, 5, 13\] must be \[H, Kv, Do\]"):
        multi_head_attention(bad, xq, xkv)
    bad = {**p, "key": {"kernel": jnp.zeros((DK, H, K + 1))}}
    with pytest.raises(ValueError, match=r"inconsistent multi-head kernels.*key \[9, 3, 5\]"):
        multi_head_attention(bad, xq, xkv)
