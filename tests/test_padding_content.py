"""Invariance to padded content: NaN and ±inf in rows the mask never reads change no output and no gradient.

Every path is run twice through the *same* compiled function: once with clean zeros in the padding, once with
NaN, +inf and -inf there. The attention functions zero such rows before any arithmetic, so both runs compute on
identical arrays and must agree bit for bit (outputs, and gradients w.r.t. every input and parameter, which
are exactly 0 at the padded rows); without that zeroing the poisoned run is NaN (``0 · NaN``), which is what
``jax.nn`` and PyTorch return. The clean run is anchored to the float64 references in ``tests/reference``.
A bias of ``-inf`` is a masked entry on every path: its rows give zeros and finite gradients.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attn_jax.attention._cudnn as cudnn_module
from attn_jax.attention import (
    additive_attention,
    additive_attention_step,
    attend,
    chunked_dot_product_attention,
    concat_scores,
    dot_product_attention,
    dot_scores,
    general_scores,
    init_additive_params,
    init_general_params,
    init_local_p_params,
    init_location_params,
    init_multi_head_params,
    local_attention,
    location_scores,
    luong_attention,
    monotonic_centers,
    multi_head_attention,
    predictive_centers,
    project_keys,
    zero_masked_keys,
    zero_masked_queries,
)
from attn_jax.attention._padding import live_rows
from attn_jax.models import RNNConfig, RNNsearch
from attn_jax.models.transformer import Transformer, TransformerConfig
from attn_jax.nn import LuongAttention
from tests.reference.chunked import attention_grads_ref
from tests.reference.core import context_ref, softmax_ref
from tests.reference.masks_dot import causal_mask_ref, dot_attention_ref, multi_head_ref
from tests.reference.scorers import (
    concat_scores_ref,
    dot_scores_ref,
    general_scores_ref,
    local_ref,
    location_scores_ref,
    monotonic_centers_ref,
    predictive_centers_ref,
)

# Odd, distinct sizes: B=2, H=3, T=5, S=7, K=4, Kv=3 (D=6 model width, A=5 alignment width).
B, H, T, S, K, KV, D, A = 2, 3, 5, 7, 4, 3, 6, 5
# float64-reference comparisons in float32: rtol 1e-5 (the house rule) and atol 1e-6 for entries near zero
# (outputs and gradients here are O(1); sums run over at most 7 terms).
RTOL, ATOL = 1e-5, 1e-6
KEY_LENGTHS, QUERY_LENGTHS = np.array([7, 4]), np.array([5, 3])
POISON = np.array([np.nan, np.inf, -np.inf], np.float32)


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _padding_mask():
    """``[B, 1, T, S]``: real queries attend real keys; padded queries attend nothing."""
    keys = np.arange(S)[None, :] < KEY_LENGTHS[:, None]  # [B, S]
    queries = np.arange(T)[None, :] < QUERY_LENGTHS[:, None]  # [B, T]
    return (queries[:, :, None] & keys[:, None, :])[:, None]


def _poison(x, dead_rows):
    """``x`` with every entry of the rows where ``dead_rows`` ``[..., L]`` is True set to NaN, +inf or -inf."""
    x = np.array(x, np.float32)
    dead = np.broadcast_to(np.asarray(dead_rows)[..., None], x.shape)
    x[dead] = np.resize(POISON, int(dead.sum()))
    return x


def _clean(x, dead_rows):
    """``x`` with zeros in the rows where ``dead_rows`` is True."""
    return np.where(np.asarray(dead_rows)[..., None], 0.0, x).astype(np.float32)


def _dead(effective_mask):
    """``(dead queries [..., T], dead keys [..., S])`` of a ``[..., T, S]`` mask: rows no pair reads."""
    return ~effective_mask.any(-1), ~effective_mask.any(-2)


def _assert_same_and_finite(dirty, clean, what):
    """Bitwise equality of two pytrees computed by the same compiled program, and no NaN or inf anywhere."""
    for i, (d, c) in enumerate(zip(jax.tree.leaves(dirty), jax.tree.leaves(clean), strict=True)):
        d, c = np.asarray(d), np.asarray(c)
        assert np.all(np.isfinite(d)), f"{what}: leaf {i} has {np.sum(~np.isfinite(d))} non-finite entries"
        np.testing.assert_array_equal(d, c, err_msg=f"{what}: leaf {i} depends on the padded content")


def _value_and_grads(fn, argnums):
    """``jit`` of ``(fn(*args), grad of Σ g · fn(*args))`` w.r.t. ``argnums``; ``g`` is the last argument."""

    def run(*args):
        *inputs, g = args
        out, pullback = jax.vjp(lambda *xs: fn(*xs), *inputs)
        grads = pullback(g.astype(out.dtype))
        return out, tuple(grads[i] for i in argnums)

    return jax.jit(run)


# ---------------------------------------------------------------------------------------- dot-product paths

DOT_PATHS = {
    # the plain path's hand-written derivative (custom_jvp), its autodiff fallback, the blocked path reached
    # through dot_product_attention (one block), and the blocked path with blocks that split the padding
    "xla": lambda q, k, v, m, **kw: dot_product_attention(q, k, v, m, implementation="xla", **kw),
    "xla-autodiff": lambda q, k, v, m, **kw: dot_product_attention(q, k, v, m, return_weights=True, **kw)[0],
    "chunked": lambda q, k, v, m, **kw: dot_product_attention(q, k, v, m, implementation="chunked", **kw),
    "chunked-blocks": lambda q, k, v, m, **kw: chunked_dot_product_attention(
        q, k, v, m, query_chunk=2, key_chunk=3, **kw
    ),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", list(DOT_PATHS))
def test_dot_product_paths_ignore_padded_content(rng, path, causal):
    mask = _padding_mask()  # [B, 1, T, S]
    effective = mask & causal_mask_ref(T, S) if causal else mask
    dead_q, dead_k = _dead(np.broadcast_to(effective, (B, H, T, S)))  # causal: keys 5, 6 are read by no query
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, H, S, K)), _normal(rng, (B, H, S, KV))
    g = _normal(rng, (B, H, T, KV))
    clean = [_clean(q, dead_q), _clean(k, dead_k), _clean(v, dead_k)]
    dirty = [_poison(q, dead_q), _poison(k, dead_k), _poison(v, dead_k)]
    run = _value_and_grads(functools.partial(DOT_PATHS[path], m=jnp.asarray(mask), causal=causal), (0, 1, 2))
    out, grads = run(*clean, g)
    out_dirty, grads_dirty = run(*dirty, g)
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), f"{path}, causal={causal}")
    for grad, dead in zip(grads, (dead_q, dead_k, dead_k), strict=True):
        assert np.all(np.asarray(grad)[dead] == 0.0)  # a padded row's gradient is exactly 0
    # the clean run is attention on the real rows (float64 loops)
    ref_out, _ = dot_attention_ref(*clean, effective)
    ref_grads = attention_grads_ref(*clean, g, mask, causal=causal)[:3]
    np.testing.assert_allclose(out, ref_out, rtol=RTOL, atol=ATOL)
    for got, want in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_padded_key_shared_by_heads_is_zeroed_only_if_every_head_ignores_it(rng):
    """A key broadcast over heads is live if any head reads it; a key masked for some queries only is live."""
    keys = jnp.asarray(_normal(rng, (1, 1, 4, 2)))  # [B, 1, S, K]: shared by every head
    mask = np.ones((1, 2, 3, 4), bool)  # [B, H, T, S]
    mask[:, 0, :, 1] = False  # key 1: ignored by head 0 only -> kept
    mask[:, :, :, 2] = False  # key 2: ignored by every head -> zeroed
    mask[:, :, 1:, 3] = False  # key 3: read by query 0 only -> kept
    mask[:, 1, 2, :] = False  # query 2 of head 1 reads nothing; query 2 of head 0 still does
    got = np.asarray(zero_masked_keys(keys, jnp.asarray(mask)))
    np.testing.assert_array_equal(got[0, 0, [0, 1, 3]], np.asarray(keys)[0, 0, [0, 1, 3]])
    np.testing.assert_array_equal(got[0, 0, 2], 0.0)
    queries = jnp.asarray(_normal(rng, (1, 2, 3, 2)))  # [B, H, T, K]: one query per head
    got_q = np.asarray(zero_masked_queries(queries, jnp.asarray(mask)))
    np.testing.assert_array_equal(got_q[0, 1, 2], 0.0)
    np.testing.assert_array_equal(got_q[0, 0], np.asarray(queries)[0, 0])
    assert zero_masked_keys(keys, None) is keys
    with pytest.raises(ValueError, match="does not broadcast"):
        zero_masked_keys(keys, jnp.ones((1, 3, 5), bool))  # S = 5 against 4 keys
    with pytest.raises(ValueError, match="boolean"):
        zero_masked_queries(queries, jnp.ones((1, 3, 4)))


@pytest.mark.parametrize("t, s", [(3, 5), (5, 3)])
def test_live_rows_match_a_brute_force_count(rng, t, s):
    """Which rows are read, for every mask layout (full, key padding, query padding, none), causal or not, and
    keys shared across the batch: the running-``any`` shortcuts equal counting the pairs one by one."""
    past = causal_mask_ref(t, s)
    for shape in [(2, t, s), (2, 1, s), (2, t, 1), (1, 1)]:
        allowed = rng.random(shape) < 0.4
        full = np.broadcast_to(allowed, (2, t, s))
        for causal in (False, True):
            pairs = full & past if causal else full
            for x_batch in ((2,), (1,)):
                for axis, length in ((-1, s), (-2, t)):
                    got = live_rows(
                        jnp.asarray(allowed), x_batch + (length, 4), axis, (t, s) if causal else None
                    )
                    want = np.zeros(x_batch + (length,), bool)
                    for b, i, j in np.ndindex(2, t, s):
                        if pairs[b, i, j]:
                            want[b % x_batch[0], j if axis == -1 else i] = True
                    np.testing.assert_array_equal(
                        np.broadcast_to(got, want.shape), want, err_msg=f"{shape} {causal} {x_batch} {axis}"
                    )


def test_cudnn_branch_is_clean_with_a_stand_in(rng, monkeypatch):
    """The "cudnn" branch on CPU (jax.nn's XLA implementation stands in for cuDNN, a fake Hopper is reported).
    jax.nn alone returns NaN for NaN in padded values and for a row of -inf bias (exp(-inf - -inf)); through this
    branch both give the clean answer: padded rows zeroed before the call, -inf replaced by jax.nn's own fill."""
    calls = []
    real = jax.nn.dot_product_attention

    def stand_in(query, key, value, bias=None, mask=None, *, implementation=None, **kw):
        calls.append(implementation)
        return real(query, key, value, bias, mask, implementation="xla", **kw)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    monkeypatch.setattr(cudnn_module, "_cuda_device", lambda: types.SimpleNamespace(compute_capability="9.0"))
    t, s, width = 4, 6, 8  # even lengths and K a multiple of 8, as cuDNN needs
    mask = np.arange(s)[None, None, None, :] < np.array([6, 3])[:, None, None, None]  # [B, 1, 1, S]
    dead_k = ~np.broadcast_to(mask, (B, 1, t, s)).any(-2)  # [B, 1, S]
    bias = _normal(rng, (t, s))
    bias[1] = -np.inf  # query 1 may attend nothing
    bias[2, :2] = -np.inf
    q = _normal(rng, (B, 1, t, width))
    k, v, g = _normal(rng, (B, 1, s, width)), _normal(rng, (B, 1, s, width)), _normal(rng, (B, 1, t, width))
    bf16 = functools.partial(jnp.asarray, dtype=jnp.bfloat16)
    run = _value_and_grads(
        lambda q, k, v, b: dot_product_attention(q, k, v, jnp.asarray(mask), bias=b, implementation="cudnn"),
        (0, 1, 2, 3),
    )
    out, grads = run(bf16(q), bf16(_clean(k, dead_k)), bf16(_clean(v, dead_k)), bias, g)
    out_dirty, grads_dirty = run(bf16(q), bf16(_poison(k, dead_k)), bf16(_poison(v, dead_k)), bias, g)
    assert calls == ["cudnn"]  # traced once, run twice
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), "cudnn branch")
    assert np.all(np.asarray(out, np.float32)[:, :, 1] == 0.0)
    assert np.all(np.asarray(grads[3])[np.isneginf(bias)] == 0.0)


# ------------------------------------------------------------------------------------------ -inf bias rows


@pytest.mark.parametrize("path", list(DOT_PATHS))
def test_minus_inf_bias_row_is_a_masked_row_on_every_path(rng, path):
    """A bias row of -inf gives a zero context and finite gradients (dbias 0 there), like a fully masked row; a
    -inf entry in another row is a masked entry. The answer is the float64 masked attention."""
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, H, S, K)), _normal(rng, (B, H, S, KV))
    g = _normal(rng, (B, H, T, KV))
    bias = _normal(rng, (H, T, S))
    bias[1, 2] = -np.inf  # head 1, query 2: nothing allowed
    bias[0, :, 3] = -np.inf  # head 0: key 3 forbidden for every query (padding written as a bias)
    bias[2, 4, :5] = -np.inf
    forbidden = np.isneginf(bias)
    run = _value_and_grads(lambda q, k, v, b: DOT_PATHS[path](q, k, v, None, bias=b), (0, 1, 2, 3))
    out, grads = run(q, k, v, bias, g)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in (out, *grads))
    assert np.all(np.asarray(out)[:, 1, 2] == 0.0) and np.all(np.asarray(grads[3])[forbidden] == 0.0)
    finite_bias = np.where(forbidden, 0.0, bias)
    ref_out, _ = dot_attention_ref(q, k, v, ~forbidden, finite_bias)
    ref_grads = attention_grads_ref(q, k, v, g, ~forbidden, finite_bias)
    np.testing.assert_allclose(out, ref_out, rtol=RTOL, atol=ATOL)
    for got, want in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    # a -inf column for every query is padding too: its keys and values may hold anything
    dead_k = np.broadcast_to(forbidden.all(-2)[None], (B, H, S))
    out_dirty, grads_dirty = run(q, _poison(k, dead_k), _poison(v, dead_k), bias, g)
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), f"{path}, -inf bias column")


# ---------------------------------------------------------------------------------------------- multi-head


def test_multi_head_ignores_padded_inputs(rng, key):
    """NaN rows in padded inputs_kv (and in fully masked inputs_q rows) reach no output and no kernel gradient."""
    params = init_multi_head_params(key, H, D, key_features=D + 1, qkv_features=H * K)
    mask = _padding_mask()[:, 0]  # [B, T, S], broadcast over heads
    dead_q, dead_k = _dead(mask)
    x_q, x_kv = _normal(rng, (B, T, D)), _normal(rng, (B, S, D + 1))
    g = _normal(rng, (B, T, D))
    run = _value_and_grads(lambda p, xq, xkv: multi_head_attention(p, xq, xkv, jnp.asarray(mask)), (0, 1, 2))
    out, grads = run(params, _clean(x_q, dead_q), _clean(x_kv, dead_k), g)
    out_dirty, grads_dirty = run(params, _poison(x_q, dead_q), _poison(x_kv, dead_k), g)
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), "multi-head")
    ref, _ = multi_head_ref(params, _clean(x_q, dead_q), _clean(x_kv, dead_k), mask)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)  # padded query rows: the output bias


# ---------------------------------------------------------------------------------------------- additive


@pytest.mark.parametrize("fused", [True, False])
def test_additive_ignores_padded_keys_values_and_queries(rng, key, fused):
    params = init_additive_params(key, D, D + 1, A, normalize=True)
    mask = jnp.asarray(_padding_mask()[:, 0])  # [B, T, S]
    dead_q, dead_k = _dead(np.asarray(mask))
    query, keys = _normal(rng, (B, T, D)), _normal(rng, (B, S, D + 1))
    g = _normal(rng, (B, T, D + 1))
    run = _value_and_grads(lambda p, q, h: additive_attention(p, q, h, mask=mask, fused=fused), (0, 1, 2))
    out, grads = run(params, _clean(query, dead_q), _clean(keys, dead_k), g)
    out_dirty, grads_dirty = run(params, _poison(query, dead_q), _poison(keys, dead_k), g)
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), f"additive, fused={fused}")


def test_additive_step_ignores_padded_projected_keys_and_values(rng, key):
    """The decoder-step form with keys projected once (RNNsearch, GNMT): padded projected keys and values."""
    params = init_additive_params(key, D, D + 1, A)
    mask = np.arange(S)[None, :] < KEY_LENGTHS[:, None]  # [B, S]
    annotations = _normal(rng, (B, S, D + 1))
    projected = np.asarray(project_keys(params, annotations))
    query, g = _normal(rng, (B, D)), _normal(rng, (B, D + 1))
    run = _value_and_grads(
        lambda p, q, pk, h: additive_attention_step(p, q, pk, h, jnp.asarray(mask))[0], (0, 1, 2, 3)
    )
    out, grads = run(params, query, _clean(projected, ~mask), _clean(annotations, ~mask), g)
    out_dirty, grads_dirty = run(params, query, _poison(projected, ~mask), _poison(annotations, ~mask), g)
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), "additive step")


# ------------------------------------------------------------------------------- attend, Luong, local


@pytest.mark.parametrize("which", ["attend", "local-p"])
def test_attend_and_local_ignore_padded_values(rng, which):
    """Given scores (any scorer's), NaN or ±inf in value rows no query reads changes nothing; for local attention
    that includes the rows outside every window."""
    mask = _padding_mask()[:, 0]  # [B, T, S]
    centers = np.array([[0.0, 1.0, 1.6, 2.0, 2.0], [0.0, 0.4, 1.0, 3.0, 3.0]], np.float32)  # [B, T]
    if which == "attend":
        fn, read = (lambda e, v, c: attend(e, v, jnp.asarray(mask))[0]), mask
    else:
        fn = lambda e, v, c: local_attention(e, v, c, window=1, mask=jnp.asarray(mask), gaussian=True)  # noqa: E731
        window = np.abs(np.arange(S) - np.floor(centers + 0.5)[..., None]) <= 1
        read = mask & window  # keys 4..6 of sentence 0 lie outside every window
    dead_k = ~read.any(-2)  # [B, S]
    scores, values, g = _normal(rng, (B, T, S)), _normal(rng, (B, S, KV)), _normal(rng, (B, T, KV))
    run = _value_and_grads(fn, (0, 1, 2))
    out, grads = run(scores, _clean(values, dead_k), centers, g)
    out_dirty, grads_dirty = run(scores, _poison(values, dead_k), centers, g)
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), which)


# ------------------------------------------------------------------------------------------- Luong (module)


@pytest.mark.parametrize(
    "score, local", [("dot", None), ("general", None), ("concat", None), ("location", "m"), ("general", "p")]
)
def test_luong_attention_ignores_padded_content(rng, score, local):
    """The module hands the scorers clean keys: NaN in padded keys/values/queries reaches no parameter gradient."""
    width = D if score == "dot" else D + 1
    module = LuongAttention(
        D, width, score=score, local=local, window=2, max_source_length=S, attention_dim=A, rngs=nnx.Rngs(0)
    )
    graphdef, params = nnx.split(module)
    mask = jnp.asarray(_padding_mask()[:, 0])  # [B, T, S]
    dead_q, dead_k = _dead(np.asarray(mask))
    query, keys = _normal(rng, (B, T, D)), _normal(rng, (B, S, width))
    g = _normal(rng, (B, T, width))
    lengths = jnp.asarray(KEY_LENGTHS)

    def attention(p, q, h):
        return nnx.merge(graphdef, p)(q, h, mask=mask, source_lengths=lengths)

    run = _value_and_grads(attention, (0, 1, 2))
    out, grads = run(params, _clean(query, dead_q), _clean(keys, dead_k), g)
    out_dirty, grads_dirty = run(params, _poison(query, dead_q), _poison(keys, dead_k), g)
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), f"Luong {score}, local={local}")


# ------------------------------------------------------------------------------------------------- models


def _tiny_model(arch):
    if arch == "transformer":
        cfg = TransformerConfig(
            src_vocab=11,
            tgt_vocab=13,
            d_model=8,
            heads=2,
            d_ff=5,
            encoder_layers=1,
            decoder_layers=1,
            max_length=4,
            dropout=0.0,
        )
        return Transformer(cfg, rngs=nnx.Rngs(0))
    cfg = RNNConfig(src_vocab=11, tgt_vocab=13, arch="rnnsearch", embed=5, hidden=6, maxout=3, align=7)
    return RNNsearch(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("arch", ["rnnsearch", "transformer"])
def test_decoders_ignore_nan_in_padded_encoder_output(rng, arch):
    """The encoders write zeros at padding (tokens are ints, so their own padding is finite); a decoder step
    handed an encoding whose padded annotations and precomputed keys are NaN/±inf still gives the same logits
    and the same, finite gradients (parameters, annotations, keys): its attention zeroes what it never reads."""
    model = _tiny_model(arch)
    src_mask = np.arange(S)[None, :] < KEY_LENGTHS[:, None]  # [B, S]
    src = jnp.asarray(np.where(src_mask, rng.integers(3, 11, (B, S)), 0), jnp.int32)
    graphdef, params = nnx.split(model)
    enc = jax.jit(lambda p, s, m: nnx.merge(graphdef, p).encode(s, m))(params, src, jnp.asarray(src_mask))
    assert np.all(np.asarray(enc.memory)[~src_mask] == 0.0)
    prev = jnp.ones((B,), jnp.int32)

    def step(p, memory, keys):
        m = nnx.merge(graphdef, p)
        e = enc._replace(memory=memory, keys=keys)
        return m.decode_step(e, m.init_decoder_state(e), prev)[0]  # logits [B, V]

    def padded(
        x, poison
    ):  # the source axis is -2 of memory [B, S, D] and keys [B, S, A] or [B, L, 2, H, S, K]
        dead = np.broadcast_to(~src_mask.reshape((B,) + (1,) * (x.ndim - 3) + (S,)), x.shape[:-1])
        return _poison(x, dead) if poison else _clean(x, dead)

    run = _value_and_grads(step, (0, 1, 2))
    g = _normal(rng, (B, 13))
    out, grads = run(params, padded(enc.memory, False), padded(enc.keys, False), g)
    out_dirty, grads_dirty = run(params, padded(enc.memory, True), padded(enc.keys, True), g)
    _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), arch)


# ------------------------------------------------------------------- two-step API: every scorer, every dtype

# Tiny odd sizes for the sweep. One jitted program per dtype: float32 runs all 12 scorer-by-path combinations,
# the other dtypes 4 of them (every scorer and every path once), which keeps the compilations short.
SB, ST, SS, SD, SA, WINDOW = 2, 3, 5, 4, 6, 1
SWEEP_KEY_LENGTHS, SWEEP_QUERY_LENGTHS = np.array([5, 3]), np.array([3, 2])
SCORERS = ("dot", "general", "concat", "location")
PATHS = ("global", "local-m", "local-p")
DIAGONAL = (("dot", "global"), ("general", "local-p"), ("concat", "local-m"), ("location", "local-p"))
# Tolerances against float64: float32 (and float64 inputs, whose energies are float32 by policy) at 1e-5; bf16
# and fp16 round the context to the output dtype once more, so 2 ulps of it.
SWEEP_TOL = {
    jnp.float32: (1e-5, 1e-6),
    jnp.float64: (1e-5, 1e-6),
    jnp.bfloat16: (2 * 2.0**-7, 2 * 2.0**-7),
    jnp.float16: (2 * 2.0**-10, 2 * 2.0**-10),
}


def _sweep_params(key):
    k = jax.random.split(key, 4)
    return {
        "general": init_general_params(k[0], SD, SD),
        "concat": init_additive_params(k[1], SD, SD, SA, use_bias=False),
        "location": init_location_params(k[2], SD, SS),
        "position": init_local_p_params(k[3], SD, SA),
    }


def _two_step(scorer, path, mask, lengths):
    """``(params, query, keys) -> context``: a public scorer, then ``luong_attention`` or ``local_attention``."""

    def fn(p, q, h):
        if scorer == "dot":
            scores = dot_scores(q, h)
        elif scorer == "general":
            scores = general_scores(p["general"], q, h)
        elif scorer == "concat":
            scores = concat_scores(p["concat"], q, h)
        else:
            scores = location_scores(p["location"], q, h.shape[-2])
        if path == "global":
            return luong_attention(scores, h, mask)
        if path == "local-m":
            centers = monotonic_centers(q.shape[-2], lengths)
            return local_attention(scores, h, centers, window=WINDOW, mask=mask, gaussian=False)
        centers = predictive_centers(p["position"], q, lengths)
        return local_attention(scores, h, centers, window=WINDOW, mask=mask, gaussian=True)

    return fn


def _two_step_ref(scorer, path, p, q, h, mask):
    """float64 loops: the scorer's energies, then global or local attention over the mask."""
    if scorer == "dot":
        scores = dot_scores_ref(q, h)
    elif scorer == "general":
        scores = general_scores_ref(q, h, p["general"]["w"])
    elif scorer == "concat":
        c = p["concat"]
        scores = concat_scores_ref(q, h, c["w_q"], c["w_k"], c["v"])
    else:
        scores = location_scores_ref(q, p["location"]["w"], SS)
    if path == "global":
        return context_ref(softmax_ref(scores, mask), h)
    if path == "local-m":
        centers = monotonic_centers_ref(ST, SWEEP_KEY_LENGTHS)
    else:
        pos = p["position"]
        centers = predictive_centers_ref(q, pos["w_p"], pos["v_p"], SWEEP_KEY_LENGTHS)
    return local_ref(scores, h, centers, WINDOW, mask, gaussian=path == "local-p")[0]


@pytest.mark.parametrize(
    "dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64], ids=lambda d: d.__name__
)
def test_two_step_scorers_ignore_padded_content(rng, key, dtype):
    """A public scorer (no mask) then ``luong_attention`` / ``local_attention``, local-p with predictive centres:
    NaN and ±inf in padded keys and queries reach no output and no gradient (parameters, queries, keys), in every
    float dtype, and the clean answer is the float64 loops'."""
    with jax.enable_x64(dtype == jnp.float64):
        key_valid = np.arange(SS)[None, :] < SWEEP_KEY_LENGTHS[:, None]  # [B, S]
        query_valid = np.arange(ST)[None, :] < SWEEP_QUERY_LENGTHS[:, None]  # [B, T]
        mask = query_valid[:, :, None] & key_valid[:, None, :]  # [B, T, S]
        lengths = jnp.asarray(SWEEP_KEY_LENGTHS)
        params = jax.tree.map(lambda x: jnp.asarray(x, dtype), _sweep_params(key))
        combos = [(s, p) for s in SCORERS for p in PATHS] if dtype == jnp.float32 else DIAGONAL
        fns = {c: _two_step(*c, jnp.asarray(mask), lengths) for c in combos}

        def run(p, q, h, g):
            results = {}
            for c, fn in fns.items():
                out, pullback = jax.vjp(fn, p, q, h)
                results[c] = (out, pullback(g.astype(out.dtype)))
            return results

        run = jax.jit(run)
        q = _normal(rng, (SB, ST, SD))
        h = _normal(rng, (SB, SS, SD))
        g = jnp.asarray(_normal(rng, (SB, ST, SD)), dtype)
        clean = run(
            params, jnp.asarray(_clean(q, ~query_valid), dtype), jnp.asarray(_clean(h, ~key_valid), dtype), g
        )
        dirty = run(
            params,
            jnp.asarray(_poison(q, ~query_valid), dtype),
            jnp.asarray(_poison(h, ~key_valid), dtype),
            g,
        )
        rtol, atol = SWEEP_TOL[dtype]
        p64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
        q64 = np.asarray(jnp.asarray(_clean(q, ~query_valid), dtype), np.float64)
        h64 = np.asarray(jnp.asarray(_clean(h, ~key_valid), dtype), np.float64)
        for c in combos:
            (out, grads), (out_dirty, grads_dirty) = clean[c], dirty[c]
            assert out.dtype == dtype
            what = f"{c[0]} + {c[1]}, {dtype.__name__}"
            _assert_same_and_finite((out_dirty, grads_dirty), (out, grads), what)
            _, grad_q, grad_h = grads
            assert np.all(np.asarray(grad_q, np.float32)[~query_valid] == 0.0), what
            assert np.all(np.asarray(grad_h, np.float32)[~key_valid] == 0.0), what
            want = _two_step_ref(*c, p64, q64, h64, mask)
            np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=rtol, atol=atol, err_msg=what)
