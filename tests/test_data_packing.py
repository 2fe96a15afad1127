"""Packing several pairs per row: first-fit placement, the packed layout, the packed schedule."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_jax.data import (
    PAD_ID,
    BatchConfig,
    EncodedCorpus,
    PackedPlan,
    assemble_batch,
    assemble_packed_batch,
    make_batch_iterator,
    pack_pairs,
)
from tests.reference.segments import segment_positions_ref


def _fake(lengths, seed=0):
    """An EncodedCorpus with the given (source, target) lengths and random ids >= 4."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 50, n).tolist() for n, _ in lengths]
    tgt = [rng.integers(4, 50, m).tolist() for _, m in lengths]
    cat = lambda seqs: np.array([t for s in seqs for t in s], np.int32)
    offs = lambda seqs: np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    return EncodedCorpus(cat(src), offs(src), cat(tgt), offs(tgt), None, "fake")


def _first_fit_ref(src, tgt, ws, wt, order):
    """First-fit in plain Python lists: each pair to the first open row with room on both sides."""
    rows, free = [], []
    dropped = []
    for i in order:
        if src[i] > ws or tgt[i] > wt:
            dropped.append(i)
            continue
        for r, (fs, ft) in enumerate(free):
            if fs >= src[i] and ft >= tgt[i]:
                rows[r].append(i)
                free[r] = (fs - src[i], ft - tgt[i])
                break
        else:
            rows.append([i])
            free.append((ws - src[i], wt - tgt[i]))
    return rows, sorted(dropped)


@given(
    st.lists(st.tuples(st.integers(1, 14), st.integers(1, 14)), min_size=0, max_size=60),
    st.integers(1, 12),
    st.integers(1, 12),
    st.randoms(use_true_random=False),
)
def test_pack_pairs_places_every_pair_once_or_reports_it(needs, ws, wt, rnd):
    src = [s for s, _ in needs]
    tgt = [t for _, t in needs]
    order = list(range(len(needs)))
    rnd.shuffle(order)
    p = pack_pairs(src, tgt, ws, wt, order=order)
    placed = np.concatenate(p.rows) if p.rows else np.zeros(0, np.int64)
    # exactly once: placed and dropped partition the pairs
    assert sorted(placed.tolist() + p.dropped.tolist()) == list(range(len(needs)))
    # dropped iff longer than a row on either side: never silently
    assert p.dropped.tolist() == [i for i in range(len(needs)) if src[i] > ws or tgt[i] > wt]
    for row in p.rows:
        assert len(row) >= 1
        assert sum(src[i] for i in row) <= ws and sum(tgt[i] for i in row) <= wt
    assert p.src_used == sum(src[i] for i in placed) and p.tgt_used == sum(tgt[i] for i in placed)
    # the very rows first-fit gives (the reference is independent: lists, no NumPy)
    rows, dropped = _first_fit_ref(src, tgt, ws, wt, order)
    assert [r.tolist() for r in p.rows] == rows
    assert p.dropped.tolist() == dropped


def test_pack_pairs_by_hand_and_summary():
    p = pack_pairs([3, 4, 2, 1, 9], [3, 4, 2, 1, 1], 5, 5)
    # pair 2 goes back to row 0's tail (sequential packing would open a third row for it)
    assert [r.tolist() for r in p.rows] == [[0, 2], [1, 3]]
    assert p.dropped.tolist() == [4]
    line = p.summary()
    assert "4 pairs into 2 rows" in line and "1 pairs longer than a row dropped" in line


def test_pack_pairs_refuses_bad_input():
    with pytest.raises(ValueError, match="positive int"):
        pack_pairs([1], [1], 0, 4)
    with pytest.raises(ValueError, match="one N"):
        pack_pairs([1, 2], [1], 4, 4)
    with pytest.raises(ValueError, match="distinct"):
        pack_pairs([1, 2], [1, 2], 4, 4, order=[0, 0])
    with pytest.raises(ValueError, match="at least one"):
        pack_pairs([0], [1], 4, 4)


def test_packed_rows_hold_each_pair_as_it_is_alone():
    corpus = _fake([(3, 2), (1, 4), (5, 5), (2, 1)], seed=3)
    rows = [np.array([0, 1]), None, np.array([3, 2])]
    width = 10
    packed = assemble_packed_batch(corpus, rows, width)
    alone = assemble_batch(corpus, np.arange(4), width)  # row i: pair i, unpacked
    for b, members in enumerate(rows):
        if members is None:
            assert np.all(packed.src == PAD_ID) if b == 0 else np.all(packed.src[b] == PAD_ID)
            assert packed.example_id[b] == -1 and packed.src_len[b] == 0 and packed.tgt_len[b] == 0
            assert np.all(packed.src_segments[b] == 0) and np.all(packed.tgt_segments[b] == 0)
            continue
        a = c = 0
        for k, i in enumerate(members, start=1):
            ls, lt = alone.src_len[i], alone.tgt_len[i]
            np.testing.assert_array_equal(packed.src[b, a : a + ls], alone.src[i, :ls])
            np.testing.assert_array_equal(packed.tgt_in[b, c : c + lt], alone.tgt_in[i, :lt])
            np.testing.assert_array_equal(packed.tgt_out[b, c : c + lt], alone.tgt_out[i, :lt])
            assert np.all(packed.src_segments[b, a : a + ls] == k) and np.all(
                packed.tgt_segments[b, c : c + lt] == k
            )
            a, c = a + ls, c + lt
        assert packed.src_len[b] == a and packed.tgt_len[b] == c
        assert np.all(packed.src[b, a:] == PAD_ID) and np.all(packed.src_segments[b, a:] == 0)
        assert np.all(packed.tgt_out[b, c:] == PAD_ID) and np.all(packed.tgt_segments[b, c:] == 0)
        assert packed.example_id[b] == members[0]
    np.testing.assert_array_equal(packed.src_positions, segment_positions_ref(packed.src_segments))
    np.testing.assert_array_equal(packed.tgt_positions, segment_positions_ref(packed.tgt_segments))
    with pytest.raises(ValueError, match="need more than"):
        assemble_packed_batch(corpus, [np.array([2, 0, 1])], width)


def test_packed_plan_covers_every_kept_pair_once_per_epoch():
    rng = np.random.default_rng(0)
    lengths = [(int(rng.integers(1, 12)), int(rng.integers(1, 12))) for _ in range(90)] + [(20, 3)]
    corpus = _fake(lengths)
    config = BatchConfig(
        batch_size=4, bucket_boundaries=(8, 16), max_source_length=12, num_epochs=2, drop_remainder=False
    )
    it = make_batch_iterator(corpus, config, pack=True, prefetch=0)
    plan = it.plan
    assert isinstance(plan, PackedPlan) and plan.width == 16 and plan.num_filtered == 1
    assert plan.shapes == [(4, 16)]
    batches = list(it)
    assert len(batches) == 2 * plan.batches_per_epoch
    per_epoch = plan.batches_per_epoch
    for e in range(2):
        seen = []
        for batch in batches[e * per_epoch : (e + 1) * per_epoch]:
            assert batch.src.shape == (4, 16) and batch.gold is None
            for b in range(4):
                if batch.example_id[b] >= 0:
                    k = batch.src_segments[b].max()
                    starts = [
                        j for j in range(16) if batch.src_positions[b, j] == 0 and batch.src_segments[b, j]
                    ]
                    assert len(starts) == k
                    seen.append(batch.example_id[b])
        # every row once per epoch (example_id is a row's first pair); every kept pair sits in one row
        assert sorted(seen) == sorted(int(r[0]) for r in plan.packing.rows)
    assert sorted(np.concatenate(plan.packing.rows).tolist()) == list(range(90))
    # fewer rows than pairs: packing did something
    assert len(plan.packing.rows) < 90


def test_packed_iterator_resumes_exactly_and_refuses_gold():
    corpus = _fake([(3, 3)] * 40, seed=1)
    config = BatchConfig(batch_size=2, bucket_boundaries=(8,))
    a = make_batch_iterator(corpus, config, pack=True, prefetch=0)
    for _ in range(3):
        next(a)
    state = a.get_state()
    b = make_batch_iterator(corpus, config, pack=True, prefetch=0)
    b.set_state(state)
    x, y = next(a), next(b)
    assert all(np.array_equal(u, v) for u, v in zip(x, y, strict=True) if u is not None)
    unpacked = make_batch_iterator(corpus, config, prefetch=0)
    with pytest.raises(ValueError, match="another corpus"):
        unpacked.set_state(state)  # a packed position never resumes an unpacked run
    with pytest.raises(ValueError, match="gold"):
        make_batch_iterator(corpus, config, pack=True, with_gold=True, prefetch=0)
