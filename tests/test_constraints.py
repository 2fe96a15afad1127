"""Lexically constrained beam search (dynamic beam allocation, attn_jax.decoding._constrained).

The hand-set table model of test_decoding (next word by previous word, over {a, b}) lets the search be
compared with a float64 brute force over every sentence of at most 4 tokens, restricted to those that contain
each constraint; a small random RNNsearch checks that constraints appear whenever the length limit allows.
"""

import jax
import numpy as np
import pytest

from attn_jax.decoding import _constrained, beam_search
from tests.test_decoding import (
    ALPHA,
    B_,
    BETA,
    EOS,
    KY,
    OFFSET,
    RATIO,
    TRAP,
    TRAP_ATTENTION,
    A,
    TableModel,
    brute_force,
    make_rnnsearch,
    make_source,
    table_source,
)
from tests.tolerance import assert_close_f32


def contains(words, phrase) -> bool:
    """True when ``phrase`` occurs in ``words`` as a contiguous run."""
    n = len(phrase)
    return any(list(words[i : i + n]) == list(phrase) for i in range(len(words) - n + 1))


def words_of(out, b, n):
    return out.tokens[b, n, : max(int(out.lengths[b, n]) - 1, 0)].tolist()


# Per sentence: a phrase greedy never takes, two single words, a phrase that fills the whole limit, none.
CONSTRAINTS = [[[B_, B_]], [[A], [B_]], [[B_, A, B_]], []]


def test_exhaustive_constrained_search_equals_brute_force_over_sentences_with_the_constraints():
    model = TableModel(TRAP, TRAP_ATTENTION)
    src, mask = table_source(batch=len(CONSTRAINTS))
    # K = 32: every prefix over {a, b} of at most 3 words stays alive (at most 8, with 24 extensions), and
    # every allowed </s> extension is among the first K candidates, so the search is exhaustive for L = 4.
    out = beam_search(
        model,
        src,
        mask,
        beam_size=32,
        num_return=3,
        max_length=4,
        max_length_ratio=None,
        length_penalty_alpha=ALPHA,
        coverage_penalty_beta=BETA,
        constraints=CONSTRAINTS,
    )
    every = brute_force([TRAP], [TRAP_ATTENTION], 4, ALPHA, BETA, 100)
    for b, phrases in enumerate(CONSTRAINTS):
        want = [h for h in every if all(contains(h[2], p) for p in phrases)][:3]
        assert want, b
        for n, (score, lp, y, _) in enumerate(want):
            assert out.tokens[b, n, : len(y)].tolist() == y, (b, n)
            np.testing.assert_allclose([out.scores[b, n], out.log_probs[b, n]], [score, lp], rtol=1e-5)
        # Past them, the list holds what the limit forced to end: each lacks a constraint and says so.
        assert out.unmet_constraints[b, : len(want)].tolist() == [0] * len(want)
        assert np.all(out.unmet_constraints[b, len(want) :] > 0)


def test_a_narrow_beam_finds_what_plain_beam_search_never_holds():
    model = TableModel(TRAP)
    src, mask = table_source(batch=2)
    kw = dict(beam_size=2, num_return=2, max_length=5, max_length_ratio=None, length_penalty_alpha=0.0)
    plain = beam_search(model, src, mask, **kw)
    assert not any(contains(words_of(plain, 0, n), [B_, B_]) for n in range(2))
    out = beam_search(model, src, mask, constraints=[[[B_, B_]], []], **kw)
    # The sentence without constraints gets plain beam search's hypotheses. Two programs: float32 rounding
    # over 5 steps of V = 5 words.
    np.testing.assert_array_equal(out.tokens[1], plain.tokens[1])
    assert_close_f32([o[1] for o in out[2:4]], [p[1] for p in plain[2:4]], reduction=5 * 5)
    assert plain.unmet_constraints is None and out.unmet_constraints[1].tolist() == [0, 0]
    best = max(
        (h for h in brute_force([TRAP], [TRAP_ATTENTION], 5, 0.0, 0.0, 100) if contains(h[2], [B_, B_])),
        key=lambda h: h[0],
    )
    assert best[2] == [B_, B_, EOS]
    assert out.tokens[0, 0, :3].tolist() == best[2] and int(out.unmet_constraints[0, 0]) == 0
    np.testing.assert_allclose(out.log_probs[0, 0], best[1], rtol=1e-6)


def test_constraints_the_limit_has_no_room_for_are_reported_and_ranked_last():
    model = TableModel(TRAP)
    src, mask = table_source(batch=3)
    # A limit of 2 tokens holds one word: `a b` cannot fit; `b` can; `a` and `b` together cannot.
    out = beam_search(
        model,
        src,
        mask,
        beam_size=3,
        num_return=2,
        max_length=2,
        max_length_ratio=None,
        constraints=[[[A, B_]], [[B_]], [[A], [B_]]],
    )
    assert out.unmet_constraints[:, 0].tolist() == [1, 0, 1]
    assert words_of(out, 1, 0) == [B_] and words_of(out, 1, 1) == [A]  # the one with `b` first
    for b, phrases in enumerate([[[A, B_]], [[B_]], [[A], [B_]]]):
        for n in range(2):  # the count is what the words lack, checked here independently
            lacking = sum(not contains(words_of(out, b, n), p) for p in phrases)
            assert int(out.unmet_constraints[b, n]) == lacking


def test_kmp_progress_handles_repeats_and_shared_first_words():
    # `a a b` holds `a b`; `a c a b` holds `a b` and `a c` (they share a first word).
    cons = _constrained.pack_constraints([[[3, 4]], [[3, 4], [3, 5]], [[3, 3, 4]]], 3, 1, 2, 0)
    texts = [[3, 3, 4], [3, 5, 3, 4], [3, 3, 3, 4]]
    progress = np.zeros((3, 1, cons.lengths.shape[1]), np.int32)
    advance = jax.jit(_constrained.advance)
    for t in range(4):
        words = np.asarray([[txt[t] if t < len(txt) else 0] for txt in texts], np.int32)
        progress = advance(progress, words, cons)
    assert np.asarray(_constrained.unmet(progress, cons)).ravel().tolist() == [0, 0, 0]


def test_random_rnnsearch_meets_every_constraint_the_limit_allows():
    model = make_rnnsearch()
    src, mask = make_source()  # limits 12, 8 and 3 tokens with </s>
    rng = np.random.default_rng(3)
    phrases = [
        [rng.integers(3, KY, 2).tolist(), [int(rng.integers(3, KY))]],
        [rng.integers(3, KY, 3).tolist()],
        [rng.integers(3, KY, 2).tolist(), rng.integers(3, KY, 2).tolist()],  # 4 words: more than 2 fit
    ]
    out = beam_search(
        model,
        src,
        mask,
        beam_size=4,
        num_return=2,
        max_length_ratio=RATIO,
        max_length_offset=OFFSET,
        constraints=phrases,
    )
    for b in range(3):
        for n in range(2):
            lacking = sum(not contains(words_of(out, b, n), p) for p in phrases[b])
            assert int(out.unmet_constraints[b, n]) == lacking
    # The best of each sentence whose limit has room holds every constraint; the n-best list below it may
    # not (dynamic beam allocation keeps few hypotheses in the fullest bank), and the count says so.
    assert out.unmet_constraints[:2, 0].tolist() == [0, 0]
    assert int(out.unmet_constraints[2, 0]) > 0  # the limit had no room, and that is said


def test_bad_constraints_are_refused():
    model = TableModel(TRAP)
    src, mask = table_source(batch=2)
    kw = dict(beam_size=2, max_length=4, max_length_ratio=None)
    with pytest.raises(ValueError, match="one list per sentence"):
        beam_search(model, src, mask, constraints=[[[A]]], **kw)
    with pytest.raises(ValueError, match="constraint 0 of sentence 1 is empty"):
        beam_search(model, src, mask, constraints=[[], [[]]], **kw)
    with pytest.raises(ValueError, match="constraint 1 of sentence 0 holds 2"):
        beam_search(model, src, mask, constraints=[[[A], [EOS]], []], **kw)


def test_a_prefix_counts_toward_the_constraints():
    model = TableModel(TRAP)
    src, mask = table_source(batch=2)
    # With 2 words of room, `a b` fits only by using the prefix's `a`; the second sentence's prefix `b` leaves
    # no room for `a b`, so its translation lacks it and says so.
    out = beam_search(
        model,
        src,
        mask,
        beam_size=2,
        max_length=3,
        max_length_ratio=None,
        prefix=np.asarray([[A], [B_]], np.int32),
        prefix_lengths=np.asarray([1, 1], np.int32),
        constraints=[[[A, B_]], [[A, B_]]],
    )
    assert out.tokens[0, 0].tolist() == [A, B_, EOS] and int(out.unmet_constraints[0, 0]) == 0
    assert words_of(out, 1, 0)[0] == B_ and int(out.unmet_constraints[1, 0]) == 1
