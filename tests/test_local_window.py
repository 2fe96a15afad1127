"""Sliding-window (local) attention: ``dot_product_attention(local_window=(left, right))`` on every implementation.

Query ``i`` may attend key ``j`` iff ``i - left <= j <= i + right`` (jax.nn's ``local_window_size``), ANDed with the
mask, the bias, ``causal`` and the padding lengths. Checked against a float64 loop reference (values and
gradients), against jax.nn, "chunked" against "xla", and that the chunked kernel visits exactly the blocks that
meet a window: counted at run time, not timed. On CPU the cuDNN branch runs with a stand-in (jax.nn's XLA
implementation behind a fake Hopper device), as in tests/test_chunked_attention.py.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import attn_jax.attention._chunked as chunked_module
import attn_jax.attention._cudnn as cudnn_module
from attn_jax.attention import (
    chunked_dot_product_attention,
    dot_product_attention,
    dot_product_implementation,
    sliding_window_mask,
)
from attn_jax.nn.attention import DotProductAttention
from tests.reference.chunked import attention_grads_ref
from tests.reference.masks_dot import causal_mask_ref, dot_attention_ref, padding_mask_ref
from tests.tolerance import assert_close_f32

# Odd, distinct sizes so that a swapped axis cannot pass: B=3, H=2, T=9, S=13, K=5, Kv=3.
B, H, T, S, K, KV = 3, 2, 9, 13, 5, 3
# Longest float32 summation chain: logits over K, softmax and context over S.
REDUCTION = K + 2 * S
Q_LENGTHS, K_LENGTHS = np.array([9, 4, 7]), np.array([13, 6, 2])


def _normal(rng, shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def _rel_err(actual, expected):
    """``max|a − e| / max|e|``: one number per array, robust to entries near zero."""
    expected = np.asarray(expected, np.float64)
    return np.abs(np.asarray(actual, np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30)


def window_ref(t, s, left, right, offset=0):
    """``m[i, j] = i + offset - left <= j <= i + offset + right``, one entry at a time."""
    out = np.zeros((t, s), bool)
    for i in range(t):
        for j in range(s):
            out[i, j] = i + offset - left <= j <= i + offset + right
    return out


def _allowed_ref(t, s, window, *, causal=False, mask=None, q_lengths=None, k_lengths=None):
    """The pairs every option together allows, ``[..., T, S]`` (lengths per batch element ``[B]``)."""
    left, right = (window, window) if isinstance(window, int) else window
    out = window_ref(t, s, left, right)
    if causal:
        out = out & causal_mask_ref(t, s)
    if mask is not None:
        out = out & mask
    if q_lengths is not None:  # [B] -> [B, 1, T, 1]: shared by the heads
        out = out & padding_mask_ref(q_lengths, t)[:, None, :, None]
    if k_lengths is not None:
        out = out & padding_mask_ref(k_lengths, s)[:, None, None, :]
    return out


def _case(rng):
    """Heads share the key ([B, 1, S, K]) and the mask ([B, 1, T, S], ~70% kept); the bias is batch-shared."""
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, 1, S, K)), _normal(rng, (B, H, S, KV))
    mask = rng.random((B, 1, T, S)) < 0.7
    mask[0, 0, 3] = False  # a fully masked query row
    bias = _normal(rng, (H, T, S))
    g = _normal(rng, (B, H, T, KV))  # a random projection of the output: the gradient's cotangent
    return q, k, v, mask, bias, g


def _value_and_grads(fn, q, k, v, bias, g):
    """``(out, (dq, dk, dv, dbias))`` of ``Σ g · fn(q, k, v, bias)`` by ``jax.grad``, jitted."""

    def loss(q, k, v, bias):
        return jnp.sum(fn(q, k, v, bias) * g)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)
    return jax.jit(fn)(q, k, v, bias), grads


# --- the mask helper ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [(0, 0), (2, 1), (0, 3), 4, (20, 20)])
@pytest.mark.parametrize("offset", [0, 3])
def test_sliding_window_mask_matches_loop(window, offset):
    left, right = (window, window) if isinstance(window, int) else window
    got = sliding_window_mask(T, S, window, offset=offset)
    assert got.dtype == jnp.bool_ and got.shape == (T, S)
    np.testing.assert_array_equal(got, window_ref(T, S, left, right, offset))
    # a traced offset (a decoding step inside jit) gives the same mask
    traced = jax.jit(lambda o: sliding_window_mask(T, S, window, offset=o))(offset)
    np.testing.assert_array_equal(traced, got)


@pytest.mark.parametrize("bad", [-1, (1, -2), (1,), (1, 2, 3), 1.5, (1.0, 2), True, (True, 1), "3"])
def test_bad_windows_are_refused(rng, bad):
    q, k, v = _normal(rng, (T, K)), _normal(rng, (S, K)), _normal(rng, (S, KV))
    with pytest.raises(ValueError, match="local_window must be a non-negative int or a pair"):
        sliding_window_mask(T, S, bad)
    for impl in ("xla", "chunked"):
        with pytest.raises(ValueError, match="local_window must be a non-negative int or a pair"):
            dot_product_attention(q, k, v, local_window=bad, implementation=impl)
    with pytest.raises(ValueError, match="local_window must be"):
        DotProductAttention(local_window=bad)


# --- float64 reference: values and gradients ----------------------------------------------------------------


def _numerics(*case):
    """A case the AVX2 ``numerics`` pass reruns: two per test, one two-sided and one causal, keep that pass short."""
    return pytest.param(*case, marks=pytest.mark.numerics)


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
@pytest.mark.parametrize(
    "window,causal",
    [_numerics((2, 3), False), ((0, 0), False), (3, True), ((4, 0), False), _numerics((1, 6), True)],
)
def test_values_and_grads_match_float64_reference(rng, implementation, window, causal):
    q, k, v, mask, bias, g = _case(rng)
    chunks = dict(query_chunk=4, key_chunk=3) if implementation == "chunked" else {}
    attention = chunked_dot_product_attention if implementation == "chunked" else dot_product_attention

    def fn(q, k, v, bias):
        return attention(q, k, v, mask, bias=bias, causal=causal, local_window=window, **chunks)

    out, grads = _value_and_grads(fn, q, k, v, bias, g)
    allowed = _allowed_ref(T, S, window, causal=causal, mask=mask)
    out_ref, _ = dot_attention_ref(q, k, v, allowed, bias)
    grads_ref = attention_grads_ref(q, k, v, g, allowed, bias)
    assert out.shape == (B, H, T, KV) and out.dtype == jnp.float32
    # float32 values: sums of <= 2S + K O(1) terms, ~1e-6 relative; 1e-5 is the house tolerance.
    assert _rel_err(out, out_ref) < 1e-5
    # float32 gradients: one more matmul and the (dP − Δ) cancellation; 1e-4 relative to the largest entry
    # (tests/test_chunked_attention.py's bound for the same quantities).
    for name, got, ref in zip(("dq", "dk", "dv", "dbias"), grads, grads_ref, strict=True):
        assert got.shape == ref.shape, name
        assert _rel_err(got, ref) < 1e-4, name
    # Queries whose window holds no allowed key: the library's fully-masked-row policy (zero context and dq).
    dead = ~np.broadcast_to(allowed, (B, H, T, S)).any(-1)
    assert dead[0, :, 3].all()
    assert np.all(np.asarray(out)[dead] == 0.0) and np.all(np.asarray(grads[0])[dead] == 0.0)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in grads)


# --- peer: jax.nn ---------------------------------------------------------------------------------------------


def _to_bthk(x):
    return jnp.swapaxes(x, -3, -2)  # [B, H, T, K] <-> [B, T, H, K]


@pytest.mark.parametrize(
    "window,causal,lengths",
    [
        _numerics((2, 3), False, False),
        (4, False, False),
        ((0, 0), True, False),
        _numerics((5, 0), True, True),
        (3, False, True),
    ],
)
def test_matches_jax_nn_local_window_size(rng, window, causal, lengths):
    q, k, v = _normal(rng, (B, H, T, K)), _normal(rng, (B, H, S, K)), _normal(rng, (B, H, S, K))
    ql, kl = (Q_LENGTHS, K_LENGTHS) if lengths else (None, None)
    ours = dot_product_attention(
        q,
        k,
        v,
        causal=causal,
        local_window=window,
        implementation="xla",
        query_lengths=None if ql is None else ql[:, None],
        key_lengths=None if kl is None else kl[:, None],
    )
    theirs = _to_bthk(
        jax.nn.dot_product_attention(
            *(_to_bthk(x) for x in (q, k, v)),
            is_causal=causal,
            local_window_size=window,
            query_seq_lengths=None if ql is None else jnp.asarray(ql, jnp.int32),
            key_value_seq_lengths=None if kl is None else jnp.asarray(kl, jnp.int32),
            implementation="xla",
        )
    )
    # A query with no allowed key: jax.nn averages all values, we give 0 (the policy of test_dot_product.py);
    # every other row must agree.
    allowed = _allowed_ref(T, S, window, causal=causal, q_lengths=ql, k_lengths=kl)
    live = np.broadcast_to(allowed, (B, H, T, S)).any(-1)
    assert live.any() and (lengths or window != (2, 3) or live.all())
    assert_close_f32(np.asarray(ours)[live], np.asarray(theirs)[live], reduction=REDUCTION)
    assert np.all(np.asarray(ours)[~live] == 0.0)


# --- chunked == xla, padding, causal ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "window,causal,chunks",
    [
        _numerics((2, 3), False, (4, 3)),
        _numerics((1, 1), True, (2, 5)),
        ((7, 0), False, (3, 2)),
        ((0, 9), False, (9, 13)),
    ],
)
def test_chunked_equals_xla_with_padding_mask_and_bias(rng, window, causal, chunks):
    q, k, v, mask, bias, g = _case(rng)
    lengths = dict(query_lengths=Q_LENGTHS[:, None], key_lengths=K_LENGTHS[:, None])  # [B, 1]: head-shared

    def run(implementation):
        fn = functools.partial(
            dot_product_attention,
            causal=causal,
            local_window=window,
            implementation=implementation,
            **lengths,
        )
        if implementation == "chunked":  # small blocks, through the public chunked function's sizes
            fn = functools.partial(
                chunked_dot_product_attention, causal=causal, local_window=window, query_chunk=chunks[0]
            )
            fn = functools.partial(fn, key_chunk=chunks[1])
            padding = jnp.asarray(
                _allowed_ref(T, S, (T + S, T + S), q_lengths=Q_LENGTHS, k_lengths=K_LENGTHS)
            )
            return _value_and_grads(lambda q, k, v, b: fn(q, k, v, mask & padding, bias=b), q, k, v, bias, g)
        return _value_and_grads(lambda q, k, v, b: fn(q, k, v, mask, bias=b), q, k, v, bias, g)

    out_xla, grads_xla = run("xla")
    out_chunked, grads_chunked = run("chunked")
    assert_close_f32(out_chunked, out_xla, reduction=REDUCTION)
    # gradients add the backward's sums over T (dK, dV) and S (dQ) to the forward's chain
    assert_close_f32(grads_chunked, grads_xla, reduction=REDUCTION + T + S)
    # dot_product_attention(implementation="chunked") takes the lengths itself: the same function
    out_lengths = dot_product_attention(
        q, k, v, mask, bias=bias, causal=causal, local_window=window, implementation="chunked", **lengths
    )
    assert_close_f32(out_lengths, out_xla, reduction=REDUCTION)
    allowed = _allowed_ref(T, S, window, causal=causal, mask=mask, q_lengths=Q_LENGTHS, k_lengths=K_LENGTHS)
    out_ref, _ = dot_attention_ref(q, k, v, allowed, bias)
    assert _rel_err(out_xla, out_ref) < 1e-5


@pytest.mark.numerics
@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_causal_window_is_causal_and_local(rng, implementation):
    """Causal with window ``left``: output ``t`` depends on inputs ``t - left .. t`` only (checked with a
    gradient), and it equals the non-causal window ``(left, 0)``."""
    left = 2
    x = _normal(rng, (T, K))

    def attend(x, **kw):
        return dot_product_attention(x, x, x, implementation=implementation, **kw)

    causal = attend(x, causal=True, local_window=left)
    assert_close_f32(causal, attend(x, local_window=(left, 0)), reduction=REDUCTION)
    for t in range(T):
        jac = jax.grad(lambda x, t=t: attend(x, causal=True, local_window=left)[t].sum())(x)
        reads = np.abs(np.asarray(jac)).sum(-1) > 0
        np.testing.assert_array_equal(reads, (np.arange(T) <= t) & (np.arange(T) >= t - left), err_msg=str(t))


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_content_outside_every_window_cannot_leak(rng, implementation):
    """Keys no window reaches (``j >= T + right``) and queries whose window is empty (``i >= S + left``) may
    hold NaN: the same outputs, exact zeros for the dead queries, finite gradients, exactly 0 on those rows."""
    t, s, window = 8, 12, (1, 2)  # keys 10, 11 are in no window; with S < T the other way round below
    q, k, v = _normal(rng, (2, t, 4)), _normal(rng, (2, s, 4)), _normal(rng, (2, s, 3))
    f = jax.jit(
        lambda q, k, v: dot_product_attention(q, k, v, local_window=window, implementation=implementation)
    )
    clean = f(q, k, v)
    dirty_k, dirty_v = k.copy(), v.copy()
    dirty_k[:, t + window[1] :] = np.nan
    dirty_v[:, t + window[1] :] = np.inf
    np.testing.assert_array_equal(f(q, dirty_k, dirty_v), clean)  # same program, unread rows: bitwise
    grads = jax.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2))(q, dirty_k, dirty_v)
    assert all(np.all(np.isfinite(np.asarray(x))) for x in grads)
    assert np.all(np.asarray(grads[1])[:, t + window[1] :] == 0.0)
    # queries past the last window: S=3 keys, left=1 -> queries 4.. see nothing
    q2 = q.copy()
    q2[:, 4:] = np.nan
    out = jax.jit(
        lambda q, k, v: dot_product_attention(q, k, v, local_window=(1, 0), implementation=implementation)
    )(q2, k[:, :3], v[:, :3])
    assert np.all(np.isfinite(np.asarray(out))) and np.all(np.asarray(out)[:, 4:] == 0.0)


@pytest.mark.numerics
def test_window_wider_than_the_sequences_changes_nothing(rng):
    q, k, v, mask, bias, _ = _case(rng)
    for impl in ("xla", "chunked"):
        plain = dot_product_attention(q, k, v, mask, bias=bias, implementation=impl)
        wide = dot_product_attention(q, k, v, mask, bias=bias, implementation=impl, local_window=(T, S))
        assert_close_f32(wide, plain, reduction=REDUCTION)


# --- property: random windows, lengths and causal -----------------------------------------------------------

# (T, S, query_chunk, key_chunk): fixed shape families so hypothesis varies windows, lengths and values.
FAMILIES = [(9, 13, 4, 3), (11, 5, 3, 2), (6, 6, 6, 6), (1, 7, 1, 4)]


@st.composite
def window_cases(draw):
    t, s, bq, bk = draw(st.sampled_from(FAMILIES))
    window = (draw(st.integers(0, 8)), draw(st.integers(0, 8)))
    if draw(st.booleans()):
        window = window[0]  # the int form: (w, w)
    causal = draw(st.booleans())
    q_lengths = np.array(draw(st.lists(st.integers(0, t), min_size=2, max_size=2)))
    k_lengths = np.array(draw(st.lists(st.integers(0, s), min_size=2, max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    q, k, v = _normal(rng, (2, 1, t, 3), 2.0), _normal(rng, (2, 1, s, 3)), _normal(rng, (2, 1, s, 2))
    return (q, k, v), dict(
        window=window, causal=causal, q_lengths=q_lengths, k_lengths=k_lengths, chunks=(bq, bk)
    )


@pytest.mark.numerics
@given(window_cases())
@settings(max_examples=8, deadline=None)  # each example compiles both paths anew (~1 s each): 8 keep it ~15 s
def test_property_every_implementation_matches_reference(case):
    (q, k, v), kw = case
    t, s = q.shape[-2], k.shape[-2]
    common = dict(
        causal=kw["causal"],
        local_window=kw["window"],
        query_lengths=kw["q_lengths"][:, None],
        key_lengths=kw["k_lengths"][:, None],
    )
    allowed = _allowed_ref(
        t, s, kw["window"], causal=kw["causal"], q_lengths=kw["q_lengths"], k_lengths=kw["k_lengths"]
    )
    ref, _ = dot_attention_ref(q, k, v, allowed)
    xla = dot_product_attention(q, k, v, implementation="xla", **common)
    # the chunked kernel with small blocks (odd splits, padded tails) and the padding as a mask
    bq, bk = kw["chunks"]
    chunked = chunked_dot_product_attention(
        q,
        k,
        v,
        jnp.asarray(_allowed_ref(t, s, (t + s, t + s), q_lengths=kw["q_lengths"], k_lengths=kw["k_lengths"])),
        causal=kw["causal"],
        local_window=kw["window"],
        query_chunk=bq,
        key_chunk=bk,
    )
    for name, out in (("xla", xla), ("chunked", chunked)):
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=name)  # O(1) outputs, float32
        dead = ~np.broadcast_to(allowed, out.shape[:-1] + (s,)).any(-1)
        assert np.all(np.asarray(out)[dead] == 0.0), name


# --- the chunked kernel skips the blocks outside the window (counted, not timed) ------------------------------


def _visited_blocks(monkeypatch, fn, *args):
    """The ``(query block, key block)`` pairs whose logits the kernel computes when ``fn(*args)`` runs, in order:
    every call of the kernel's block function reports its indices through ``jax.debug.callback`` at run time."""
    visited = []
    block_logits = chunked_module._block_logits

    def counting(cfg, q_i, k_j, mask, bias, i, j):
        jax.debug.callback(lambda i, j: visited.append((int(i), int(j))), i, j)
        return block_logits(cfg, q_i, k_j, mask, bias, i, j)

    monkeypatch.setattr(chunked_module, "_block_logits", counting)
    jax.block_until_ready(fn(*args))
    jax.effects_barrier()
    monkeypatch.setattr(chunked_module, "_block_logits", block_logits)
    return visited


def _needed_blocks(t, s, bq, bk, left, right, causal):
    """Blocks holding at least one (row, col) pair of the window (and causal), over the padded block grid."""
    nq, nk = -(-t // bq), -(-s // bk)
    return {
        (i, j)
        for i in range(nq)
        for j in range(nk)
        if any(
            r - left <= c <= r + right and (c <= r or not causal)
            for r in range(i * bq, (i + 1) * bq)
            for c in range(j * bk, (j + 1) * bk)
        )
    }


@pytest.mark.parametrize(
    "t,s,chunks,window,causal",
    [
        (64, 64, (8, 8), (8, 8), False),
        (64, 64, (8, 8), (16, 0), True),
        (30, 45, (4, 7), (3, 11), False),
        (45, 30, (7, 4), (0, 2), False),  # queries past S + left see no block at all
        (20, 20, (3, 5), (2, 2), True),
    ],
)
def test_chunked_visits_only_blocks_that_meet_a_window(rng, monkeypatch, t, s, chunks, window, causal):
    """Forward and backward each compute exactly the blocks that hold a pair of the window: none needed is
    skipped, none outside is computed, each once; the count falls with the window."""
    q, k, v = _normal(rng, (t, 4)), _normal(rng, (s, 4)), _normal(rng, (s, 3))
    bq, bk = chunks

    def attention(q, k, v, window):
        return chunked_dot_product_attention(
            q, k, v, causal=causal, local_window=window, query_chunk=bq, key_chunk=bk
        )

    fwd = jax.jit(functools.partial(attention, window=window))
    both = jax.jit(jax.grad(lambda q, k, v: fwd(q, k, v).sum(), argnums=(0, 1, 2)))
    forward = _visited_blocks(monkeypatch, fwd, q, k, v)
    forward_and_backward = _visited_blocks(monkeypatch, both, q, k, v)
    needed = _needed_blocks(t, s, bq, bk, *window, causal)
    total = -(-t // bq) * -(-s // bk)
    assert len(forward) == len(set(forward)) == len(needed) < total / 2
    assert set(forward) == needed
    backward = list(forward_and_backward)
    for block in forward:  # the backward pass recomputes each block once more
        backward.remove(block)
    assert sorted(backward) == sorted(forward)
    # without the window the same kernel computes every block (or every causal one)
    no_window = _visited_blocks(monkeypatch, jax.jit(functools.partial(attention, window=None)), q, k, v)
    assert len(no_window) == len(_needed_blocks(t, s, bq, bk, t + s, t + s, causal)) > len(forward)


# --- cuDNN: the window as cuDNN's sliding window, or in the dense mask ------------------------------------------


def _stand_in(monkeypatch, calls):
    """jax.nn's cuDNN call replaced by its XLA implementation (same arguments), a fake Hopper device reported."""
    real = jax.nn.dot_product_attention

    def stand_in(query, key, value, bias=None, mask=None, *, implementation=None, **kw):
        calls.append(dict(implementation=implementation, mask=mask, **kw))
        return real(query, key, value, bias, mask, implementation="xla", **kw)

    monkeypatch.setattr(jax.nn, "dot_product_attention", stand_in)
    monkeypatch.setattr(cudnn_module, "_cuda_device", lambda: types.SimpleNamespace(compute_capability="9.0"))


@pytest.mark.parametrize(
    "window,causal,sliding",
    [((3, 0), False, True), ((3, 5), True, True), (2, True, True), ((3, 2), False, False)],
)
def test_cudnn_branch_gets_the_sliding_window(rng, monkeypatch, window, causal, sliding):
    calls = []
    _stand_in(monkeypatch, calls)
    t, s, width = 6, 10, 8
    q, k, v = (jnp.asarray(_normal(rng, (B, H, n, width)), jnp.bfloat16) for n in (t, s, s))
    lengths = dict(query_lengths=np.array([6, 3, 5])[:, None], key_lengths=np.array([10, 5, 1])[:, None])
    kw = dict(causal=causal, local_window=window, **lengths)
    out = dot_product_attention(q, k, v, implementation="cudnn", **kw)
    ref = dot_product_attention(q, k, v, implementation="xla", **kw)
    (call,) = calls
    left = window if isinstance(window, int) else window[0]
    if sliding:  # cuDNN's own window: left keys back to the query itself, with its causal mask types
        assert call["local_window_size"] == (left, 0) and call["is_causal"] and call["mask"] is None
    else:  # a window reaching right of a non-causal query: ANDed into the dense mask
        assert (
            call["local_window_size"] is None and not call["is_causal"] and call["mask"].shape == (1, 1, t, s)
        )
    assert call["query_seq_lengths"] is not None  # the padding still travels as lengths
    # jax.nn rounds the weights to bf16 before multiplying the values (2^-9 relative), ours keeps float32
    # until the end: a few bf16 ulps of max|ref| (tests/test_chunked_attention.py's bound).
    assert _rel_err(np.asarray(out, np.float32), np.asarray(ref, np.float32)) < 2e-2
    allowed = _allowed_ref(
        t, s, window, causal=causal, q_lengths=np.array([6, 3, 5]), k_lengths=np.array([10, 5, 1])
    )
    dead = ~np.broadcast_to(allowed, (B, H, t, s)).any(-1)
    assert dead.any() and np.all(np.asarray(out, np.float32)[dead] == 0.0)  # jax.nn alone averages the values
    # None picks cuDNN for the windows it carries, and says why not for the others
    choice, reason = dot_product_implementation(q, k, v, causal=causal, local_window=window, **lengths)
    if sliding:
        assert (choice, reason) == ("cudnn", None)
    else:
        assert choice == "xla" and "sliding window has no right side" in reason


@pytest.mark.gpu
def test_cudnn_sliding_window_matches_xla_on_gpu(rng):
    t, s, width = 64, 96, 64
    q, k, v = (jnp.asarray(_normal(rng, (B, H, n, width)), jnp.bfloat16) for n in (t, s, s))
    for window, causal in (((5, 0), False), ((7, 3), True), ((4, 4), False)):
        kw = dict(causal=causal, local_window=window, key_lengths=np.array([96, 40, 3])[:, None])
        out = dot_product_attention(q, k, v, implementation="cudnn", **kw)
        ref = dot_product_attention(q, k, v, implementation="xla", **kw)
        # bf16: cuDNN rounds P to bf16 inside its kernel (see the stand-in test)
        assert _rel_err(np.asarray(out, np.float32), np.asarray(ref, np.float32)) < 2e-2, (window, causal)


# --- the NNX module ---------------------------------------------------------------------------------------------


@pytest.mark.numerics
def test_module_option_is_the_function_option(rng):
    q, k, v, mask, _, _ = _case(rng)
    module = DotProductAttention(local_window=(2, 1))
    out, weights = module(q, k, v, mask, return_weights=True)
    want, want_w = dot_product_attention(q, k, v, mask, local_window=(2, 1), return_weights=True)
    assert_close_f32(out, want, reduction=REDUCTION)
    assert np.all(np.asarray(weights)[..., ~window_ref(T, S, 2, 1)] == 0.0)
    np.testing.assert_array_equal(np.asarray(weights) > 0, np.asarray(want_w) > 0)
    assert nnx.state(module) == nnx.State({})  # the window is static configuration, not a parameter
