"""The built-in synthetic corpus: grammar, translation, gold alignments, determinism, length buckets, TFDS builder."""

import glob
import hashlib
import os
import random

import pytest

from attn_jax.data import (
    TEST_BUCKETS,
    SyntheticSpec,
    generate_synthetic,
    length_bucket,
    parse_alignment,
    parse_source,
    translate_source,
)
from attn_jax.data._lexicon import LEXICON, TARGET_PARTICLES
from attn_jax.data._synthetic import _Sampler, realize

TINY = SyntheticSpec(train_size=200, validation_size=50, test_per_bucket=10)
# sha256 of every (source, target, alignment) of TINY in order. Changing the grammar, lexicon or sampling changes
# the data: bump GENERATOR_VERSION (the TFDS version) and update this hash.
TINY_SHA256 = "ce8d005ad985110c37f54d7c32f828b2edde4cb7084351605d9f7bb4d5c1f71e"


def _digest(splits) -> str:
    h = hashlib.sha256()
    for name in ("train", "validation", "test"):
        for p in splits[name]:
            h.update(f"{name}\t{p.source}\t{p.target}\t{p.alignment}\n".encode())
    return h.hexdigest()


@pytest.fixture(scope="module")
def tiny():
    return generate_synthetic(TINY)


def _t(word):
    return LEXICON.translation[word]


def _part(noun, plural):
    return TARGET_PARTICLES[(LEXICON.gender[noun], plural)]


def test_hand_checked_translations():
    """SOV, adjectives after the noun, no word for 'the', noun -> noun + particle, relative clause and PP first."""
    pair = translate_source("the big dog chased a cat .")
    assert pair.target.split() == [
        _t("dog"),
        _part("dog", False),
        _t("big"),
        _t("cat"),
        _part("cat", False),
        _t("a"),
        _t("chased"),
        ".",
    ]
    assert pair.alignment == "1-2 2-0 2-1 3-6 4-5 5-3 5-4 6-7"

    pair = translate_source("dogs which slept near the lake barked .")
    # [[lake near] slept which] dogs barked .
    assert pair.target.split() == [
        _t("lake"),
        _part("lake", False),
        _t("near"),
        _t("slept"),
        _t("which"),
        _t("dog"),
        _part("dog", True),
        _t("barked"),
        ".",
    ]
    assert pair.alignment == "0-5 0-6 1-4 2-3 3-2 5-0 5-1 6-7 7-8"

    pair = translate_source("the cat slept , because every old red fox quickly ate two apples .")
    assert pair.target.split() == [
        _t("cat"),
        _part("cat", False),
        _t("slept"),
        ",",
        _t("because"),
        _t("fox"),
        _part("fox", False),
        _t("red"),
        _t("old"),
        _t("every"),
        _t("apple"),
        _part("apple", True),
        _t("two"),
        _t("quickly"),
        _t("ate"),
        ".",
    ]


def test_generator_is_deterministic_and_pinned(tiny):
    assert _digest(generate_synthetic(TINY)) == _digest(tiny)
    assert _digest(tiny) == TINY_SHA256
    other = generate_synthetic(SyntheticSpec(train_size=200, validation_size=50, test_per_bucket=10, seed=1))
    assert _digest(other) != _digest(tiny)


def test_sizes_and_test_buckets(tiny):
    assert [len(tiny[s]) for s in ("train", "validation", "test")] == [200, 50, 10 * len(TEST_BUCKETS)]
    counts = [0] * len(TEST_BUCKETS)
    for p in tiny["test"]:
        n = len(p.source.split())
        lo, hi = TEST_BUCKETS[length_bucket(n)]
        assert lo <= n and (hi is None or n < hi)
        counts[length_bucket(n)] += 1
    assert counts == [10] * len(TEST_BUCKETS)
    lengths = [len(p.source.split()) for p in tiny["test"]]
    assert min(lengths) < 10 and max(lengths) >= 60


def test_held_out_splits_do_not_repeat_training_sources(tiny):
    train = {p.source for p in tiny["train"]}
    validation = {p.source for p in tiny["validation"]}
    test = [p.source for p in tiny["test"]]
    assert not validation & train
    assert not set(test) & (train | validation)
    assert len(set(test)) == len(test)


def test_gold_alignments_are_consistent(tiny):
    one_to_many = 0
    for split in tiny.values():
        for p in split:
            src, tgt = p.source.split(), p.target.split()
            links = parse_alignment(p.alignment)
            assert links == sorted(set(links))
            assert all(0 <= i < len(src) and 0 <= j < len(tgt) for i, j in links)
            # Every target word is aligned to exactly one source word ...
            assert sorted(j for _, j in links) == list(range(len(tgt)))
            # ... and the only unaligned source words are the articles "the".
            aligned = {i for i, _ in links}
            assert [w for k, w in enumerate(src) if k not in aligned] == [w for w in src if w == "the"]
            # Aligned words translate each other through the lexicon (nouns: stem + particle).
            for i, j in links:
                word = LEXICON.noun_of_plural.get(src[i], src[i])
                assert tgt[j] == LEXICON.translation[word] or tgt[j] in TARGET_PARTICLES.values()
            fan_out = [sum(1 for i2, _ in links if i2 == i) for i in aligned]
            one_to_many += max(fan_out) > 1
    assert one_to_many > 0.9 * sum(len(s) for s in tiny.values())


def test_target_is_a_function_of_the_source(tiny):
    """The grammar is LL(1): parsing a generated source gives back the tree, and translating it gives the pair."""
    for split in tiny.values():
        for p in split:
            assert translate_source(p.source) == p
    rng = random.Random(7)
    sampler = _Sampler(rng)
    for length in range(3, 90, 3):
        tree = sampler.sentence(length)
        assert parse_source(realize(tree).source) == tree


def test_reordering_is_long_distance(tiny):
    """Long sentences need reordering: some link jumps far from the diagonal (the point of attention)."""
    long_pairs = [p for p in tiny["test"] if len(p.source.split()) >= 60]
    jumps = [max(abs(i - j) for i, j in parse_alignment(p.alignment)) for p in long_pairs]
    assert min(jumps) >= 5 and max(jumps) >= 15


@pytest.mark.parametrize(
    "sentence, message",
    [
        ("the dog slept", "expected END"),
        ("the dog slept . the", "word 4: text after"),
        ("a dogs slept .", "does not agree"),
        ("dog slept .", "does not agree"),
        ("the dog florped .", "not in the synthetic source lexicon"),
        ("the dog slept but the cat slept .", "needs comma"),
        ("the dog slept , and the cat slept .", "takes no comma"),
        ("the dog chased .", "word 3: expected N/NP"),
    ],
)
def test_parse_rejects_ungrammatical_sentences(sentence, message):
    with pytest.raises(ValueError) as e:
        parse_source(sentence)
    assert message in str(e.value)


def test_lexicon_has_hundreds_of_words_per_class():
    assert len(LEXICON.nouns) >= 300
    assert len(LEXICON.adjectives) >= 150
    assert len(LEXICON.transitive_verbs) + len(LEXICON.intransitive_verbs) >= 200
    assert len(LEXICON.adverbs) >= 70 and len(LEXICON.prepositions) >= 25
    # Source and target vocabularies do not share words (except punctuation).
    shared = set(LEXICON.source_vocabulary()) & set(LEXICON.target_vocabulary())
    assert shared == {",", "."}


def test_spec_validation():
    with pytest.raises(ValueError, match="min_length"):
        SyntheticSpec(min_length=2)
    with pytest.raises(ValueError, match="sizes"):
        SyntheticSpec(train_size=-1)


# ---------------------------------------------------------------------------------------------------------------
# TFDS builder.


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import tensorflow_datasets as tfds

    import attn_jax.data  # noqa: F401  registers the builder

    dirs = [tmp_path_factory.mktemp(f"tfds{k}") for k in range(2)]
    for d in dirs:
        tfds.builder("attn_jax_synthetic/tiny", data_dir=str(d)).download_and_prepare()
    return dirs


def test_tfds_builder_loads_the_generator_pairs(built, tiny):
    import tensorflow_datasets as tfds

    for split in ("train", "validation", "test"):
        ds = tfds.load("attn_jax_synthetic/tiny", split=split, data_dir=str(built[0]), download=False)
        got = [
            (ex["source"].decode(), ex["target"].decode(), ex["alignment"].decode())
            for ex in tfds.as_numpy(ds)
        ]
        assert got == [tuple(p) for p in tiny[split]]
    info = tfds.builder("attn_jax_synthetic/tiny", data_dir=str(built[0])).info
    assert info.splits["test"].num_examples == 70
    assert info.supervised_keys == ("source", "target")


def test_tfds_builds_are_byte_identical(built):
    def files(d):
        paths = sorted(glob.glob(os.path.join(d, "attn_jax_synthetic", "tiny", "*", "*.tfrecord*")))
        return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}

    a, b = files(str(built[0])), files(str(built[1]))
    assert len(a) == 3 and a == b


def test_load_synthetic_corpus(built, tiny):
    from attn_jax.data import load_synthetic_corpus

    corpus = load_synthetic_corpus("test", "tiny", data_dir=str(built[0]))
    assert corpus.sources == tuple(p.source for p in tiny["test"])
    assert corpus.alignments == tuple(p.alignment for p in tiny["test"])


def test_docstring_examples():
    import doctest

    from attn_jax.data import _synthetic, _vocab

    for module in (_synthetic, _vocab):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0


def test_imports_stay_light():
    """`import attn_jax` never loads the data package, and `import attn_jax.data` does not load TensorFlow."""
    import subprocess
    import sys

    code = (
        "import sys, attn_jax\n"
        "assert 'attn_jax.data' not in sys.modules and 'tensorflow' not in sys.modules\n"
        "import attn_jax.data\n"
        "assert 'tensorflow' not in sys.modules, 'attn_jax.data imported tensorflow'\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"}
    )
