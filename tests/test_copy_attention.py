"""The pointer-generator mixture (See, Liu & Manning 2017, eq. 9): ``attn_jax.copy_mass`` and
``attn_jax.pointer_generator_log_probs`` against float64 loop references (tests/reference/copy.py), values and
gradients, and its properties (rows sum to 1, padding is never read, ``p_gen = 1`` is ``log_softmax``)."""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import attn_jax
from tests.reference.copy import pointer_generator_ref
from tests.reference.scorers import rel_err
from tests.tolerance import assert_close_f32

# Odd, distinct sizes: a swapped axis changes a shape or a sum and fails.
B, T, S, V, N_OOV = 3, 5, 7, 11, 4
E = V + N_OOV
SRC_LENGTHS = np.array([7, 4, 0])  # full, padded, and a sentence with no real source word
NEG = float(np.finfo(np.float32).min)


def _case(seed=0):
    """Logits, masked softmax weights, extended source ids (repeats, in-vocabulary words and OOV words) and gate
    logits; ``[B, T, ...]`` except the ids and mask, ``[B, 1, S]`` (one row per sentence)."""
    rng = np.random.default_rng(seed)
    logits = (2.0 * rng.normal(size=(B, T, V))).astype(np.float32)
    mask = (np.arange(S) < SRC_LENGTHS[:, None])[:, None, :]  # [B, 1, S]
    scores = rng.normal(size=(B, T, S))
    w = np.where(mask, np.exp(scores), 0.0)
    w = (w / np.maximum(w.sum(-1, keepdims=True), 1e-30)).astype(np.float32)
    ids = rng.integers(0, E, size=(B, 1, S))
    ids[0, 0, :3] = [V + 1, 2, V + 1]  # an OOV word twice and a vocabulary word
    ids[1, 0, 4:] = E + 5  # padding may hold any id, even out of range
    ids = np.where(mask, ids, 0) if seed % 2 else ids
    gen = rng.normal(size=(B, T)).astype(np.float32)
    return logits, w, ids, gen, mask


def _ref(logits, w, ids, gen, mask):
    flat = lambda x, k: np.broadcast_to(x, (B, T, k)).reshape(B * T, k)  # noqa: E731
    out = pointer_generator_ref(
        flat(logits, V), flat(w, S), flat(ids, S), np.reshape(gen, -1), E, flat(mask, S)
    )
    return out.reshape(B, T, E)


_log_probs = jax.jit(attn_jax.pointer_generator_log_probs, static_argnames="extended_size")


def test_log_probs_match_float64_reference():
    logits, w, ids, gen, mask = _case()
    got = np.asarray(attn_jax.pointer_generator_log_probs(logits, w, ids, gen, E, mask))
    ref = _ref(logits, w, ids, gen, mask)
    possible = np.isfinite(ref)
    assert rel_err(got[possible], ref[possible]) < 1e-5
    np.testing.assert_array_equal(got[~possible], NEG)  # impossible words: finfo.min, never -inf or NaN
    assert (~possible).any() and possible[..., V:].any()  # the case has both kinds of extended slot
    # The copy term matters: without it the in-vocabulary source words are off by far more than rounding.
    no_copy = _ref(logits, w, ids, np.full_like(gen, 40.0), mask)
    assert rel_err(no_copy[..., :V], ref[..., :V]) > 1e-2


@pytest.mark.numerics
def test_padded_source_positions_are_never_read():
    logits, w, ids, gen, mask = _case(1)
    base = _log_probs(logits, w, ids, gen, extended_size=E, src_mask=mask)
    mask_b = np.broadcast_to(mask, w.shape)
    poisoned_w = np.where(mask_b, w, np.nan).astype(np.float32)
    poisoned_ids = np.where(mask, ids, E + 100)  # out of range at padding
    got = _log_probs(logits, poisoned_w, poisoned_ids, gen, extended_size=E, src_mask=mask)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(base))  # same program, same bits

    def objective(w_):
        out = attn_jax.pointer_generator_log_probs(logits, w_, poisoned_ids, gen, E, mask)
        return jnp.sum(jnp.where(out > NEG, out, 0.0))

    g = jax.jit(jax.grad(objective))(poisoned_w)
    assert bool(jnp.all(jnp.isfinite(g))) and not np.any(np.asarray(g)[~mask_b])
    # The sentence with no source word can only generate: the vocabulary part of the mixture, scaled by p_gen.
    want = jax.nn.log_sigmoid(gen[2])[:, None] + jax.nn.log_softmax(logits[2])
    assert_close_f32(np.asarray(base)[2, :, :V], want, reduction=V)
    np.testing.assert_array_equal(np.asarray(base)[2, :, V:], NEG)


def _directional(f64, x, d, h=1e-6):
    return (f64(x + h * d) - f64(x - h * d)) / (2 * h)


def test_gradients_match_float64_finite_differences():
    logits, w, ids, gen, mask = _case(2)
    ids = np.where(mask, ids, 0)
    w[0, 1, 1] = 0.0  # a vocabulary word (id 2) attended with weight exactly 0: its gradient must still flow
    ref = _ref(logits, w, ids, gen, mask)
    rng = np.random.default_rng(5)
    r = np.where(np.isfinite(ref), rng.normal(size=ref.shape), 0.0)  # impossible words excluded

    def objective(z, a, g):
        out = attn_jax.pointer_generator_log_probs(z, a, ids, g, E, mask)
        return jnp.sum(r * jnp.where(out > NEG, out, 0.0))

    grads = jax.jit(jax.grad(objective, argnums=(0, 1, 2)))(logits, w, gen)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in grads)
    z64, w64, g64 = (np.asarray(x, np.float64) for x in (logits, w, gen))

    def ref_obj(z, a, g):
        out = _ref(z, a, ids, g, mask)
        return float(np.sum(r * np.where(np.isfinite(out), out, 0.0)))

    fs = [lambda x: ref_obj(x, w64, g64), lambda x: ref_obj(z64, x, g64), lambda x: ref_obj(z64, w64, x)]
    live_w = np.broadcast_to(mask, w.shape)
    for f, x, got in zip(fs, (z64, w64, g64), grads, strict=True):
        for _ in range(3):
            d = rng.normal(size=x.shape)
            if x is w64:
                d = np.where(live_w, d, 0.0)  # the reference ignores padding: so must the direction
            want = _directional(f, x, d)
            np.testing.assert_allclose(float(np.sum(np.asarray(got, np.float64) * d)), want, rtol=1e-4)
    # The zero-weight vocabulary word: ∂/∂α = (1 − p_gen) / P(w), not 0.
    p_w = np.exp(ref[0, 1, 2])
    want = r[0, 1, 2] / (1.0 + np.exp(gen[0, 1])) / p_w
    others = [j for j in range(S) if ids[0, 0, j] == 2 and j != 1]  # none in this case: the term stands alone
    assert not others
    np.testing.assert_allclose(float(grads[1][0, 1, 1]), want, rtol=1e-4)


def test_log_space_keeps_unlikely_words():
    # P_vocab(word 1) = e^-200: in probability space it underflows to 0 and its log to -inf; here it stays.
    z = jnp.array([0.0, -200.0, 0.0])
    out = attn_jax.pointer_generator_log_probs(z, jnp.array([1.0]), jnp.array([3]), jnp.array(0.0), 4)
    np.testing.assert_allclose(float(out[1]), np.log(0.5) - 200.0 - np.log1p(np.exp(-200.0) + 1.0), rtol=1e-6)
    # p_gen near 1 from a large gate logit: log(1 − p_gen) without cancellation.
    out = attn_jax.pointer_generator_log_probs(z, jnp.array([1.0]), jnp.array([3]), jnp.array(30.0), 4)
    np.testing.assert_allclose(float(out[3]), -30.0 - np.log1p(np.exp(-30.0)), rtol=1e-6)


@st.composite
def _rows(draw):
    n, v = draw(st.integers(1, 4)), draw(st.integers(2, 9))
    s, n_oov = draw(st.integers(1, 6)), draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    logits = (3.0 * rng.normal(size=(n, v))).astype(np.float32)
    lengths = rng.integers(1, s + 1, size=n)
    mask = np.arange(s) < lengths[:, None]
    w = np.where(mask, rng.exponential(size=(n, s)), 0.0)
    w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    ids = rng.integers(0, v + n_oov, size=(n, s))
    gen = (2.0 * rng.normal(size=n)).astype(np.float32)
    return logits, w, ids, gen, mask, v + n_oov


@settings(max_examples=10)  # each example is new shapes: op-by-op compiles dominate (25 examples: 23 s)
@given(_rows())
def test_rows_sum_to_one_and_padding_is_irrelevant(case):
    logits, w, ids, gen, mask, e = case
    out = attn_jax.pointer_generator_log_probs(logits, w, ids, gen, e, mask)
    total = np.sum(np.exp(np.asarray(out, np.float64)), axis=-1)
    np.testing.assert_allclose(total, 1.0, rtol=1e-5)
    assert bool(jnp.all(out <= 0.0)) and not bool(jnp.any(jnp.isnan(out)))
    # Anything at padding (weight and id) changes nothing.
    noisy_w = np.where(mask, w, 123.0).astype(np.float32)
    noisy_ids = np.where(mask, ids, (ids + 1) % e)
    again = attn_jax.pointer_generator_log_probs(logits, noisy_w, noisy_ids, gen, e, mask)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(out))  # same ops on the same live inputs


@pytest.mark.numerics
@settings(max_examples=10)
@given(_rows())
def test_gate_extremes_are_the_two_pure_distributions(case):
    logits, w, ids, gen, mask, e = case
    v = logits.shape[-1]
    n = logits.shape[0]
    gen_only = attn_jax.pointer_generator_log_probs(logits, w, ids, np.full(n, np.inf, np.float32), e, mask)
    assert_close_f32(gen_only[:, :v], jax.nn.log_softmax(logits), reduction=v)
    np.testing.assert_array_equal(np.asarray(gen_only[:, v:]), NEG)
    copy_only = attn_jax.pointer_generator_log_probs(logits, w, ids, np.full(n, -np.inf, np.float32), e, mask)
    assert_close_f32(jnp.exp(copy_only), attn_jax.copy_mass(w, ids, e, mask), reduction=w.shape[-1])


def test_copy_mass_matches_loop_and_sums_repeats():
    logits, w, ids, gen, mask = _case()
    ids = np.where(mask, ids, 0)
    got = np.asarray(attn_jax.copy_mass(w, ids, E, mask))  # ids [B, 1, S] broadcast over T
    for b in range(B):
        for t in range(T):
            want = np.zeros(E)
            for j in range(S):
                if mask[b, 0, j]:
                    want[ids[b, 0, j]] += w[b, t, j]
            np.testing.assert_allclose(got[b, t], want, rtol=1e-5, atol=1e-6)  # float64 reference: house 1e-5
    assert np.sum(ids[0, 0] == V + 1) >= 2  # the loop above checked a word that occurs twice


@pytest.mark.numerics
def test_jit_and_vmap_agree_with_eager():
    logits, w, ids, gen, mask = _case(3)
    eager = attn_jax.pointer_generator_log_probs(logits, w, ids, gen, E, mask)
    jitted = _log_probs(logits, w, ids, gen, extended_size=E, src_mask=mask)
    assert_close_f32(jitted, eager, reduction=V + S)
    per_sentence = jax.vmap(lambda z, a, i, g, m: attn_jax.pointer_generator_log_probs(z, a, i, g, E, m))(
        logits, w, ids, gen, mask
    )
    assert_close_f32(per_sentence, eager, reduction=V + S)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda c: attn_jax.pointer_generator_log_probs(*c[:4], V - 1, c[4]),
            "extended_size must be an int >=",
        ),
        (
            lambda c: attn_jax.pointer_generator_log_probs(c[0], c[1], c[2], c[3][:, 0], E, c[4]),
            "leading axes",
        ),
        (
            lambda c: attn_jax.pointer_generator_log_probs(c[0], c[1], c[2] * 1.0, c[3], E, c[4]),
            "integer ids",
        ),
        (
            lambda c: attn_jax.pointer_generator_log_probs(c[0], c[1], c[2] + E, c[3], E, None),
            r"\[0, extended",
        ),
        (lambda c: attn_jax.copy_mass(c[1], c[2], E, c[4] * 1.0), "must be boolean"),
        (lambda c: attn_jax.copy_mass(c[1][:, :1], np.zeros((B, T, S), int), E), "widen"),
    ],
    ids=["small_extended", "gate_shape", "float_ids", "ids_range", "float_mask", "ids_widen"],
)
def test_bad_inputs_are_refused_with_the_shapes(call, match):
    logits, w, ids, gen, mask = _case()
    with pytest.raises(ValueError, match=match):
        call((logits, w, np.where(mask, ids, 0), gen, mask))
