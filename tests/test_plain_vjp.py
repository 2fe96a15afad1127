"""The plain ("xla") dot-product path's hand-written derivative (FlashAttention's ``rowsum(dO∘O)`` identity).

``dot_product_attention`` routes the common case (no ``return_weights``, static ``scale``, equal batch axes) through
a ``jax.custom_jvp`` whose transpose is FlashAttention's backward. Every other case keeps plain autodiff of the same
forward; ``return_weights=True`` reaches that autodiff path with the same operations, so it is the in-library
reference here, next to the float64 loop references. One compiled shape family keeps the file fast.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from attn_jax.attention import dot_product_attention
from tests.reference.chunked import attention_grads_ref
from tests.reference.masks_dot import causal_mask_ref, dot_attention_ref
from tests.tolerance import assert_close_f32

# Odd, distinct sizes so that a swapped axis cannot pass: B=3, H=2, T=5, S=7, K=11, Kv=3.
B, H, T, S, K, KV = 3, 2, 5, 7, 11, 3
# Longest float32 summation chain through forward and backward (logits over K, softmax and context over S, dP over
# Kv, dq/dk over S): the reduction length for comparing two float32 programs.
REDUCTION = K + 3 * S + KV


def _normal(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def _rel_err(actual, expected):
    """``max|a − e| / max|e|``: one number per array, robust to entries near zero."""
    expected = np.asarray(expected, np.float64)
    return np.abs(np.asarray(actual, np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30)


def _fast(q, k, v, mask, bias, *, causal=False, scale=None):
    """The common case: goes through the custom derivative."""
    return dot_product_attention(q, k, v, mask, bias=bias, causal=causal, scale=scale)


def _autodiff(q, k, v, mask, bias, *, causal=False, scale=None):
    """The same forward through plain autodiff (``return_weights`` keeps the fallback path)."""
    return dot_product_attention(q, k, v, mask, bias=bias, causal=causal, scale=scale, return_weights=True)[0]


def _vjp(attention):
    """``(out, (dq, dk, dv, dbias))`` of ``Σ g · attention(q, k, v, mask, bias)``, unjitted."""

    def run(q, k, v, mask, bias, g):
        out, pullback = jax.vjp(lambda q, k, v, bias: attention(q, k, v, mask, bias), q, k, v, bias)
        return out, pullback(g)

    return run


def _goes_through_custom_rule(fn, *args) -> bool:
    text = str(jax.make_jaxpr(fn)(*args))
    return "custom_jvp_call" in text and "name=_plain_attention" in text


def _dead_row_mask(rng, shape):
    """~60% of keys visible; query 1 of batch 0 / head 0 sees nothing and key 2 is hidden from everyone."""
    mask = rng.random(shape) < 0.6
    mask[0, 0, 1] = False
    mask[..., 2] = False
    return mask


# name -> (mask, bias) builders over (rng); causal and scale per case
CASES = {
    "plain": (lambda rng: None, lambda rng: None, False, None),
    # key padding [B, 1, 1, S] (batch 2 has no keys: all its rows are dead) and a per-batch bias [B, 1, T, S]
    "padding": (
        lambda rng: (np.arange(S) < np.array([7, 3, 0])[:, None])[:, None, None, :],
        lambda rng: _normal(rng, (B, 1, T, S)),
        False,
        None,
    ),
    # causal with a bias shared by the whole batch [1, 1, T, S] and a non-default scale
    "causal": (lambda rng: None, lambda rng: _normal(rng, (1, 1, T, S)), True, 0.37),
    # a random mask with a fully masked row, and a rank-2 bias [T, S] that broadcasts over B and H
    "dead_row": (
        lambda rng: _dead_row_mask(rng, (B, H, T, S)),
        lambda rng: _normal(rng, (T, S)),
        False,
        None,
    ),
}


def _case(rng, name, dtype=np.float32):
    mask_fn, bias_fn, causal, scale = CASES[name]
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, H, S, K)), _normal(rng, (B, H, S, KV))
    g = _normal(rng, (B, H, T, KV))
    mask, bias = mask_fn(rng), bias_fn(rng)
    q, k, v, g = (jnp.asarray(x, dtype) for x in (q, k, v, g))
    return (q, k, v, mask, bias, g), causal, scale


def _effective_mask(mask, causal):
    m = np.ones((T, S), bool) if mask is None else np.asarray(mask)
    return np.logical_and(m, causal_mask_ref(T, S)) if causal else m


# --- values and gradients: autodiff and float64 ----------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize("name", list(CASES))
def test_matches_autodiff_and_float64_reference(rng, name):
    (q, k, v, mask, bias, g), causal, scale = _case(rng, name)
    kw = dict(causal=causal, scale=scale)
    fast, slow = functools.partial(_fast, **kw), functools.partial(_autodiff, **kw)
    assert _goes_through_custom_rule(fast, q, k, v, mask, bias)
    assert not _goes_through_custom_rule(slow, q, k, v, mask, bias)
    out, grads = jax.jit(_vjp(fast))(q, k, v, mask, bias, g)
    out_ad, grads_ad = jax.jit(_vjp(slow))(q, k, v, mask, bias, g)

    # The forward is the same code, fused differently under jit: float32 rounding apart.
    assert_close_f32(out, out_ad, reduction=REDUCTION)
    out_ref, _ = dot_attention_ref(q, k, v, _effective_mask(mask, causal), bias, scale)
    assert out.dtype == jnp.float32 and _rel_err(out, out_ref) < 1e-5

    grads_ref = attention_grads_ref(q, k, v, g, mask, bias, scale, causal=causal)
    for what, a, a_ad, ref in zip(("dq", "dk", "dv", "dbias"), grads, grads_ad, grads_ref, strict=True):
        if ref is None:  # no bias
            assert a is None and a_ad is None
            continue
        assert a.shape == ref.shape and a.dtype == jnp.float32, what
        # float32 sums of <= 11 O(1) terms and the (dP − D) cancellation: ~1e-7 relative to the largest entry;
        # the two float32 paths differ only in how D is summed (over Kv = 3 instead of S = 7 products).
        assert_close_f32(a, a_ad, reduction=REDUCTION, err_msg=f"{what}: custom vs autodiff")
        assert _rel_err(a_ad, ref) < 1e-5, f"{what}: autodiff vs float64 (is the reference right?)"
        assert _rel_err(a, ref) < 1e-5, f"{what}: custom vs float64"

    # masked keys and dead query rows: zero output, exactly zero gradients there, finite everywhere
    live = np.broadcast_to(_effective_mask(mask, causal), (B, H, T, S))
    dead = ~live.any(-1)  # [B, H, T]
    assert np.all(np.asarray(out)[dead] == 0.0)
    assert np.all(np.asarray(grads[0])[dead] == 0.0)
    hidden = ~live.any(-2)  # [B, H, S]: keys no query may attend to
    assert np.all(np.asarray(grads[1])[hidden] == 0.0) and np.all(np.asarray(grads[2])[hidden] == 0.0)
    assert all(np.all(np.isfinite(x)) for x in grads if x is not None)
    if name == "padding":
        assert dead[2].all() and hidden[1, :, 3:].all()
        assert np.all(np.asarray(grads[3])[2] == 0.0)  # a per-batch bias of a dead batch entry


def test_bfloat16_matches_autodiff_and_float64_reference(rng):
    (q, k, v, mask, bias, g), _, _ = _case(rng, "dead_row", dtype=jnp.bfloat16)
    q = q * 4  # |logits| up to ~15: a peaked softmax
    out, grads = jax.jit(_vjp(_fast))(q, k, v, mask, bias, g)
    out_ad, grads_ad = jax.jit(_vjp(_autodiff))(q, k, v, mask, bias, g)
    assert _goes_through_custom_rule(_fast, q, k, v, mask, bias)
    assert out.dtype == jnp.bfloat16
    assert [x.dtype for x in grads] == [jnp.bfloat16] * 3 + [jnp.float32]  # bias is float32 here
    # The reference uses the same bf16-rounded inputs and cotangent in float64, and the products and softmax run
    # in float32, so the error is the final rounding of each result to bf16 (8 mantissa bits: 2^-9 ~ 2e-3
    # relative per entry); 1e-2 relative to the largest entry leaves room. The two float32 paths can differ
    # by one bf16 step where the float32 values straddle a rounding boundary: the same tolerance.
    f64 = [np.asarray(x, np.float64) for x in (q, k, v, g)]
    out_ref, _ = dot_attention_ref(f64[0], f64[1], f64[2], mask, bias)
    grads_ref = attention_grads_ref(*f64, mask, bias)
    assert _rel_err(out, out_ref) < 1e-2 and _rel_err(out, out_ad) < 1e-2
    for what, a, a_ad, ref in zip(("dq", "dk", "dv", "dbias"), grads, grads_ad, grads_ref, strict=True):
        assert np.all(np.isfinite(np.asarray(a, np.float32))), what
        assert _rel_err(a, ref) < 1e-2, what
        assert _rel_err(a, a_ad) < 1e-2, what


@pytest.mark.numerics
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.2, 0.6, 1.0]))
@settings(max_examples=10)
def test_property_random_masks_match_autodiff(seed, density):
    rng = np.random.default_rng(seed)
    (q, k, v, _, bias, g), _, _ = _case(rng, "dead_row")
    mask = rng.random((B, H, T, S)) < density  # may mask whole rows
    out, grads = _jit_fast_vjp(q, k, v, mask, bias, g)
    out_ad, grads_ad = _jit_autodiff_vjp(q, k, v, mask, bias, g)
    # A fully masked mask gives all-zero gradients on both paths: the helper then demands exact zeros.
    assert_close_f32((out, grads), (out_ad, grads_ad), reduction=REDUCTION)


_jit_fast_vjp = jax.jit(_vjp(_fast))
_jit_autodiff_vjp = jax.jit(_vjp(_autodiff))


# --- transforms ------------------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_jit_equals_eager_and_vmap_equals_loop(rng):
    (q, k, v, mask, bias, g), _, _ = _case(rng, "padding")  # bias [B, 1, T, S], mask [B, 1, 1, S]
    eager = _vjp(_fast)(q, k, v, mask, bias, g)
    jitted = _jit_fast_vjp(q, k, v, mask, bias, g)
    assert_close_f32(eager, jitted, reduction=REDUCTION)

    # vmap over the batch axis; the per-batch bias and mask are mapped, a shared bias [1, T, S] is not
    per_example = jax.jit(jax.vmap(_vjp(_fast)))(q, k, v, mask, bias, g)
    shared = jax.jit(jax.vmap(_vjp(_fast), in_axes=(0, 0, 0, 0, None, 0)))(q, k, v, mask, bias[0], g)
    for i in range(B):  # bias[i] and bias[0] are both [1, T, S]: one compiled shape
        loop = _jit_fast_vjp(q[i], k[i], v[i], mask[i], bias[i], g[i])
        loop_shared = _jit_fast_vjp(q[i], k[i], v[i], mask[i], bias[0], g[i])
        assert_close_f32(jax.tree.map(lambda a, i=i: a[i], per_example), loop, reduction=REDUCTION)
        assert_close_f32(jax.tree.map(lambda a, i=i: a[i], shared), loop_shared, reduction=REDUCTION)


def test_check_grads(rng):
    # tiny: finite differences call the function eagerly many times
    q, k, v = _normal(rng, (2, 3, 4)), _normal(rng, (2, 5, 4)), _normal(rng, (2, 5, 3))
    mask = rng.random((2, 3, 5)) < 0.7
    mask[0, 1] = False  # through a fully masked row too
    bias = _normal(rng, (1, 3, 5))
    f = jax.jit(lambda q, k, v, bias: _fast(q, k, v, mask, bias, causal=True, scale=0.6))
    assert _goes_through_custom_rule(f, q, k, v, bias)
    # float32 finite differences (x64 is off globally): eps 1e-3 keeps the truncation error ~1e-6 and the
    # rounding error ~1e-7/1e-3 = 1e-4, far inside 1e-2. The rule is a custom_jvp, so forward mode works, and
    # reverse over reverse differentiates its transpose (forward mode is also compared with autodiff below).
    check_grads(f, (q, k, v, bias), order=1, modes=["fwd", "rev"], eps=1e-3, atol=1e-2, rtol=1e-2)
    check_grads(f, (q, k, v, bias), order=2, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


@pytest.mark.numerics
def test_forward_mode_matches_autodiff(rng):
    (q, k, v, mask, bias, _), causal, scale = _case(rng, "causal")
    tangents = tuple(_normal(rng, np.shape(x)) for x in (q, k, v, bias))
    kw = dict(causal=causal, scale=scale)

    @jax.jit
    def jvps(q, k, v, bias, tangents):
        def both(f):
            full = jax.jvp(lambda *a: f(*a[:3], mask, a[3], **kw), (q, k, v, bias), tangents)
            # only the value carries a tangent (the others are symbolic zeros inside the rule)
            value_only = jax.jvp(lambda v: f(q, k, v, mask, bias, **kw), (v,), (tangents[2],))[1]
            return full, value_only

        return both(_fast), both(_autodiff)

    ((primal, tangent), t_v), ((primal_ad, tangent_ad), t_v_ad) = jvps(q, k, v, bias, tangents)
    assert_close_f32((primal, tangent, t_v), (primal_ad, tangent_ad, t_v_ad), reduction=REDUCTION)


# --- dispatch --------------------------------------------------------------------------------------------------


def test_default_implementation_takes_the_custom_rule(rng):
    (q, k, v, mask, bias, _), _, _ = _case(rng, "dead_row")
    assert _goes_through_custom_rule(
        lambda q, k, v: dot_product_attention(q, k, v, mask, implementation="xla"), q, k, v
    )
    if jax.default_backend() == "cpu":  # None resolves to "xla" for short sequences off-GPU
        assert _goes_through_custom_rule(
            lambda q, k, v: dot_product_attention(q, k, v, mask, bias=bias), q, k, v
        )


@pytest.mark.numerics
def test_fallbacks_still_work_and_match(rng):
    """return_weights, broadcast batch axes and a traced scale keep plain autodiff, with the same values."""
    (q, k, v, mask, bias, g), _, _ = _case(rng, "dead_row")

    # return_weights: the context equals the fast path's
    ctx, w = jax.jit(dot_product_attention, static_argnames="return_weights")(
        q, k, v, mask, bias=bias, return_weights=True
    )
    assert_close_f32(ctx, jax.jit(_fast)(q, k, v, mask, bias), reduction=REDUCTION)
    assert w.shape == (B, H, T, S)

    # a key/value shared by the heads ([B, 1, S, K]): batch axes differ, so autodiff; check against float64
    k1, v1 = k[:, :1], v[:, :1]
    assert not _goes_through_custom_rule(_fast, q, k1, v1, mask, bias)
    out, grads = jax.jit(_vjp(_fast))(q, k1, v1, mask, bias, g)
    out_ref, _ = dot_attention_ref(q, k1, v1, mask, bias)
    assert _rel_err(out, out_ref) < 1e-5
    grads_ref = attention_grads_ref(q, k1, v1, g, mask, bias)
    for what, a, ref in zip(("dq", "dk", "dv", "dbias"), grads, grads_ref, strict=True):
        assert a.shape == ref.shape and _rel_err(a, ref) < 1e-5, what

    # a traced scale falls back too and stays differentiable
    def scaled(scale):
        return dot_product_attention(q, k, v, mask, bias=bias, scale=scale)

    assert not _goes_through_custom_rule(scaled, 0.5)
    scaled = jax.jit(scaled)
    fixed = jax.jit(functools.partial(_fast, scale=0.5))
    # Traced vs static scale: two programs (on AVX-512 an entry of 0.009 moves by 2.5e-7, elementwise 1.2e-5).
    assert_close_f32(scaled(0.5), fixed(q, k, v, mask, bias), reduction=REDUCTION)
    d_scale = jax.jit(jax.grad(lambda s: jnp.sum(scaled(s) * g)))(0.5)
    eps = 1e-2  # central difference in float32: truncation ~eps² = 1e-4, rounding ~1e-7/1e-2 = 1e-5
    numeric = (jnp.sum(scaled(0.5 + eps) * g) - jnp.sum(scaled(0.5 - eps) * g)) / (2 * eps)
    np.testing.assert_allclose(d_scale, numeric, rtol=1e-2, atol=1e-3)
