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
    assert sorted(bench.ROWS) == list(range(1, 11))
    args = bench.parse_args([])
    assert (args.rows, args.quick, args.device) == ("1,2,3,4,5,6", False, "cpu")
    assert args.out == bench.DEFAULT_OUT == f"{bench.HERE}/RESULTS.md"
    args = bench.parse_args(["--quick", "--rows", "2,3", "--device", "gpu", "--out", "/tmp/R.md"])
    assert (args.rows, args.quick, args.device, args.out) == ("2,3", True, "gpu", "/tmp/R.md")
    # A row that does not exist is refused before JAX is imported, naming the rows there are.
    with pytest.raises(
        SystemExit, match=r"unknown rows \[11\]; choose from \[1, 2, 3, 4, 5, 6, 7, 8, 9, 10\]"
    ):
        bench.main(["--rows", "1,11"])


def test_matmul_flops_counts_attention_as_the_formula(monkeypatch):
    """The plain path's forward is ``4·B·H·L²·K``; its VJP adds four products of the same size (3× in all)."""
    import jax
    import jax.numpy as jnp

    from attn_jax.attention import dot_product_attention

    peak = import_harness(monkeypatch).peak
    b, h, length, k = 2, 3, 8, 4
    q = jnp.ones((b, h, length, k), jnp.float32)

    def f(q, k_, v):
        return dot_product_attention(q, k_, v, implementation="xla")

    fwd = peak.matmul_flops(jax.make_jaxpr(f)(q, q, q))
    assert fwd == 4 * b * h * length**2 * k == peak.attention_flops(b, h, length, k, "fwd")
    both = peak.matmul_flops(jax.make_jaxpr(lambda q, k_, v, g: jax.vjp(f, q, k_, v)[1](g))(q, q, q, q))
    assert both == 12 * b * h * length**2 * k == peak.attention_flops(b, h, length, k, "fwd+bwd")
    with pytest.raises(ValueError, match="mode must be"):
        peak.attention_flops(b, h, length, k, "bwd")


def test_matmul_flops_scan_cond_and_while(monkeypatch):
    """A scan body counts once per step, a cond its costliest branch; a while loop has no trip count."""
    import jax
    import jax.numpy as jnp

    peak = import_harness(monkeypatch).peak
    a, w, w2 = jnp.ones((3, 4)), jnp.ones((4, 4)), jnp.ones((4, 6))

    def scanned(a):
        def body(c, _):
            return c @ w, None

        return jax.lax.scan(body, a, None, length=5)[0]

    assert peak.matmul_flops(jax.make_jaxpr(scanned)(a)) == 5 * 2 * 3 * 4 * 4
    branches = jax.make_jaxpr(lambda p, a: jax.lax.cond(p, lambda a: (a @ w2).sum(), lambda a: a.sum(), a))
    assert peak.matmul_flops(branches(True, a)) == 2 * 3 * 4 * 6
    looped = jax.make_jaxpr(lambda a: jax.lax.while_loop(lambda c: c.sum() < 9.0, lambda c: c @ w, a))
    with pytest.raises(ValueError, match="while_loop"):
        peak.matmul_flops(looped(a))


def test_fmt_spread_and_peak_share(monkeypatch):
    harness = import_harness(monkeypatch)
    assert harness.fmt_spread([1.1, 0.9, 1.3]) == "1.1 (0.9–1.3)"
    assert harness.fmt_spread([1.25]) == "1.25"
    p = harness.Peak({"XLA (2 threads)": 80.0, "PyTorch (1 thread)": 40.0}, 10.0)
    assert p.gflops == 80.0 and p.percent(20.0) == "25 %"


def test_measure_interleaved_records_cpu_time_of_timed_calls(monkeypatch):
    """Each timing carries the process's CPU use per timed call: a call that burns 5 ms of CPU shows ≥ 4 ms."""
    import time

    timing = import_harness(monkeypatch).timing
    monkeypatch.setattr(timing, "SETTLE_BELOW_S", 0.0)

    def burn():
        end = time.process_time() + 0.005
        while time.process_time() < end:
            pass

    sizes = types.SimpleNamespace(min_repeats=3, max_repeats=3, budget_s=0.0, runs=2)
    runs = timing.measure_runs(types.SimpleNamespace(sizes=sizes), {"burn": burn, "idle": lambda: None})
    assert len(runs) == 2
    for run in runs:
        burnt, idle = run["burn"].usage, run["idle"].usage
        assert burnt.user_s + burnt.system_s >= 0.004
        assert idle.user_s + idle.system_s < 0.004
        assert min(burnt.minor_faults, burnt.voluntary_switches, burnt.involuntary_switches) >= 0


def test_row4_cli_corpus_has_every_word_and_row4_lengths(monkeypatch, tmp_path):
    """Row 4's `attn-jax train` corpus: every one of V - 4 words a side, and tokens with </s> in [L/2, L]."""
    import_harness(monkeypatch)
    import importlib

    row4_cli = importlib.import_module("rows.row4_cli")
    vocab, length, pairs = 50, 12, 40
    row4_cli.write_corpus(str(tmp_path), vocab, length, pairs)
    for side, prefix in (("src", "s"), ("tgt", "t")):
        lines = (tmp_path / f"train.{side}").read_text(encoding="utf-8").splitlines()
        assert len(lines) == pairs
        words = [w for line in lines for w in line.split()]
        assert set(words) == {f"{prefix}{k}" for k in range(vocab - 4)}
        tokens = [len(line.split()) + 1 for line in lines]  # + </s>
        assert min(tokens) >= length // 2 and max(tokens) <= length, (min(tokens), max(tokens))
