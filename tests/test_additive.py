"""Additive (Bahdanau) attention against float64 loop references, hand-computed cases and properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from attn_jax.attention import _additive
from attn_jax.attention._additive import (
    additive_attention,
    additive_attention_step,
    additive_scores,
    init_additive_params,
    project_keys,
)
from attn_jax.attention._softmax import assert_valid_attention_weights, attend
from tests.reference.core import context_ref, softmax_ref
from tests.reference.scorers import additive_energies_ref, additive_ref, rel_err
from tests.tolerance import assert_close_f32

# Odd, distinct sizes: a swapped axis changes a shape or a sum and fails.
B, T, S, DQ, DK, DV, A = 3, 5, 7, 11, 13, 9, 15
LENGTHS = np.array([7, 4, 0])  # full, padded, and a sentence with no valid key
CONFIGS = {
    "bias": dict(use_bias=True),
    "no_bias": dict(use_bias=False),
    "normed": dict(normalize=True),
}
# Longest float32 summation chain to the context (W_k h over Dk, |v| and v·tanh over A, the softmax denominator
# and the context over S): the reduction length for comparing two float32 programs.
REDUCTION = DK + 2 * A + 2 * S


# Jitted once per shape: hypothesis examples and the truncated-sentence loop reuse the compiled function.
# Tests call jitted wrappers (compiled once per shape) rather than eager op-by-op dispatch, which compiles every
# primitive separately and dominates the runtime; test_jit_and_vmap compares against the eager path.
_attn = jax.jit(lambda p, q, k, v, m: additive_attention(p, q, k, v, m, return_weights=True))
_scores = jax.jit(lambda p, q, k: additive_scores(p, q, project_keys(p, k)))


def _params(key, *, dq=DQ, dk=DK, a=A, scale=1.0, dtype=jnp.float32, **kw):
    """Random params; b and g perturbed away from their init (0 and sqrt(1/A)) so a dropped term is caught."""
    p = init_additive_params(key, dq, dk, a, **kw)
    ks = jax.random.split(jax.random.fold_in(key, 1), 2)
    if "b" in p:
        p["b"] = 0.5 * jax.random.normal(ks[0], (a,))
    if "g" in p:
        p["g"] = jnp.asarray(1.7)
    p["v"] = p["v"] * scale
    return {k: v.astype(dtype) for k, v in p.items()}


def _inputs(rng, b=B, t=T, s=S):
    q = rng.normal(size=(b, t, DQ)).astype(np.float32)
    k = rng.normal(size=(b, s, DK)).astype(np.float32)
    v = rng.normal(size=(b, s, DV)).astype(np.float32)
    return q, k, v


def _length_mask(lengths, s=S):
    """[B, 1, S] key-padding mask built with plain jnp ops (True = may attend)."""
    return (jnp.arange(s)[None, :] < jnp.asarray(lengths)[:, None])[:, None, :]


# --- hand-computed cases (seed lesson 002) -----------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize(
    "energies, expected",
    [
        # e = (2.0, 0.5, -1.0): exp = 7.389, 1.649, 0.368; sum 9.406 -> 0.786, 0.175, 0.039.
        ((2.0, 0.5, -1.0), (0.786, 0.175, 0.039)),
        # Raising the second energy by 2 moves most of the reading: -> 0.371, 0.611, 0.018.
        ((2.0, 2.5, -1.0), (0.371, 0.611, 0.018)),
    ],
)
def test_seed_energies_softmax_stage_and_through_the_scorer(energies, expected):
    # atol 6e-4: the lesson rounds the weights to three decimals.
    values = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    ctx, w = attend(jnp.array([energies]), values)
    np.testing.assert_allclose(w[0], expected, atol=6e-4)
    # c = α1 h1 + α2 h2 + α3 h3 with h = e1, e2, e1 + e2.
    np.testing.assert_allclose(ctx[0], [expected[0] + expected[2], expected[1] + expected[2]], atol=1.2e-3)

    # The same energies out of the additive scorer: A = 1, W = U = 1, v = 4, s = 0, h_j = atanh(e_j / 4),
    # so e_j = 4 tanh(0 + h_j) exactly.
    params = {"w_q": jnp.ones((1, 1)), "w_k": jnp.ones((1, 1)), "v": jnp.array([4.0])}
    keys = jnp.arctanh(jnp.array(energies) / 4.0)[:, None]
    e = _scores(params, jnp.zeros((1, 1)), keys)
    np.testing.assert_allclose(e[0], energies, rtol=1e-6, atol=1e-6)
    ctx2, w2 = _attn(params, jnp.zeros((1, 1)), keys, values, None)
    np.testing.assert_allclose(w2[0], expected, atol=6e-4)
    # energies 4·tanh(atanh(e/4)) are e up to float32 rounding, and _attn is another program than attend
    assert_close_f32(ctx2, ctx, reduction=3)


def test_hand_computed_one_dimensional_case():
    # A = Dq = Dk = 1, W = U = v = 1, no bias, s = 0.5, h = (0, 0.5, -0.5):
    #   tanh arguments 0.5, 1.0, 0.0 -> e = (tanh 0.5, tanh 1, 0) = (0.462117, 0.761594, 0)
    #   exp(e) = 1.587480, 2.141682, 1 (sum 4.729162) -> α = (0.335672, 0.452872, 0.211456)
    #   c = Σ α_j h_j = 0.5 · 0.452872 - 0.5 · 0.211456 = 0.120708
    params = {"w_q": jnp.ones((1, 1)), "w_k": jnp.ones((1, 1)), "v": jnp.ones(1)}
    s = jnp.array([[0.5]])
    h = jnp.array([[0.0], [0.5], [-0.5]])
    ctx, w = _attn(params, s, h, h, None)
    np.testing.assert_allclose(_scores(params, s, h)[0], [0.462117, 0.761594, 0.0], atol=1e-6)
    np.testing.assert_allclose(w[0], [0.335672, 0.452872, 0.211456], atol=1e-6)
    np.testing.assert_allclose(ctx[0], [0.120708], atol=1e-6)

    # Bias b = -0.5 shifts the arguments to (0, 0.5, -0.5): e = (0, 0.462117, -0.462117).
    e_b = _scores({**params, "b": jnp.array([-0.5])}, s, h)
    np.testing.assert_allclose(e_b[0], [0.0, 0.462117, -0.462117], atol=1e-6)

    # Weight norm: v = -3, g = 2 -> v_eff = g v / |v| = -2, energies doubled and negated.
    e_g = _scores({**params, "v": jnp.array([-3.0]), "g": jnp.asarray(2.0)}, s, h)
    np.testing.assert_allclose(e_g[0], [-0.924234, -1.523188, 0.0], atol=1e-6)


# --- float64 references -------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", list(CONFIGS))
def test_matches_float64_reference(config, key, rng):
    params = _params(key, **CONFIGS[config])
    q, k, v = _inputs(rng)
    mask = _length_mask(LENGTHS)
    ctx, w = _attn(params, q, k, v, mask)
    ctx_ref, w_ref = additive_ref(params, q, k, v, mask)
    p64 = {n: np.asarray(x, np.float64) for n, x in params.items()}
    e_ref = additive_energies_ref(q, k, p64["w_q"], p64["w_k"], p64["v"], p64.get("b"), p64.get("g"))
    assert rel_err(_scores(params, q, k), e_ref) < 1e-5
    assert rel_err(w, w_ref) < 1e-5
    assert rel_err(ctx, ctx_ref) < 1e-5
    assert ctx.dtype == jnp.float32 and w.dtype == jnp.float32
    assert_valid_attention_weights(w, mask)


def test_broadcast_leading_axes_and_default_values(key, rng):
    # query [2, B, T, Dq] against keys [B, S, Dk]: leading axes broadcast; values default to the keys (h_j).
    params = _params(key)
    q = rng.normal(size=(2, B, T, DQ)).astype(np.float32)
    _, k, _ = _inputs(rng)
    ctx, w = jax.jit(lambda p, q, k: additive_attention(p, q, k, return_weights=True))(params, q, k)
    ctx_ref, w_ref = additive_ref(params, q, k)
    assert ctx.shape == (2, B, T, DK)
    assert rel_err(w, w_ref) < 1e-5
    assert rel_err(ctx, ctx_ref) < 1e-5


@pytest.mark.numerics
def test_projected_keys_are_used_and_keys_not_reprojected(key, rng):
    params = _params(key)
    q, k, v = _inputs(rng)
    pk = jax.jit(project_keys)(params, k)
    expected = _attn(params, q, k, v, None)
    # Garbage keys of the right shape must not matter once projected_keys is given; keys may also be None.
    # (Keys projected by their own program vs inside _attn's: float32 rounding apart; garbage would be O(1) off.)
    garbage = 100.0 * rng.normal(size=k.shape).astype(np.float32)
    f = jax.jit(lambda p, q, k, v, pk: additive_attention(p, q, k, v, projected_keys=pk, return_weights=True))
    assert_close_f32(f(params, q, garbage, v, pk), expected, reduction=REDUCTION)
    g = jax.jit(lambda p, q, v, pk: additive_attention(p, q, None, v, projected_keys=pk, return_weights=True))
    assert_close_f32(g(params, q, v, pk), expected, reduction=REDUCTION)


# --- the split form: project once, one query per step inside lax.scan --------------------------------------


def _decode(params, queries, keys, values, key_mask):
    """Teacher-forced decoder loop: project once, then one additive_attention_step per target position."""
    pk = project_keys(params, keys)

    def step(carry, q_t):  # q_t: [B, Dq]
        ctx, w = additive_attention_step(params, q_t, pk, values, key_mask)
        return carry, (ctx, w)

    _, (ctx, w) = jax.lax.scan(step, None, jnp.swapaxes(queries, 0, 1))  # scan over T
    return jnp.swapaxes(ctx, 0, 1), jnp.swapaxes(w, 0, 1)


@pytest.mark.numerics
def test_scan_of_steps_equals_all_at_once(key, rng):
    params = _params(key, normalize=True)
    q, k, v = _inputs(rng)
    key_mask = jnp.arange(S)[None, :] < jnp.asarray(LENGTHS)[:, None]  # [B, S]
    ctx_s, w_s = jax.jit(_decode)(params, q, k, v, key_mask)
    ctx, w = _attn(params, q, k, v, key_mask[:, None, :])
    assert_close_f32((ctx_s, w_s), (ctx, w), reduction=REDUCTION)


def _dot_operand_shapes(jaxpr, inside_scan=False):
    """[(operand shapes, inside a scan body?)] for every dot_general in ``jaxpr`` and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append((tuple(tuple(x.aval.shape) for x in eqn.invars), inside_scan))
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _dot_operand_shapes(inner, inside_scan or eqn.primitive.name == "scan")
    return found


def test_keys_are_projected_once_outside_the_scan(key, rng, monkeypatch):
    params = _params(key)
    q, k, v = _inputs(rng)
    key_mask = jnp.ones((B, S), bool)
    dots = _dot_operand_shapes(jax.make_jaxpr(_decode)(params, q, k, v, key_mask).jaxpr)
    with_w_k = [inside for shapes, inside in dots if (DK, A) in shapes]
    assert with_w_k == [False], f"W_k h must be one dot_general outside the scan, got {dots}"
    # The query projection does run inside the scan (so the walk does see the body).
    assert any(inside and (DQ, A) in shapes for shapes, inside in dots)

    # And a Python loop of steps never calls project_keys.
    calls = []
    original = _additive.project_keys
    monkeypatch.setattr(_additive, "project_keys", lambda *a: calls.append(1) or original(*a))
    pk = jax.jit(original)(params, k)
    step = jax.jit(
        additive_attention_step
    )  # a step that projected keys would call project_keys while tracing
    for t in range(T):
        step(params, q[:, t], pk, v, key_mask)
    assert calls == []


# --- properties ---------------------------------------------------------------------------------------------


@st.composite
def _padded_batch(draw):
    # Fixed shapes (each new shape compiles): the examples vary lengths, content and params. T = 4 != S = 7, so
    # a softmax over the target axis cannot pass.
    b, t, s = 3, 4, 7
    # Lengths from a small set too (the truncated run compiles once per length); 0 = no valid key at all.
    lengths = draw(st.lists(st.sampled_from([0, 3, s]), min_size=b, max_size=b))
    return b, t, s, np.array(lengths), draw(st.integers(0, 2**31 - 1))


@pytest.mark.numerics
@settings(max_examples=15)
@given(_padded_batch())
def test_padding_properties(case):
    b, t, s, lengths, seed = case
    rng = np.random.default_rng(seed)
    params = _params(jax.random.key(seed % 1000), normalize=True)  # has every optional term (b, g)
    q, k, v = _inputs(rng, b, t, s)
    mask = _length_mask(lengths, s)
    ctx, w = _attn(params, q, k, v, mask)
    # Rows sum to 1 over the source axis, padded keys get exactly 0, empty sentences give all-zero rows.
    assert_valid_attention_weights(w, mask)
    assert np.all(np.isfinite(ctx))
    assert np.all(np.asarray(ctx)[lengths == 0] == 0.0)
    ctx_ref, w_ref = additive_ref(params, q, k, v, mask)
    assert rel_err(w, w_ref) < 1e-5 and rel_err(ctx, ctx_ref) < 1e-5

    # Whatever sits in the padding is invisible.
    pad = np.arange(s)[None, :] >= lengths[:, None]
    k2, v2 = k.copy(), v.copy()
    k2[pad] = 1e3 * rng.normal(size=k2[pad].shape)
    v2[pad] = 1e3 * rng.normal(size=v2[pad].shape)
    ctx2, w2 = _attn(params, q, k2, v2, mask)
    # The same compiled program, and padded keys contribute exact zeros (masked logits -> weight 0, 0 · v = 0):
    # bitwise equal.
    np.testing.assert_array_equal(w2, w)
    np.testing.assert_array_equal(ctx2, ctx)

    # Padded == truncated, sentence by sentence (two programs: float32 rounding apart).
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        ctx_t, w_t = _attn(params, q[i], k[i, :n], v[i, :n], None)
        assert_close_f32(w[i, :, :n], w_t, reduction=REDUCTION)
        assert_close_f32(ctx[i], ctx_t, reduction=REDUCTION)


@settings(max_examples=10)
@given(st.integers(0, 2**31 - 1))
def test_arbitrary_masks_normalise_over_source_axis(seed):
    rng = np.random.default_rng(seed)
    params = _params(jax.random.key(seed % 1000))
    q, k, v = _inputs(rng)
    mask = rng.random((B, T, S)) < 0.5
    ctx, w = _attn(params, q, k, v, mask)
    assert_valid_attention_weights(w, mask)
    ctx_ref, w_ref = additive_ref(params, q, k, v, mask)
    assert rel_err(w, w_ref) < 1e-5 and rel_err(ctx, ctx_ref) < 1e-5


def test_fully_masked_rows_give_zeros_and_finite_grads(key, rng):
    params = _params(key, normalize=True)
    q, k, v = _inputs(rng)
    mask = np.ones((B, T, S), bool)
    mask[0, 1] = False  # one query with nothing to attend to
    mask[2] = False  # a sentence with no valid key at all

    def loss(p, q, k, v):
        ctx, w = additive_attention(p, q, k, v, mask, return_weights=True)
        return jnp.sum(ctx**2) + jnp.sum(w * jnp.arange(S))

    ctx, w = _attn(params, q, k, v, mask)
    assert np.all(np.asarray(w)[~mask.any(-1)] == 0.0) and np.all(np.asarray(ctx)[~mask.any(-1)] == 0.0)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(params, q, k, v)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    # No gradient leaks into a fully masked sentence's keys, values or queries.
    assert np.all(np.asarray(grads[2])[2] == 0) and np.all(np.asarray(grads[3])[2] == 0)
    assert np.all(np.asarray(grads[1])[2] == 0)


# --- transformations ----------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_jit_and_vmap(key, rng):
    params = _params(key, normalize=True)
    q, k, v = _inputs(rng)
    mask = _length_mask(LENGTHS)
    f = lambda p, q, k, v, m: additive_attention(p, q, k, v, m, return_weights=True)
    eager = f(params, q, k, v, mask)
    jitted = jax.jit(f)(params, q, k, v, mask)
    # Eager runs op by op, jit fuses: two programs, float32 rounding apart (on AVX-512, 2.3e-6 of an entry).
    assert_close_f32(jitted, eager, reduction=REDUCTION)
    # vmap over the batch (params shared) == a Python loop over single sentences.
    vmapped = jax.jit(jax.vmap(f, in_axes=(None, 0, 0, 0, 0)))(params, q, k, v, mask)
    for i in range(B):
        one = _attn(params, q[i], k[i], v[i], mask[i])
        assert_close_f32(tuple(x[i] for x in vmapped), one, reduction=REDUCTION)


@pytest.mark.parametrize("config", ["bias", "normed"])
def test_check_grads(config, key, rng):
    # float32 finite differences (the scorer computes in float32 by policy, so x64 inputs would not help):
    # eps=1e-3 gives ~1e-4 relative rounding noise in the difference quotient; tolerance 1e-2 leaves margin.
    params = _params(key, dq=4, dk=3, a=5, **CONFIGS[config])
    q = rng.normal(size=(2, 3, 4)).astype(np.float32)
    k = rng.normal(size=(2, 6, 3)).astype(np.float32)
    v = rng.normal(size=(2, 6, 2)).astype(np.float32)
    mask = jnp.arange(6)[None, None, :] < jnp.array([6, 4])[:, None, None]
    f = jax.jit(lambda p, q, k, v: additive_attention(p, q, k, v, mask))
    check_grads(f, (params, q, k, v), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)
    pk = project_keys(params, k)
    step = jax.jit(lambda p, q_t, pk, v: additive_attention_step(p, q_t, pk, v, mask[:, 0])[0])
    check_grads(step, (params, q[:, 0], pk, v), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


# --- low precision ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, ctx_tol",
    [
        # Energies, softmax and the context sum run in float32 from the (exactly representable) low-precision
        # inputs, so the weights stay at float32 accuracy; the context is rounded once to the output dtype:
        # relative 2^-8 for bfloat16, 2^-11 for float16 (tolerances: about twice that).
        (jnp.bfloat16, 1e-2),
        (jnp.float16, 2e-3),
    ],
)
def test_low_precision_large_energies(dtype, ctx_tol, key, rng):
    params = _params(key, scale=20.0, dtype=dtype, normalize=False)  # |v| ~ 20: energies of tens
    q, k, v = (jnp.asarray(10.0 * x, dtype) for x in _inputs(rng))
    mask = _length_mask(LENGTHS)
    ctx, w = additive_attention(params, q, k, v, mask, return_weights=True)
    assert ctx.dtype == dtype and w.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(ctx, np.float32))) and np.all(np.isfinite(w))
    e = _scores(params, q, k)
    assert float(jnp.max(jnp.abs(e))) > 20.0  # the case is really one of large energies
    ctx_ref, w_ref = additive_ref(params, q, k, v, mask)  # float64 from the same rounded inputs
    assert_valid_attention_weights(w, mask)
    assert np.max(np.abs(np.asarray(w) - w_ref)) < 1e-4  # energies ~50 in float32: |Δe| ~ 1e-5
    assert rel_err(np.asarray(ctx, np.float32), ctx_ref) < ctx_tol


# --- init and errors ----------------------------------------------------------------------------------------


def test_init_params(key):
    p = init_additive_params(key, DQ, DK, A, normalize=True, use_bias=False, dtype=jnp.bfloat16)
    assert sorted(p) == ["b", "g", "v", "w_k", "w_q"]  # normalize forces the bias
    assert all(x.dtype == jnp.bfloat16 for x in p.values())
    assert p["w_q"].shape == (DQ, A) and p["w_k"].shape == (DK, A) and p["v"].shape == (A,)
    np.testing.assert_allclose(float(p["g"]), np.sqrt(1 / A), rtol=1e-2)
    assert np.all(np.asarray(p["b"], np.float32) == 0)
    assert "b" not in init_additive_params(key, DQ, DK, A, use_bias=False)
    # Unlike the paper's v = 0, the init gives non-uniform weights from the first step.
    p = init_additive_params(key, DQ, DK, A)
    q, k, _ = _inputs(np.random.default_rng(1))
    _, w = _attn(p, q, k, k, None)
    assert float(jnp.std(w)) > 1e-3


def test_errors_name_the_shapes(key, rng):
    params = _params(key)
    q, k, v = _inputs(rng)
    with pytest.raises(ValueError, match=r"query has 10 features.*\[3, 5, 10\].*w_q \[11, 15\]"):
        additive_attention(params, q[..., :10], k, v)
    with pytest.raises(ValueError, match=r"keys have 12 features.*w_k \[13, 15\]"):
        additive_attention(params, q, k[..., :12], v)
    with pytest.raises(ValueError, match=r"values \[3, 6, 9\].*\[3, 7, 15\]"):
        additive_attention(params, q, k, v[:, :6])
    with pytest.raises(ValueError, match=r"mask of shape \[3, 5, 6\].*\[3, 5, 7\]"):
        additive_attention(params, q, k, v, jnp.ones((B, T, S - 1), bool))
    with pytest.raises(ValueError, match=r"mask must be boolean"):
        additive_attention(params, q, k, v, jnp.ones((B, T, S)))
    with pytest.raises(ValueError, match=r"projected_keys axis -1 has size 14"):
        additive_scores(params, q, jnp.ones((B, S, A - 1)))
    with pytest.raises(ValueError, match=r"batch axes \[3\].*\[2\]"):
        additive_attention(params, q, k[:2], v[:2])
    with pytest.raises(ValueError, match=r"disagree on A"):
        additive_attention({**params, "v": params["v"][:-1]}, q, k, v)
    with pytest.raises(ValueError, match=r"step logits.*\[3, 7\]"):
        additive_attention_step(params, q[:, 0], project_keys(params, k), v, jnp.ones((B, S + 1), bool))
    with pytest.raises(ValueError, match=r"attention_dim must be a positive int"):
        init_additive_params(key, DQ, DK, 0)


def test_reference_is_the_seed_formula():
    # The float64 reference itself against the seed's PyTorch-style one-liner
    # scores = (v * tanh(H @ W1 + s @ W2)).sum(-1), alpha = softmax(scores), context = alpha @ H.
    rng = np.random.default_rng(3)
    s, H = rng.normal(size=DQ), rng.normal(size=(S, DK))
    W2, W1, v = rng.normal(size=(DQ, A)), rng.normal(size=(DK, A)), rng.normal(size=A)
    scores = (v * np.tanh(H @ W1 + s @ W2)).sum(-1)
    alpha = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    params = {"w_q": W2, "w_k": W1, "v": v}
    ctx, w = additive_ref(params, s[None], H)
    np.testing.assert_allclose(w[0], alpha, rtol=1e-12)
    np.testing.assert_allclose(ctx[0], alpha @ H, rtol=1e-12)
    np.testing.assert_allclose(softmax_ref(scores[None])[0], alpha, rtol=1e-12)
    np.testing.assert_allclose(context_ref(alpha[None], H)[0], alpha @ H, rtol=1e-12)
