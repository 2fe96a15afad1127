"""Forced output: target prefixes (beam search and greedy decoding continue after them), and the pipeline and
``attn-jax translate`` flags for prefixes and lexical constraints (the constrained search: test_constraints).

The hand-set table model of test_decoding (next word by previous word, over {a, b}) lets an exhaustive beam
be compared with a float64 brute force restricted to the sentences that start with the prefix; a tiny
untrained run checks the pipeline and ``attn-jax translate --prefix`` / ``--constraints``.
"""

import json

import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.decoding import beam_search, greedy_decode
from attn_jax.pipeline import TranslateError, load_model, translate_sentences
from tests.test_cli_translate import make_run
from tests.test_decoding import (
    ALPHA,
    B_,
    BETA,
    EOS,
    TRAP,
    TRAP_ATTENTION,
    A,
    TableModel,
    brute_force,
    table_source,
)
from tests.tolerance import assert_close_f32

PREFIXES = [[], [A], [B_, A], [A, B_, B_]]


def prefix_array(prefixes):
    ids = np.zeros((len(prefixes), max(map(len, prefixes))), np.int32)
    for r, p in enumerate(prefixes):
        ids[r, : len(p)] = p
    return ids, np.asarray([len(p) for p in prefixes], np.int32)


def test_exhaustive_beam_with_prefix_equals_brute_force_over_sentences_with_that_prefix():
    model = TableModel(TRAP, TRAP_ATTENTION)
    src, mask = table_source(batch=len(PREFIXES))
    prefix, lengths = prefix_array(PREFIXES)
    # K = 16 keeps every sentence over {a, b} of at most 4 tokens (test_decoding's exhaustive case).
    out = beam_search(
        model,
        src,
        mask,
        beam_size=16,
        num_return=4,
        max_length=4,
        max_length_ratio=None,
        length_penalty_alpha=ALPHA,
        coverage_penalty_beta=BETA,
        prefix=prefix,
        prefix_lengths=lengths,
    )
    every = brute_force([TRAP], [TRAP_ATTENTION], 4, ALPHA, BETA, 100)
    for r, p in enumerate(PREFIXES):
        want = [h for h in every if h[2][: len(p)] == p][:4]
        for n, (score, lp, y, _) in enumerate(want):
            assert out.tokens[r, n, : len(y)].tolist() == y, (r, n)
            np.testing.assert_allclose([out.scores[r, n], out.log_probs[r, n]], [score, lp], rtol=1e-5)
        # Fewer sentences start with a long prefix: the rest of the n-best list is empty.
        assert np.all(np.isneginf(out.scores[r, len(want) :])) and np.all(out.lengths[r, len(want) :] == 0)
        # Every returned hypothesis starts with its prefix.
        assert all(out.tokens[r, n, : len(p)].tolist() == p for n in range(len(want)))


# The shapes and static options of the next two tests' searches are the same: they compile three searches.
SMALL = dict(beam_size=3, num_return=2, max_length=5, max_length_ratio=None)


def test_whole_reference_as_prefix_gives_the_reference_then_eos():
    model = TableModel(TRAP, TRAP_ATTENTION)
    src, mask = table_source(batch=3)
    # Greedy alone says a a a a </s>; `a a b` is the reference, and </s> (0.9) is the best word after `b`.
    reference = [A, A, B_]
    prefix, lengths = prefix_array([reference, [B_, A], []])
    forced = dict(max_length=5, max_length_ratio=None, prefix=prefix, prefix_lengths=lengths)
    greedy = greedy_decode(model, src, mask, **forced)
    beam = beam_search(model, src, mask, **{**SMALL, **forced}, coverage_penalty_beta=0.0)
    for out in (greedy, beam):
        assert out.tokens[0, 0].tolist() == [*reference, EOS, 0]
        np.testing.assert_allclose(out.log_probs[0, 0], np.log(0.6 * 0.36 * 0.34 * 0.9), rtol=1e-6)
    # After `b a` greedy takes `a` (0.36 > 0.34 > 0.30) until the limit forces </s>, flagged as cut.
    assert greedy.tokens[1, 0].tolist() == [B_, A, A, A, EOS] and bool(greedy.truncated[1, 0])


def test_empty_prefixes_change_nothing_and_bad_prefixes_are_refused():
    model = TableModel(TRAP, TRAP_ATTENTION)
    src, mask = table_source(batch=3)
    kw = dict(SMALL, coverage_penalty_beta=BETA)
    plain = beam_search(model, src, mask, **kw)
    empty = beam_search(model, src, mask, prefix=np.zeros((3, 2), np.int32), prefix_lengths=[0, 0, 0], **kw)
    np.testing.assert_array_equal(empty.tokens, plain.tokens)
    # Two programs: float32 rounding over 5 steps of V = 5 words and S = 3 source words.
    assert_close_f32(empty[1:5], plain[1:5], reduction=5 * (5 + 3))
    ok = np.asarray([[A, B_]] * 3, np.int32)
    with pytest.raises(ValueError, match="together"):
        beam_search(model, src, mask, prefix=ok, **kw)
    with pytest.raises(ValueError, match="not a word id"):
        beam_search(model, src, mask, prefix=np.asarray([[A, EOS]] * 3), prefix_lengths=[2, 2, 2], **kw)
    with pytest.raises(ValueError, match="prefix of sentence 1 has 2 tokens, but its length limit is 2"):
        beam_search(model, src, mask, prefix=ok, prefix_lengths=[0, 2, 1], limits=[5, 2, 5], **kw)
    with pytest.raises(ValueError, match=r"prefix_lengths\[0\] = 3 is outside \[0, 2\]"):
        beam_search(model, src, mask, prefix=ok, prefix_lengths=[3, 0, 0], **kw)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"))


SOURCES = ["the dog slept .", "every monk stood , because the torch bit fragile lazy bananas .", ""]


def test_translations_start_with_their_prefix_and_a_long_prefix_is_kept_whole(run_dir):
    loaded = load_model(run_dir)
    words = list(loaded.tgt_vocab.tokens[4:40])
    # The first sentence's limit is max(T, 2·4 + 10) tokens; its prefix is longer: the limit grows to hold it.
    long = " ".join(words[i % len(words)] for i in range(40))
    prefixes = [long, f"{words[3]} {words[7]}", ""]
    got = translate_sentences(loaded, SOURCES, beam_size=2, nbest=2, prefixes=prefixes)
    for hyps, prefix in zip(got[:2], prefixes, strict=False):
        assert hyps and all(h.tokens[: len(prefix.split())] == prefix.split() for h in hyps)
    assert got[0][0].limit >= 40 and len(got[0][0].tokens) >= 40
    assert got[2][0].text == ""  # a blank line is not decoded
    with pytest.raises(TranslateError, match="prefix of line 2: 'zzzqx' is not in the target vocabulary"):
        translate_sentences(loaded, SOURCES, beam_size=2, prefixes=["", f"{words[0]} zzzqx", ""])
    with pytest.raises(TranslateError, match="got 2 prefixes for 3 sentences"):
        translate_sentences(loaded, SOURCES, beam_size=2, prefixes=["", ""])


def test_cli_prefix_file(run_dir, tmp_path, capsys):
    loaded = load_model(run_dir)
    words = list(loaded.tgt_vocab.tokens[4:10])
    src, prefix = tmp_path / "in.txt", tmp_path / "prefix.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    prefix.write_text(f"{words[0]} {words[1]}\n{words[2]}\n\n", encoding="utf-8")
    argv = ["translate", "--workdir", run_dir, "--input", str(src), "--beam", "2", "--nbest", "2"]
    status = main([*argv, "--prefix", str(prefix)])
    out, err = capsys.readouterr()
    assert status == 0, err
    texts = [line.split(" ||| ")[:2] for line in out.splitlines()]
    assert [i for i, _ in texts[:4]] == ["0", "0", "1", "1"]
    assert all(t.split()[:2] == words[:2] for _, t in texts[:2])
    assert all(t.split()[:1] == [words[2]] for _, t in texts[2:4])
    prefix.write_text("a\nb\n", encoding="utf-8")
    status = main(["translate", "--workdir", run_dir, "--input", str(src), "--prefix", str(prefix)])
    err = capsys.readouterr().err
    assert status == 1 and len(err.strip().splitlines()) == 1
    assert f"--prefix {prefix} has 2 lines but the input {src} has 3" in err


def test_cli_constraints_file_and_the_count_of_those_the_limit_cut(run_dir, tmp_path, capsys):
    loaded = load_model(run_dir)
    w = list(loaded.tgt_vocab.tokens[4:10])
    src, cons = tmp_path / "in.txt", tmp_path / "constraints.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    # Two words of room: line 1's phrase fits, line 2's three words do not.
    cons.write_text(f"{w[0]} {w[1]}\n{w[2]}\t{w[3]} {w[4]}\n\n", encoding="utf-8")
    argv = ["translate", "--workdir", run_dir, "--input", str(src), "--beam", "2", "--max-length", "2"]
    status = main([*argv, "--constraints", str(cons), "--alignment", "json"])
    out, err = capsys.readouterr()
    assert status == 0, err
    best = [json.loads(line)["hypotheses"][0] for line in out.splitlines()[:2]]
    assert best[0]["tokens"] == w[:2] and best[0]["unmet_constraints"] == 0
    assert best[1]["unmet_constraints"] >= 1
    assert "warning: 1 of 2 translations lack" in err and "of their constraints" in err


def test_sampling_refuses_forced_output(tmp_path, capsys):
    """Forced output is a beam-search option: sampling with a prefix or constraints is refused, not ignored."""
    from attn_jax.decoding import LengthLimit, Sampling, search_batches

    for key in ("prefixes", "constraints"):
        batches = search_batches(
            None, [[5]], limit=LengthLimit(10), beam_size=1, sampling=Sampling(), **{key: [[]]}
        )
        with pytest.raises(ValueError, match="sampling takes no prefixes or constraints"):
            next(batches)
    (tmp_path / "p.txt").write_text("a\n")
    for flag in ("--prefix", "--constraints"):
        argv = ["translate", "--workdir", str(tmp_path), "--sample", flag, str(tmp_path / "p.txt")]
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.strip().splitlines() == [
            f"attn-jax translate: error: {flag} cannot be combined with --sample (forced output is a "
            "beam-search option)"
        ]
