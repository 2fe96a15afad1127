"""Token-budget batches (``data.batch_tokens``): no batch over the budget in any bucket, packed or not, with a
data-axis multiple; the start-up report's numbers against a count of the batches; the config key and its errors."""

import pathlib

import numpy as np
import pytest

from attn_jax.data import BatchConfig, make_batch_iterator
from attn_jax.train import (
    ConfigError,
    apply_overrides,
    check_config,
    default_config,
    load_config,
    make_inputs,
)
from attn_jax.train._inputs import describe_batches
from tests.test_data_batching import _fake

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
BOUNDARIES = (8, 16, 24, 32, 48, 64)


@pytest.fixture(scope="module")
def corpus():
    """1,500 pairs of 1 to 60 tokens a side, the target within 2 of the source: every bucket of BOUNDARIES
    gets several batches."""
    rng = np.random.default_rng(7)
    src = rng.integers(1, 61, 1500)
    tgt = np.clip(src + rng.integers(-2, 3, 1500), 1, 60)
    return _fake(list(zip(src.tolist(), tgt.tolist(), strict=True)), seed=3)


def _count(batches, packed):
    """``{padded length: (rows, batches, pairs, real source tokens, real target tokens)}``, counted from the
    batches themselves."""
    counts = {}
    for b in batches:
        rows, length = b.src.shape
        pairs = int(b.src_segments.max(axis=1).sum()) if packed else int((b.example_id >= 0).sum())
        old = counts.get(length, (rows, 0, 0, 0, 0))
        assert old[0] == rows  # one batch size per bucket
        counts[length] = (
            rows,
            old[1] + 1,
            old[2] + pairs,
            old[3] + int(b.src_len.sum()),
            old[4] + int(b.tgt_len.sum()),
        )
    return counts


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("multiple", [1, 3])
def test_no_batch_over_the_budget(corpus, pack, multiple):
    budget = 400
    config = BatchConfig(
        batch_size=None,
        tokens_per_batch=budget,
        batch_multiple=multiple,
        bucket_boundaries=BOUNDARIES,
        num_epochs=1,
        seed=5,
    )
    it = make_batch_iterator(corpus, config, pack=pack, prefetch=0)
    batches = list(it)
    for b in batches:
        rows, length = b.src.shape
        assert b.tgt_in.shape == b.tgt_out.shape == (rows, length)
        assert rows * length <= budget and rows % multiple == 0
        assert (rows + multiple) * length > budget  # the most rows the budget holds, not fewer
    counted = _count(batches, pack)
    # unpacked: every bucket made batches (short sentences, big batches); packed: one width, that of the longest
    assert sorted(counted) == ([64] if pack else list(BOUNDARIES))
    if not pack:
        assert counted[8][0] == 50 // multiple * multiple and counted[64][0] == 6
    # every kept pair once (drop_remainder drops each bucket's last incomplete batch)
    stats = it.plan.bucket_stats(corpus)
    assert {s.length: (s.rows, s.batches, s.pairs, s.src_tokens, s.tgt_tokens) for s in stats} == counted
    assert all(s.budget_rows == budget // s.length for s in stats)


def test_a_budget_below_the_multiple_is_an_error(corpus):
    config = BatchConfig(
        batch_size=None, tokens_per_batch=100, batch_multiple=2, bucket_boundaries=BOUNDARIES
    )
    with pytest.raises(
        ValueError,
        match=r"holds 1 row\(s\) of padded length 64, fewer than the batch multiple 2; raise it to at least 128",
    ) as e:
        make_batch_iterator(corpus, config)
    assert "\n" not in str(e.value)


def test_config_key():
    assert default_config().data.batch_tokens == 0
    config = apply_overrides(default_config(), ["config.data.batch_tokens=4096"])
    check_config(config)
    assert config.data.batch_tokens == 4096
    with pytest.raises(ConfigError, match=r"data.batch_tokens must be >= 0, got -1"):
        check_config(apply_overrides(default_config(), ["data.batch_tokens=-1"]))
    # the data axis rounds token batches' rows; batch_size no longer has to divide by it
    mesh = ["parallel.strategy=data", "parallel.data=3", "data.eval_batch_size=81", "data.batch_size=80"]
    with pytest.raises(ConfigError, match="data.batch_size=80 must be a multiple of parallel.data=3"):
        check_config(apply_overrides(default_config(), mesh))
    check_config(apply_overrides(default_config(), [*mesh, "data.batch_tokens=4096"]))


def _smoke(*overrides):
    base = ["data.bucket_boundaries=8,12,16", "data.synthetic_spec.max_length=12", "data.prefetch=0"]
    return apply_overrides(load_config(f"{CONFIGS / 'transformer_cpu.py'}:smoke"), [*base, *overrides])


@pytest.mark.parametrize("pack", [False, True])
def test_start_up_report_matches_a_count(tmp_path, pack):
    """The trainer's inputs under a data axis of 3: rows rounded down to a multiple of it, and the start-up
    lines' figures equal to a count over epoch 0's batches."""
    config = _smoke("data.batch_tokens=200", f"data.pack={pack}")
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False, data_axis=3)
    n = inputs.train.plan.batches_per_epoch
    counted = _count([next(inputs.train) for _ in range(n)], pack)
    lines = describe_batches(config, inputs.batch_stats)
    assert lines[0].startswith("data: token batches (data.batch_tokens=200): rows × padded length <= 200")
    assert len(lines) == len(counted) + 2
    for line, (length, (rows, batches, pairs, src, tgt)) in zip(
        lines[1:], sorted(counted.items()), strict=False
    ):
        assert rows % 3 == 0 and rows * length <= 200 and (rows + 3) * length > 200
        rounded = f", the budget's {200 // length} rows rounded down to a multiple of the data axis"
        padded = batches * rows * length
        assert line == (
            f"data:   length {length}: {rows} rows a batch ({rows * length} padded tokens"
            f"{rounded if rows != 200 // length else ''}), {batches} batches, {pairs / batches:.1f} sentences and "
            f"{src / batches:.0f} source / {tgt / batches:.0f} target real tokens a batch "
            f"({src / padded:.1%} / {tgt / padded:.1%} of padded)"
        )
    total = [sum(c[i] for c in counted.values()) for i in range(1, 5)]
    padded = sum(c[0] * c[1] * length for length, c in counted.items())
    assert lines[-1].startswith(
        f"data:   in all: {total[0]} batches of {total[1]:,} sentences, {total[2]:,} source"
    )
    assert lines[-1].endswith(f"of {padded:,} padded ({total[2] / padded:.1%} / {total[3] / padded:.1%})")


def test_a_budget_too_small_for_the_data_axis_names_the_key(tmp_path):
    config = _smoke("data.batch_tokens=40")
    with pytest.raises(
        ConfigError, match=r"^data.batch_tokens=40: a token budget of 40 holds \d row\(s\)"
    ) as e:
        make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False, data_axis=4)
    assert "\n" not in str(e.value)
