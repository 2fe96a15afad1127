"""Positional encodings: sinusoidal (Vaswani), learned tables, rotary (RoFormer) — references and properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from attn_jax.attention._positional import (
    init_learned_positions,
    learned_positions,
    rotary_embedding,
    sinusoidal_positions,
)
from tests.reference.masks_dot import rope_ref, sinusoidal_ref
from tests.tolerance import assert_close_f32

# Odd/distinct sizes: B=3, H=2, L=7, D=10 (even: features come in pairs), K=6.
B, H, L, D, K = 3, 2, 7, 10, 6


# --- sinusoidal ---------------------------------------------------------------------------------------------


def test_sinusoidal_matches_reference(rng):
    # int form is computed in float64 NumPy: float32 rounding of the output is the only error
    np.testing.assert_allclose(sinusoidal_positions(50, D), sinusoidal_ref(50, D), rtol=0, atol=1e-7)
    # array form: float32 angles; pos <= 60 so |angle| <= 60 and its float32 rounding is <= 60 * 6e-8 ~ 4e-6
    pos = rng.integers(0, 60, size=(B, L))
    np.testing.assert_allclose(sinusoidal_positions(pos, D), sinusoidal_ref(pos, D), rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        sinusoidal_positions(9, 4, max_timescale=100.0), sinusoidal_ref(9, 4, 100.0), rtol=0, atol=1e-7
    )
    assert sinusoidal_positions(4, D, dtype=jnp.bfloat16).dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        jax.jit(sinusoidal_positions, static_argnums=1)(pos, D), sinusoidal_positions(pos, D)
    )


def test_sinusoidal_interleaved_layout():
    pe = np.asarray(sinusoidal_positions(3, D))
    np.testing.assert_allclose(pe[:, 0], np.sin(np.arange(3)), atol=1e-7)  # sin at even features...
    np.testing.assert_allclose(pe[:, 1], np.cos(np.arange(3)), atol=1e-7)  # ...cos at odd ones
    np.testing.assert_allclose(pe[2, 2], np.sin(2 / 10000 ** (2 / D)), atol=1e-7)


@given(st.integers(1, 40))
@settings(max_examples=10)
def test_sinusoidal_shift_is_a_fixed_rotation(k):
    """PE(pos + k) = M_k PE(pos): one matrix M_k (a 2x2 rotation per frequency) for every pos (Vaswani §3.5)."""
    n = 64
    pe = np.asarray(sinusoidal_positions(n + k, D), np.float64)
    omega = 10000.0 ** (-np.arange(0, D, 2) / D)
    m = np.zeros((D, D))
    for i, w in enumerate(omega):
        c, s = np.cos(k * w), np.sin(k * w)
        # sin(a + kw) = sin a cos kw + cos a sin kw; cos(a + kw) = cos a cos kw - sin a sin kw
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
    # one matrix for all 64 positions (float32 output rounding: atol 1e-6)
    np.testing.assert_allclose(pe[:n] @ m.T, pe[k:], atol=1e-6)
    # and it is not the identity or a permutation: the shift is visible
    assert np.abs(pe[k:] - pe[:n]).max() > 0.1


# --- learned ------------------------------------------------------------------------------------------------


def test_learned_positions(key, rng):
    table = init_learned_positions(key, 16, D)
    assert table.shape == (16, D) and table.dtype == jnp.float32
    rows = np.asarray(table)
    assert 0.015 < float(np.std(rows)) < 0.025  # N(0, 0.02^2) over 160 samples
    np.testing.assert_array_equal(learned_positions(table, L), rows[:L])
    pos = rng.integers(0, 16, size=(B, L))
    out = learned_positions(table, pos)
    for b in range(B):
        for i in range(L):
            np.testing.assert_array_equal(out[b, i], rows[pos[b, i]])
    np.testing.assert_array_equal(jax.jit(learned_positions)(table, pos), out)
    # under jit an out-of-range position cannot raise: it becomes NaN rather than silently reusing a row
    bad = jax.jit(learned_positions)(table, jnp.array([0, 16, -1]))
    assert np.all(np.isfinite(bad[0])) and np.all(np.isnan(bad[1:]))
    # gradients reach exactly the rows looked up
    g = jax.jit(jax.grad(lambda t: learned_positions(t, jnp.array([3, 3, 5])).sum()))(table)
    np.testing.assert_array_equal(
        np.asarray(g), np.broadcast_to(np.bincount([3, 3, 5], minlength=16)[:, None], (16, D))
    )


def test_learned_positions_errors(key):
    table = jnp.zeros((8, 4))
    with pytest.raises(ValueError, match=r"asked for 9 positions but the table \[8, 4\] has 8 rows"):
        learned_positions(table, 9)
    with pytest.raises(ValueError, match=r"positions range over \[0, 8\] but the table \[8, 4\] has 8 rows"):
        learned_positions(table, np.array([0, 8]))
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        init_learned_positions(key, 0, 4)


# --- rotary -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_matches_reference(rng, interleaved):
    x = rng.standard_normal((B, H, L, K)).astype(np.float32)
    pos = rng.integers(0, 50, size=(B, 1, L))  # broadcast over heads
    out = rotary_embedding(x, pos, interleaved=interleaved)
    # float32 angles up to 50 rad: rounding <= 50 * 6e-8 = 3e-6 in the angle, so 1e-5 on O(1) outputs
    np.testing.assert_allclose(out, rope_ref(x, pos, interleaved=interleaved), rtol=1e-5, atol=1e-5)
    default = rotary_embedding(x, interleaved=interleaved)  # positions 0..L-1
    np.testing.assert_allclose(default, rope_ref(x, interleaved=interleaved), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        rotary_embedding(x, base=100.0, interleaved=interleaved),
        rope_ref(x, base=100.0, interleaved=interleaved),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.numerics
def test_rope_conventions_differ_by_a_feature_permutation(rng):
    x = rng.standard_normal((L, K)).astype(np.float32)
    perm = np.concatenate([np.arange(0, K, 2), np.arange(1, K, 2)])  # interleaved -> half-split layout
    # two programs (the pairs sit in different lanes): each output is a two-term sum x_i cos − x_j sin
    assert_close_f32(
        rotary_embedding(x, interleaved=True)[:, perm],
        rotary_embedding(x[:, perm], interleaved=False),
        reduction=2,
    )
    assert not np.allclose(rotary_embedding(x, interleaved=True), rotary_embedding(x, interleaved=False))


_rope = jax.jit(rotary_embedding, static_argnames="interleaved")


@given(
    st.integers(0, 200), st.integers(0, 200), st.integers(-100, 100), st.booleans(), st.integers(0, 2**31 - 1)
)
@settings(max_examples=20)
def test_rope_relative_position_property(m, n, shift, interleaved, seed):
    """<rope(q, m), rope(k, n)> depends only on m - n: shifting both positions changes nothing."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, K)).astype(np.float32)
    shift = max(shift, -min(m, n))

    def score(a, b):
        return float(
            jnp.sum(
                _rope(q, jnp.array([a]), interleaved=interleaved)
                * _rope(k, jnp.array([b]), interleaved=interleaved)
            )
        )

    # float32 angles up to 300 rad: rounding ~ 300 * 6e-8 = 2e-5 per angle; |q||k| <~ 10 -> atol 1e-3
    assert abs(score(m, n) - score(m + shift, n + shift)) < 1e-3
    # ...and it equals the float64 reference at the relative position alone: <rope(q, m-n), k>
    ref = float(np.sum(rope_ref(q, [m - n], interleaved=interleaved) * k))
    assert abs(score(m, n) - ref) < 1e-3


@pytest.mark.numerics
@given(st.integers(0, 2**31 - 1))
@settings(max_examples=10)
def test_rope_preserves_norms(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, L, K)).astype(np.float32)
    pos = rng.integers(0, 1000, size=(B, L))
    for interleaved in (True, False):
        out = _rope(x, pos, interleaved=interleaved)
        # a rotation of float32 pairs, then a norm over K: float32 rounding of two programs
        assert_close_f32(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), reduction=2 + K)


@pytest.mark.numerics
def test_rope_jit_and_vmap(rng):
    x = rng.standard_normal((B, L, K)).astype(np.float32)
    pos = rng.integers(0, 50, size=(B, L))
    assert_close_f32(_rope(x, pos, interleaved=True), rotary_embedding(x, pos), reduction=2)  # jit vs eager
    batched = jax.vmap(rotary_embedding)(x, pos)
    for b in range(B):
        assert_close_f32(batched[b], rotary_embedding(x[b], pos[b]), reduction=2)


def test_rope_grads_and_low_precision(rng):
    # Not in the `numerics` pass: no two-program comparison, and XLA cannot compile float16 conversions for a CPU
    # capped below F16C (--xla_cpu_max_isa=SSE4_2: "Symbols not found: __extendhfsf2").
    x = rng.standard_normal((B, L, K)).astype(np.float32)
    pos = rng.integers(0, 50, size=(B, L))
    check_grads(
        jax.jit(lambda x: rotary_embedding(x, pos)),
        (x,),
        order=2,
        modes=["rev"],
        eps=1e-3,
        atol=1e-2,
        rtol=1e-2,
    )
    # bf16/fp16 in, same dtype out; the rotation is float32, so the only error is the output rounding:
    # 2^-9 (bf16) and 2^-12 (fp16) relative, bounded by 1e-2 and 1e-3 of max|x|.
    for dtype, tol in [(jnp.bfloat16, 1e-2), (jnp.float16, 1e-3)]:
        xl = jnp.asarray(x, dtype)
        out = rotary_embedding(xl, pos)
        assert out.dtype == dtype
        ref = rope_ref(np.asarray(xl, np.float64), pos)
        assert np.abs(np.asarray(out, np.float64) - ref).max() <= tol * np.abs(ref).max()


# --- errors -------------------------------------------------------------------------------------------------


def test_positional_errors(rng):
    with pytest.raises(ValueError, match="features must be a positive even int"):
        sinusoidal_positions(5, 7)
    with pytest.raises(ValueError, match="K must be a positive even int"):
        rotary_embedding(jnp.ones((L, 5)))
    with pytest.raises(
        ValueError, match=r"positions \[3, 4\] must broadcast to x's leading axes \[3, 2, 7\]"
    ):
        rotary_embedding(jnp.ones((B, H, L, K)), jnp.zeros((B, 4), jnp.int32))
    with pytest.raises(
        ValueError, match=r"positions \[1, 3, 7\] must broadcast to x's leading axes \[3, 7\]"
    ):
        rotary_embedding(jnp.ones((B, L, K)), jnp.zeros((1, B, L), jnp.int32))
    with pytest.raises(ValueError, match="x must be floating point"):
        rotary_embedding(jnp.ones((L, K), jnp.int32))
