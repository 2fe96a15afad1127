"""Beam search and greedy decoding (attn_jax.decoding).

Two kinds of model: a hand-set Markov "table" model whose next-word distribution (and attention) depends on the
previous word only, so every score can be computed by hand; and a small random RNNsearch (sizes as in
test_models_rnn: K_x=17, K_y=19, m=9, n=11, l=3, n'=13; S=7, sentence lengths 7, 4, 1) checked against a slow
float64 beam search written below hypothesis by hypothesis. Parameters are N(0, 0.5²) so distributions are peaked
(no near-ties), and the output bias of </s> is lowered by 3 so hypotheses grow long enough to hit the length limits.
"""

import doctest
import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_jax.decoding import (
    _beam,
    _penalties,
    beam_search,
    coverage_penalty,
    greedy_decode,
    length_penalty,
    normalized_score,
)
from attn_jax.models import EncoderOutput, RNNConfig, build_model
from tests.test_models_rnn import rnn_reduction
from tests.tolerance import assert_close_f32

PAD, BOS, EOS, A, B_ = 0, 1, 2, 3, 4  # the table model's vocabulary: <pad> <s> </s> a b
KX, KY, S = 17, 19, 7
LENGTHS = (7, 4, 1)
SIZES = dict(embed=9, hidden=11, maxout=3, align=13)
RATIO, OFFSET = 1.5, 2
LIMITS = [math.floor(RATIO * n) + OFFSET for n in LENGTHS]  # [12, 8, 3]
BEAM, NBEST, ALPHA, BETA = 3, 3, 0.6, 0.2
TINY = float(np.finfo(np.float32).tiny)
# Two float32 programs decoding the random RNNsearch (beam search's cached steps vs teacher forcing, greedy vs a loop
# of steps) are compared over its longest float32 summation chain, to the longest hypothesis.
DECODE_REDUCTION = rnn_reduction(S, max(LIMITS))

# ------------------------------------------------------------------------------------------ the table model

ENCODE_CALLS: list[tuple[int, ...]] = []  # src shapes seen by TableModel.encode while tracing
STEP_ROWS: list[int] = []  # batch rows seen by TableModel.decode_step while tracing


class TableState(NamedTuple):
    steps: jax.Array  # [B] int32, a batch-leading leaf (the distribution depends on the previous word only)


class TableModel(nnx.Module):
    """``P(y_t | y_<t) = probs[y_{t-1}]``, attention ``attention[y_{t-1}]`` renormalised over real source words."""

    def __init__(self, probs, attention=None):
        self.log_table = nnx.Param(jnp.log(jnp.asarray(probs, jnp.float32)))
        self.with_attention = attention is not None
        self.attn_table = nnx.Param(jnp.asarray(attention if attention is not None else [[0.0]], jnp.float32))

    def encode(self, src, src_mask):
        ENCODE_CALLS.append(tuple(src.shape))
        return EncoderOutput(memory=None, keys=None, mask=src_mask, summary=None)

    def init_decoder_state(self, enc):
        return TableState(steps=jnp.zeros(enc.mask.shape[:1], jnp.int32))

    def decode_step(self, enc, state, prev_tokens):
        STEP_ROWS.append(enc.mask.shape[0])
        logits = self.log_table[...][prev_tokens]  # [B, V]
        attn = None
        if self.with_attention:
            w = self.attn_table[...][prev_tokens] * enc.mask  # [B, S]
            attn = w / jnp.sum(w, axis=-1, keepdims=True)
        return logits, TableState(steps=state.steps + 1), attn


def table_probs(rows):
    """A ``[5, 5]`` table from ``{prev: {word: p}}``; unlisted entries get 1e-9 (never chosen)."""
    table = np.full((5, 5), 1e-9)
    for prev, dist in rows.items():
        for word, p in dist.items():
            table[prev, word] = p
    return table


# Greedy takes `a` (0.6), then `a` again (0.36 > 0.34 > 0.30 for </s>) forever; the best sentence is `b </s>`
# (0.4 · 0.9 = 0.36), against `a </s>` (0.6 · 0.3 = 0.18) and anything longer through `a` (≤ 0.6 · 0.36).
TRAP = table_probs(
    {
        BOS: {A: 0.6, B_: 0.4},
        A: {EOS: 0.30, A: 0.36, B_: 0.34},
        B_: {EOS: 0.9, A: 0.05, B_: 0.05},
    }
)
# Attention over S=3 source words, by previous word.
TRAP_ATTENTION = np.full((5, 3), 1.0 / 3)
TRAP_ATTENTION[BOS] = [0.5, 0.5, 0.0]
TRAP_ATTENTION[A] = [0.2, 0.3, 0.5]
TRAP_ATTENTION[B_] = [0.1, 0.1, 0.8]


def table_source(batch=2, width=3):
    return jnp.zeros((batch, width), jnp.int32), jnp.ones((batch, width), bool)


def test_beam_search_finds_the_best_sentence_that_greedy_misses():
    model = TableModel(TRAP)
    src, mask = table_source()
    greedy = greedy_decode(model, src, mask, max_length=4, max_length_ratio=None)
    beam = beam_search(
        model,
        src,
        mask,
        beam_size=2,
        num_return=2,
        max_length=4,
        max_length_ratio=None,
        length_penalty_alpha=0.0,
    )
    # Greedy never chooses </s> after `a`, so the limit forces it: a a a </s>.
    np.testing.assert_array_equal(greedy.tokens[:, 0], [[A, A, A, EOS]] * 2)
    np.testing.assert_allclose(greedy.log_probs[:, 0], np.log(0.6 * 0.36 * 0.36 * 0.30), rtol=1e-6)
    np.testing.assert_array_equal(beam.tokens[:, 0], [[B_, EOS, PAD, PAD]] * 2)
    # a </s> (0.18) ranks 3rd of the extensions at position 2, behind b </s> and a a: it never finishes;
    # a b </s> (0.6 · 0.34 · 0.9) is next.
    np.testing.assert_array_equal(beam.tokens[:, 1], [[A, B_, EOS, PAD]] * 2)
    np.testing.assert_array_equal(beam.lengths, [[2, 3]] * 2)
    np.testing.assert_allclose(beam.log_probs, np.log([[0.36, 0.6 * 0.34 * 0.9]] * 2), rtol=1e-6)
    np.testing.assert_allclose(beam.scores, beam.log_probs)  # α = β = 0: the raw log-probability
    assert greedy.attention is None and beam.attention is None


def test_penalty_functions_equal_hand_computed_values():
    np.testing.assert_allclose(
        length_penalty(jnp.array([1, 7, 13]), 0.6), [1.0, 2.0**0.6, 3.0**0.6], rtol=1e-6
    )
    assert float(length_penalty(40, 0.0)) == 1.0
    cov = jnp.array([[0.5, 2.0, 0.25, 9.0], [0.0, 1.0, 1.0, 1.0]])
    mask = jnp.array([[True, True, True, False], [True, True, True, True]])
    # Row 0: min(2, 1) contributes log 1 = 0 and the padded 9.0 nothing; row 1: a never-attended word is clipped.
    expected = [0.2 * (math.log(0.5) + math.log(0.25)), 0.2 * math.log(TINY)]
    np.testing.assert_allclose(coverage_penalty(cov, mask, 0.2), expected, rtol=1e-6)
    assert np.all(np.isfinite(coverage_penalty(cov, mask, 0.2)))
    np.testing.assert_array_equal(coverage_penalty(cov, mask, 0.0), [0.0, 0.0])
    score = normalized_score(jnp.float32(-3.0), 7, cov[0], mask[0], 0.6, 0.2)
    np.testing.assert_allclose(score, -3.0 / 2.0**0.6 + expected[0], rtol=1e-6)


def hand_score(p, rows, alpha=ALPHA, beta=BETA):
    """``log P / ((5 + |Y|) / 6)^α + β Σ_i log min(Σ_j α_ij, 1)`` in float64, ``rows`` the attention per token."""
    cov = np.sum(rows, axis=0)
    return math.log(p) / ((5 + len(rows)) / 6) ** alpha + beta * np.sum(
        np.log(np.clip(np.minimum(cov, 1.0), TINY, None))
    )


def test_beam_scores_apply_length_and_coverage_penalties_by_hand():
    model = TableModel(TRAP, TRAP_ATTENTION)
    src, mask = table_source()
    out = beam_search(
        model,
        src,
        mask,
        beam_size=2,
        num_return=2,
        max_length=4,
        max_length_ratio=None,
        length_penalty_alpha=ALPHA,
        coverage_penalty_beta=BETA,
    )
    b_rows = TRAP_ATTENTION[[BOS, B_]]  # b </s>: coverage [0.6, 0.6, 0.8], P = 0.4 · 0.9
    ab_rows = TRAP_ATTENTION[[BOS, A, B_]]  # a b </s>: coverage [0.8, 0.9, 1.3], P = 0.6 · 0.34 · 0.9
    np.testing.assert_array_equal(out.tokens[0], [[B_, EOS, PAD, PAD], [A, B_, EOS, PAD]])
    np.testing.assert_allclose(
        out.scores[0], [hand_score(0.36, b_rows), hand_score(0.6 * 0.34 * 0.9, ab_rows)], rtol=1e-6
    )
    np.testing.assert_allclose(out.log_probs[0], np.log([0.36, 0.6 * 0.34 * 0.9]), rtol=1e-6)
    np.testing.assert_allclose(out.attention[0, 0, :2], b_rows, rtol=1e-6)
    np.testing.assert_allclose(out.attention[0, 1, :3], ab_rows, rtol=1e-6)
    np.testing.assert_array_equal(out.attention[0, 0, 2:], 0.0)  # nothing after </s>


def test_length_normalisation_changes_the_winner():
    # a </s> (0.1) beats a a </s> (0.09) and a a a </s> (0.081) on raw probability; α = 2 prefers the longest.
    model = TableModel(table_probs({BOS: {A: 1.0}, A: {A: 0.9, EOS: 0.1}}))
    src, mask = table_source()
    kw = dict(beam_size=2, num_return=2, max_length=4, max_length_ratio=None)  # as above: no new compilation
    raw = beam_search(model, src, mask, length_penalty_alpha=0.0, **kw)
    assert raw.tokens[0, 0].tolist() == [A, EOS, PAD, PAD]
    np.testing.assert_allclose(raw.scores[0, 0], math.log(0.1), rtol=1e-6)
    long_ = beam_search(model, src, mask, length_penalty_alpha=2.0, **kw)
    assert long_.tokens[0, 0].tolist() == [A, A, A, EOS]
    np.testing.assert_allclose(long_.scores[0, 0], math.log(0.081) / (9 / 6) ** 2, rtol=1e-6)


def test_early_stop_never_cuts_off_a_longer_winner():
    # With α = 3 and 10 tokens allowed, a⁹ </s> (0.5 · 0.9⁸ · 0.1, lp = (15/6)³) beats b </s> (0.5, lp = (7/6)³).
    # After two positions b </s> is finished and `a a` (0.45) alive: a stop rule that bounded the alive score
    # with the current length instead of the limit would end the search there and return b </s>.
    model = TableModel(table_probs({BOS: {A: 0.5, B_: 0.5}, A: {A: 0.9, EOS: 0.1}, B_: {EOS: 1.0}}))
    src, mask = table_source()
    out = beam_search(
        model, src, mask, beam_size=2, max_length=10, max_length_ratio=None, length_penalty_alpha=3.0
    )
    assert out.tokens[0, 0].tolist() == [A] * 9 + [EOS]
    np.testing.assert_allclose(out.scores[0, 0], math.log(0.5 * 0.9**8 * 0.1) / (15 / 6) ** 3, rtol=1e-5)


def test_coverage_penalty_changes_the_winner():
    # b </s> (0.4) looks only at word 0; a a </s> (0.15) covers every word: β = 1 makes it win.
    probs = table_probs({BOS: {A: 0.6, B_: 0.4}, A: {A: 0.5, EOS: 0.5}, B_: {EOS: 1.0}})
    attention = np.full((5, 3), 1.0 / 3)
    attention[[BOS, B_]] = [1.0, 0.0, 0.0]
    attention[A] = [0.0, 0.5, 0.5]
    model = TableModel(probs, attention)
    src, mask = table_source()
    kw = dict(beam_size=2, num_return=2, max_length=4, max_length_ratio=None, length_penalty_alpha=0.0)
    assert beam_search(model, src, mask, **kw).tokens[0, 0].tolist() == [B_, EOS, PAD, PAD]
    covered = beam_search(model, src, mask, coverage_penalty_beta=1.0, **kw)
    assert covered.tokens[0, 0].tolist() == [A, A, EOS, PAD]
    np.testing.assert_allclose(covered.scores[0, 0], math.log(0.15), rtol=1e-6)  # coverage [1, 1, 1]: cp = 0
    # With padding the third word is not a word: a </s> (coverage [1, 1] after renormalising) now wins.
    padded = beam_search(model, src, mask.at[:, 2].set(False), coverage_penalty_beta=1.0, **kw)
    assert padded.tokens[0, 0].tolist() == [A, EOS, PAD, PAD]
    np.testing.assert_allclose(padded.scores[0, 0], math.log(0.3), rtol=1e-6)


def brute_force(tables, attentions, max_len, alpha, beta, nbest):
    """Every sentence over {a, b} of at most ``max_len`` tokens with </s>, scored in float64 (ensemble mean)."""
    hyps = []
    for n_words in range(max_len):
        for words in itertools.product([A, B_], repeat=n_words):
            y, prev = [*words, EOS], [BOS, *words]
            lp = np.mean([sum(math.log(t[p, w]) for p, w in zip(prev, y, strict=True)) for t in tables])
            rows = np.mean([a[prev] for a in attentions], axis=0)
            hyps.append((hand_score(math.exp(lp), rows, alpha, beta), lp, y, rows))
    return sorted(hyps, key=lambda h: -h[0])[:nbest]


def test_exhaustive_beam_and_ensemble_equal_brute_force():
    other = table_probs(
        {BOS: {A: 0.2, B_: 0.7, EOS: 0.1}, A: {EOS: 0.8, A: 0.1, B_: 0.1}, B_: {EOS: 0.5, A: 0.25, B_: 0.25}}
    )
    other_attention = np.roll(TRAP_ATTENTION, 1, axis=1)
    m1, m2 = TableModel(TRAP, TRAP_ATTENTION), TableModel(other, other_attention)
    src, mask = table_source()
    # K = 16 keeps every prefix over {a, b} alive and finishes every </s> extension (at most 12 extensions
    # per position before the last), so the search is exhaustive for L = 4.
    kw = dict(
        beam_size=16,
        num_return=8,
        max_length=4,
        max_length_ratio=None,
        length_penalty_alpha=ALPHA,
        coverage_penalty_beta=BETA,
    )
    for members in ([m1], [m1, m2]):
        out = beam_search(members, src, mask, **kw)
        tables = [TRAP, other][: len(members)]
        atts = [TRAP_ATTENTION, other_attention][: len(members)]
        for n, (score, lp, y, rows) in enumerate(brute_force(tables, atts, 4, ALPHA, BETA, 8)):
            assert out.tokens[1, n, : len(y)].tolist() == y
            np.testing.assert_allclose([out.scores[1, n], out.log_probs[1, n]], [score, lp], rtol=1e-5)
            np.testing.assert_allclose(out.attention[1, n, : len(y)], rows, rtol=1e-5)
    # Two copies of one model are that model.
    same, single = beam_search([m2, m2], src, mask, **kw), beam_search(m2, src, mask, **kw)
    np.testing.assert_array_equal(same.tokens, single.tokens)
    np.testing.assert_array_equal(same.lengths, single.lengths)
    # Two programs (the ensemble averages the members' probabilities): float32 rounding over 4 steps of V = 5 words
    # and S = 3 source words; exact zeros after </s> stay exact (an all-zero array must match exactly).
    for got, want in zip(same[2:], single[2:], strict=True):
        assert_close_f32(got, want, reduction=4 * (5 + 3))


def test_encoder_runs_once_per_sentence_and_search_compiles_once():
    model = TableModel(TRAP, TRAP_ATTENTION)
    src, mask = table_source(batch=3, width=3)
    ENCODE_CALLS.clear()
    STEP_ROWS.clear()
    before = _beam._TRACE_COUNT[0]
    first = beam_search(model, src, mask, beam_size=4, num_return=2, max_length=6)
    assert ENCODE_CALLS == [(3, 3)]  # once, on the B sentences, before tiling to B·K rows
    assert STEP_ROWS[0] == 3 and set(STEP_ROWS[1:]) == {12}  # the first step on B rows, the loop's on B·K
    # A new batch of the same shape, and new α, β, ratio, offset and parameter values: no retracing.
    beam_search(
        model,
        src + 1,
        mask.at[:, -1].set(False),
        beam_size=4,
        num_return=2,
        max_length=6,
        length_penalty_alpha=1.0,
        coverage_penalty_beta=0.5,
        max_length_ratio=1.0,
        max_length_offset=0,
    )
    beam_search(
        TableModel(TRAP * 0.5 + 0.1, TRAP_ATTENTION), src, mask, beam_size=4, num_return=2, max_length=6
    )
    assert _beam._TRACE_COUNT[0] == before + 1
    assert len(ENCODE_CALLS) == 1
    assert first.tokens.shape == (3, 2, 6)


def compiled_search_hlo(graphdef, state, src, mask, *, beam_size: int, length: int = 6) -> str:
    """The optimised HLO text of one model's beam search over ``src`` (α 0.6, β 0, limit ``length``)."""
    batch = src.shape[0]
    lowered = _beam._search_jit.lower(
        (graphdef,),
        (state,),
        src,
        mask,
        jnp.full((batch,), length, jnp.int32),
        jnp.float32(0.6),
        jnp.float32(0.0),
        beam_size=beam_size,
        num_return=1,
        length=length,
        bos_id=1,
        eos_id=2,
        pad_id=0,
    )
    return lowered.compile().as_text()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA:CPU's lowering of top_k")
def test_compiled_search_selects_with_topk_not_a_full_sort():
    """The per-step selection over the K·V extensions must compile to XLA's TopK kernel: when a second slice
    of top_k's output kept XLA from rewriting the sort behind it, every step sorted all K·V candidates of every
    sentence, most of the search's time. A structural check of the compiled program, not a timing."""
    cfg = RNNConfig(src_vocab=50, tgt_vocab=300, embed=8, hidden=8, maxout=4, align=8)
    graphdef, state = nnx.split(build_model(cfg, rngs=nnx.Rngs(0)))
    src, mask = jnp.ones((2, 5), jnp.int32), jnp.ones((2, 5), bool)
    hlo = compiled_search_hlo(graphdef, state, src, mask, beam_size=4)
    sorts = [line for line in hlo.splitlines() if " sort(" in line]
    assert not sorts, f"the search sorts instead of using TopK: {sorts[0].strip()[:200]}"
    assert "TopK" in hlo


def test_row_candidates_equal_float64_log_softmax_top_words():
    """The logits path's candidates: the best 2K + 3 words of a row in (log-prob, id) order, <s> and padding at
    -inf, </s> kept in the last slot when it ranks lower, against a float64 NumPy ranking."""
    rng = np.random.default_rng(3)
    k, vocab = 2, 40
    logits = rng.normal(size=(3, k, vocab)).astype(np.float32)
    logits[0, 0, [5, 9, 11]] = logits[0, 0, 7]  # ties rank by word id
    logits[1, :, EOS] = -8.0  # </s> far below the best words
    logits[2, 0, PAD] = logits[2, 0, BOS] = 9.0  # <s> and padding on top
    word, logp, eos_logp, best_word = _beam._row_candidates(jnp.asarray(logits), k, BOS, EOS, PAD)
    x = logits.astype(np.float64)
    want_logp = (
        x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    )
    width = 2 * k + 3
    for b, j in itertools.product(range(3), range(k)):
        order = sorted(range(vocab), key=lambda w: (-logits[b, j, w], w))[:width]
        if EOS not in order[:-1]:
            order[-1] = EOS
        assert word[b, j].tolist() == order
        want = [-np.inf if w in (PAD, BOS) else want_logp[b, j, w] for w in order]
        np.testing.assert_allclose(logp[b, j], want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(eos_logp[b, j], want_logp[b, j, EOS], rtol=1e-6, atol=1e-6)
        others = [want_logp[b, j, w] for w in range(vocab) if w not in (PAD, BOS, EOS)]
        np.testing.assert_allclose(best_word[b, j], max(others), rtol=1e-6, atol=1e-6)
    assert word[1, 0, -1] == EOS and word[2, 0, 0] == PAD and logp[2, 0, 0] == -np.inf


@pytest.mark.parametrize("chunk", [4, 7, 256])
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_two_stage_top_k_equals_a_stable_numpy_ranking(chunk, data):
    """The search's two-stage top-k and row maximum against NumPy's stable ranking: ties to the lower id,
    -inf words, a last block cut by the vocabulary, and axes narrow enough for the one-stage path."""
    k = data.draw(st.integers(1, 6), label="k")
    vocab = data.draw(st.integers(k, 300), label="vocab")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    rng = np.random.default_rng(seed)
    spread = data.draw(st.sampled_from([3, 12, 40]), label="spread")  # few values: many ties
    x = rng.integers(-spread, spread + 1, size=(2, 3, vocab)).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = -np.inf
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_beam, "_CHUNK", chunk)
        x_max, vals, idx = _beam._max_and_top_k(jnp.asarray(x), k)
    order = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    np.testing.assert_array_equal(np.asarray(idx), order)
    np.testing.assert_array_equal(np.asarray(vals), np.take_along_axis(x, order, -1))
    np.testing.assert_array_equal(np.asarray(x_max)[..., 0], x.max(-1))


def test_logits_path_equals_the_log_softmax_path():
    """One model ranks candidates read off its logits; two copies of it go through the averaged log-softmax.
    Both searches must agree on every token, length and limit flag, with ties among the words (</s> tied too)."""
    vocab = 12
    table = np.full((vocab, vocab), 1.0)
    table[:, EOS] = 1.0  # </s> ties with every word after <s>
    table[A] = np.arange(vocab) % 3 + 1.0  # three-way ties
    table[B_, EOS] = 0.5
    table = table / table.sum(-1, keepdims=True)
    attention = np.random.default_rng(0).uniform(0.1, 1.0, (vocab, 3))
    src, mask = table_source(batch=2)
    model = TableModel(table, attention)
    rnn = make_rnnsearch()
    rnn_src, rnn_mask = make_source()
    for m, (s, sm) in ((model, (src, mask)), (rnn, (rnn_src, rnn_mask))):
        for k in (1, 2, 3):
            kw = dict(
                beam_size=k, num_return=k, max_length=6, max_length_ratio=None, length_penalty_alpha=ALPHA
            )
            one, two = beam_search(m, s, sm, **kw), beam_search([m, m], s, sm, **kw)
            np.testing.assert_array_equal(one.tokens, two.tokens)
            np.testing.assert_array_equal(one.lengths, two.lengths)
            np.testing.assert_array_equal(one.truncated, two.truncated)
            assert_close_f32(one.scores, two.scores, reduction=6 * vocab)
            assert_close_f32(one.log_probs, two.log_probs, reduction=6 * vocab)


def test_max_length_and_ratio_limits_are_respected():
    # The trap model never stops after `a` under greedy decoding: every sentence runs to its limit.
    model = TableModel(TRAP)
    lengths = jnp.array([5, 2, 0])
    mask = jnp.arange(5)[None, :] < lengths[:, None]
    src = jnp.zeros((3, 5), jnp.int32)
    out = greedy_decode(model, src, mask, max_length_ratio=0.5, max_length_offset=1)
    # L = ⌊0.5 · 5⌋ + 1 = 3; limits ⌊0.5 · |x|⌋ + 1 = 3, 2, 1 (the empty sentence can only say </s>).
    assert out.tokens.shape == (3, 1, 3)
    np.testing.assert_array_equal(out.tokens[:, 0], [[A, A, EOS], [A, EOS, PAD], [EOS, PAD, PAD]])
    np.testing.assert_array_equal(out.lengths[:, 0], [3, 2, 1])
    capped = greedy_decode(model, src, mask, max_length=3, max_length_ratio=1.0)  # min(3, |x| + 10)
    np.testing.assert_array_equal(capped.lengths[:, 0], [3, 3, 3])
    # A limit of one token leaves a single hypothesis: the other n-best slot is empty (-inf, padding).
    nbest = beam_search(
        model, src, mask, beam_size=2, num_return=2, max_length_ratio=0.5, max_length_offset=1
    )
    lengths = np.asarray(nbest.lengths)
    assert np.all(lengths[:2] >= 2) and np.all(lengths[:2] <= [[3], [2]])
    np.testing.assert_array_equal(nbest.lengths[2], [1, 0])
    np.testing.assert_array_equal(nbest.tokens[2], [[EOS, PAD, PAD], [PAD, PAD, PAD]])
    assert np.isneginf(nbest.scores[2, 1]) and np.all(np.isfinite(nbest.scores[:2]))


def test_bad_input_raises_value_error_naming_shapes():
    model = TableModel(TRAP)
    src, mask = table_source(batch=2, width=3)
    with pytest.raises(ValueError, match="beam_size must be a positive int, got 0"):
        beam_search(model, src, mask, beam_size=0)
    with pytest.raises(ValueError, match=r"num_return must be an int in \[1, beam_size=2\], got 3"):
        beam_search(model, src, mask, beam_size=2, num_return=3)
    with pytest.raises(
        ValueError, match=r"src_mask must be boolean \[B, S\] like src \[2, 3\], got bool of shape \[2, 4\]"
    ):
        beam_search(model, src, jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"src_mask must be boolean .* got int32 of shape \[2, 3\]"):
        beam_search(model, src, jnp.ones((2, 3), jnp.int32))
    with pytest.raises(ValueError, match=r"src must be integer token ids \[B, S\], got int32 of shape \[6\]"):
        beam_search(model, src.reshape(-1), mask.reshape(-1))
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        beam_search(model, src, mask, max_length=0)
    with pytest.raises(ValueError, match="give max_length or max_length_ratio"):
        beam_search(model, src, mask, max_length_ratio=None)
    with pytest.raises(ValueError, match="length_penalty_alpha must be a finite number >= 0"):
        beam_search(model, src, mask, length_penalty_alpha=-1.0)
    with pytest.raises(ValueError, match="eos_id must differ"):
        beam_search(model, src, mask, eos_id=0)
    with pytest.raises(ValueError, match="at least one model"):
        beam_search([], src, mask)
    with pytest.raises(ValueError, match="must be a flax.nnx.Module"):
        beam_search(object(), src, mask)
    with pytest.raises(ValueError, match="must be < the vocabulary size 5"):
        beam_search(model, src, mask, beam_size=2, max_length=3, eos_id=7)
    with pytest.raises(
        ValueError, match="disagree on the target vocabulary: model 0 has 5 words, model 1 has 6"
    ):
        beam_search([model, TableModel(np.full((6, 6), 1 / 6))], src, mask, beam_size=2, max_length=3)
    with pytest.raises(ValueError, match="coverage_penalty_beta > 0 needs attention"):
        beam_search(
            model,
            src,
            mask,
            beam_size=2,
            num_return=2,
            max_length=4,
            max_length_ratio=None,
            coverage_penalty_beta=0.2,
        )


@pytest.mark.parametrize(
    "module", [_penalties, pytest.param(_beam, marks=pytest.mark.slow)], ids=["penalties", "beam"]
)
def test_docstring_examples(module):
    # The beam example initialises an RNNsearch eagerly (one compilation per random op): ~15 s on a busy CPU.
    result = doctest.testmod(module, extraglobs={"jnp": jnp, "nnx": nnx})
    assert result.failed == 0 and result.attempted > 0


# ------------------------------------------------------------------------------------ a random RNNsearch


def make_rnnsearch(seed=0):
    """A random RNNsearch built abstractly and filled from NumPy (eager init compiles slowly on a busy CPU)."""
    cfg = RNNConfig(src_vocab=KX, tgt_vocab=KY, **SIZES)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def fill(path, x):
        value = 0.5 * rng.normal(size=x.shape)
        if any(getattr(p, "key", None) == "b_w" for p in path):
            value[EOS] -= 3.0  # make </s> rarer so hypotheses run into the length limits
        return jnp.asarray(value, x.dtype)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, state))


def make_source(seed=1):
    rng = np.random.default_rng(seed)
    mask = np.arange(S)[None, :] < np.asarray(LENGTHS)[:, None]
    src = np.where(mask, rng.integers(3, KX, (len(LENGTHS), S)), 0).astype(np.int32)
    return jnp.asarray(src), jnp.asarray(mask)


class Steps:
    """Jitted encode/init, decode step and teacher-forced forward of one model (the references' building blocks)."""

    def __init__(self, model):
        graphdef, self.state = nnx.split(model)

        def start(st, src, mask):
            m = nnx.merge(graphdef, st)
            enc = m.encode(src, mask)
            return enc, m.init_decoder_state(enc)

        self._start = jax.jit(start)
        self._step = jax.jit(lambda st, e, d, y: nnx.merge(graphdef, st).decode_step(e, d, y))
        self._forward = jax.jit(lambda st, *a: nnx.merge(graphdef, st)(*a))

    def start(self, src, mask):
        return self._start(self.state, src, mask)

    def step(self, enc, dec, prev):
        return self._step(self.state, enc, dec, prev)

    def forward(self, src, mask, tgt_in):
        return self._forward(self.state, src, mask, tgt_in)


def log_softmax64(logits):
    x = np.asarray(logits, np.float64)
    x = x - x.max()
    return x - np.log(np.sum(np.exp(x)))


def reference_beam_search(steps, src_row, mask_row, *, beam, nbest, limit, alpha, beta):
    """A slow beam search in float64, one hypothesis at a time (each decoded as its own batch of one).

    Same search as ``beam_search`` without its early stop: all extensions of all alive hypotheses are sorted
    by raw log-probability; the </s> ones among the first ``beam`` are finished, the first ``beam`` others
    stay alive; <pad> and <s> are never produced; at the limit only </s> may follow. Returns the ``nbest``
    best finished.
    """
    enc, dec = steps.start(src_row[None], mask_row[None])
    valid = np.asarray(mask_row)
    alive = [dict(tokens=[], lp=0.0, state=dec, rows=[])]
    finished = []
    for t in range(limit):
        extensions = []
        for hyp in alive:
            prev = hyp["tokens"][-1] if hyp["tokens"] else BOS
            logits, state, attn = steps.step(enc, hyp["state"], jnp.array([prev], jnp.int32))
            logp = log_softmax64(logits[0])
            rows = hyp["rows"] + [np.asarray(attn[0], np.float64)]
            coverage = np.sum(rows, axis=0)
            cp = beta * sum(math.log(max(min(coverage[i], 1.0), TINY)) for i in range(len(valid)) if valid[i])
            lp = hyp["lp"] + logp[EOS]
            score = lp / ((5 + t + 1) / 6) ** alpha + cp
            # Cut by the limit: </s> is forced there while the model's most probable next token is a word.
            forced = t + 1 == limit and logp[EOS] < max(
                logp[w] for w in range(len(logp)) if w not in (PAD, BOS, EOS)
            )
            extensions.append(
                dict(tokens=hyp["tokens"] + [EOS], lp=lp, score=score, rows=rows, forced=forced)
            )
            if t + 1 < limit:
                for word in range(len(logp)):
                    if word not in (PAD, BOS, EOS):
                        extensions.append(
                            dict(
                                tokens=hyp["tokens"] + [word],
                                lp=hyp["lp"] + logp[word],
                                state=state,
                                rows=rows,
                            )
                        )
        extensions.sort(key=lambda h: -h["lp"])
        finished += [h for h in extensions[:beam] if h["tokens"][-1] == EOS]
        alive = [h for h in extensions if h["tokens"][-1] != EOS][:beam]
    return sorted(finished, key=lambda h: -h["score"])[:nbest]


@functools.cache
def rnnsearch_case():
    """(model steps, src, mask, jitted beam search result, per-sentence float64 references), computed once."""
    model = make_rnnsearch()
    src, mask = make_source()
    out = beam_search(
        model,
        src,
        mask,
        beam_size=BEAM,
        num_return=NBEST,
        max_length_ratio=RATIO,
        max_length_offset=OFFSET,
        length_penalty_alpha=ALPHA,
        coverage_penalty_beta=BETA,
    )
    steps = Steps(model)
    refs = [
        reference_beam_search(
            steps, src[b], mask[b], beam=BEAM, nbest=NBEST, limit=LIMITS[b], alpha=ALPHA, beta=BETA
        )
        for b in range(len(LENGTHS))
    ]
    return model, steps, src, mask, out, refs


def test_jitted_beam_search_equals_float64_reference():
    _, _, _, _, out, refs = rnnsearch_case()
    assert out.tokens.shape == (3, NBEST, max(LIMITS)) and out.attention.shape == (3, NBEST, max(LIMITS), S)
    for b, ref in enumerate(refs):
        for n, hyp in enumerate(ref):
            length = len(hyp["tokens"])
            assert out.lengths[b, n] == length
            np.testing.assert_array_equal(out.tokens[b, n, :length], hyp["tokens"])
            # float32 log-softmax accumulated over ≤ 12 steps against float64: relative error ~1e-7 per step.
            np.testing.assert_allclose(out.log_probs[b, n], hyp["lp"], rtol=1e-5)
            np.testing.assert_allclose(out.scores[b, n], hyp["score"], rtol=1e-5)
            np.testing.assert_allclose(
                out.attention[b, n, :length], np.stack(hyp["rows"]), rtol=1e-5, atol=1e-7
            )
            assert bool(out.truncated[b, n]) == hyp["forced"]
    # The case must exercise long hypotheses and the per-sentence limits, or it would prove little.
    assert int(out.lengths.max()) >= 5
    assert int(out.lengths[2].max()) == LIMITS[2] and bool(out.truncated.any())
    np.testing.assert_array_equal(out.limits, LIMITS)


def test_nbest_sorted_eos_terminated_and_within_limits():
    _, _, _, _, out, _ = rnnsearch_case()
    scores, lengths, tokens = np.asarray(out.scores), np.asarray(out.lengths), np.asarray(out.tokens)
    assert np.all(np.diff(scores, axis=1) <= 0) and np.all(np.isfinite(scores))
    for b in range(3):
        assert np.all(lengths[b] <= LIMITS[b]) and np.all(lengths[b] >= 1)
        hyps = {tuple(tokens[b, n, : lengths[b, n]]) for n in range(NBEST)}
        assert len(hyps) == NBEST  # distinct hypotheses
        for n in range(NBEST):
            row = tokens[b, n]
            assert row[lengths[b, n] - 1] == EOS
            assert EOS not in row[: lengths[b, n] - 1] and not np.isin(row[: lengths[b, n]], [PAD, BOS]).any()
            assert np.all(row[lengths[b, n] :] == PAD)  # never a token after </s>
            np.testing.assert_array_equal(out.attention[b, n, lengths[b, n] :], 0.0)


def test_returned_attention_belongs_to_the_returned_words():
    _, steps, src, mask, out, _ = rnnsearch_case()
    n_sent, n_best, width = out.tokens.shape
    tokens = np.asarray(out.tokens).reshape(-1, width)
    tgt_in = np.concatenate([np.full((len(tokens), 1), BOS), tokens[:, :-1]], axis=1).astype(np.int32)
    rep = lambda x: jnp.repeat(x, n_best, axis=0)
    logits, attn = steps.forward(rep(src), rep(mask), jnp.asarray(tgt_in))  # teacher forcing on the outputs
    logp = jax.nn.log_softmax(logits, axis=-1)
    lengths = np.asarray(out.lengths).reshape(-1)
    got_attn = np.asarray(out.attention).reshape(len(tokens), width, S)
    for i, length in enumerate(
        lengths
    ):  # beam search's cached steps vs teacher forcing: two float32 programs
        assert_close_f32(got_attn[i, :length], attn[i, :length], reduction=DECODE_REDUCTION)
        lp = float(np.sum(np.asarray(logp[i, np.arange(length), tokens[i, :length]], np.float64)))
        assert_close_f32(out.log_probs.reshape(-1)[i], lp, reduction=DECODE_REDUCTION)


def test_beam_one_equals_greedy_equals_argmax_loop():
    model, steps, src, mask, _, _ = rnnsearch_case()
    kw = dict(max_length_ratio=RATIO, max_length_offset=OFFSET)
    greedy = greedy_decode(model, src, mask, **kw)
    beam1 = beam_search(model, src, mask, beam_size=1, length_penalty_alpha=0.0, **kw)
    for field in ("tokens", "lengths", "log_probs", "scores", "attention"):  # greedy_decode *is* beam size 1
        np.testing.assert_array_equal(getattr(greedy, field), getattr(beam1, field))
    for b in range(len(LENGTHS)):
        enc, dec = steps.start(src[b : b + 1], mask[b : b + 1])
        words, total, prev = [], 0.0, BOS
        for t in range(LIMITS[b]):
            logits, dec, _ = steps.step(enc, dec, jnp.array([prev], jnp.int32))
            logp = log_softmax64(logits[0])
            logp[[PAD, BOS]] = -np.inf
            prev = EOS if t + 1 == LIMITS[b] else int(np.argmax(logp))
            words.append(prev)
            total += logp[prev]
            if prev == EOS:
                break
        assert greedy.lengths[b, 0] == len(words)
        np.testing.assert_array_equal(greedy.tokens[b, 0, : len(words)], words)
        assert_close_f32(greedy.log_probs[b, 0], total, reduction=DECODE_REDUCTION)  # two float32 programs
    # Greedy must reach a length limit on some sentence here, and stop on its own </s> on another.
    assert any(greedy.lengths[b, 0] == LIMITS[b] for b in range(3))
