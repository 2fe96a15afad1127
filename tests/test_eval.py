"""attn_jax.eval: sacreBLEU (overall, by length, No UNK), Pharaoh alignments, AER, heatmaps, tables."""

import json
import math
import struct
import sys

import matplotlib.image
import numpy as np
import pytest
import sacrebleu
from hypothesis import given
from hypothesis import strategies as st

from attn_jax import eval as ev
from attn_jax.data import (
    TEST_BUCKETS,
    UNK_ID,
    SyntheticSpec,
    WordVocabulary,
    assemble_batch,
    corpus_from_pairs,
    encode_corpus,
    generate_synthetic,
    length_bucket,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def corpus():
    """A few real pairs of the built-in corpus (all seven length buckets), with gold alignments."""
    return generate_synthetic(SyntheticSpec(train_size=10, validation_size=5, test_per_bucket=3))["test"]


def _sentences(rng, n, vocab=12, lo=0, hi=75):
    """n space-joined sentences of lo..hi random words over a small vocabulary (so n-grams match often)."""
    words = [f"w{k}" for k in range(vocab)]
    return [" ".join(rng.choice(words, size=int(rng.integers(lo, hi + 1)))) for _ in range(n)]


def _noisy(rng, sentences, p=0.3):
    """Each word replaced with probability p: a hypothesis that partially matches its reference."""
    return [" ".join(w if rng.random() > p else "zz" for w in s.split()) for s in sentences]


# ----------------------------------------------------------------------------------------------------- BLEU


@pytest.mark.parametrize("kwargs", [{}, {"tokenize": "none", "lowercase": True}])
def test_corpus_bleu_equals_sacrebleu(rng, kwargs):
    refs = _sentences(rng, 40, lo=1)
    hyps = _noisy(rng, refs)
    got = ev.corpus_bleu(hyps, refs, **kwargs)
    want = sacrebleu.corpus_bleu(hyps, [refs], **kwargs)
    assert 0 < got.score < 100
    assert got.score == want.score  # same sacreBLEU code path: bit-identical
    assert got.precisions == tuple(want.precisions)
    assert (got.brevity_penalty, got.hyp_len, got.ref_len) == (want.bp, want.sys_len, want.ref_len)
    assert got.num_sentences == 40
    metric = sacrebleu.metrics.BLEU(**kwargs)
    metric.corpus_score(hyps, [refs])
    assert got.signature == str(metric.get_signature())
    assert ("tok:none" in got.signature) == ("tokenize" in kwargs)
    assert json.loads(json.dumps(got.to_dict()))["bleu"] == want.score


def test_bleu_by_length_equals_sacrebleu_on_each_bucket(rng):
    refs = _sentences(rng, 60, lo=1, hi=20)
    hyps = _noisy(rng, refs)
    # Source lengths 0..69 except the 30s, so one bucket is empty.
    lengths = [n for n in range(70) if not 30 <= n < 40][:60]
    sources = [" ".join(["s"] * n) for n in lengths]
    r = ev.bleu_by_length(hyps, refs, sources)
    assert r.overall.score == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert [b.label for b in r.buckets] == ["0-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60+"]
    assert [b.num_sentences for b in r.buckets] == [10, 10, 10, 0, 10, 10, 10]
    for b in r.buckets:
        rows = [k for k, n in enumerate(lengths) if n in b.bucket]
        if not rows:
            assert math.isnan(b.bleu.score) and b.bleu.signature == r.signature
            continue
        want = sacrebleu.corpus_bleu([hyps[k] for k in rows], [[refs[k] for k in rows]])
        assert b.bleu.score == want.score
    # `lengths` overrides the word counts of the sources: everything in the first bucket.
    r0 = ev.bleu_by_length(hyps, refs, sources, lengths=[0] * 60)
    assert r0.buckets[0].bleu.score == r.overall.score and r0.buckets[0].num_sentences == 60


def test_bucket_edges():
    assert [ev.bucket_index(n) for n in (0, 9, 10, 59, 60, 61, 500)] == [0, 0, 1, 5, 6, 6, 6]
    assert [ev.bucket_index(np.int64(n)) for n in (9, 10)] == [0, 1]
    labels = [ev.PAPER_BUCKETS[ev.bucket_index(n)].label for n in (9, 10, 59, 60, 61)]
    assert labels == ["0-9", "10-19", "50-59", "60+", "60+"]
    # The same buckets as the stratified test split of the built-in corpus.
    assert [(b.low, b.high) for b in ev.PAPER_BUCKETS] == list(TEST_BUCKETS)
    assert all(ev.bucket_index(n) == length_bucket(n) for n in range(120))
    custom = ev.length_buckets((5, 6, 30))
    assert [b.label for b in custom] == ["0-4", "5", "6-29", "30+"]
    assert [ev.bucket_index(n, custom) for n in (4, 5, 6, 29, 30)] == [0, 1, 2, 2, 3]
    with pytest.raises(ValueError, match="strictly increasing"):
        ev.length_buckets((10, 10))
    with pytest.raises(ValueError, match="strictly increasing"):
        ev.length_buckets((0, 10))
    with pytest.raises(ValueError, match=">= 0"):
        ev.bucket_index(-1)
    gappy = (ev.LengthBucket(0, 5, "0-4"), ev.LengthBucket(6, None, "6+"))
    with pytest.raises(ValueError, match="tile"):
        ev.bleu_by_length(["a"], ["a"], ["x"], buckets=gappy)


def test_no_unk_bleu(rng):
    refs = _sentences(rng, 30, lo=1, hi=15)
    hyps = _noisy(rng, refs)
    src_unk = [k % 3 == 0 for k in range(30)]
    ref_unk = [k % 5 == 0 for k in range(30)]
    keep = [k for k in range(30) if k % 3 and k % 5]
    r = ev.bleu_no_unk(hyps, refs, source_has_unk=src_unk, reference_has_unk=ref_unk)
    assert r.num_sentences == len(keep) == 16
    assert r.score == sacrebleu.corpus_bleu([hyps[k] for k in keep], [[refs[k] for k in keep]]).score
    assert r.score != ev.corpus_bleu(hyps, refs).score
    by_predicate = ev.bleu_subset(hyps, refs, lambda k: k in keep)
    assert by_predicate == r
    none_kept = ev.bleu_subset(hyps, refs, [False] * 30)
    assert none_kept.num_sentences == 0 and math.isnan(none_kept.score)


def test_no_unk_flags_from_a_word_vocabulary():
    assert ev.UNK_ID == UNK_ID
    # Frequency ties break alphabetically: the 4-word shortlist keeps "cat" and drops "dog".
    src_vocab = WordVocabulary.build(["the dog slept .", "the cat slept ."], max_size=4)
    tgt_vocab = WordVocabulary.build(["a b c d .", "a c b d ."])
    sources = ["the cat slept .", "the dog slept .", "the cat slept ."]
    refs = ["a b c d .", "a c b d .", "a e b d ."]  # "e" is unknown to the target vocabulary
    src_unk = [ev.has_unk(src_vocab.encode(s)) for s in sources]
    ref_unk = [ev.has_unk(tgt_vocab.encode(r)) for r in refs]
    assert src_unk == [False, True, False] and ref_unk == [False, False, True]
    assert [ev.has_unk(tgt_vocab.decode(tgt_vocab.encode(r))) for r in refs] == ref_unk
    r = ev.bleu_no_unk(["a b c d .", "x", "y"], refs, source_has_unk=src_unk, reference_has_unk=ref_unk)
    assert r.num_sentences == 1 and r.score == pytest.approx(100.0)


def test_bleu_bad_input():
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        ev.corpus_bleu(["a", "b"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="2 hypotheses but 1 sources"):
        ev.bleu_by_length(["a", "b"], ["a", "b"], ["x"])
    with pytest.raises(ValueError, match="source sentences or their lengths"):
        ev.bleu_by_length(["a"], ["a"])
    with pytest.raises(ValueError, match="2 hypotheses but 3 source_has_unk"):
        ev.bleu_no_unk(["a", "b"], ["a", "b"], source_has_unk=[False] * 3, reference_has_unk=[False] * 2)
    with pytest.raises(ValueError, match="no sentences"):
        ev.corpus_bleu([], [])
    with pytest.raises(TypeError, match="hypothesis 1 is a int"):
        ev.corpus_bleu(["a", 3], ["a", "b"])
    with pytest.raises(TypeError, match="not one string"):
        ev.corpus_bleu("a b", "a b")


# ----------------------------------------------------------------------------------------------- Alignment


def test_pharaoh_round_trip(corpus):
    for pair in corpus:
        n_src, n_tgt = len(pair.source.split()), len(pair.target.split())
        a = ev.parse_pharaoh(pair.alignment, source_length=n_src, target_length=n_tgt)
        assert a.sure == a.possible  # the built-in corpus has only sure links
        assert ev.format_pharaoh(a) == pair.alignment
        assert ev.format_pharaoh(a.sure) == pair.alignment
    mixed = ev.parse_pharaoh("0-0 1?1 2-1 1-1 3?0")
    assert mixed.sure == {(0, 0), (2, 1), (1, 1)}  # a link both sure and possible is sure
    assert mixed.possible == {(0, 0), (1, 1), (2, 1), (3, 0)}
    assert ev.format_pharaoh(mixed) == "0-0 1-1 2-1 3?0"
    assert ev.parse_pharaoh("") == (frozenset(), frozenset()) and ev.format_pharaoh(()) == ""


@given(st.frozensets(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=40))
def test_pharaoh_round_trip_property(links):
    text = ev.format_pharaoh(links)
    assert ev.parse_pharaoh(text).sure == links
    assert text == " ".join(f"{i}-{j}" for i, j in sorted(links))


def test_pharaoh_bad_input():
    for bad in ("0-", "a-1", "1-2-3", "-1-2", "12", "1:2"):
        with pytest.raises(ValueError, match="bad Pharaoh link"):
            ev.parse_pharaoh(f"0-0 {bad}")
    with pytest.raises(ValueError, match="source index 5 out of range for 5 source words"):
        ev.parse_pharaoh("0-0 5-1", source_length=5, target_length=9)
    with pytest.raises(ValueError, match="target index 2 out of range for 2 target words"):
        ev.parse_pharaoh("0-2", source_length=5, target_length=2)


def test_argmax_alignment_on_a_hand_matrix():
    # [T=4, S=3]; row 1 ties (0.4, 0.4) -> lowest source index; row 3 is fully masked (all zero) -> no link.
    w = np.array(
        [
            [0.1, 0.7, 0.2],
            [0.4, 0.4, 0.2],
            [0.05, 0.15, 0.8],
            [0.0, 0.0, 0.0],
        ]
    )
    assert ev.argmax_alignment(w) == {(1, 0), (0, 1), (2, 2)}
    # Column argmax: source 0 -> target 1, source 1 -> target 0, source 2 -> target 2.
    assert ev.mutual_argmax_alignment(w) == {(1, 0), (0, 1), (2, 2)}
    w2 = np.array([[0.6, 0.4], [0.9, 0.1]])  # source 0's best target is 1; source 1's is 0, which prefers 0
    assert ev.argmax_alignment(w2) == {(0, 0), (0, 1)}
    assert ev.mutual_argmax_alignment(w2) == {(0, 1)}
    assert ev.threshold_alignment(w, 0.4) == {(1, 0), (0, 1), (1, 1), (2, 2)}
    assert ev.threshold_alignment(w, 0.75) == {(2, 2)}
    # The valid sub-matrix decides: dropping the last source column (say </s>) moves target 2 to source 1.
    assert (1, 2) in ev.argmax_alignment(w[:, :2])
    assert ev.argmax_alignment(np.zeros((0, 3))) == frozenset()


def test_hard_alignment_bad_input():
    with pytest.raises(ValueError, match=r"\[T, S\].*shape \(2, 3, 4\)"):
        ev.argmax_alignment(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="NaN"):
        ev.argmax_alignment(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="non-negative"):
        ev.mutual_argmax_alignment(np.array([[-0.5, 1.0]]))
    with pytest.raises(ValueError, match="no source column"):
        ev.argmax_alignment(np.zeros((2, 0)))
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\]"):
        ev.threshold_alignment(np.ones((2, 2)), 0.0)


def test_alignment_matrix_matches_the_batch_gold_layout(corpus):
    """Our [T, S] matrix == attn_jax.data's batched gold[b, j, i] for the same pairs (i source, j target)."""
    pairs = [(p.source, p.target, p.alignment) for p in corpus[:6]]
    pc = corpus_from_pairs(pairs)
    enc = encode_corpus(pc, WordVocabulary.build(pc.sources), WordVocabulary.build(pc.targets))
    length = max(max(len(s.split()), len(t.split())) for s, t, _ in pairs) + 1
    batch = assemble_batch(enc, np.arange(len(pairs)), length, with_gold=True)
    for b, (s, t, a) in enumerate(pairs):
        n, m = len(s.split()), len(t.split())
        mat = ev.alignment_matrix(a, n, m)
        np.testing.assert_array_equal(batch.gold[b, :m, :n], mat)
        assert not batch.gold[b, m:].any() and not batch.gold[b, :, n:].any()
        assert ev.links_from_matrix(batch.gold[b]) == ev.parse_pharaoh(a).sure


def test_perfect_attention_recovers_gold_and_aer_zero(corpus):
    gold = [p.alignment for p in corpus]
    hyps = []
    for p in corpus:
        n, m = len(p.source.split()), len(p.target.split())
        # Attention over the words plus </s> (last column, last row), peaked on each target word's gold source.
        w = np.full((m + 1, n + 1), 0.01) + 0.9 * ev.alignment_matrix(p.alignment, n + 1, m + 1)
        w /= w.sum(axis=1, keepdims=True)
        hyps.append(ev.argmax_alignment(w[:m, :n]))  # the valid sub-matrix: words only
    r = ev.alignment_error_rate(hyps, gold)
    assert r.aer == 0.0 and r.precision == 1.0 and r.recall == 1.0
    assert r.num_sentences == len(corpus) and r.hyp_links == r.sure_links == r.sure_hits > 0
    assert ev.alignment_error_rate(gold, gold).aer == 0.0


def test_aer_of_a_shifted_alignment_by_hand():
    # Sentence 1: gold = diagonal of 5 words; hypothesis = every target word shifted one source word to the
    # right (clipped at the last word): A = {1-0, 2-1, 3-2, 4-3, 4-4}, A∩S = {4-4}.
    # AER = 1 - (1 + 1) / (5 + 5) = 0.8.
    gold1 = "0-0 1-1 2-2 3-3 4-4"
    shifted = {(min(j + 1, 4), j) for j in range(5)}
    r1 = ev.alignment_error_rate([shifted], [gold1])
    assert r1.aer == pytest.approx(0.8, abs=1e-15)
    assert (r1.precision, r1.recall) == (0.2, 0.2)
    # Sentence 2 is perfect (3 links). Corpus level sums counts: 1 - (4 + 4) / (8 + 8) = 0.5, whereas the mean of
    # the per-sentence rates would be (0.8 + 0) / 2 = 0.4.
    r = ev.alignment_error_rate([shifted, "0-0 1-2 2-1"], [gold1, "0-0 1-2 2-1"])
    assert r.aer == pytest.approx(0.5, abs=1e-15)
    assert (r.hyp_links, r.sure_links, r.sure_hits, r.possible_hits) == (8, 8, 4, 4)
    # Sure ⊂ possible: S = {0-0}, P = {0-0, 1-1}, A = {0-0, 1-1, 2-2}: 1 - (1 + 2) / (3 + 1) = 0.25.
    gold = ev.Alignment(frozenset({(0, 0)}), frozenset({(0, 0), (1, 1)}))
    r3 = ev.alignment_error_rate([{(0, 0), (1, 1), (2, 2)}], [gold])
    assert r3.aer == pytest.approx(0.25, abs=1e-15)
    assert ev.alignment_error_rate(["0-0 1-1 2-2"], ["0-0 1?1"]) == r3  # the same gold as Pharaoh text
    assert math.isnan(ev.alignment_error_rate([()], [()]).aer)


@given(
    st.lists(
        st.tuples(
            st.frozensets(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=12),
            st.frozensets(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=12),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_aer_properties(pairs):
    hyps, golds = zip(*pairs, strict=True)
    r = ev.alignment_error_rate(hyps, golds)
    assert 0.0 <= r.aer <= 1.0
    # With S = P, AER is symmetric in A and S and equals one minus the F1 of the links.
    assert ev.alignment_error_rate(golds, hyps).aer == pytest.approx(r.aer, abs=1e-12)
    inter = sum(len(a & g) for a, g in pairs)
    total = sum(len(a) + len(g) for a, g in pairs)
    assert r.aer == pytest.approx(1 - 2 * inter / total, abs=1e-12)
    assert ev.alignment_error_rate(golds, golds).aer == 0.0


def test_aer_bad_input():
    with pytest.raises(ValueError, match="2 hypothesis alignments but 1 gold alignments"):
        ev.alignment_error_rate(["0-0", "0-0"], ["0-0"])
    with pytest.raises(ValueError, match="2 alignments but 1 source_lengths"):
        ev.alignment_error_rate(["0-0", "0-0"], ["0-0", "0-0"], source_lengths=[3])
    with pytest.raises(ValueError, match="hypothesis 1: link 3-0: source index 3 out of range for 3 source"):
        ev.alignment_error_rate([{(0, 0)}, {(3, 0)}], ["0-0", "0-0"], source_lengths=[3, 3])
    with pytest.raises(ValueError, match="target index 4 out of range for 4 target"):
        ev.alignment_error_rate(["0-0"], ["0-4"], target_lengths=[4])
    with pytest.raises(ValueError, match="negative index"):
        ev.alignment_error_rate([{(-1, 0)}], ["0-0"])
    with pytest.raises(ValueError, match="pair of ints"):
        ev.alignment_error_rate([{(0, 1, 2)}], ["0-0"])
    with pytest.raises(TypeError, match="not one string"):
        ev.alignment_error_rate("0-0", "0-0")


# ------------------------------------------------------------------------------------------------ Pictures


def _png_size(path):
    """(width, height) from the IHDR chunk, after checking the PNG signature."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_attention_heatmap_png(tmp_path, corpus):
    pyplot_before = "matplotlib.pyplot" in sys.modules
    p = corpus[-1]  # a 60+ word sentence
    src, tgt = p.source.split(), p.target.split()
    w = np.full((len(tgt), len(src)), 0.02) + ev.alignment_matrix(p.alignment, len(src), len(tgt))
    w /= w.sum(axis=1, keepdims=True)
    path = ev.plot_attention(w, src, tgt, tmp_path / "sub" / "a.png", gold=p.alignment, title="test")
    assert path == str(tmp_path / "sub" / "a.png")
    width, height = ev.attention_figsize(len(src), len(tgt))
    assert _png_size(path) == (round(100 * width), round(100 * height))
    assert width == 2 + 0.25 * len(src)
    img = matplotlib.image.imread(path)
    assert img.shape == (round(100 * height), round(100 * width), 4)
    red = (img[..., 0] > 0.7) & (img[..., 1] < 0.4) & (img[..., 2] < 0.4)
    assert red.sum() > 100  # the gold markers
    plain = ev.plot_attention(w, src, tgt, tmp_path / "b.png", figsize=(5.0, 4.0), dpi=60)
    assert _png_size(plain) == (300, 240)
    assert not _red_pixels(plain)
    assert ("matplotlib.pyplot" in sys.modules) == pyplot_before  # no pyplot, no global backend switch


def _red_pixels(path):
    img = matplotlib.image.imread(path)
    return int(((img[..., 0] > 0.7) & (img[..., 1] < 0.4) & (img[..., 2] < 0.4)).sum())


def test_heatmap_white_is_one(tmp_path):
    """Grayscale with white = 1 (the paper's Figure 3): mostly-one weights render brighter than mostly-zero."""
    w = np.eye(7)[:5]
    words_s, words_t = [f"s{i}" for i in range(7)], [f"t{j}" for j in range(5)]
    bright = matplotlib.image.imread(ev.plot_attention(1 - w, words_s, words_t, tmp_path / "1.png"))
    dark = matplotlib.image.imread(ev.plot_attention(w, words_s, words_t, tmp_path / "0.png"))
    assert bright[..., :3].mean() > dark[..., :3].mean() + 0.2


def test_heatmap_bad_input(tmp_path):
    w = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match=r"\[2, 3\] but there are 2 target and 2 source words"):
        ev.plot_attention(w, ["a", "b"], ["x", "y"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="source index 3 out of range for 3 source words"):
        ev.plot_attention(w, ["a", "b", "c"], ["x", "y"], tmp_path / "x.png", gold="3-0")
    assert not (tmp_path / "x.png").exists()


def _two_systems(rng):
    refs = _sentences(rng, 40, lo=1, hi=12)
    sources = [" ".join(["s"] * (3 * k)) for k in range(40)]  # lengths 0..117: every bucket filled
    enc = ev.bleu_by_length(_noisy(rng, refs, 0.5), refs, sources)
    search = ev.bleu_by_length(_noisy(rng, refs, 0.2), refs, sources)
    return {"RNNenc": enc, "RNNsearch": search}


def test_bleu_by_length_plot_png(tmp_path, rng):
    systems = _two_systems(rng)
    path = ev.plot_bleu_by_length(systems, tmp_path / "bleu.png", title="BLEU by length")
    assert _png_size(path) == (600, 400)
    assert matplotlib.image.imread(path).shape == (400, 600, 4)
    other = ev.bleu_by_length(["a"], ["a"], ["x"], buckets=ev.length_buckets((5,)))
    with pytest.raises(ValueError, match="different length buckets"):
        ev.plot_bleu_by_length({**systems, "other": other}, tmp_path / "bad.png")


# -------------------------------------------------------------------------------------------------- Tables


def test_bleu_by_length_tables(rng):
    systems = _two_systems(rng)
    md = ev.bleu_by_length_markdown(systems)
    lines = md.splitlines()
    assert lines[0] == "| source length | sentences | RNNenc | RNNsearch |"
    for k, label in enumerate(["0-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60+"]):
        e, s = systems["RNNenc"].buckets[k], systems["RNNsearch"].buckets[k]
        assert lines[2 + k] == f"| {label} | {e.num_sentences} | {e.bleu.score:.2f} | {s.bleu.score:.2f} |"
    e, s = systems["RNNenc"].overall, systems["RNNsearch"].overall
    assert lines[9] == f"| all | 40 | {e.score:.2f} | {s.score:.2f} |"
    assert f"sacreBLEU: {e.signature}" in md
    js = json.loads(json.dumps(ev.bleu_by_length_json(systems), allow_nan=False))
    assert js["buckets"][0] == "0-9" and js["rows"][-1]["bucket"] == "all"
    assert js["rows"][3]["bleu"] == {n: r.buckets[3].bleu.score for n, r in systems.items()}
    assert js["rows"][3]["sentences"]["RNNsearch"] == systems["RNNsearch"].buckets[3].num_sentences
    assert js["systems"]["RNNenc"]["overall"]["bleu"] == e.score

    # Empty bucket -> "—" / null; systems scored on different sentences -> per-cell counts.
    a = ev.bleu_by_length(["a b c d"], ["a b c d"], ["x"], buckets=ev.length_buckets((5,)))
    b = ev.bleu_by_length(
        ["a b c d"] * 2, ["a b c d", "a b c e"], ["x", "x"], buckets=ev.length_buckets((5,))
    )
    md2 = ev.bleu_by_length_markdown({"A": a, "B|x": b}, digits=1)
    assert md2.splitlines()[0] == r"| source length | A | B\|x |"
    assert md2.splitlines()[3] == "| 5+ | — (n=0) | — (n=0) |"
    assert md2.splitlines()[2] == f"| 0-4 | 100.0 (n=1) | {b.buckets[0].bleu.score:.1f} (n=2) |"
    assert json.loads(json.dumps(ev.bleu_by_length_json({"A": a}), allow_nan=False))["rows"][1]["bleu"] == {
        "A": None
    }


def test_summary_tables(rng):
    systems = _two_systems(rng)
    aer_enc = ev.alignment_error_rate(["0-0 1-1 2-2 3-3"], ["0-0 1-1 2-3 3-2"])  # AER 0.5
    aer_search = ev.alignment_error_rate(["0-0 1-1 2-2 3-3"], ["0-0 1-1 2-2 3-3"])  # AER 0
    no_unk = ev.bleu_subset(["a b c d", "x"], ["a b c d", "y"], [True, False])
    scores = {
        "RNNenc": ev.SystemScores(systems["RNNenc"].overall, aer=aer_enc),
        "RNNsearch": ev.SystemScores(systems["RNNsearch"].overall, no_unk=no_unk, aer=aer_search),
    }
    lines = ev.summary_markdown(scores).splitlines()
    assert lines[0].startswith("| system | BLEU (all) | sentences | BLEU (No UNK) |")
    e, s = systems["RNNenc"].overall.score, systems["RNNsearch"].overall.score
    assert lines[2] == f"| RNNenc | {e:.2f} | 40 | — | — | 50.00 | 50.00 | 50.00 |"
    assert lines[3] == f"| RNNsearch | {s:.2f} | 40 | 100.00 | 1 | 0.00 | 100.00 | 100.00 |"
    js = json.loads(json.dumps(ev.summary_json(scores), allow_nan=False))
    assert js["RNNenc"]["aer"]["aer"] == 0.5 and js["RNNenc"]["no_unk"] is None
    assert js["RNNsearch"]["bleu"]["bleu"] == s and js["RNNsearch"]["no_unk"]["sentences"] == 1
    with pytest.raises(ValueError, match="no systems"):
        ev.summary_markdown({})
