"""Fused additive (Bahdanau) scores: values and gradients against float64 loop references and the naive autodiff,
inside a decoder ``lax.scan`` as RNNsearch runs it, under jit/vmap, in low precision, and its memory.

The fused scorer is a ``jax.custom_vjp`` whose backward recomputes ``tanh(W_q s + U h)``; the naive one is the
plain autodiff of the formula (``fused=False``). Both must agree with each other and with float64 references, and
the fused one must not keep a ``[T, B, S, A]`` residual alive in a scan over decoder steps.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from attn_jax.attention._additive import (
    additive_attention,
    additive_attention_step,
    additive_scores,
    init_additive_params,
    project_keys,
)
from attn_jax.attention._fused_additive import fused_additive_scores
from attn_jax.attention._softmax import assert_valid_attention_weights
from attn_jax.models import RNNConfig, RNNsearch, build_model
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
# Longest float32 summation chains, the reduction lengths for comparing two float32 programs (fused vs naive,
# blocked vs whole, scan vs all at once, jit vs eager): the kernel's db and dv sum B·T·S cells of sums over A;
# the scorer adds the projections over Dq or Dk, the attention a softmax and a context over S and the |v| of
# weight norm over A.
KERNEL_REDUCTION = B * T * S + A
REDUCTION = B * T * S + DK + 2 * A + 2 * S


def _params(key, *, dq=DQ, dk=DK, a=A, scale=1.0, dtype=jnp.float32, **kw):
    """Random params; b and g moved away from their init (0 and sqrt(1/A)) so a dropped term is caught."""
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


def _key_mask(lengths=LENGTHS, s=S):
    """[B, S] key-padding mask (True = may attend)."""
    return jnp.arange(s)[None, :] < jnp.asarray(lengths)[:, None]


# --- float64 loop references of the gradients -----------------------------------------------------------------


def _source_index(idx, shape):
    """Index into an operand of batch ``shape`` that broadcasting mapped to the broadcast index ``idx``."""
    idx = idx[len(idx) - len(shape) :]
    return tuple(0 if n == 1 else i for i, n in zip(idx, shape, strict=True))


def kernel_ref(q, k, v, b, cot):
    """``e = vᵀ tanh(q_i + k_j + b)`` and the gradients of ``L = Σ cot·e`` w.r.t. q, k, v, b; float64 loops."""
    q, k, v, b, cot = (np.asarray(x, np.float64) for x in (q, k, v, b, cot))
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    nt, ns, na = q.shape[-2], k.shape[-2], v.shape[0]
    e = np.zeros(batch + (nt, ns))
    dq, dk, dv, db = np.zeros(q.shape), np.zeros(k.shape), np.zeros(na), np.zeros(na)
    for idx in np.ndindex(*batch):
        iq, ik = _source_index(idx, q.shape[:-2]), _source_index(idx, k.shape[:-2])
        for i in range(nt):
            for j in range(ns):
                c = cot[idx + (i, j)]
                terms = []
                for a in range(na):
                    t = math.tanh(q[iq + (i, a)] + k[ik + (j, a)] + b[a])
                    terms.append(v[a] * t)
                    dq[iq + (i, a)] += c * v[a] * (1.0 - t * t)
                    dk[ik + (j, a)] += c * v[a] * (1.0 - t * t)
                    db[a] += c * v[a] * (1.0 - t * t)
                    dv[a] += c * t
                e[idx + (i, j)] = math.fsum(terms)
    return e, (dq, dk, dv, db)


def _project(x, w):
    """``out[n, i, a] = Σ_d x[n, i, d] · w[d, a]`` with exact sums."""
    (nb, ni, nd), na = x.shape, w.shape[1]
    out = np.zeros((nb, ni, na))
    for n, i, a in np.ndindex(nb, ni, na):
        out[n, i, a] = math.fsum(x[n, i, d] * w[d, a] for d in range(nd))
    return out


def params_grads_ref(params, query, keys, cot):
    """Gradients of ``L = Σ cot · additive_scores(params, query, project_keys(params, keys))``; float64 loops.

    Chain rule through ``W_q s``, ``W_k h``, ``b`` and the weight norm ``v_eff = g v / ‖v‖`` written out by hand.
    """
    p = {n: np.asarray(x, np.float64) for n, x in params.items()}
    query, keys, cot = (np.asarray(x, np.float64) for x in (query, keys, cot))
    w_q, w_k, v = p["w_q"], p["w_k"], p["v"]
    b = p.get("b", np.zeros_like(v))
    norm = math.sqrt(math.fsum(x * x for x in v))
    v_eff = p["g"] * v / norm if "g" in p else v
    (nb, nt, _), ns, na = query.shape, keys.shape[1], v.shape[0]
    ws, uh = _project(query, w_q), _project(keys, w_k)  # W s_i [B, T, A], U h_j [B, S, A]
    d_ws, d_uh, d_veff, d_b = np.zeros(ws.shape), np.zeros(uh.shape), np.zeros(na), np.zeros(na)
    for n in range(nb):
        for i in range(nt):
            for j in range(ns):
                for a in range(na):
                    t = math.tanh(ws[n, i, a] + uh[n, j, a] + b[a])
                    delta = cot[n, i, j] * v_eff[a] * (1.0 - t * t)
                    d_ws[n, i, a] += delta
                    d_uh[n, j, a] += delta
                    d_b[a] += delta
                    d_veff[a] += cot[n, i, j] * t
    grads = {
        "w_q": np.einsum("ntd,nta->da", query, d_ws),
        "w_k": np.einsum("nsd,nsa->da", keys, d_uh),
    }
    if "b" in p:
        grads["b"] = d_b
    if "g" in p:
        dot = math.fsum(d_veff[a] * v[a] for a in range(na))
        grads["g"] = np.asarray(dot / norm)
        grads["v"] = p["g"] / norm * (d_veff - dot * v / norm**2)
    else:
        grads["v"] = d_veff
    d_query = np.einsum("nta,da->ntd", d_ws, w_q)
    d_keys = np.einsum("nsa,da->nsd", d_uh, w_k)
    return grads, d_query, d_keys


def test_params_grads_ref_agrees_with_finite_differences(key, rng):
    # The hand-written chain rule is itself checked against float64 central differences of the seed reference.
    params = {n: np.asarray(x, np.float64) for n, x in _params(key, dq=3, dk=2, a=4, normalize=True).items()}
    query, keys = rng.normal(size=(1, 2, 3)), rng.normal(size=(1, 3, 2))
    cot = rng.normal(size=(1, 2, 3))

    def loss(p, q, k):
        e = additive_energies_ref(q, k, p["w_q"], p["w_k"], p["v"], p.get("b"), p.get("g"))
        return float(np.sum(cot * e))

    grads, d_query, d_keys = params_grads_ref(params, query, keys, cot)
    h = 1e-6  # float64 central differences: truncation ~h², rounding ~1e-16/h
    for name in params:
        for i in np.ndindex(*params[name].shape):
            up, down = dict(params), dict(params)
            up[name], down[name] = params[name].copy(), params[name].copy()
            up[name][i] += h
            down[name][i] -= h
            fd = (loss(up, query, keys) - loss(down, query, keys)) / (2 * h)
            assert abs(fd - grads[name][i]) < 1e-7, (name, i)
    for arr, grad, which in ((query, d_query, 0), (keys, d_keys, 1)):
        for i in np.ndindex(*arr.shape):
            up, down = arr.copy(), arr.copy()
            up[i] += h
            down[i] -= h
            args_up = (up, keys) if which == 0 else (query, up)
            args_down = (down, keys) if which == 0 else (query, down)
            fd = (loss(params, *args_up) - loss(params, *args_down)) / (2 * h)
            assert abs(fd - grad[i]) < 1e-7, (which, i)


# --- the kernel -----------------------------------------------------------------------------------------------

# (q_proj shape, k_proj shape): batched; keys shared across the batch (dk sums over it); one query row for a
# batch of key sets (dq sums over the stretched size-1 axis).
KERNEL_CASES = {
    "batched": ((B, T, A), (B, S, A)),
    "shared_keys": ((B, T, A), (S, A)),
    "stretched_query": ((1, T, A), (B, S, A)),
}


def _kernel_vjp(q, k, v, b, cot, *, fused=True, block_size=None):
    """Energies and the gradients of ``Σ cot · e`` w.r.t. (q, k, v, b)."""

    def f(q, k, v, b):
        if fused:
            return fused_additive_scores(q, k, v, b, block_size=block_size)
        return jnp.einsum("...tsa,a->...ts", jnp.tanh(q[..., :, None, :] + k[..., None, :, :] + b), v)

    e, vjp = jax.vjp(f, q, k, v, b)
    return e, vjp(cot)


@pytest.mark.parametrize("block_size", [None, 2])  # 2: three blocks over T = 5, the last one padded
@pytest.mark.parametrize("case", list(KERNEL_CASES))
def test_kernel_matches_float64_reference_and_naive(case, block_size, rng):
    q_shape, k_shape = KERNEL_CASES[case]
    q = rng.normal(size=q_shape).astype(np.float32)
    k = rng.normal(size=k_shape).astype(np.float32)
    v = (rng.normal(size=A) / math.sqrt(A)).astype(np.float32)
    b = (0.5 * rng.normal(size=A)).astype(np.float32)
    cot = rng.normal(size=np.broadcast_shapes(q_shape[:-2], k_shape[:-2]) + (T, S)).astype(np.float32)
    e, grads = jax.jit(lambda *a: _kernel_vjp(*a, block_size=block_size))(q, k, v, b, cot)
    e_naive, grads_naive = jax.jit(lambda *a: _kernel_vjp(*a, fused=False))(q, k, v, b, cot)
    e_ref, grads_ref = kernel_ref(q, k, v, b, cot)
    assert e.dtype == jnp.float32
    assert rel_err(e, e_ref) < 1e-5 and rel_err(e_naive, e_ref) < 1e-5
    for name, g, g_naive, g_ref in zip("qkvb", grads, grads_naive, grads_ref, strict=True):
        assert g.shape == g_ref.shape, name
        assert rel_err(g, g_ref) < 1e-5, name
        assert_close_f32(g, g_naive, reduction=KERNEL_REDUCTION, err_msg=name)


@pytest.mark.numerics
def test_kernel_blocks_equal_one_block(rng):
    # Every block size, dividing T or not, gives the one-block result to float32 rounding.
    q = rng.normal(size=(B, T, A)).astype(np.float32)
    k = rng.normal(size=(B, S, A)).astype(np.float32)
    v = rng.normal(size=A).astype(np.float32)
    b = rng.normal(size=A).astype(np.float32)
    cot = rng.normal(size=(B, T, S)).astype(np.float32)
    whole = jax.jit(lambda *a: _kernel_vjp(*a, block_size=T))(q, k, v, b, cot)
    for block in (1, 3, 4):
        blocked = jax.jit(lambda *a, bs=block: _kernel_vjp(*a, block_size=bs))(q, k, v, b, cot)
        assert_close_f32(blocked, whole, reduction=KERNEL_REDUCTION, err_msg=f"block {block}")


@pytest.mark.numerics
@settings(max_examples=6)
@given(
    st.sampled_from([1, 3, 5]),  # T (1: one decoder step)
    st.sampled_from([None, 1, 2]),  # block size
    st.sampled_from([(2,), (1,), ()]),  # key batch axes, against query batch (2,)
    st.integers(0, 2**31 - 1),
)
def test_kernel_property_fused_equals_naive(t, block_size, k_batch, seed):
    rng = np.random.default_rng(seed)
    q = (2.0 * rng.normal(size=(2, t, A))).astype(np.float32)
    k = (2.0 * rng.normal(size=k_batch + (S, A))).astype(np.float32)
    v, b = rng.normal(size=(2, A)).astype(np.float32)
    cot = rng.normal(size=(2, t, S)).astype(np.float32)
    got = jax.jit(lambda *a: _kernel_vjp(*a, block_size=block_size))(q, k, v, b, cot)
    want = jax.jit(lambda *a: _kernel_vjp(*a, fused=False))(q, k, v, b, cot)
    assert_close_f32(got, want, reduction=2 * t * S + A)


# --- the scorer with parameters -------------------------------------------------------------------------------


def _scores_vjp(params, query, keys, cot, fused):
    """Energies from params and the gradients of ``Σ cot · e`` w.r.t. (params, query, keys)."""

    def f(p, q, k):
        return additive_scores(p, q, project_keys(p, k), fused=fused)

    e, vjp = jax.vjp(f, params, query, keys)
    return e, vjp(cot)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_scores_match_float64_reference_in_value_and_gradient(config, key, rng):
    params = _params(key, **CONFIGS[config])
    q, k, _ = _inputs(rng)
    cot = rng.normal(size=(B, T, S)).astype(np.float32)
    fused = jax.jit(lambda *a: _scores_vjp(*a, fused=True))(params, q, k, cot)
    naive = jax.jit(lambda *a: _scores_vjp(*a, fused=False))(params, q, k, cot)
    p64 = {n: np.asarray(x, np.float64) for n, x in params.items()}
    e_ref = additive_energies_ref(q, k, p64["w_q"], p64["w_k"], p64["v"], p64.get("b"), p64.get("g"))
    grads_ref, dq_ref, dk_ref = params_grads_ref(params, q, k, cot)
    for e, (grads, dq, dk) in (fused[0], fused[1]), (naive[0], naive[1]):
        assert rel_err(e, e_ref) < 1e-5
        assert sorted(grads) == sorted(grads_ref)
        for name in grads_ref:
            assert rel_err(grads[name], grads_ref[name]) < 1e-5, name
        assert rel_err(dq, dq_ref) < 1e-5 and rel_err(dk, dk_ref) < 1e-5
    assert_close_f32(fused, naive, reduction=REDUCTION)


def _attention_vjp(params, q, k, v, mask, cot_ctx, cot_w, fused):
    def f(p, q, k, v):
        return additive_attention(p, q, k, v, mask, return_weights=True, fused=fused)

    out, vjp = jax.vjp(f, params, q, k, v)
    return out, vjp((cot_ctx, cot_w))


@pytest.mark.numerics
@pytest.mark.parametrize("config", ["bias", "normed"])
def test_masked_attention_fused_equals_naive_and_reference(config, key, rng):
    # Masking happens after the scores (masked_softmax); a sentence with no valid key must give zero weights,
    # a zero context and finite, zero gradients on both paths.
    params = _params(key, **CONFIGS[config])
    q, k, v = _inputs(rng)
    mask = _key_mask()[:, None, :]  # [B, 1, S]
    cot_ctx = rng.normal(size=(B, T, DV)).astype(np.float32)
    cot_w = rng.normal(size=(B, T, S)).astype(np.float32)
    fused = jax.jit(lambda *a: _attention_vjp(*a, fused=True))(params, q, k, v, mask, cot_ctx, cot_w)
    naive = jax.jit(lambda *a: _attention_vjp(*a, fused=False))(params, q, k, v, mask, cot_ctx, cot_w)
    (ctx, w), grads = fused
    ctx_ref, w_ref = additive_ref(params, q, k, v, mask)
    assert rel_err(ctx, ctx_ref) < 1e-5 and rel_err(w, w_ref) < 1e-5
    assert_valid_attention_weights(w, mask)
    assert np.all(np.asarray(w)[2] == 0) and np.all(np.asarray(ctx)[2] == 0)
    for x in jax.tree.leaves(grads):
        assert np.all(np.isfinite(x))
    _, dq, dk, dv = grads
    assert (
        np.all(np.asarray(dq)[2] == 0) and np.all(np.asarray(dk)[2] == 0) and np.all(np.asarray(dv)[2] == 0)
    )
    assert_close_f32(fused, naive, reduction=REDUCTION)


# --- inside a decoder scan, as RNNsearch runs it --------------------------------------------------------------


def _scan_loss(fused, key_mask):
    """A loss over a ``lax.scan`` of decoder steps: keys projected once outside, one query per step."""

    def loss(params, queries, keys, values, cot):
        pk = project_keys(params, keys)

        def step(total, xs):
            q_t, c_t = xs  # [B, Dq], [B, Dv]
            ctx, w = additive_attention_step(params, q_t, pk, values, key_mask, fused=fused)
            return total + jnp.sum(ctx * c_t) + jnp.sum(w * w), None

        total, _ = jax.lax.scan(step, 0.0, (jnp.swapaxes(queries, 0, 1), jnp.swapaxes(cot, 0, 1)))
        return total

    return loss


@pytest.mark.numerics
def test_scan_of_steps_gradients_fused_equal_naive(key, rng):
    params = _params(key, normalize=True)  # weight-normed v with a gain g, and a bias b
    q, k, v = _inputs(rng)
    cot = rng.normal(size=(B, T, DV)).astype(np.float32)
    grad = lambda fused: jax.jit(jax.value_and_grad(_scan_loss(fused, _key_mask()), argnums=(0, 1, 2, 3)))
    fused = grad(True)(params, q, k, v, cot)
    naive = grad(False)(params, q, k, v, cot)
    assert sorted(fused[1][0]) == sorted(params)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(fused))
    assert_close_f32(fused, naive, reduction=REDUCTION)
    # And the scan's gradient equals the all-at-once attention's (same loss, written without the scan).
    mask = _key_mask()[:, None, :]

    def loss_all(p, q, k, v, c):
        ctx, w = additive_attention(p, q, k, v, mask, return_weights=True)
        return jnp.sum(ctx * c) + jnp.sum(w * w)

    at_once = jax.jit(jax.value_and_grad(loss_all, argnums=(0, 1, 2, 3)))(params, q, k, v, cot)
    assert_close_f32(fused, at_once, reduction=REDUCTION)


def _scan_residual_shapes(jaxpr):
    """Shapes of every output of every ``scan`` in ``jaxpr`` and its sub-jaxprs (the forward scan's outputs
    include the residuals it stacks for the backward pass)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found += [tuple(x.aval.shape) for x in eqn.outvars]
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _scan_residual_shapes(inner)
    return found


def test_memory_of_a_scan_of_steps(key):
    # Sizes small enough for CI; the ratio grows with A and S (the naive residual is T·B·S·A floats).
    b, t, s, a, d = 8, 50, 50, 256, 16
    params = _params(key, dq=d, dk=d, a=a, normalize=True)
    q = jnp.zeros((b, t, d))
    k = jnp.zeros((b, s, d))
    cot = jnp.zeros((b, t, d))
    mask = jnp.ones((b, s), bool)
    stacked = {}
    temp = {}
    for fused in (False, True):
        grad = jax.grad(_scan_loss(fused, mask), argnums=(0, 1, 2, 3))
        shapes = _scan_residual_shapes(jax.make_jaxpr(grad)(params, q, k, k, cot).jaxpr)
        stacked[fused] = max(math.prod(x) for x in shapes if x and x[0] == t)
        compiled = jax.jit(grad).lower(params, q, k, k, cot).compile()
        analysis = compiled.memory_analysis()
        temp[fused] = None if analysis is None else analysis.temp_size_in_bytes
    # The naive scan stacks (at least) the [T, B, 1, S, A] tanh; the fused one only per-step vectors.
    assert stacked[False] >= t * b * s * a
    assert stacked[True] <= t * b * max(s, a, d)
    if temp[False] is not None:
        ratio = temp[True] / temp[False]
        assert ratio <= 0.25, (temp, ratio)


def test_memory_of_all_queries_at_once(key):
    # Without a scan the fused backward walks over blocks of queries, so its transient is [B, block, S, A].
    b, t, s, a, d = 8, 50, 50, 256, 16
    params = _params(key, dq=d, dk=d, a=a)
    q = jnp.zeros((b, t, d))
    k = jnp.zeros((b, s, d))
    temp = {}
    for fused in (False, True):
        loss = lambda p, q, k, fused=fused: jnp.sum(additive_attention(p, q, k, fused=fused) ** 2)
        analysis = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(params, q, k).compile().memory_analysis()
        if analysis is None:
            pytest.skip("no compiled memory analysis on this backend")
        temp[fused] = analysis.temp_size_in_bytes
    assert temp[True] <= temp[False] / 2, temp


# --- RNNsearch ------------------------------------------------------------------------------------------------

RNN_SIZES = dict(src_vocab=17, tgt_vocab=19, embed=9, hidden=11, maxout=3, align=13)


def _rnnsearch(scorer):
    """A small RNNsearch with N(0, 0.5²) params filled by NumPy (eager init compiles slowly on CPU)."""
    cfg = RNNConfig(arch="rnnsearch", scorer=scorer, **RNN_SIZES)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(0)
    state = jax.tree.map(lambda x: jnp.asarray(0.5 * rng.normal(size=x.shape), x.dtype), state)
    return nnx.merge(graphdef, state)


def _has_custom_vjp(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name.startswith("custom_vjp"):
            return True
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns") and _has_custom_vjp(inner):
                    return True
    return False


def test_rnnsearch_uses_the_fused_scorer_by_default():
    model = _rnnsearch("normed_additive")  # the weight-normed scorer: its params are a superset of additive's
    assert isinstance(model, RNNsearch) and model.attention.fused
    rng = np.random.default_rng(1)
    src = jnp.asarray(rng.integers(0, 17, (B, S)), jnp.int32)
    src_mask = _key_mask(np.array([7, 4, 1]))
    tgt = jnp.asarray(rng.integers(0, 19, (B, T)), jnp.int32)

    def grads(model):
        graphdef, state = nnx.split(model)

        def loss(state):
            logits, attn = nnx.merge(graphdef, state)(src, src_mask, tgt)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 0]) + jnp.sum(attn[..., 0])

        traced = jax.jit(jax.grad(loss)).trace(state)
        return traced.jaxpr.jaxpr, traced.lower().compile()(state)

    jaxpr_fused, g_fused = grads(model)
    model.attention.fused = False
    jaxpr_naive, g_naive = grads(model)
    assert _has_custom_vjp(jaxpr_fused) and not _has_custom_vjp(jaxpr_naive)
    # The decoder scan stacks a [T, B, 1, S, A] tanh residual only on the naive path.
    tanh_residual = (T, B, 1, S, RNN_SIZES["align"])
    assert tanh_residual in _scan_residual_shapes(jaxpr_naive)
    assert tanh_residual not in _scan_residual_shapes(jaxpr_fused)
    leaves_fused, leaves_naive = jax.tree.leaves(g_fused), jax.tree.leaves(g_naive)
    assert len(leaves_fused) == len(leaves_naive)
    assert all(np.all(np.isfinite(x)) for x in leaves_fused)
    # Back through T decoder steps (each summing over hidden, align and S) and S encoder steps (hidden, embed).
    n = RNN_SIZES["hidden"] + RNN_SIZES["align"] + S
    assert_close_f32(
        leaves_fused, leaves_naive, reduction=T * n + S * (RNN_SIZES["hidden"] + RNN_SIZES["embed"])
    )


# --- transformations ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [None, 2])
def test_check_grads(block_size, rng):
    # float32 finite differences (the kernel computes in float32 by policy): eps=1e-3 gives ~1e-4 relative
    # rounding noise in the difference quotient; tolerance 1e-2 leaves margin. Order 2 differentiates the
    # custom backward itself. (tests/test_additive.py::test_check_grads checks the default, fused, path through
    # additive_attention and additive_attention_step.)
    q = rng.normal(size=(2, 3, 5)).astype(np.float32)
    k = rng.normal(size=(6, 5)).astype(np.float32)
    v, b = rng.normal(size=(2, 5)).astype(np.float32)
    f = jax.jit(lambda q, k, v, b: fused_additive_scores(q, k, v, b, block_size=block_size))
    check_grads(f, (q, k, v, b), order=2, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


@pytest.mark.numerics
def test_jit_and_vmap(rng):
    q = rng.normal(size=(B, T, A)).astype(np.float32)
    k = rng.normal(size=(B, S, A)).astype(np.float32)
    v, b = rng.normal(size=(2, A)).astype(np.float32)
    cot = rng.normal(size=(B, T, S)).astype(np.float32)
    eager = _kernel_vjp(q, k, v, b, cot)
    jitted = jax.jit(_kernel_vjp)(q, k, v, b, cot)
    assert_close_f32(jitted, eager, reduction=KERNEL_REDUCTION)
    # vmap over the batch (v, b shared; their gradients come back per example) == a loop over sentences.
    vmapped = jax.jit(jax.vmap(_kernel_vjp, in_axes=(0, 0, None, None, 0)))(q, k, v, b, cot)
    one = jax.jit(_kernel_vjp)
    for i in range(B):
        single = one(q[i], k[i], v, b, cot[i])
        assert_close_f32(jax.tree.map(lambda x, i=i: x[i], vmapped), single, reduction=KERNEL_REDUCTION)


def test_forward_mode_needs_the_naive_path(key, rng):
    params = _params(key)
    q, k, _ = _inputs(rng)
    pk = project_keys(params, k)
    tangent = jnp.ones_like(jnp.asarray(q))
    _, jvp_naive = jax.jvp(lambda q: additive_scores(params, q, pk, fused=False), (q,), (tangent,))
    assert np.all(np.isfinite(jvp_naive))
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(lambda q: additive_scores(params, q, pk), (q,), (tangent,))


# --- low precision --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_large_energies(dtype, key, rng):
    # Energies, tanh and every sum run in float32 from the (exactly representable) low-precision inputs, so the
    # energies match the float64 reference of the *rounded* inputs at float32 accuracy, and fused == naive.
    # Gradients come back in the input dtype: each is rounded once, relative 2^-8 (bf16) / 2^-11 (fp16), so
    # fused and naive gradients may differ by one unit in the last place of the larger ones (tolerance 2^-7).
    params = _params(key, normalize=True)
    params["g"] = jnp.asarray(40.0)  # ‖v_eff‖ = g = 40: energies of tens
    params = {n: x.astype(dtype) for n, x in params.items()}
    q, k, v = (jnp.asarray(10.0 * x, dtype) for x in _inputs(rng))
    mask = _key_mask()[:, None, :]
    cot_ctx = jnp.asarray(rng.normal(size=(B, T, DV)), dtype)
    cot_w = rng.normal(size=(B, T, S)).astype(np.float32)
    (ctx, w), grads = jax.jit(lambda *a: _attention_vjp(*a, fused=True))(
        params, q, k, v, mask, cot_ctx, cot_w
    )
    (_, w_naive), grads_naive = jax.jit(lambda *a: _attention_vjp(*a, fused=False))(
        params, q, k, v, mask, cot_ctx, cot_w
    )
    assert ctx.dtype == dtype and w.dtype == jnp.float32
    e = jax.jit(lambda p, q, k: additive_scores(p, q, project_keys(p, k)))(params, q, k)
    assert float(jnp.max(jnp.abs(e))) > 20.0  # the case is really one of large energies
    p64 = {n: np.asarray(x, np.float64) for n, x in params.items()}
    e_ref = additive_energies_ref(q, k, p64["w_q"], p64["w_k"], p64["v"], p64.get("b"), p64.get("g"))
    assert rel_err(e, e_ref) < 1e-5
    # Two float32 programs, but the softmax amplifies their energy rounding by |e| ~ 50 (|Δe| ~ 1e-5 -> Δw of the
    # same size, beyond the f32 helper's floor): an absolute bound of its own.
    assert np.max(np.abs(np.asarray(w) - np.asarray(w_naive))) < 1e-4
    for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_naive), strict=True):
        assert x.dtype == y.dtype == dtype
        assert np.all(np.isfinite(np.asarray(x, np.float32)))
        assert rel_err(np.asarray(x, np.float32), np.asarray(y, np.float32)) < 2**-7


# --- errors and docs ------------------------------------------------------------------------------------------


def test_errors_name_the_shapes():
    q, k, v = jnp.zeros((2, 3, 5)), jnp.zeros((2, 4, 5)), jnp.zeros(5)
    with pytest.raises(ValueError, match=r"\[2, 4, 6\].*alignment width"):
        fused_additive_scores(q, jnp.zeros((2, 4, 6)), v)
    with pytest.raises(ValueError, match=r"bias must have shape \[5\], got \[4\]"):
        fused_additive_scores(q, k, v, jnp.zeros(4))
    with pytest.raises(ValueError, match=r"q_proj batch axes \[2\].*k_proj batch axes \[3\]"):
        fused_additive_scores(q, jnp.zeros((3, 4, 5)), v)
    with pytest.raises(ValueError, match="q_proj must have at least 2 axes"):
        fused_additive_scores(jnp.zeros(5), k, v)
    with pytest.raises(ValueError, match="v must have exactly 1 axes"):
        fused_additive_scores(q, k, jnp.zeros((5, 1)))
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        fused_additive_scores(q, k, v, block_size=0)
