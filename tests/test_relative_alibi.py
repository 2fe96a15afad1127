"""ALiBi (Press et al. 2022) and Shaw et al. (2018) relative positions: float64 references, gradients, errors.

The model-level checks (the Transformer against its float64 reference, causality, cached decoding == teacher
forcing, beam search) run as the ``post-alibi-tied`` and ``pre-relative-gqa-untied`` variants of
tests/test_transformer.py.

Distinct sizes: B=3, H=4, G=2, T=5, S=7, K=6, k=2 (< S - 1, so the clipping matters).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_jax.attention import (
    alibi_bias,
    alibi_slopes,
    init_relative_embeddings,
    relative_attention,
    relative_position_index,
)
from tests.reference.positions import (
    alibi_bias_ref,
    alibi_slopes_ref,
    relative_attention_ref,
    relative_index_ref,
)
from tests.tolerance import assert_close_f32

B, H, G, T, S, K, KMAX = 3, 4, 2, 5, 7, 6, 2


# --- ALiBi --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 32])
def test_alibi_slopes_match_the_papers_code(heads):
    ours = alibi_slopes(heads)
    assert ours.dtype == np.float64 and ours.shape == (heads,)
    # the repo multiplies start·start^i (a few float64 roundings); ours takes each power of 2 directly
    np.testing.assert_allclose(ours, alibi_slopes_ref(heads), rtol=1e-13, atol=0)
    # every slope is distinct and in (0, 1): each head decays at its own rate
    assert len(set(ours.tolist())) == heads and np.all((ours > 0) & (ours < 1))


def test_alibi_slopes_are_the_papers_geometric_sequence():
    # Press et al. §3: for 8 heads 1/2, 1/4, ..., 1/256; the first term and the ratio are 2^(-8/H)
    np.testing.assert_array_equal(alibi_slopes(8), [2.0**-i for i in range(1, 9)])
    for heads in (4, 16, 64):
        ratio = alibi_slopes(heads)[1:] / alibi_slopes(heads)[:-1]
        np.testing.assert_allclose(ratio, 2 ** (-8 / heads), rtol=1e-14)
        assert alibi_slopes(heads)[0] == pytest.approx(2 ** (-8 / heads), rel=1e-15)
    # 6 heads: the 4-head sequence, then the 8-head sequence's 1st and 3rd terms (2^-1, 2^-3)
    np.testing.assert_array_equal(alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])


def test_alibi_bias_matches_reference_and_teacher_forcing_equals_a_step():
    slopes = alibi_slopes(H)
    bias = alibi_bias(slopes, jnp.arange(T), jnp.arange(S))
    assert bias.dtype == jnp.float32 and bias.shape == (H, T, S)
    # integer distances times a power of 2: exact in float32
    np.testing.assert_array_equal(bias, alibi_bias_ref(alibi_slopes_ref(H), T, S))
    # one query at position t per batch row over S keys: teacher forcing's row t, bit for bit
    t = jnp.asarray([0, 3, 4])
    step = alibi_bias(slopes, t[:, None], jnp.arange(S)[None, :])  # [B, H, 1, S]
    assert step.shape == (B, H, 1, S)
    for b in range(B):
        np.testing.assert_array_equal(step[b, :, 0], bias[:, int(t[b])])


def test_alibi_errors_are_one_line():
    for call, message in [
        (lambda: alibi_slopes(0), "num_heads must be a positive int"),
        (lambda: alibi_slopes(2.0), "num_heads must be a positive int"),
        (lambda: alibi_bias(np.ones((2, 2)), jnp.arange(3), jnp.arange(3)), r"slopes must be \[H\]"),
        (lambda: alibi_bias(np.ones(2), jnp.arange(3.0), jnp.arange(3)), "query_positions must be integer"),
        (lambda: alibi_bias(np.ones(2), jnp.asarray(3), jnp.arange(3)), "query_positions"),
    ]:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)


# --- Shaw et al. relative positions ---------------------------------------------------------------------------


def test_relative_index_matches_reference():
    idx = relative_position_index(jnp.arange(T), jnp.arange(S), KMAX)
    assert idx.dtype == jnp.int32 and idx.shape == (T, S)
    ref = [[relative_index_ref(i, j, KMAX) for j in range(S)] for i in range(T)]
    np.testing.assert_array_equal(idx, ref)
    assert int(idx.min()) == 0 and int(idx.max()) == 2 * KMAX  # both clipped edges are reached


def _inputs(rng, groups=H):
    q = rng.standard_normal((B, H, T, K))
    k = rng.standard_normal((B, groups, S, K))
    v = rng.standard_normal((B, groups, S, K))
    rel_k = rng.standard_normal((2 * KMAX + 1, K))
    rel_v = rng.standard_normal((2 * KMAX + 1, K))
    lengths = np.array([7, 3, 0])  # a full row, a padded row, a fully masked row
    mask = np.broadcast_to((np.arange(S)[None, :] < lengths[:, None])[:, None, None, :], (B, H, T, S))
    return q, k, v, rel_k, rel_v, mask


def _reference(q, k, v, rel_k, rel_v, mask):
    """Float64 ``(context [B, H, T, K], weights [B, H, T, S])``; query head h reads key head h // (H / G)."""
    repeats = H // k.shape[1]
    z, w = np.zeros((B, H, T, K)), np.zeros((B, H, T, S))
    for b in range(B):
        for h in range(H):
            g = h // repeats
            z[b, h], w[b, h] = relative_attention_ref(
                q[b, h], k[b, g], v[b, g], mask[b, h], rel_k, rel_v, KMAX
            )
    return z, w


@pytest.mark.parametrize("groups", [H, G])
def test_relative_attention_matches_float64_reference(rng, groups):
    q, k, v, rel_k, rel_v, mask = _inputs(rng, groups)
    idx = relative_position_index(jnp.arange(T), jnp.arange(S), KMAX)
    f32 = [jnp.asarray(x, jnp.float32) for x in (q, k, v, rel_k, rel_v)]
    ctx, weights = relative_attention(
        *f32[:3], jnp.asarray(mask), *f32[3:], idx, num_kv_heads=None if groups == H else groups
    )
    ref_ctx, ref_w = _reference(q, k, v, rel_k, rel_v, mask)
    assert ctx.dtype == jnp.float32 and ctx.shape == (B, H, T, K)
    np.testing.assert_allclose(ctx, ref_ctx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights, ref_w, rtol=0, atol=1e-6)
    # the fully masked row: zero weights and a zero context (no relative value term sneaks in)
    np.testing.assert_array_equal(ctx[2], 0.0)
    # the tables matter: without them the result moves by O(1)
    plain, _ = relative_attention(*f32[:3], jnp.asarray(mask), 0 * f32[3], 0 * f32[4], idx,
                                  num_kv_heads=None if groups == H else groups)  # fmt: skip
    assert float(jnp.max(jnp.abs(plain - ctx))) > 0.1


def test_relative_attention_gradients_match_float64_reference(rng):
    """Directional derivatives of ``Σ ctx·w_out`` against central differences of the float64 reference."""
    q, k, v, rel_k, rel_v, mask = _inputs(rng)
    mask = mask.copy()
    mask[2] = True  # every row real, so the derivative involves every entry
    idx = relative_position_index(jnp.arange(T), jnp.arange(S), KMAX)
    w_out = rng.standard_normal((B, H, T, K))
    args = (q, k, v, rel_k, rel_v)

    def loss(*xs):
        ctx, _ = relative_attention(*xs[:3], jnp.asarray(mask), *xs[3:], idx)
        return jnp.sum(ctx * w_out)

    grads = jax.grad(loss, argnums=(0, 1, 2, 3, 4))(*(jnp.asarray(x, jnp.float32) for x in args))
    eps = 1e-6
    for n, (x, grad) in enumerate(zip(args, grads, strict=True)):
        direction = rng.standard_normal(x.shape)
        plus, minus = list(args), list(args)
        plus[n], minus[n] = x + eps * direction, x - eps * direction
        f_plus = np.sum(_reference(*plus, mask)[0] * w_out)
        f_minus = np.sum(_reference(*minus, mask)[0] * w_out)
        fd = (f_plus - f_minus) / (2 * eps)  # float64: error ~eps² + 1e-16/eps, ~1e-10
        ours = float(np.sum(np.asarray(grad, np.float64) * direction))
        assert abs(ours - fd) <= 1e-4 * max(1.0, abs(fd)), (n, ours, fd)
        assert abs(fd) > 1e-2  # the direction actually moves the output


@pytest.mark.numerics
def test_relative_step_equals_teacher_forcing(rng):
    """One query at position t over keys 0..S-1 reads teacher forcing's row t (the cached decoder's case)."""
    q, k, v, rel_k, rel_v, mask = (jnp.asarray(x, jnp.float32) for x in _inputs(rng))
    full_idx = relative_position_index(jnp.arange(T), jnp.arange(S), KMAX)
    full, _ = relative_attention(q, k, v, None, rel_k, rel_v, full_idx)
    t = jnp.asarray([4, 0, 2])
    step_idx = relative_position_index(t[:, None], jnp.arange(S)[None, :], KMAX)  # [B, 1, S]
    np.testing.assert_array_equal(step_idx[:, 0], full_idx[t])
    q_t = q[jnp.arange(B), :, t][:, :, None]  # [B, H, 1, K]
    step, _ = relative_attention(q_t, k, v, None, rel_k, rel_v, step_idx)
    # a [1, S] vs a [T, S] logits block: two float32 programs (reductions over K, S and S)
    assert_close_f32(step[:, :, 0], full[jnp.arange(B), :, t], reduction=K + 2 * S)


def test_init_relative_embeddings_scale():
    table = init_relative_embeddings(jax.random.key(0), 50, 64)
    assert table.shape == (101, 64) and table.dtype == jnp.float32
    assert abs(float(jnp.std(table)) * 8 - 1) < 0.05  # N(0, 1/K): std 1/8
    assert init_relative_embeddings(jax.random.key(0), 1, 4, dtype=jnp.bfloat16).dtype == jnp.bfloat16


def test_relative_errors_are_one_line():
    q = jnp.ones((1, 2, 3, 4))
    table, idx = jnp.zeros((5, 4)), relative_position_index(jnp.arange(3), jnp.arange(3), 2)
    for call, message in [
        (lambda: relative_position_index(jnp.arange(3), jnp.arange(3), 0), "max_distance must be a positive"),
        (lambda: relative_position_index(jnp.arange(3), jnp.arange(3.0), 2), "key_positions must be integer"),
        (lambda: init_relative_embeddings(jax.random.key(0), 2, 0), "features must be a positive int"),
        (lambda: relative_attention(q, q, q, None, jnp.zeros((4, 4)), table, idx), r"relative_keys must be"),
        (
            lambda: relative_attention(q, q, q, None, table, jnp.zeros((5, 3)), idx),
            r"relative_values must be",
        ),
        (lambda: relative_attention(q, q, q, None, table, table, idx[:2]), "index has shape"),
    ]:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)
