"""experiments/benchmarks/bench.py's own bookkeeping: the targets summary counts every target column, and
measure_interleaved settles short calls before timing them (no PyTorch needed)."""

import types

from tests.bench_module import load_bench


def test_targets_summary_counts_every_target_column(monkeypatch):
    bench = load_bench(monkeypatch)
    sec = bench.Section("1. rows with a target per peer")
    # Row 1's layout: a target column after each ratio; the last one alone used to be counted (2 met, 0 MISSED).
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
    text = bench.device_section(ctx, [sec], [], [], 1.0)
    assert "Targets: 5 met, 2 MISSED" in text


def test_measure_interleaved_settles_short_calls_only(monkeypatch):
    bench = load_bench(monkeypatch)
    counts = {"short": 0, "long": 0}

    def call(name):
        def run():
            counts[name] += 1

        return run

    sizes = types.SimpleNamespace(min_repeats=3, max_repeats=3, budget_s=0.0)
    ctx = types.SimpleNamespace(sizes=sizes)
    monkeypatch.setattr(bench, "SETTLE_S", 0.002)
    out = bench.measure_interleaved(ctx, {"short": call("short")})
    assert out["short"].calls == 3
    # 2 warm-up calls, then each of the 3 rounds: untimed calls for SETTLE_S (at least one), then the timed one
    assert counts["short"] >= 2 + 3 * 2
    monkeypatch.setattr(bench, "SETTLE_BELOW_S", 0.0)  # every call counts as long: timed directly
    bench.measure_interleaved(ctx, {"long": call("long")})
    assert counts["long"] == 2 + 3
