"""The benchmark's own bookkeeping (experiments/benchmarks): the targets summary counts every target column,
measure_interleaved settles short calls before timing them, and bench.py keeps its command line (no PyTorch needed)."""

import types

import pytest

from tests.bench_module import import_harness, load_bench


def test_targets_summary_counts_every_target_column(monkeypatch):
    harness = import_harness(monkeypatch)
    sec = harness.Section("1. rows with a target per peer")
    # Row 1's layout: a target column after each ratio, and every one of them counts, not only the last.
    sec.table(
        ["L", "ratio a", "target ≤ 1.05", "ratio b", "target ≤ 1.2", "ratio c", "target ≤ 1.2"],
        [
            ["256", "0.9", "met", "1.3", "MISSED", "1.1", "met"],
            ["512", "1.1", "MISSED", "1.0", "met", "0.9", "met"],
        ],
    )
    sec.table(
        ["quantity", "value", "target", "status"], [["x", "1", "≥ 1", "met"], ["y", "2", "(info)", "—"]]
    )
    sec.table(["program", "compilations"], [["train_step", "met"]])  # no target column: not counted
    ctx = types.SimpleNamespace(device="cpu", quick=False)
    text = harness.device_section(ctx, [sec], [], [], 1.0)
    assert "Targets: 5 met, 2 MISSED" in text


def test_measure_interleaved_settles_short_calls_only(monkeypatch):
    timing = import_harness(monkeypatch).timing
    counts = {"short": 0, "long": 0}

    def call(name):
        def run():
            counts[name] += 1

        return run

    sizes = types.SimpleNamespace(min_repeats=3, max_repeats=3, budget_s=0.0)
    ctx = types.SimpleNamespace(sizes=sizes)
    monkeypatch.setattr(timing, "SETTLE_S", 0.002)
    out = timing.measure_interleaved(ctx, {"short": call("short")})
    assert out["short"].calls == 3
    # 2 warm-up calls, then each of the 3 rounds: untimed calls for SETTLE_S (at least one), then the timed one
    assert counts["short"] >= 2 + 3 * 2
    monkeypatch.setattr(timing, "SETTLE_BELOW_S", 0.0)  # every call counts as long: timed directly
    timing.measure_interleaved(ctx, {"long": call("long")})
    assert counts["long"] == 2 + 3


def test_bench_keeps_its_command_line_and_every_row(monkeypatch):
    bench = load_bench(monkeypatch)
    assert sorted(bench.ROWS) == list(range(1, 9))
    args = bench.parse_args([])
    assert (args.rows, args.quick, args.device) == ("1,2,3,4,5,6", False, "cpu")
    assert args.out == bench.DEFAULT_OUT == f"{bench.HERE}/RESULTS.md"
    args = bench.parse_args(["--quick", "--rows", "2,3", "--device", "gpu", "--out", "/tmp/R.md"])
    assert (args.rows, args.quick, args.device, args.out) == ("2,3", True, "gpu", "/tmp/R.md")
    # A row that does not exist is refused before JAX is imported, naming the rows there are.
    with pytest.raises(SystemExit, match=r"unknown rows \[9\]; choose from \[1, 2, 3, 4, 5, 6, 7, 8\]"):
        bench.main(["--rows", "1,9"])
