"""Chunked (FlashAttention-style) dot-product attention: float64 references for values and gradients, the
plain path, masks, causal block skipping, padding, dtypes, transforms, the implementation switch and memory.

Compilation dominates the runtime here (each chunked kernel is two nested loops per pass), so every test
reuses a few fixed shape families and jits one function per family.
"""

import functools
import types

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import attn_jax.attention._chunked as chunked_module
import attn_jax.attention._cudnn as cudnn_module
import attn_jax.attention._dispatch as dispatch_module
from attn_jax.attention import chunked_dot_product_attention, dot_product_attention
from tests.reference.chunked import attention_grads_ref
from tests.reference.masks_dot import causal_mask_ref, dot_attention_ref
from tests.tolerance import assert_close_f32

# Odd, distinct sizes, with T and S not multiples of any block size used: B=3, H=2, T=37, S=53, K=11, Kv=5.
B, H, T, S, K, KV = 3, 2, 37, 53, 11, 5


def _normal(rng, shape, scale=1.0, dtype=np.float32):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def _rel_err(actual, expected):
    """``max|a − e| / max|e|``: one number per array, robust to entries near zero."""
    expected = np.asarray(expected, np.float64)
    return np.abs(np.asarray(actual, np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30)


def _loss_and_grads(attention):
    """``(out, (dq, dk, dv, dbias))`` of ``Σ g · attention(q, k, v, mask, bias)``, jitted."""

    @jax.jit
    def run(q, k, v, mask, bias, g):
        out, vjp = jax.vjp(lambda q, k, v, bias: attention(q, k, v, mask, bias=bias), q, k, v, bias)
        return out, vjp(g)

    return run


def _case(rng):
    """Heads share the key ([B, 1, S, K]) and the mask ([B, 1, T, S]); the bias is shared by the batch.

    The mask keeps ~60% of the keys, kills two whole query rows and one whole head-batch.
    """
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, 1, S, K)), _normal(rng, (B, H, S, KV))
    mask = rng.random((B, 1, T, S)) < 0.6
    mask[0, 0, 3] = False
    mask[1, 0, T - 1] = False  # in the last, padded, query block
    mask[2] = False
    bias = _normal(rng, (H, T, S))
    g = _normal(rng, (B, H, T, KV))
    return q, k, v, mask, bias, g


# --- float64 references: values and gradients ---------------------------------------------------------------


@pytest.mark.parametrize(
    "causal,q_chunk,kv_chunk,scale",
    [
        (False, 16, 16, None),
        # unequal blocks: the causal skip bounds must agree between the passes when bq != bk (the numerics
        # pass under AVX2 reruns this one: the richer case, at the cost of one)
        pytest.param(True, 8, 16, 0.37, marks=pytest.mark.numerics),
    ],
)
def test_values_and_grads_match_float64_reference(rng, causal, q_chunk, kv_chunk, scale):
    q, k, v, mask, bias, g = _case(rng)
    chunked = functools.partial(
        chunked_dot_product_attention, causal=causal, scale=scale, query_chunk=q_chunk, key_chunk=kv_chunk
    )
    plain = functools.partial(dot_product_attention, causal=causal, scale=scale, implementation="xla")
    out, grads = _loss_and_grads(chunked)(q, k, v, mask, bias, g)
    out_xla, grads_xla = _loss_and_grads(plain)(q, k, v, mask, bias, g)

    c = causal_mask_ref(T, S) if causal else True
    out_ref, _ = dot_attention_ref(q, k, v, np.logical_and(mask, c), bias, scale)
    grads_ref = attention_grads_ref(q, k, v, g, mask, bias, scale, causal=causal)
    assert out.dtype == jnp.float32 and out.shape == (B, H, T, KV)
    # float32 values: sums of <= 53 O(1) terms, so ~1e-6 relative; 1e-5 is the house tolerance.
    assert _rel_err(out, out_ref) < 1e-5
    # float32 gradients: one more matmul and the (dP − Δ) cancellation; 1e-4 relative to the largest entry.
    for name, a, a_xla, ref in zip(("dq", "dk", "dv", "dbias"), grads, grads_xla, grads_ref, strict=True):
        assert a.shape == ref.shape, name
        assert _rel_err(a_xla, ref) < 1e-4, f"plain {name} vs reference (is the reference right?)"
        assert _rel_err(a, ref) < 1e-4, name
    # Chunked and plain: two float32 programs (logits over K, softmax and context over S, blocked or not).
    assert_close_f32(out, out_xla, reduction=K + 2 * S)

    # Fully masked query rows (and the whole dead batch entry): exactly zero output, zero dq, finite grads.
    dead = ~np.broadcast_to(np.logical_and(mask, c), (B, H, T, S)).any(-1)  # [B, H, T]
    assert dead[0, :, 3].all() and dead[2].all()
    assert np.all(np.asarray(out)[dead] == 0.0)
    assert np.all(np.asarray(grads[0])[dead] == 0.0)
    assert all(np.all(np.isfinite(x)) for x in grads)


def _outermost(jaxpr, names):
    """The first of ``names`` met walking ``jaxpr`` depth-first through sub-jaxprs (jit, pjit), or None."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in names:
            return eqn.primitive.name
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found = _outermost(sub, names)
            if found:
                return found
    return None


@pytest.mark.parametrize("causal", [False, True])
def test_batch_loop_and_vmap_agree(rng, monkeypatch, causal):
    # The CPU loops over (batch, head) with lax.map; accelerators vmap it. Both must give the same values and
    # gradients, broadcast operands included (the key and mask shared by the heads, the bias by the batch):
    # here the vmap branch is forced on the CPU and both are checked against the float64 reference.
    q, k, v, mask, bias, g = _case(rng)
    f = functools.partial(chunked_dot_product_attention, causal=causal, query_chunk=8, key_chunk=16)
    c = causal_mask_ref(T, S) if causal else True
    out_ref, _ = dot_attention_ref(q, k, v, np.logical_and(mask, c), bias, None)
    grads_ref = attention_grads_ref(q, k, v, g, mask, bias, None, causal=causal)
    results = {}
    for loop in (True, False):
        monkeypatch.setattr(chunked_module, "_LOOP_PLATFORMS", ("cpu",) if loop else ())
        jax.clear_caches()  # the platforms are read at trace time: retrace
        # the loop: the kernel (a custom_vjp) sits inside a scan; vmap: it is called once, batched
        outer = _outermost(jax.make_jaxpr(f)(q, k, v, mask, bias=bias).jaxpr, ("scan", "custom_vjp_call"))
        assert outer == ("scan" if loop else "custom_vjp_call"), (loop, outer)
        results[loop] = _loss_and_grads(f)(q, k, v, mask, bias, g)
    jax.clear_caches()  # no vmap-traced kernel left for the tests after this one
    for loop, (out, grads) in results.items():
        assert _rel_err(out, out_ref) < 1e-5, loop
        for name, a, ref in zip(("dq", "dk", "dv", "dbias"), grads, grads_ref, strict=True):
            assert a.shape == ref.shape and _rel_err(a, ref) < 1e-4, (loop, name)


def test_check_grads_blocked_backward(rng):
    # tiny, with padding in both axes (T=5, S=7 in blocks of 2 and 3), causal, a dead row and a bias
    q, k, v = _normal(rng, (5, 4)), _normal(rng, (7, 4)), _normal(rng, (7, 3))
    mask = rng.random((5, 7)) < 0.7
    mask[2] = False
    bias = _normal(rng, (5, 7))
    f = jax.jit(
        lambda q, k, v, bias: chunked_dot_product_attention(
            q, k, v, mask, bias=bias, causal=True, query_chunk=2, key_chunk=3
        )
    )
    # float32 finite differences, as in test_dot_product: eps 1e-3 keeps truncation ~1e-6 and rounding
    # ~1e-7/1e-3 = 1e-4, far inside 1e-2. Reverse mode, first order: the custom_vjp is not forward-differentiable.
    check_grads(f, (q, k, v, bias), order=1, modes=["rev"], eps=1e-3, atol=1e-2, rtol=1e-2)


# --- properties over shapes, masks and block sizes ----------------------------------------------------------

# (q, k, v batch axes, T, S, K, Kv, query_chunk, key_chunk, causal, mask batch axes or None): a few fixed
# families, so that hypothesis varies values and masks without paying one compilation per example.
FAMILIES = [
    ((), (), (), 9, 13, 3, 2, 4, 5, False, None),  # no mask: only the key padding is masked
    ((2,), (1,), (2,), 7, 7, 5, 3, 3, 2, True, (2,)),  # causal, k shared over the batch
    ((3, 2), (3, 1), (1, 2), 6, 11, 2, 4, 6, 4, False, (3, 1)),  # v broadcast the other way; block == T
    ((2,), (2,), (2,), 1, 5, 3, 3, 1, 2, True, ()),  # a single query
]


@st.composite
def chunked_cases(draw):
    qb, kb, vb, t, s, k, kv, bq, bk, causal, mb = draw(st.sampled_from(FAMILIES))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    q, key, v = _normal(rng, qb + (t, k), 2.0), _normal(rng, kb + (s, k)), _normal(rng, vb + (s, kv))
    mask = None if mb is None else rng.random(mb + (t, s)) < draw(st.sampled_from([0.2, 0.7, 1.0]))
    return (q, key, v, mask), dict(causal=causal, query_chunk=bq, key_chunk=bk)


_chunked = jax.jit(chunked_dot_product_attention, static_argnames=("causal", "query_chunk", "key_chunk"))


@given(chunked_cases())
@settings(max_examples=12)
def test_property_matches_reference(case):
    (q, k, v, mask), kw = case
    out = _chunked(q, k, v, mask, **kw)
    t, s = q.shape[-2], k.shape[-2]
    m = mask
    if kw["causal"]:
        m = causal_mask_ref(t, s) if m is None else np.logical_and(m, causal_mask_ref(t, s))
    ref, _ = dot_attention_ref(q, k, v, m)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)  # atol: O(1) outputs, float32 eps 1.2e-7
    if m is not None:  # queries with no valid key: exactly zero
        dead = ~np.broadcast_to(m, out.shape[:-1] + (s,)).any(-1)
        assert np.all(np.asarray(out)[dead] == 0.0)


@pytest.mark.parametrize("q_chunk", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("kv_chunk", [1, 2, 3, 5, 8])
def test_causal_skip_visits_exactly_the_needed_blocks(q_chunk, kv_chunk):
    """The forward's key-block range and the backward's query-block range are the same set of blocks, and it
    is exactly the blocks holding at least one (row, col) with col <= row: none needed is skipped, none
    wholly in the future is computed."""
    t, s = 10, 13
    t_pad, s_pad = -(-t // q_chunk) * q_chunk, -(-s // kv_chunk) * kv_chunk
    nq, nk = t_pad // q_chunk, s_pad // kv_chunk
    cfg = chunked_module._Config(t, s, q_chunk, kv_chunk, 1.0, True)
    for i in range(nq):
        for j in range(nk):
            rows = range(i * q_chunk, (i + 1) * q_chunk)
            cols = range(j * kv_chunk, (j + 1) * kv_chunk)
            needed = any(c <= r for r in rows for c in cols)
            in_forward = j < int(chunked_module._kv_stop(cfg, i, nk))
            in_backward = i >= int(chunked_module._q_start(cfg, j, nq))
            assert in_forward == needed == in_backward, (i, j)


# --- dtypes ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,tol",
    [
        # Relative to max|reference| on the *rounded* inputs. Logits are exact (bf16/fp16 products are exact
        # in float32) and everything accumulates in float32, so the error is the final rounding to the input
        # dtype: bf16 keeps 8 mantissa bits (2^-9 ~ 2e-3; 1e-2 leaves room), fp16 11 bits (2^-12; 1e-3).
        (jnp.bfloat16, 1e-2),
        (jnp.float16, 1e-3),
    ],
)
def test_low_precision_large_logits(rng, dtype, tol):
    # |logits| reach ~60: exp(60) overflows float16 if anything ran in the input dtype.
    q, k = _normal(rng, (T, 16), 20.0), _normal(rng, (S, 16))
    v, g = _normal(rng, (S, KV)), _normal(rng, (T, KV))
    mask = rng.random((T, S)) < 0.5
    mask[5] = False
    q, k, v, g = (jnp.asarray(x, dtype) for x in (q, k, v, g))
    attention = functools.partial(chunked_dot_product_attention, causal=True, query_chunk=16, key_chunk=16)
    out, grads = _loss_and_grads(attention)(q, k, v, mask, None, g)
    assert out.dtype == dtype and all(x.dtype == dtype for x in grads[:3])
    q64, k64, v64, g64 = (np.asarray(x, np.float64) for x in (q, k, v, g))
    assert np.abs(np.einsum("tk,sk->ts", q64, k64) / 4.0).max() > 50.0
    m = np.logical_and(mask, causal_mask_ref(T, S))
    out_ref, _ = dot_attention_ref(q64, k64, v64, m)
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    assert _rel_err(np.asarray(out, np.float32), out_ref) <= tol
    grads_ref = attention_grads_ref(q64, k64, v64, g64, m)
    for name, a, ref in zip(("dq", "dk", "dv"), grads[:3], grads_ref[:3], strict=True):
        a = np.asarray(a, np.float32)
        assert np.all(np.isfinite(a)), name
        # gradients: float32 accumulation, one rounding to the dtype at the end (same budget as the values)
        assert _rel_err(a, ref) <= tol, name


# --- transforms -------------------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_jit_equals_eager_and_vmap_equals_loop(rng):
    q, k, v = _normal(rng, (3, 5, 4)), _normal(rng, (7, 4)), _normal(rng, (3, 7, 2))
    mask = rng.random((3, 5, 7)) < 0.7
    f = functools.partial(chunked_dot_product_attention, query_chunk=2, key_chunk=3)
    loop = [f(q[i], k, v[i], mask[i]) for i in range(3)]  # eager, one example at a time
    # jit vs eager and vmap vs loop: two programs each (sums over K = 4 and S = 7)
    assert_close_f32(jax.jit(f)(q[0], k, v[0], mask[0]), loop[0], reduction=4 + 2 * 7)
    # vmap with the key shared by every batch element (in_axes None)
    batched = jax.jit(jax.vmap(f, in_axes=(0, None, 0, 0)))(q, k, v, mask)
    assert_close_f32(batched, np.stack(loop), reduction=4 + 2 * 7)


# --- the implementation switch ----------------------------------------------------------------------------------


@pytest.mark.numerics
def test_switch_dispatches_and_chunked_equals_xla(rng):
    q, k, v = _normal(rng, (2, 9, 3)), _normal(rng, (2, 12, 3)), _normal(rng, (2, 12, 2))
    mask, bias = rng.random((2, 9, 12)) < 0.7, _normal(rng, (9, 12))
    run = lambda **kw: jax.jit(functools.partial(dot_product_attention, causal=True, scale=0.5, **kw))(
        q, k, v, mask, bias=bias
    )
    xla, chunked = run(implementation="xla"), run(implementation="chunked")
    auto = run()  # short: the plain path
    assert_close_f32(chunked, xla, reduction=3 + 2 * 12)  # two programs: sums over K = 3 and S = 12
    np.testing.assert_array_equal(auto, xla)  # the same program: the default dispatches to "xla" here
    ref, _ = dot_attention_ref(q, k, v, np.logical_and(mask, causal_mask_ref(9, 12)), bias, 0.5)
    np.testing.assert_allclose(xla, ref, rtol=1e-5, atol=1e-6)


def _uses_chunked(shapes, **kw):
    """Whether ``dot_product_attention`` traces to the blocked kernel (its custom_vjp) for these operands."""
    specs = (jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes)
    return "custom_vjp_call" in str(jax.make_jaxpr(functools.partial(dot_product_attention, **kw))(*specs))


@pytest.mark.parametrize("backend,short,long", [("cpu", 511, 512), ("gpu", 2048, 4096)])
def test_default_picks_xla_for_short_and_chunked_for_long(monkeypatch, backend, short, long):
    # the threshold is the backend's (the blocked kernel wins on the CPU from 512 x 512, the chunked_vs_plain
    # bench row); tracing only, so the backend is stood in for
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert not _uses_chunked(shapes=[(short, 8), (short, 8), (short, 8)])
    assert _uses_chunked(shapes=[(long, 8), (long, 8), (long, 8)])
    assert _uses_chunked(shapes=[(long, 8), (long, 8), (long, 8)], implementation="chunked")
    assert not _uses_chunked(shapes=[(long, 8), (long, 8), (long, 8)], implementation="xla")
    assert not _uses_chunked(shapes=[(long, 8), (long, 8), (long, 8)], return_weights=True)
    assert _uses_chunked(shapes=[(short, 8), (short, 8), (short, 8)], implementation="chunked")


def test_query_blocks_by_backend_and_mask(monkeypatch):
    # hand-computed: 1024 rows on the CPU for full attention unless 512-row blocks pad T less; 512 elsewhere
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    full = {
        t: dispatch_module.query_chunk(t, False, None) for t in (8, 600, 1024, 1100, 1536, 2000, 2048, 2500)
    }
    assert full == {8: 1024, 600: 1024, 1024: 1024, 1100: 512, 1536: 512, 2000: 1024, 2048: 1024, 2500: 512}
    assert dispatch_module.query_chunk(2048, True, None) == 512
    assert dispatch_module.query_chunk(2048, False, (64, 64)) == 512
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert dispatch_module.query_chunk(2048, False, None) == 512


def _block_products(shape, **kw):
    """The ``[rows, cols]`` float32 logits blocks in the jaxpr of ``dot_product_attention`` on ``shape`` operands."""
    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
    text = str(jax.make_jaxpr(functools.partial(dot_product_attention, **kw))(spec, spec, spec))
    return {b for b in ("f32[1024,512]", "f32[512,512]", "f32[768,512]") if b in text}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU's block sizes")
def test_cpu_default_runs_1024_row_blocks_for_full_attention_only():
    assert _block_products((1024, 8)) == {"f32[1024,512]"}
    assert _block_products((768, 8)) == {"f32[768,512]"}  # one block of all 768 rows: no padded rows
    assert _block_products((1024, 8), causal=True) == {"f32[512,512]"}
    assert _block_products((1024, 8), local_window=100) == {"f32[512,512]"}


@pytest.mark.numerics
def test_cpu_default_with_a_clipped_query_block_matches_float64(rng):
    # T = 1000: one 1000-row query block, keys in 512-blocks padded to 1024; forward and gradients
    q, k, v, g = (_normal(rng, (1000, 8)) for _ in range(4))
    q32, k32, v32, g32 = (jnp.asarray(x, jnp.float32) for x in (q, k, v, g))
    out, vjp = jax.vjp(
        lambda a, b, c: dot_product_attention(a, b, c, implementation="chunked"), q32, k32, v32
    )
    ref, _ = dot_attention_ref(q, k, v, None, None, None)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)
    for got, want in zip(vjp(g32), attention_grads_ref(q, k, v, g)[:3], strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU error")
def test_cudnn_without_gpu_raises(rng):
    q = jnp.asarray(_normal(rng, (2, 8, 8)), jnp.bfloat16)
    with pytest.raises(
        ValueError, match=r"implementation='cudnn' does not apply: it needs a CUDA GPU.*'cpu'"
    ):
        dot_product_attention(q, q, q, implementation="cudnn")


def _cudnn_case(rng, dtype=jnp.bfloat16):
    """bf16 heads [3, 2, T=6, K=8] with a head-shared key and mask (dead rows) and a batch-shared bias."""
    q, k, v = _normal(rng, (3, 2, 6, 8)), _normal(rng, (3, 1, 10, 8)), _normal(rng, (3, 2, 10, 8))
    mask = rng.random((3, 1, 6, 10)) < 0.6
    mask[0, 0, 2] = False
    mask[2] = False
    bias = _normal(rng, (2, 6, 10))
    return (*(jnp.asarray(x, dtype) for x in (q, k, v)), mask, bias)


def test_cudnn_branch_layout_and_dead_rows_with_a_stand_in(rng, monkeypatch):
    """The "cudnn" branch's reshapes, broadcasts and dead-row zeroing, run on CPU: jax.nn's cuDNN call is replaced
    by its XLA implementation (same signature and semantics) and a fake Hopper device is reported."""
    calls = []
    real = jax.nn.dot_product_attention

    def stand_in(query, key, value, bias=None, mask=None, *, implementation=None, **kw):
        calls.append(implementation)
        assert query.ndim == key.ndim == value.ndim == 4 and query.shape[2] == 1  # [N, T, 1, K]
        return real(query, key, value, bias, mask, implementation="xla", **kw)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    monkeypatch.setattr(cudnn_module, "_cuda_device", lambda: types.SimpleNamespace(compute_capability="9.0"))
    q, k, v, mask, bias = _cudnn_case(rng)
    kw = dict(bias=bias, causal=True, scale=0.4)
    out = jax.jit(functools.partial(dot_product_attention, implementation="cudnn", **kw))(q, k, v, mask)
    ref = jax.jit(functools.partial(dot_product_attention, implementation="xla", **kw))(q, k, v, mask)
    assert calls == ["cudnn"] and out.dtype == jnp.bfloat16 and out.shape == ref.shape
    # jax.nn rounds the weights to bf16 before multiplying the values (2^-9 relative), ours keeps float32
    # until the end: a few bf16 ulps of max|ref|.
    assert _rel_err(np.asarray(out, np.float32), np.asarray(ref, np.float32)) < 2e-2
    dead = ~np.broadcast_to(np.logical_and(mask, causal_mask_ref(6, 10)), (3, 2, 6, 10)).any(-1)
    assert dead.any() and np.all(np.asarray(out, np.float32)[dead] == 0.0)  # jax.nn alone averages the values
    # None picks cuDNN for bf16 without mask or bias, and not with a mask (it would need a [T, S] bias)
    jax.eval_shape(dot_product_attention, q, k, v)  # tracing is enough to see the choice
    assert calls == ["cudnn", "cudnn"]
    jax.eval_shape(dot_product_attention, q, k, v, mask)
    assert calls == ["cudnn", "cudnn"]
    with pytest.raises(ValueError, match="must all be bfloat16 or all float16"):
        dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), implementation="cudnn")
    with pytest.raises(ValueError, match="Kv == key width K"):
        dot_product_attention(q, k, v[..., :4], implementation="cudnn")


@pytest.mark.gpu
def test_cudnn_and_chunked_match_xla_on_gpu(rng):
    q, k, v, mask, bias = _cudnn_case(rng)
    ref = np.asarray(
        dot_product_attention(q, k, v, mask, bias=bias, causal=True, implementation="xla"), np.float32
    )
    for impl in ("cudnn", "chunked"):
        out = dot_product_attention(q, k, v, mask, bias=bias, causal=True, implementation=impl)
        # bf16 (see the stand-in test); cuDNN also rounds P to bf16 inside its kernel
        assert _rel_err(np.asarray(out, np.float32), ref) < 2e-2, impl


def test_bad_arguments_raise(rng):
    q, k, v = _normal(rng, (5, 4)), _normal(rng, (7, 4)), _normal(rng, (7, 2))
    with pytest.raises(ValueError, match="implementation must be"):
        dot_product_attention(q, k, v, implementation="flash")
    with pytest.raises(ValueError, match="return_weights=True needs implementation='xla'"):
        dot_product_attention(q, k, v, implementation="chunked", return_weights=True)
    with pytest.raises(ValueError, match="query_chunk must be a positive int, got 0"):
        chunked_dot_product_attention(q, k, v, query_chunk=0)
    with pytest.raises(ValueError, match="key_chunk must be a positive int, got 2.5"):
        chunked_dot_product_attention(q, k, v, key_chunk=2.5)
    with pytest.raises(ValueError, match="static scale"):
        jax.jit(lambda s: chunked_dot_product_attention(q, k, v, scale=s))(0.5)
    with pytest.raises(ValueError, match=r"same length S.*key \[7, 4\], value \[6, 2\]"):
        chunked_dot_product_attention(q, k, v[:6])
    with pytest.raises(ValueError, match=r"mask of shape \[5, 6\] does not broadcast.*\[5, 7\]"):
        chunked_dot_product_attention(q, k, v, jnp.ones((5, 6), bool))


# --- memory -----------------------------------------------------------------------------------------------------


def _temp_bytes(implementation, length, width=8):
    spec = jax.ShapeDtypeStruct((length, width), jnp.float32)
    loss = lambda q, k, v: dot_product_attention(q, k, v, causal=True, implementation=implementation).sum()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(spec, spec, spec).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_chunked_forward_and_backward_never_hold_a_t_by_s_buffer():
    length = 4096
    logits_bytes = length * length * 4  # one float32 [T, S] array: 64 MiB
    # The default (None) picks the blocked kernel at this length; its live blocks are 512 x 512.
    assert _temp_bytes(None, length) < logits_bytes / 10
    assert _temp_bytes("xla", length) > logits_bytes
