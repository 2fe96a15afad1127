"""Repetition control in beam search: ``no_repeat_ngram`` and ``min_length``, on hand-set bigram tables whose
greedy path repeats a bigram forever or stops at once, checked against a float64 greedy loop written here."""

import numpy as np
import pytest

from attn_jax.decoding import _beam, beam_search, greedy_decode
from tests.test_decoding import TableModel

PAD, BOS, EOS, A, B, C = range(6)
V = 6


def table(rows):
    """A ``[6, 6]`` table of ``P(word | previous word)`` from ``{prev: {word: p}}``; the rest share what is left."""
    t = np.zeros((V, V))
    for prev, dist in rows.items():
        t[prev, list(dist)] = list(dist.values())
    for prev in range(V):
        rest = [w for w in range(V) if t[prev, w] == 0]
        t[prev, rest] = max(1.0 - t[prev].sum(), 1e-6) / len(rest)
    return t


# Greedy: a b a b a b ... (every bigram repeats); c is the runner-up after both words.
LOOP = table(
    {
        BOS: {A: 0.7, C: 0.2},
        A: {B: 0.6, C: 0.3, EOS: 0.01},
        B: {A: 0.6, C: 0.3, EOS: 0.01},
        C: {A: 0.5, B: 0.4},
    }
)
# Greedy: </s> at once; then a, then b, then </s> again.
STOP = table({BOS: {EOS: 0.8, A: 0.15}, A: {EOS: 0.7, B: 0.25}, B: {EOS: 0.9, C: 0.05}, C: {EOS: 0.9}})


def reference_greedy(probs, limit, no_repeat_ngram=0, min_length=0):
    """Float64 greedy decoding with the two rules, one token at a time: ``(words, log P)``, ``</s>`` included."""
    logp, out, prev, total = np.log(probs), [], BOS, 0.0
    for t in range(limit):
        row = logp[prev].copy()
        row[[PAD, BOS]] = -np.inf
        if t + 1 >= limit:  # the limit forces </s>
            row[np.arange(V) != EOS] = -np.inf
        elif t < min_length:
            row[EOS] = -np.inf
        n = no_repeat_ngram
        if n and t >= n - 1:
            context = out[t - n + 1 :] if n > 1 else []
            for j in range(t - n + 1):
                if out[j : j + n - 1] == context and out[j + n - 1] != EOS:
                    row[out[j + n - 1]] = -np.inf
        word = int(np.argmax(row))
        total += row[word]
        out.append(word)
        if word == EOS:
            break
        prev = word
    return out, total


def ngrams(words, n):
    return [tuple(words[j : j + n]) for j in range(len(words) - n + 1)]


def decode(model, limit, **kw):
    src, mask = np.ones((2, 3), np.int32), np.ones((2, 3), bool)
    return beam_search(model, src, mask, max_length=limit, max_length_ratio=None, **kw)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_matches_a_float64_greedy_loop_and_repeats_nothing(n):
    model, limit = TableModel(LOOP), 12
    words_off, _ = reference_greedy(LOOP, limit)
    assert len(ngrams(words_off[:-1], 2)) > len(set(ngrams(words_off[:-1], 2)))  # off: the loop repeats
    want, want_lp = reference_greedy(LOOP, limit, no_repeat_ngram=n)
    src, mask = np.ones((2, 3), np.int32), np.ones((2, 3), bool)
    got = greedy_decode(model, src, mask, max_length=limit, max_length_ratio=None, no_repeat_ngram=n)
    for row in range(2):
        words = [int(w) for w in got.tokens[row, 0, : int(got.lengths[row, 0])]]
        assert words == want, (n, words, want)
        assert float(got.log_probs[row, 0]) == pytest.approx(want_lp, rel=1e-5)
        body = words[:-1] if words[-1] == EOS else words
        assert len(ngrams(body, n)) == len(set(ngrams(body, n)))
    # Beam search: no hypothesis of the n-best list repeats an n-gram either.
    out = decode(model, limit, beam_size=4, num_return=4, no_repeat_ngram=n)
    for row in range(2):
        for k in range(4):
            if out.scores[row, k] == -np.inf:
                continue
            words = [int(w) for w in out.tokens[row, k, : int(out.lengths[row, k])] if w != EOS]
            assert len(ngrams(words, n)) == len(set(ngrams(words, n))), (n, k, words)


def test_min_length_forbids_eos_before_it_and_the_limit_still_wins():
    model = TableModel(STOP)
    off = decode(model, 8, beam_size=1, num_return=1)
    assert int(off.lengths[0, 0]) == 1  # off: </s> at once
    for m in (1, 4):
        want, want_lp = reference_greedy(STOP, 8, min_length=m)
        out = decode(model, 8, beam_size=1, num_return=1, length_penalty_alpha=0.0, min_length=m)
        words = [int(w) for w in out.tokens[0, 0, : int(out.lengths[0, 0])]]
        assert words == want and EOS not in words[:m] and len(words) >= m + 1
        assert float(out.log_probs[0, 0]) == pytest.approx(want_lp, rel=1e-5)
    beam = decode(model, 8, beam_size=3, num_return=3, min_length=3)
    assert np.all(beam.lengths[beam.scores > -np.inf] >= 4)
    # A limit below the minimum still ends every hypothesis with </s> at the limit.
    short = decode(model, 3, beam_size=2, num_return=2, min_length=5)
    assert np.all(short.lengths[:, 0] == 3) and np.all(short.tokens[:, 0, 2] == EOS)


def test_off_adds_no_operation_and_each_setting_compiles_once():
    """0 leaves the search's program as it was (no scatter, the n-gram ban's one), and a second call with the
    same options reuses the compiled search."""
    model = TableModel(LOOP)
    from flax import nnx

    src, mask = np.ones((2, 3), np.int32), np.ones((2, 3), bool)

    def hlo(**kw):
        g, s = nnx.split(model)
        args = ((g,), (s,), src, mask, np.full(2, 6, np.int32), np.float32(0.6), np.float32(0.0))
        static = dict(beam_size=3, num_return=1, length=6, bos_id=BOS, eos_id=EOS, pad_id=PAD)
        return _beam._search_jit.lower(*args, **static, **kw).as_text()

    default = hlo()
    assert default == hlo(no_repeat_ngram=0, min_length=0)
    assert "scatter" not in default and "scatter" in hlo(no_repeat_ngram=2)
    before = _beam._TRACE_COUNT[0]
    decode(model, 9, beam_size=2, no_repeat_ngram=2, min_length=1)
    decode(model, 9, beam_size=2, no_repeat_ngram=2, min_length=1)
    assert _beam._TRACE_COUNT[0] == before + 1
    with pytest.raises(ValueError, match="no_repeat_ngram must be a non-negative int"):
        decode(model, 9, no_repeat_ngram=-1)


@pytest.mark.slow
def test_translate_and_evaluate_take_the_flags(tmp_path, capsys):
    """``translate --no-repeat-ngram 2 --min-length 4`` gives the library's output under the same options: no
    repeated bigram, no translation shorter than 4 words; a negative value is a bad flag (exit 2)."""
    from attn_jax.cli import build_parser, main
    from attn_jax.pipeline import load_model, translate_sentences
    from tests.test_cli_translate import SENTENCES, make_run

    run = make_run(tmp_path / "run")
    sentences = [s for s in SENTENCES if s]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    flags = ["--no-repeat-ngram", "2", "--min-length", "4"]
    assert main(["translate", "--workdir", run, "--input", str(src), "--beam", "3", *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    loaded = load_model(run)
    want = translate_sentences(loaded, sentences, beam_size=3, no_repeat_ngram=2, min_length=4)
    assert lines == [h[0].text for h in want]
    for h in want:
        assert len(h[0].ids) >= 4 and len(ngrams(h[0].ids, 2)) == len(set(ngrams(h[0].ids, 2)))
    args = build_parser().parse_args(["evaluate", "--workdir", run, *flags])
    assert (args.no_repeat_ngram, args.min_length) == (2, 4)
    with pytest.raises(SystemExit) as e:
        main(["translate", "--workdir", run, "--min-length", "-1"])
    assert e.value.code == 2 and "--min-length: must be an int >= 0, got -1" in capsys.readouterr().err
