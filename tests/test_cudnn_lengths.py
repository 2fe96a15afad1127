"""Padding as lengths: ``padding_lengths`` (mask -> lengths, checked), ``query_lengths=``/``key_lengths=`` on
every implementation (the same function as the mask they stand for), and the cuDNN branch handing them to
``jax.nn.dot_product_attention`` as ``query_seq_lengths``/``key_value_seq_lengths`` instead of a dense mask.

On CPU the cuDNN branch runs with a stand-in (jax.nn's XLA implementation, which takes the same sequence lengths,
behind a fake Hopper device), as in tests/test_chunked_attention.py; the ``gpu`` test runs real cuDNN.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import attn_jax.attention._cudnn as cudnn_module
from attn_jax.attention import (
    dot_product_attention,
    dot_product_implementation,
    key_padding_mask,
    make_attention_mask,
    make_causal_mask,
    make_padding_mask,
    padding_lengths,
)
from tests.reference.masks_dot import causal_mask_ref, dot_attention_ref, padding_mask_ref
from tests.tolerance import assert_close_f32

# Odd, distinct sizes so that a swapped axis cannot pass: B=3, H=2, T=5, S=7, K=11, Kv=3.
B, H, T, S, K, KV = 3, 2, 5, 7, 11, 3
# Longest float32 summation chain: logits over K, softmax and context over S.
REDUCTION = K + 2 * S
Q_LENGTHS, K_LENGTHS = np.array([5, 2, 0]), np.array([7, 3, 4])


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _rel_err(actual, expected):
    """``max|a − e| / max|e|``: one number per array, robust to entries near zero."""
    expected = np.asarray(expected, np.float64)
    return np.abs(np.asarray(actual, np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30)


def _pairs_ref(q_lengths, k_lengths, t, s, causal=False):
    """``[B, T, S]`` float64-side reference of the pairs lengths allow, one entry at a time."""
    out = padding_mask_ref(q_lengths, t)[:, :, None] & padding_mask_ref(k_lengths, s)[:, None, :]
    return out & causal_mask_ref(t, s) if causal else out


# ------------------------------------------------------------------------------------- mask -> lengths


def test_key_padding_masks_give_key_lengths():
    for lengths in ([7, 3, 4], [0, 1, 7], [7, 7, 7]):
        mask = key_padding_mask(make_padding_mask(jnp.array(lengths), S))[:, None]  # [B, 1, 1, S]
        q, k = padding_lengths(mask)
        assert q is None and k.dtype == jnp.int32 and k.shape == (B, 1)
        np.testing.assert_array_equal(np.asarray(k)[:, 0], lengths)


def test_query_and_key_padding_masks_give_both_lengths():
    for q_lengths, k_lengths in ((Q_LENGTHS, K_LENGTHS), ([1, 5, 3], [1, 7, 2]), ([5, 5, 5], [7, 7, 7])):
        valid_q = make_padding_mask(jnp.array(q_lengths), T)
        valid_k = make_padding_mask(jnp.array(k_lengths), S)
        mask = make_attention_mask(valid_q, valid_k)[:, None]  # [B, 1, T, S]
        q, k = padding_lengths(mask)
        # an element with no query (or no key) allows no pair: canonical lengths 0 and 0 there
        empty = (np.array(q_lengths) == 0) | (np.array(k_lengths) == 0)
        np.testing.assert_array_equal(np.asarray(q)[:, 0], np.where(empty, 0, q_lengths))
        np.testing.assert_array_equal(np.asarray(k)[:, 0], np.where(empty, 0, k_lengths))


def test_masks_that_are_not_padding_give_none():
    prefix = padding_mask_ref(K_LENGTHS, S)[:, None, :]  # [B, 1, S]
    hole = prefix.copy()
    hole[1, 0, 1] = False  # [T, F, T, F, ...]: a key inside the prefix is masked
    left_padded = prefix[..., ::-1].copy()  # padding first
    uneven = np.broadcast_to(prefix, (B, T, S)).copy()
    uneven[0, 2, 6] = False  # one real query sees fewer keys than the others
    query_hole = _pairs_ref(Q_LENGTHS, K_LENGTHS, T, S)
    query_hole[0, 1] = False  # a padded query before a real one
    for name, mask in (("hole", hole), ("left", left_padded), ("uneven", uneven), ("query hole", query_hole)):
        assert padding_lengths(jnp.asarray(mask)) is None, name
    # a causal mask is a padding mask only when told it holds the causal pattern
    causal = jnp.asarray(_pairs_ref(Q_LENGTHS, K_LENGTHS, T, S, causal=True))
    assert padding_lengths(causal) is None
    assert padding_lengths(causal, causal=True) is not None
    assert padding_lengths(jnp.asarray(_pairs_ref(Q_LENGTHS, K_LENGTHS, T, S)), causal=True) is None


def test_causal_padding_mask_gives_lengths_that_rebuild_it():
    """Decoder self-attention: causal ∧ padding. A key length above the query length describes the same mask
    (keys j >= q are read by no real query), so the canonical key length is min(q, k)."""
    q_lengths, k_lengths = np.array([5, 2, 4]), np.array([5, 4, 1])
    mask = _pairs_ref(q_lengths, k_lengths, T, T, causal=True)
    q, k = padding_lengths(jnp.asarray(mask), causal=True)
    np.testing.assert_array_equal(q, q_lengths)
    np.testing.assert_array_equal(k, np.minimum(q_lengths, k_lengths))
    rebuilt = _pairs_ref(np.asarray(q), np.asarray(k), T, T, causal=True)
    np.testing.assert_array_equal(rebuilt, mask)


def test_broadcast_axes_and_no_padding():
    assert padding_lengths(jnp.ones((1, 1), bool)) == (None, None)  # no padding at all
    assert padding_lengths(jnp.zeros((1, 1), bool)) is None  # lengths cannot say "nothing" with no axis
    q, k = padding_lengths(jnp.asarray(padding_mask_ref(Q_LENGTHS, T)[:, :, None]))  # [B, T, 1]: queries only
    assert k is None
    np.testing.assert_array_equal(q, Q_LENGTHS)


def test_padding_lengths_refuses_traced_and_non_boolean_masks():
    mask = jnp.ones((2, 3), bool)
    with pytest.raises(ValueError, match="unknown inside jit.*query_lengths=/key_lengths="):
        jax.jit(padding_lengths)(mask)
    with pytest.raises(ValueError, match="must be boolean"):
        padding_lengths(mask.astype(jnp.float32))
    with pytest.raises(ValueError, match="at least 2 axes"):
        padding_lengths(jnp.ones((3,), bool))


def _lengths_decomposition_ref(mask, causal):
    """Brute force over every (q, k) per batch element: does some pair of lengths rebuild ``mask [B, T, S]``?"""
    b, t, s = mask.shape
    pattern = causal_mask_ref(t, s) if causal else np.ones((t, s), bool)
    for i in range(b):
        found = any(
            np.array_equal(
                (np.arange(t)[:, None] < q) & (np.arange(s)[None, :] < k) & pattern,
                mask[i],
            )
            for q in range(t + 1)
            for k in range(s + 1)
        )
        if not found:
            return False
    return True


@given(
    data=st.data(),
    t=st.integers(2, 6),
    s=st.integers(2, 6),
    causal=st.booleans(),
    from_lengths=st.booleans(),
)
def test_padding_lengths_is_exact(data, t, s, causal, from_lengths):
    """For random lengths (and random masks): the answer is not None iff some lengths rebuild the mask, and the
    lengths returned rebuild it entry for entry."""
    b = 3
    if from_lengths:
        q_lengths = np.array(data.draw(st.lists(st.integers(0, t), min_size=b, max_size=b)))
        k_lengths = np.array(data.draw(st.lists(st.integers(0, s), min_size=b, max_size=b)))
        mask = _pairs_ref(q_lengths, k_lengths, t, s, causal)
    else:
        bits = data.draw(st.lists(st.booleans(), min_size=b * t * s, max_size=b * t * s))
        mask = np.array(bits).reshape(b, t, s)
    got = padding_lengths(jnp.asarray(mask), causal=causal)
    assert (got is not None) == _lengths_decomposition_ref(mask, causal)
    if from_lengths:
        assert got is not None
    if got is not None:
        q, k = got
        assert q.shape == k.shape == (b,) and q.dtype == k.dtype == jnp.int32
        np.testing.assert_array_equal(_pairs_ref(np.asarray(q), np.asarray(k), t, s, causal), mask)


# ------------------------------------------------------------------ lengths on the XLA and chunked paths


def _inputs(rng, t=T, s=S, width=K, kv=KV):
    return _normal(rng, (B, H, t, width)), _normal(rng, (B, 1, s, width)), _normal(rng, (B, H, s, kv))


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
@pytest.mark.parametrize("causal", [False, True])
def test_lengths_equal_the_mask_they_stand_for(rng, implementation, causal):
    """jit(lengths) == jit(equivalent boolean mask) to float32 rounding, and both == the float64 reference; padded
    queries (and the element with no query) get an exactly zero context."""
    q, k, v = _inputs(rng)
    q_lengths, k_lengths = Q_LENGTHS[:, None], K_LENGTHS[:, None]  # [B, 1]: shared by the heads
    mask = make_attention_mask(
        make_padding_mask(q_lengths, T), make_padding_mask(k_lengths, S)
    )  # [B, 1, T, S]
    kw = dict(causal=causal, implementation=implementation)
    with_lengths = jax.jit(
        lambda q, k, v, ql, kl: dot_product_attention(q, k, v, query_lengths=ql, key_lengths=kl, **kw)
    )(q, k, v, q_lengths, k_lengths)
    with_mask = jax.jit(lambda q, k, v, m: dot_product_attention(q, k, v, m, **kw))(q, k, v, mask)
    assert_close_f32(with_lengths, with_mask, reduction=REDUCTION)
    pairs = _pairs_ref(Q_LENGTHS, K_LENGTHS, T, S, causal)[:, None]  # [B, 1, T, S]
    ref, _ = dot_attention_ref(q, k, v, pairs)
    np.testing.assert_allclose(with_lengths, ref, rtol=1e-5, atol=1e-6)
    dead = ~np.broadcast_to(pairs, (B, H, T, S)).any(-1)  # [B, H, T]
    assert dead[2].all() and np.all(np.asarray(with_lengths)[dead] == 0.0)


def test_key_lengths_combine_with_a_mask_and_a_bias(rng):
    """Lengths AND a mask AND a bias: the answer of the combined mask (float64 reference)."""
    q, k, v = _inputs(rng)
    mask = rng.random((B, H, T, S)) < 0.7
    bias = _normal(rng, (H, T, S))
    out = dot_product_attention(q, k, v, mask, bias=bias, key_lengths=K_LENGTHS[:, None])
    pairs = mask & padding_mask_ref(K_LENGTHS, S)[:, None, None, :]
    ref, _ = dot_attention_ref(q, k, v, pairs, bias)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_lengths_beyond_the_axis_mean_every_position(rng):
    """``i < q`` for every i < T when q >= T, and for none when q <= 0: as make_padding_mask reads them."""
    q, k, v = _inputs(rng)
    full = dot_product_attention(q, k, v, implementation="xla")
    np.testing.assert_array_equal(
        dot_product_attention(q, k, v, query_lengths=np.array([[T + 3]]), key_lengths=np.array(99)), full
    )
    np.testing.assert_array_equal(dot_product_attention(q, k, v, key_lengths=np.array(-1)), 0.0)


def test_bad_lengths_are_refused(rng):
    q, k, v = _inputs(rng)
    with pytest.raises(ValueError, match=r"key_lengths must be integers, got dtype float32"):
        dot_product_attention(q, k, v, key_lengths=K_LENGTHS.astype(np.float32)[:, None])
    with pytest.raises(
        ValueError, match=r"query_lengths of shape \[3\] does not broadcast.*\[3, 2\].*\[B, 1\]"
    ):
        dot_product_attention(q, k, v, query_lengths=Q_LENGTHS)  # [B] against batch axes [B, H]


# ------------------------------------------------------------------------------------------ the cuDNN branch


def _stand_in(monkeypatch, calls):
    """jax.nn's cuDNN call replaced by its XLA implementation (same arguments), a fake Hopper device reported."""
    real = jax.nn.dot_product_attention

    def stand_in(query, key, value, bias=None, mask=None, *, implementation=None, **kw):
        calls.append(
            dict(
                implementation=implementation,
                mask=mask,
                query_seq_lengths=kw.get("query_seq_lengths"),
                key_value_seq_lengths=kw.get("key_value_seq_lengths"),
            )
        )
        return real(query, key, value, bias, mask, implementation="xla", **kw)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    monkeypatch.setattr(cudnn_module, "_cuda_device", lambda: types.SimpleNamespace(compute_capability="9.0"))


def _cudnn_case(rng):
    """bf16 [B, H, T=6, K=8] queries, a head-shared key, S=10 (even lengths, K a multiple of 8, as cuDNN needs)."""
    t, s, width = 6, 10, 8
    q, k, v = _normal(rng, (B, H, t, width)), _normal(rng, (B, 1, s, width)), _normal(rng, (B, H, s, width))
    q_lengths, k_lengths = np.array([6, 3, 4]), np.array([10, 5, 0])  # element 2: no key at all
    return [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)], q_lengths, k_lengths


@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_branch_gets_sequence_lengths_not_a_mask(rng, monkeypatch, causal):
    calls = []
    _stand_in(monkeypatch, calls)
    (q, k, v), q_lengths, k_lengths = _cudnn_case(rng)
    t, s = q.shape[-2], k.shape[-2]
    lengths = dict(query_lengths=q_lengths[:, None], key_lengths=k_lengths[:, None])
    # eagerly, so the stand-in sees the lengths' values (the gradient test below runs the branch under jit)
    out = dot_product_attention(q, k, v, implementation="cudnn", causal=causal, **lengths)
    (call,) = calls
    assert call["implementation"] == "cudnn" and call["mask"] is None
    # one cuDNN batch element per (b, h); the keyless element 2 gets one key and no query (the same empty set)
    want_q, want_k = np.repeat([6, 3, 0], H), np.repeat([10, 5, 1], H)
    for got, want in ((call["query_seq_lengths"], want_q), (call["key_value_seq_lengths"], want_k)):
        assert got.dtype == jnp.int32 and got.shape == (B * H,)
        np.testing.assert_array_equal(got, want)
    mask = make_attention_mask(make_padding_mask(q_lengths, t), make_padding_mask(k_lengths, s))[:, None]
    ref = dot_product_attention(q, k, v, mask, causal=causal, implementation="xla")
    # jax.nn rounds the weights to bf16 before multiplying the values (2^-9 relative), ours keeps float32 until
    # the end: a few bf16 ulps of max|ref| (the tolerance of test_chunked_attention's stand-in test)
    assert out.dtype == jnp.bfloat16 and _rel_err(out, np.asarray(ref, np.float32)) < 2e-2
    dead = ~np.broadcast_to(_pairs_ref(q_lengths, k_lengths, t, s, causal)[:, None], (B, H, t, s)).any(-1)
    assert dead[2].all() and np.all(np.asarray(out, np.float32)[dead] == 0.0)


def test_cudnn_branch_with_lengths_keeps_padding_out_of_gradients(rng, monkeypatch):
    """NaN and inf in padded key/value rows and in padded queries change no output and no gradient."""
    _stand_in(monkeypatch, [])
    (q, k, v), q_lengths, k_lengths = _cudnn_case(rng)
    g = jnp.asarray(_normal(rng, q.shape), jnp.bfloat16)

    @jax.jit
    def run(q, k, v):
        fn = functools.partial(
            dot_product_attention,
            implementation="cudnn",
            query_lengths=q_lengths[:, None],
            key_lengths=k_lengths[:, None],
        )
        out, pullback = jax.vjp(fn, q, k, v)
        return out, pullback(g)

    def poison(x, lengths):
        dead = np.arange(x.shape[-2])[None, :] >= lengths[:, None]  # [B, L]
        return jnp.where(dead[:, None, :, None], jnp.asarray(np.nan, x.dtype), x)

    clean = run(q, k, v)
    dirty = run(poison(q, q_lengths), poison(k, k_lengths), poison(v, k_lengths))
    for c, d in zip(jax.tree.leaves(clean), jax.tree.leaves(dirty), strict=True):
        assert np.all(np.isfinite(np.asarray(d, np.float32)))
        np.testing.assert_array_equal(np.asarray(d, np.float32), np.asarray(c, np.float32))


def test_none_picks_cudnn_for_lengths_and_says_why_not_for_a_mask(rng, monkeypatch):
    """With padding as lengths, ``implementation=None`` runs cuDNN; with the same padding as a boolean mask it
    runs XLA and dot_product_implementation gives the reason (and how to get cuDNN)."""
    calls = []
    _stand_in(monkeypatch, calls)
    (q, k, v), q_lengths, k_lengths = _cudnn_case(rng)
    lengths = dict(query_lengths=q_lengths[:, None], key_lengths=k_lengths[:, None])
    jax.eval_shape(functools.partial(dot_product_attention, **lengths), q, k, v)  # tracing shows the choice
    assert [c["implementation"] for c in calls] == ["cudnn"]
    assert dot_product_implementation(q, k, v, **lengths) == ("cudnn", None)
    mask = key_padding_mask(make_padding_mask(k_lengths, k.shape[-2]))[:, None]
    jax.eval_shape(dot_product_attention, q, k, v, mask)
    assert len(calls) == 1
    choice, reason = dot_product_implementation(q, k, v, mask)
    assert choice == "xla" and "dense [..., T, S] bias" in reason and "query_lengths=/key_lengths=" in reason
    # ... and the conversion the reason points to gets cuDNN back
    q_len, k_len = padding_lengths(mask)
    assert dot_product_implementation(q, k, v, query_lengths=q_len, key_lengths=k_len) == ("cudnn", None)
    assert dot_product_implementation(q, k, v, return_weights=True)[0] == "xla"
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    assert "bfloat16 or all float16" in dot_product_implementation(*f32, **lengths)[1]


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU reason")
def test_on_cpu_the_reason_names_the_device(rng):
    (q, k, v), q_lengths, k_lengths = _cudnn_case(rng)
    choice, reason = dot_product_implementation(q, k, v, key_lengths=k_lengths[:, None])
    assert choice == "xla" and reason.startswith("it needs a CUDA GPU") and "'cpu'" in reason
    with pytest.raises(ValueError, match="implementation='cudnn' does not apply: it needs a CUDA GPU"):
        dot_product_attention(q, k, v, key_lengths=k_lengths[:, None], implementation="cudnn")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_with_lengths_matches_xla_with_the_mask_on_gpu(rng, causal):
    """Real cuDNN given lengths == the XLA path given the equivalent boolean mask: outputs and gradients, padded
    rows exactly zero, the keyless element finite."""
    (q, k, v), q_lengths, k_lengths = _cudnn_case(rng)
    t, s = q.shape[-2], k.shape[-2]
    g = jnp.asarray(_normal(rng, q.shape), jnp.bfloat16)
    mask = make_attention_mask(make_padding_mask(q_lengths, t), make_padding_mask(k_lengths, s))[:, None]

    def run(fn):
        out, pullback = jax.vjp(fn, q, k, v)
        return out, pullback(g)

    cudnn = jax.jit(
        lambda: run(
            functools.partial(
                dot_product_attention,
                causal=causal,
                implementation="cudnn",
                query_lengths=q_lengths[:, None],
                key_lengths=k_lengths[:, None],
            )
        )
    )()
    xla = jax.jit(
        lambda: run(lambda q, k, v: dot_product_attention(q, k, v, mask, causal=causal, implementation="xla"))
    )()
    assert (
        "cudnn"
        in jax.jit(
            functools.partial(dot_product_attention, implementation="cudnn", key_lengths=k_lengths[:, None])
        )
        .lower(q, k, v)
        .as_text()
        .lower()
    )
    # bf16: cuDNN rounds P to bf16 inside its kernel, ours keeps float32 until the end (see the stand-in test);
    # gradients chain two more bf16 products
    for i, (a, b) in enumerate(zip(jax.tree.leaves(cudnn), jax.tree.leaves(xla), strict=True)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.all(np.isfinite(a)), i
        assert _rel_err(a, b) < (2e-2 if i == 0 else 4e-2), i
    dead = ~np.broadcast_to(_pairs_ref(q_lengths, k_lengths, t, s, causal)[:, None], (B, H, t, s)).any(-1)
    assert np.all(np.asarray(cudnn[0], np.float32)[dead] == 0.0)


def test_decoder_self_attention_round_trip(rng):
    """The Transformer decoder's causal ∧ target-padding mask -> padding_lengths(causal=True) -> lengths with
    causal=True: the same outputs as the mask."""
    q, _, _ = _inputs(rng)
    lengths = np.array([5, 2, 3])
    valid = make_padding_mask(lengths, T)
    mask = jnp.logical_and(make_attention_mask(valid, valid), make_causal_mask(T))[:, None]  # [B, 1, T, T]
    ql, kl = padding_lengths(mask, causal=True)
    out = dot_product_attention(q, q, q, query_lengths=ql, key_lengths=kl, causal=True)
    assert_close_f32(out, dot_product_attention(q, q, q, mask), reduction=K + 2 * T)
