"""Sampling (``attn_jax.decoding.sample_decode``) and ``attn-jax translate --sample``.

Most tests use hand-set Markov "table" models (``tests.test_decoding.TableModel``): the next-word distribution
depends on the previous word only, so the distribution every draw comes from is computed here in float64, loop by
loop, independently of the sampler. The statistical tests use a fixed seed, so they are deterministic; each states
its false-alarm rate, the chance that a correct sampler fails it for a new seed.
"""

import numpy as np
import pytest
from scipy import stats

from attn_jax.decoding import (
    LengthLimit,
    Sampling,
    _sampling,
    greedy_decode,
    sample_decode,
    search_batches,
)
from tests.test_decoding import TableModel
from tests.tolerance import assert_close_f32

PAD, BOS, EOS = 0, 1, 2
ALPHA = 1e-4  # false-alarm rate of each chi-square test
# One shape for (nearly) every call, so that the tests share compiled samplers: V words, B sentences of a source
# W wide, N samples each, at most L tokens.
V, B, W, N, L = 12, 100, 4, 20, 7
ATTENTION = np.random.default_rng(1).uniform(0.1, 1.0, (V, W))


def random_table(vocab, seed, concentration=0.5, eos=None):
    """A ``[V, V]`` table of ``P(word | previous word)``, rows drawn from a Dirichlet; ``eos`` fixes ``P(</s>)``."""
    rng = np.random.default_rng(seed)
    table = rng.dirichlet(np.full(vocab, concentration), size=vocab) + 1e-3
    table /= table.sum(axis=1, keepdims=True)
    if eos is not None:
        table[:, EOS] = 0.0
        table *= (1.0 - eos) / table.sum(axis=1, keepdims=True)
        table[:, EOS] = eos
    return table


def reference_q(row, temperature=1.0, top_k=0, top_p=1.0):
    """Float64 distribution a draw comes from: ``<pad>``/``<s>`` removed, ``P^(1/T)`` renormalised, cut to the
    ``top_k`` most probable words, renormalised, then to the fewest most probable words whose probability sums
    to ``top_p`` (and any word tied with the last of them), renormalised."""
    logp = np.log(np.asarray(row, np.float64))
    logp[[PAD, BOS]] = -np.inf
    q = np.exp((logp - logp.max()) / temperature)
    q /= q.sum()
    order = sorted(range(len(q)), key=lambda w: -q[w])
    if top_k:
        for w in order[top_k:]:
            q[w] = 0.0
        q /= q.sum()
    if top_p < 1:
        kept, total = [], 0.0
        for w in order:
            if total >= top_p or q[w] == 0:
                break
            kept.append(w)
            total += q[w]
        q = np.where(q >= q[kept[-1]], q, 0.0)  # a word tied with the last one kept stays too
        q /= q.sum()
    return q


def nucleus_margin(table, temperature, top_k, top_p):
    """The smallest distance between ``top_p`` and a cumulative probability of the candidates, over all rows:
    a float32 sampler can only disagree with the float64 nucleus when this is below its rounding."""
    margin = np.inf
    for row in table:
        q = np.sort(reference_q(row, temperature, top_k))[::-1]
        margin = min(margin, np.min(np.abs(np.cumsum(q) - top_p)))
    return margin


def source(batch=B, width=W):
    lengths = np.arange(batch) % width + 1
    mask = np.arange(width)[None, :] < lengths[:, None]
    return np.where(mask, 3, 0).astype(np.int32), mask


def draws(out):
    """``(previous word, drawn word)`` of every position a sample chose freely (not its forced last ``</s>``)."""
    tokens, lengths, limits = np.asarray(out.tokens), np.asarray(out.lengths), np.asarray(out.limits)
    pairs = []
    for b, n in np.ndindex(lengths.shape):
        length = int(lengths[b, n])
        for t in range(length):
            if t + 1 >= limits[b]:
                break
            pairs.append((BOS if t == 0 else int(tokens[b, n, t - 1]), int(tokens[b, n, t])))
    return pairs


def model(table):
    return TableModel(table, ATTENTION)


def sample(table_or_model, seed, **kw):
    """``sample_decode`` at the shared shape (``N`` samples of ``B`` sentences, ``L`` tokens at most)."""
    m = table_or_model if not isinstance(table_or_model, np.ndarray) else model(table_or_model)
    src, mask = source()
    if "limits" not in kw:
        kw.update(max_length=L, max_length_ratio=None)
    return sample_decode(m, src, mask, seed, num_samples=kw.pop("num_samples", N), **kw)


# ---------------------------------------------------------------------------------------------- greedy


# The greedy path is 3 4 5 </s>: cut at limits 1-3 (the model wanted another word), its own </s> from 4 on.
GREEDY = random_table(V, seed=0, concentration=1.0)
for _prev, _word in ((BOS, 3), (3, 4), (4, 5), (5, EOS)):
    GREEDY[_prev] = 0.5 * GREEDY[_prev] / GREEDY[_prev].sum()
    GREEDY[_prev, _word] += 0.5


@pytest.mark.numerics
def test_top_k_one_tiny_temperature_or_top_p_equal_greedy_decoding():
    """Three ways to make sampling greedy give greedy decoding's words, cut flags and attention in all ``N``
    samples; an ensemble too. Log-probabilities are two float32 programs' sums (tolerance over ``L`` terms)."""
    src, mask = source()
    limits = np.resize(np.array([1, 3, 4, L], np.int32), B)
    single = model(GREEDY)
    ensemble = [single, TableModel(random_table(V, seed=2), ATTENTION[::-1])]
    for m, options in (
        (single, dict(top_k=1)),
        (single, dict(temperature=1e-6)),
        (single, dict(top_p=1e-6, temperature=2.0)),
        (ensemble, dict(top_k=1)),
    ):
        want = greedy_decode(m, src, mask, limits=limits)
        got = sample(m, 7, limits=limits, **options)
        for field in ("tokens", "lengths", "truncated", "log_probs", "attention"):
            wanted = np.repeat(np.asarray(getattr(want, field)), N, axis=1)
            if field in ("log_probs", "attention"):
                assert_close_f32(getattr(got, field), wanted, reduction=L)
            else:
                np.testing.assert_array_equal(getattr(got, field), wanted, err_msg=field)
        np.testing.assert_array_equal(got.scores, got.log_probs)
        np.testing.assert_array_equal(got.limits, want.limits)
    # The case covers both endings: cut by the limit (1 and 3 tokens), and the model's own </s> (4 tokens).
    want = greedy_decode(single, src, mask, limits=limits)
    assert want.lengths[:4, 0].tolist() == [1, 3, 4, 4]
    assert want.truncated[:4, 0].tolist() == [True, True, False, False]


# ---------------------------------------------------------------------------------------- distributions

# The first word's distribution; <pad> and <s> have probability too, and must never be drawn. </s> and word 7 tie
# at the nucleus boundary of the top_p case: both are in it.
FIRST = np.array([0.05, 0.05, 0.06, 0.28, 0.2, 0.12, 0.08, 0.06, 0.04, 0.03, 0.02, 0.01])
DRAWS = B * N


@pytest.mark.parametrize(
    "options",
    [dict(), dict(temperature=0.5), dict(top_k=3), dict(top_p=0.75, temperature=1.3)],
    ids=["plain", "temperature", "top_k", "top_p"],
)
def test_first_word_frequencies_match_the_distribution(options):
    """2000 first words (100 sentences x 20 samples) against the float64 distribution by Pearson's chi-square
    test at ``ALPHA`` = 1e-4 (false alarms: 1e-4 per case); words outside the support are never drawn.
    The tempered draws must also fail the test against the untempered distribution (its power)."""
    out = sample(np.tile(FIRST, (V, 1)), 11, **options)
    counts = np.bincount(np.asarray(out.tokens)[:, :, 0].ravel(), minlength=V)
    q = reference_q(FIRST, **options)
    assert counts[q == 0].sum() == 0, (counts, q)
    expected, observed = pooled(DRAWS * q, counts)
    assert len(expected) >= 3 and expected.min() >= 5
    assert stats.chisquare(observed, expected).pvalue > ALPHA, (observed, expected)
    if set(options) == {"temperature"}:
        expected, observed = pooled(DRAWS * reference_q(FIRST), counts)
        assert stats.chisquare(observed, expected).pvalue < ALPHA


def pooled(expected, observed):
    """The words of the support, the least expected pooled into one bin until it expects >= 5 draws (so that
    the chi-square approximation holds)."""
    order = [w for w in np.argsort(expected) if expected[w] > 0]
    cut = 1
    while cut < len(order) and expected[order[:cut]].sum() < 5:
        cut += 1
    pool, rest = order[:cut], order[cut:]
    return (
        np.append(expected[rest], expected[pool].sum()),
        np.append(observed[rest], observed[pool].sum()),
    )


NUCLEUS = random_table(V, seed=5, concentration=0.3, eos=0.1)


@pytest.mark.parametrize(
    "options",
    [dict(top_p=0.6, temperature=0.8), dict(top_k=3), dict(top_k=4, top_p=0.7, temperature=1.5)],
    ids=["top_p", "top_k", "both"],
)
def test_no_draw_outside_the_top_k_or_the_nucleus(options):
    """Every freely drawn word, at every position of 2000 samples, lies in the float64 nucleus / top-k set of
    its context; many draws are not the argmax (so the cut is tested, not greedy decoding)."""
    temperature, top_k, top_p = (
        options.get("temperature", 1.0),
        options.get("top_k", 0),
        options.get("top_p", 1),
    )
    if top_p < 1:
        assert nucleus_margin(NUCLEUS, temperature, top_k, top_p) > 1e-4  # no boundary float32 could blur
    q = [reference_q(row, temperature, top_k, top_p) for row in NUCLEUS]
    pairs = draws(sample(NUCLEUS, 3, **options))
    assert len(pairs) > 5000
    below_best = 0
    for prev, word in pairs:
        assert q[prev][word] > 0, (prev, word, q[prev])
        below_best += q[prev][word] < q[prev].max()
    assert below_best > 1000


# ------------------------------------------------------------------------------------- seeds and batches


def test_same_seed_same_samples_and_every_sentence_draws_its_own():
    before = _sampling._TRACE_COUNT[0]
    first, again = sample(NUCLEUS, 5), sample(NUCLEUS, 5)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    # A new seed, temperature or top-p is a runtime value: no new compilation.
    other = sample(NUCLEUS, 6, temperature=0.9)
    assert _sampling._TRACE_COUNT[0] <= before + 1
    assert np.mean(np.asarray(first.tokens) != np.asarray(other.tokens)) > 0.3
    # The model gives every sentence the same distribution: only the draws tell the 2000 samples apart.
    rows = {tuple(r) for r in np.asarray(first.tokens).reshape(B * N, -1).tolist()}
    assert len(rows) > 500
    # A sentence draws by its id, wherever it sits in the batch.
    perm = np.random.default_rng(0).permutation(B)
    moved = sample(NUCLEUS, 5, ids=perm)
    np.testing.assert_array_equal(np.asarray(moved.tokens)[np.argsort(perm)], first.tokens)


def test_search_batches_draws_each_sentence_by_its_id():
    """``search_batches`` gives sentence ``i`` the id ``ids[i]``: reversed, the sentences land in other batches
    and rows, yet each gets the same samples; by default the ids are the positions, so equal sentences differ."""
    m = TableModel(NUCLEUS)
    sources, ids = [[3, 4, 5]] * 4, [10, 11, 12, 13]
    kw = dict(limit=LengthLimit(4, 1.0, 1), beam_size=1, num_return=2, batch_size=2)
    kw["sampling"] = Sampling(temperature=0.9, top_p=0.8, seed=2)

    def by_sentence(ids):
        got = {}
        for members, _, result in search_batches(m, sources, ids=ids, **kw):
            assert len(members) == 2
            for r, i in enumerate(members):
                got[ids[i] if ids else i] = np.asarray(result.tokens[r]).tobytes()
        return got

    forward, backward, default = by_sentence(ids), by_sentence(ids[::-1]), by_sentence(None)
    assert forward == backward
    assert len(set(forward.values())) == 4 and len(set(default.values())) == 4


# ------------------------------------------------------------------------------------- limits and scores


@pytest.mark.numerics
def test_samples_keep_their_limits_flag_cuts_and_score_the_models_log_probability():
    """Each sample ends in ``</s>`` within its sentence's limit; it is flagged as cut exactly when it reached
    the limit with a draw other than ``</s>`` (both happen here); its log-probability is the float64 sum of
    the model's (untempered) log-probabilities of its words, the forced ``</s>`` included; samples come most
    probable first."""
    table = random_table(V, seed=9, eos=0.3)
    limits = np.resize(np.array([1, 2, 4, L], np.int32), B)
    out = sample(table, 1, temperature=0.7, limits=limits)
    tokens, lengths, truncated = np.asarray(out.tokens), np.asarray(out.lengths), np.asarray(out.truncated)
    cut_at_limit = {True: 0, False: 0}
    totals = np.zeros((B, N))
    for b, n in np.ndindex(lengths.shape):
        length, words = int(lengths[b, n]), tokens[b, n].tolist()
        assert 1 <= length <= limits[b]
        assert words[length - 1] == EOS and EOS not in words[: length - 1]
        assert set(words[length:]) <= {PAD} and not {PAD, BOS} & set(words[:length])
        assert not truncated[b, n] or length == limits[b]
        if length == limits[b] and limits[b] > 1:
            cut_at_limit[bool(truncated[b, n])] += 1
        prev = BOS
        for w in words[:length]:
            totals[b, n] += np.log(table[prev, w])
            prev = w
    assert_close_f32(out.log_probs, totals, reduction=L)
    assert cut_at_limit[True] > 100 and cut_at_limit[False] > 100, cut_at_limit
    assert np.all(np.diff(np.asarray(out.log_probs), axis=1) <= 0)
    assert np.all(lengths[limits == 1] == 1)  # a limit of 1 leaves room for </s> only


def test_repetition_control_applies_to_samples():
    """``no_repeat_ngram`` and ``min_length`` forbid words as in beam search: no sample repeats a bigram or
    ends before 3 words (where its limit allows), though unblocked samples of this model do both."""
    table = random_table(V, seed=4, concentration=0.2, eos=0.2)
    free = np.asarray(sample(table, 8).tokens).reshape(B * N, L).tolist()
    out = sample(table, 8, no_repeat_ngram=2, min_length=3)
    blocked = np.asarray(out.tokens).reshape(B * N, L).tolist()

    def bigrams(words):
        words = [w for w in words if w not in (PAD, EOS)]
        return [tuple(words[i : i + 2]) for i in range(len(words) - 1)]

    assert any(len(bigrams(w)) > len(set(bigrams(w))) for w in free)
    assert any(w.index(EOS) < 3 for w in free)
    for words, length in zip(blocked, np.asarray(out.lengths).ravel(), strict=True):
        assert length >= 4 and len(bigrams(words)) == len(set(bigrams(words))), words


def test_bad_options_are_one_line_errors_naming_them():
    src, mask = source(2)
    m = model(NUCLEUS)
    for kw, name in (
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(num_samples=0), "num_samples"),
        (dict(ids=[1]), "ids"),
        (dict(ids=[0, -1]), "ids"),
    ):
        with pytest.raises(ValueError, match=name) as e:
            sample_decode(m, src, mask, 0, max_length=3, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="seed"):
        Sampling(seed=-1).check()


# -------------------------------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from tests.test_cli_translate import make_run

    return make_run(tmp_path_factory.mktemp("run"))


def test_translate_sample_writes_the_librarys_samples(run_dir, tmp_path, capsys):
    """``translate --sample`` writes ``--num-samples`` samples per line, as the library draws them; an input
    translated in two pieces (as streamed stdin is) gets the same samples as at once."""
    from attn_jax.cli import main
    from attn_jax.pipeline import load_model, translate_sentences
    from tests.test_cli_translate import SENTENCES

    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    flags = [
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "3",
        "--num-samples",
        "2",
        "--batch-size",
        "2",
    ]
    assert main(["translate", "--workdir", run_dir, "--input", str(src), "--sample", *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    loaded = load_model(run_dir)
    # Batches of 2 rows for all three calls: one compiled sampler.
    options = dict(nbest=2, batch_size=2, sampling=Sampling(temperature=0.8, top_p=0.9, seed=3))
    want = translate_sentences(loaded, SENTENCES, **options)
    expected = [
        f"{i} ||| {h.text} ||| {h.log_prob:.6f} ||| {h.log_prob:.6f}"
        for i, hyps in enumerate(want)
        for h in hyps
    ]
    assert lines == expected
    pieces = translate_sentences(loaded, SENTENCES[:2], **options)
    pieces += translate_sentences(loaded, SENTENCES[2:], first_index=2, **options)
    assert [[h.text for h in hyps] for hyps in pieces] == [[h.text for h in hyps] for hyps in want]
    texts = [h.text for hyps in want for h in hyps if hyps[0].ids]
    assert len(set(texts)) > len(texts) // 2  # the samples differ (an untrained model: a flat distribution)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--sample", "--beam", "4"], "--beam 4 cannot be combined with --sample"),
        (["--sample", "--nbest", "2"], "--nbest cannot be combined with --sample"),
        (["--sample", "--temperature", "0"], "--temperature must be a finite number > 0, got 0.0"),
        (["--sample", "--top-p", "1.5"], "--top-p must be a number in (0, 1], got 1.5"),
        (["--sample", "--top-k", "-1"], "--top-k must be an int >= 0, got -1"),
        (["--top-p", "0.9"], "--top-p applies to sampling only: add --sample"),
    ],
)
def test_bad_sampling_flags_are_one_line_errors(flags, message, tmp_path, capsys):
    from attn_jax.cli import main

    assert main(["translate", "--workdir", str(tmp_path / "none"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attn-jax translate: error: {message}") and err.count("\n") == 1, err
