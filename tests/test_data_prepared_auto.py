"""Large plain corpora are prepared on disk without a flag (``data.prepare_above``): said in one line, trained
step for step as in memory; the batch schedule of a prepared corpus keeps its index arrays on disk."""

import json
import pathlib

import jax
import numpy as np
import pytest

from attn_jax import data
from attn_jax.data._batching import _Spill
from attn_jax.data._corpus import _iter_lines
from attn_jax.train import load_checkpoint, make_inputs
from attn_jax.train._inputs import choose_prepared_dir, count_lines
from tests.test_data_prepared import TRAIN, _config, _losses, _train, _write


@pytest.fixture()
def corpus(tmp_path) -> pathlib.Path:
    d = tmp_path / "corpus"
    d.mkdir()
    _write(d, "train", TRAIN)  # 66 lines: 60 good pairs, 4 over the length limits, 2 with an empty side
    return d


@pytest.mark.slow
def test_a_corpus_over_the_threshold_is_prepared_and_trains_as_in_memory(tmp_path, corpus, capsys):
    # The same compiled program on the same batches: losses and parameters agree bit for bit.
    _train(tmp_path / "memory", corpus, capsys, 3, "data.prepare_above=0")
    auto = tmp_path / "auto"
    out = _train(auto, corpus, capsys, 3, "data.prepare_above=50")
    assert (
        f"data: the training file {corpus}/train.en has 66 lines, over data.prepare_above=50: it is prepared on "
        f"disk in {auto}/prepared and streamed from there (data.prepared_dir chooses the directory; "
        "data.prepare_above=0 reads it into memory)"
    ) in out
    assert f"data: preparing the train split in {auto}/prepared (none is there yet)" in out
    assert (auto / "prepared" / "manifest.json").is_file()
    assert not (tmp_path / "memory" / "prepared").exists()
    memory = _losses(tmp_path / "memory")
    assert [s for s, _ in memory] == [1, 2, 3]
    assert _losses(auto) == memory
    got, want = load_checkpoint(auto, step=3), load_checkpoint(tmp_path / "memory", step=3)
    for a, b in zip(jax.tree.leaves(got.state["params"]), jax.tree.leaves(want.state["params"]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert got.data["schedule"] == want.data["schedule"]
    # Every drop is counted as in memory.
    report = json.loads((auto / "data.json").read_text())["train"]
    assert report == json.loads((tmp_path / "memory" / "data.json").read_text())["train"]


def test_the_threshold_decides_and_an_explicit_directory_wins(tmp_path, corpus):
    lines = []
    work = str(tmp_path / "w")
    assert choose_prepared_dir(_config(corpus), work, log=lines.append) == ""  # the default: 200,000
    assert choose_prepared_dir(_config(corpus, "data.prepare_above=66"), work, log=lines.append) == ""
    assert lines == []
    chosen = choose_prepared_dir(_config(corpus, "data.prepare_above=65"), work, log=lines.append)
    assert chosen == f"{work}/prepared" and len(lines) == 1 and "66 lines" in lines[0]
    explicit = _config(corpus, "data.prepare_above=1", f"data.prepared_dir={tmp_path}/mine")
    assert choose_prepared_dir(explicit, work, log=lines.append) == f"{tmp_path}/mine"
    assert len(lines) == 1


def test_a_corpus_a_prepared_directory_cannot_hold_stays_in_memory_and_says_why(tmp_path, corpus):
    links = tmp_path / "train.links"
    links.write_text("0-0\n" * len(TRAIN))
    config = _config(corpus, "data.prepare_above=10", f"data.alignment_path={tmp_path}/{{split}}.links")
    lines = []
    assert choose_prepared_dir(config, str(tmp_path / "w"), log=lines.append) == ""
    assert lines == [
        f"data: the training file {corpus}/train.en has 66 lines, over data.prepare_above=10, but it is read "
        "into memory: a prepared corpus keeps token ids only, and data.alignment_path is set"
    ]


@pytest.mark.parametrize(
    "text, lines", [(b"", 0), (b"a\n", 1), (b"a\nb", 2), (b"a\r\n\nb\n", 3), (b"\n" * 70_000, 70_000)]
)
def test_count_lines_counts_as_the_readers_split(tmp_path, text, lines):
    path = tmp_path / "f"
    path.write_bytes(text)
    assert count_lines(str(path)) == lines
    assert count_lines(str(path)) == sum(1 for _ in _iter_lines(path))


def test_a_prepared_schedule_keeps_its_indices_on_disk_and_equals_memory(tmp_path, corpus):
    config = _config(corpus)
    memory = make_inputs(config, str(tmp_path / "v0"), reuse_vocab=False)
    disk = make_inputs(config, str(tmp_path / "v1"), reuse_vocab=False, prepared_dir=str(tmp_path / "p"))
    a, b = memory.train.plan, disk.train.plan
    assert all(isinstance(bucket.members, np.ndarray) for bucket in a.buckets)
    assert all(isinstance(bucket.members, _Spill) for bucket in b.buckets)
    assert [(x.length, x.batch_size, x.members.tolist()) for x in a.buckets] == [
        (x.length, x.batch_size, x.members.tolist()) for x in b.buckets
    ]
    assert all(isinstance(rows, _Spill) for rows in b._epoch(0).rows)
    assert b.num_filtered == a.num_filtered == 4
    for k in range(3 * a.batches_per_epoch):  # three epochs, each shuffled afresh
        (ka, ra), (kb, rb) = a.global_batch(k), b.global_batch(k)
        assert ka == kb
        np.testing.assert_array_equal(ra, rb)
    assert sorted(str(p.name) for p in (tmp_path / "p").iterdir()) == [
        "manifest.json",
        "train.src_offsets.npy",
        "train.src_tokens.npy",
        "train.tgt_offsets.npy",
        "train.tgt_tokens.npy",
        "vocab",
    ]  # the schedule's files have no names


def test_the_schedule_is_unchanged_by_reading_lengths_in_blocks(monkeypatch):
    # Blocks of 7 pairs: a bucket's members come from several blocks and keep corpus order.
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=(2, 200))
    offsets = [np.concatenate([[0], np.cumsum(n)]) for n in lengths]
    corpus = data.EncodedCorpus(
        np.zeros(offsets[0][-1], np.int32), offsets[0], np.zeros(offsets[1][-1], np.int32), offsets[1]
    )
    config = data.BatchConfig(batch_size=4, bucket_boundaries=(8, 16, 24), max_source_length=35)
    whole = data.BatchPlan(corpus, config)
    monkeypatch.setattr("attn_jax.data._batching._BLOCK", 7)
    blocks = data.BatchPlan(corpus, config)
    assert [b.members.tolist() for b in blocks.buckets] == [b.members.tolist() for b in whole.buckets]
    assert blocks.buckets[-1].length == 40  # past the last boundary: rounded up from 39 + </s>
    for b in whole.buckets:  # corpus order within a bucket, every kept pair once
        assert b.members.tolist() == sorted(b.members.tolist())
    kept = np.flatnonzero(lengths[0] <= 35)
    assert sorted(np.concatenate([b.members for b in whole.buckets]).tolist()) == kept.tolist()
