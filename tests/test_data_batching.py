"""Batching: fixed padded shapes, filtering, token budgets, seeded shuffling, exact resumption, process shards."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_jax.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    BatchConfig,
    BatchPlan,
    CorpusError,
    EncodedCorpus,
    SyntheticSpec,
    WordVocabulary,
    corpus_from_pairs,
    encode_corpus,
    generate_synthetic,
    make_batch_iterator,
    parse_alignment,
)


@pytest.fixture(scope="module")
def corpus():
    return corpus_from_pairs(
        generate_synthetic(SyntheticSpec(train_size=400, validation_size=1, test_per_bucket=1))["train"]
    )


@pytest.fixture(scope="module")
def vocabs(corpus):
    return WordVocabulary.build(corpus.sources), WordVocabulary.build(corpus.targets, max_size=500)


@pytest.fixture(scope="module")
def encoded(corpus, vocabs):
    return encode_corpus(corpus, *vocabs)


def _fake(lengths, seed=0):
    """An EncodedCorpus with the given (source, target) lengths and random ids >= 4."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 50, n).tolist() for n, _ in lengths]
    tgt = [rng.integers(4, 50, m).tolist() for _, m in lengths]
    cat = lambda seqs: np.array([t for s in seqs for t in s], np.int32)
    offs = lambda seqs: np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    return EncodedCorpus(cat(src), offs(src), cat(tgt), offs(tgt), None, "fake")


def _equal(a, b):
    return all((x is None and y is None) or np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _check_batch(batch, corpus: EncodedCorpus, add_source_eos=True):
    """Every row holds its pair, with the documented specials and padding."""
    B, L = batch.src.shape
    assert batch.tgt_in.shape == batch.tgt_out.shape == (B, L)
    for arr in (batch.src, batch.tgt_in, batch.tgt_out, batch.src_len, batch.tgt_len, batch.example_id):
        assert arr.dtype == np.int32
    for b in range(B):
        i = batch.example_id[b]
        if i < 0:
            assert batch.src_len[b] == batch.tgt_len[b] == 0
            assert not batch.src[b].any() and not batch.tgt_in[b].any() and not batch.tgt_out[b].any()
            continue
        s, t = corpus.source(i), corpus.target(i)
        want_src = list(s) + ([EOS_ID] if add_source_eos else [])
        assert batch.src[b].tolist() == want_src + [PAD_ID] * (L - len(want_src))
        assert batch.tgt_in[b].tolist() == [BOS_ID, *t] + [PAD_ID] * (L - len(t) - 1)
        assert batch.tgt_out[b].tolist() == [*t, EOS_ID] + [PAD_ID] * (L - len(t) - 1)
        assert batch.src_len[b] == len(want_src) and batch.tgt_len[b] == len(t) + 1
        assert batch.src_mask[b].sum() == batch.src_len[b] and batch.tgt_mask[b].sum() == batch.tgt_len[b]


def test_one_epoch_covers_every_pair_once_in_fixed_shapes(encoded):
    config = BatchConfig(batch_size=16, shuffle=True, num_epochs=1, drop_remainder=False)
    it = make_batch_iterator(encoded, config)
    batches = list(it)
    assert len(batches) == it.plan.batches_per_epoch
    shapes = {b.src.shape for b in batches}
    assert shapes == set(it.shapes) and len(shapes) <= len(config.bucket_boundaries)
    for length in {s[1] for s in shapes}:
        assert length in config.bucket_boundaries
    ids = np.concatenate([b.example_id for b in batches])
    assert sorted(ids[ids >= 0].tolist()) == list(range(len(encoded)))
    for b in batches:
        _check_batch(b, encoded)
        # The bucket is the smallest boundary that fits: the row would not fit the next smaller one.
        need = np.maximum(b.src_len, b.tgt_len)
        assert need.max() <= b.src.shape[1]
        smaller = [x for x in config.bucket_boundaries if x < b.src.shape[1]]
        if smaller:
            assert need[b.example_id >= 0].min() > smaller[-1]


def test_drop_remainder_keeps_only_full_batches(encoded):
    it = make_batch_iterator(encoded, BatchConfig(batch_size=16, num_epochs=1, drop_remainder=True))
    batches = list(it)
    assert all((b.example_id >= 0).all() for b in batches)
    assert len(batches) == sum(len(bk.members) // 16 for bk in it.plan.buckets)


def test_length_filter(encoded):
    config = BatchConfig(
        batch_size=8, max_source_length=30, max_target_length=35, num_epochs=1, drop_remainder=False
    )
    it = make_batch_iterator(encoded, config)
    ids = np.concatenate([b.example_id for b in it])
    ids = ids[ids >= 0]
    keep = (encoded.src_lengths <= 30) & (encoded.tgt_lengths <= 35)
    assert sorted(ids.tolist()) == np.flatnonzero(keep).tolist()
    assert it.plan.num_filtered == (~keep).sum() > 0
    with pytest.raises(CorpusError, match=r"no pairs left after the length filter \(max_source_length=2"):
        make_batch_iterator(encoded, BatchConfig(max_source_length=2))


def test_token_budget(encoded):
    config = BatchConfig(batch_size=None, tokens_per_batch=500, batch_multiple=4, num_epochs=1)
    it = make_batch_iterator(encoded, config)
    for (b, length), bucket in zip(it.shapes, it.plan.buckets, strict=False):
        assert b * length <= 500 and b % 4 == 0 and (b + 4) * length > 500
        assert bucket.length == length
    assert {b.src.shape for b in it} <= set(it.shapes)


def test_long_pairs_get_an_extra_bucket():
    corpus = _fake([(3, 3), (40, 2), (5, 70)])
    plan = BatchPlan(corpus, BatchConfig(batch_size=1, bucket_boundaries=(8, 16)))
    # One extra boundary, the longest need (71) rounded up to a multiple of 8, takes both long pairs.
    assert [(b.length, b.members.tolist()) for b in plan.buckets] == [(8, [0]), (72, [1, 2])]


def test_shuffle_is_seeded_and_changes_every_epoch(encoded):
    def order(seed, epochs):
        config = BatchConfig(batch_size=8, seed=seed, num_epochs=epochs, drop_remainder=False)
        it = make_batch_iterator(encoded, config, prefetch=0)
        return [b.example_id.tolist() for b in it]

    a, b = order(0, 2), order(0, 2)
    assert a == b
    n = len(a) // 2
    assert a[:n] != a[n:]  # epoch 2 is a different permutation of the same pairs
    assert sorted(sum(a[:n], [])) == sorted(sum(a[n:], []))
    assert order(1, 1) != a[:n]
    # Unshuffled: buckets shortest first, corpus order inside each bucket.
    unshuffled = list(make_batch_iterator(encoded, BatchConfig(batch_size=8, shuffle=False, num_epochs=1)))
    lengths = [b.src.shape[1] for b in unshuffled]
    assert lengths == sorted(lengths)
    assert all(np.all(np.diff(b.example_id) > 0) for b in unshuffled)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_resume_reproduces_the_batch_sequence(encoded, prefetch):
    config = BatchConfig(batch_size=16, seed=3, num_epochs=3)
    reference = list(make_batch_iterator(encoded, config, prefetch=prefetch))
    per_epoch = len(reference) // 3
    for stop in (0, 5, per_epoch, per_epoch + 2):  # mid-epoch and across an epoch boundary
        it = make_batch_iterator(encoded, config, prefetch=prefetch)
        for _ in range(stop):
            next(it)
        state = json.loads(json.dumps(it.get_state()))  # survives a JSON checkpoint
        assert state["next_index"] == stop
        resumed = make_batch_iterator(encoded, config, prefetch=prefetch)
        resumed.set_state(state)
        rest = list(resumed)
        assert len(rest) == len(reference) - stop
        assert all(_equal(x, y) for x, y in zip(rest, reference[stop:], strict=True))


def test_state_from_another_pipeline_is_refused(encoded):
    state = make_batch_iterator(encoded, BatchConfig(batch_size=16)).get_state()
    other = make_batch_iterator(encoded, BatchConfig(batch_size=16, seed=1))
    with pytest.raises(ValueError, match="saved for another corpus, batch config or process"):
        other.set_state(state)
    shard = make_batch_iterator(encoded, BatchConfig(batch_size=16), process_index=0, process_count=2)
    with pytest.raises(ValueError, match="another"):
        shard.set_state(state)


def test_two_processes_split_every_global_batch(encoded):
    config = BatchConfig(
        batch_size=None, tokens_per_batch=700, batch_multiple=2, num_epochs=2, drop_remainder=False
    )
    whole = list(make_batch_iterator(encoded, config))
    shards = [list(make_batch_iterator(encoded, config, process_index=p, process_count=2)) for p in range(2)]
    assert len(shards[0]) == len(shards[1]) == len(whole)
    for g, a, b in zip(whole, *shards, strict=True):
        assert a.src.shape == b.src.shape == (g.src.shape[0] // 2, g.src.shape[1])
        for field in range(6):
            assert np.array_equal(np.concatenate([a[field], b[field]]), g[field])
    with pytest.raises(ValueError, match="not divisible by process_count=2"):
        make_batch_iterator(encoded, BatchConfig(batch_size=3), process_index=1, process_count=2)
    with pytest.raises(ValueError, match="process_index < process_count"):
        make_batch_iterator(encoded, BatchConfig(batch_size=4), process_index=2, process_count=2)


def test_gold_alignment_matrix(corpus, encoded):
    it = make_batch_iterator(encoded, BatchConfig(batch_size=8, num_epochs=1), with_gold=True)
    for batch in it:
        B, L = batch.src.shape
        assert batch.gold.shape == (B, L, L) and batch.gold.dtype == bool
        for b in range(B):
            i = batch.example_id[b]
            links = parse_alignment(corpus.alignments[i])
            assert batch.gold[b].sum() == len(links)
            for si, tj in links:
                assert batch.gold[b, tj, si]
            # Each label position of a target word (not </s>, not padding) has exactly one gold source word.
            n = batch.tgt_len[b] - 1
            assert (batch.gold[b, :n].sum(-1) == 1).all() and not batch.gold[b, n:].any()
            assert not batch.gold[b, :, batch.src_len[b] - 1 :].any()  # never </s> or padding


def test_gold_needs_word_level_alignments(corpus, vocabs):
    from attn_jax.data import SentencePieceVocabulary

    spm = SentencePieceVocabulary.train(corpus.targets, vocab_size=200)
    enc = encode_corpus(corpus, vocabs[0], spm)
    assert enc.alignments is None
    with pytest.raises(ValueError, match="no word-level gold alignments"):
        make_batch_iterator(enc, BatchConfig(batch_size=8), with_gold=True)


def test_no_source_eos(encoded):
    it = make_batch_iterator(encoded, BatchConfig(batch_size=8, num_epochs=1, add_source_eos=False))
    for batch in it:
        _check_batch(batch, encoded, add_source_eos=False)


def test_config_validation(encoded):
    with pytest.raises(ValueError, match="exactly one of batch_size"):
        BatchConfig(batch_size=8, tokens_per_batch=100)
    with pytest.raises(ValueError, match="bucket_boundaries must be increasing"):
        BatchConfig(bucket_boundaries=(16, 8))
    with pytest.raises(ValueError, match="multiple of batch_multiple"):
        BatchConfig(batch_size=6, batch_multiple=4)
    with pytest.raises(CorpusError, match="no complete batch"):
        make_batch_iterator(_fake([(3, 3)] * 5), BatchConfig(batch_size=8))


@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=60),
    batch_size=st.integers(1, 9),
    boundaries=st.lists(st.integers(2, 50), min_size=1, max_size=4, unique=True).map(
        lambda b: tuple(sorted(b))
    ),
    seed=st.integers(0, 3),
)
def test_property_every_pair_once_per_epoch(lengths, batch_size, boundaries, seed):
    corpus = _fake(lengths, seed)
    config = BatchConfig(
        batch_size=batch_size, bucket_boundaries=boundaries, seed=seed, num_epochs=2, drop_remainder=False
    )
    it = make_batch_iterator(corpus, config, prefetch=0)
    batches = list(it)
    n = it.plan.batches_per_epoch
    for epoch in (batches[:n], batches[n:]):
        ids = np.concatenate([b.example_id for b in epoch])
        assert sorted(ids[ids >= 0].tolist()) == list(range(len(lengths)))
    assert {b.src.shape for b in batches} <= set(it.shapes)
    assert len(it.shapes) <= len(boundaries) + 1
    for b in batches:
        _check_batch(b, corpus)
