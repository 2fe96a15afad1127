"""experiments/benchmarks/bench.py --quick: every row runs and writes numbers into the RESULTS file it is given."""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "experiments", "benchmarks", "bench.py")
ROW_TITLES = (
    "### 1. Scaled dot-product attention",
    "### 2. Chunked (flash-style) vs plain attention",
    "### 3. Additive attention in a decoder scan",
    "### 4. RNNsearch training throughput",
    "### 5. Beam-search decoding speed",
    "### 6. Compilations during a bucketed training run",
)
# A measurement: a number, optionally with a unit or a thousands separator ("1.61 s", "2,444,240", "5.2e-07").
NUMBER = re.compile(r"^-?\d[\d,]*(\.\d+)?(e[-+]?\d+)?( (µs|ms|s|MiB|GiB|new))?( \(.*\))?$")
BAD_TEXT = ("ERROR", "n/a", "skipped")
BAD_CELLS = ("nan", "inf", "-inf", "")


def _tables(section: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table of ``section`` as (header, data rows)."""
    tables, lines = [], section.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip("|").split("|")])
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables


@pytest.mark.slow
def test_quick_bench_writes_every_row_with_numbers(tmp_path):
    pytest.importorskip("torch", reason="the benchmark's PyTorch peers need the `bench` extra")
    out = tmp_path / "RESULTS.md"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # no fake devices from conftest
    p = subprocess.run(
        [sys.executable, BENCH, "--quick", "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    text = out.read_text(encoding="utf-8")

    cpu = text.split("<!-- section:cpu -->")[1].split("<!-- /section:cpu -->")[0]
    gpu = text.split("<!-- section:gpu -->")[1].split("<!-- /section:gpu -->")[0]
    assert "not measured (no accelerator available on this machine)" in gpu
    for key in ("| jax |", "| jaxlib |", "| flax |", "| torch |", "| CPU |", "| git commit |", "| date |"):
        assert key in cpu, key
    positions = [cpu.find(t) for t in ROW_TITLES]
    assert all(i >= 0 for i in positions) and positions == sorted(positions), positions
    assert "**ERROR**" not in cpu

    rows = cpu.split("### ")[1:]
    assert len(rows) == len(ROW_TITLES)
    for row in rows:
        tables = _tables(row)
        assert tables, row[:200]
        for header, data in tables:
            assert data, (row[:80], header)
            for cells in data:
                assert len(cells) == len(header), (header, cells)
                assert not any(bad in c for c in cells for bad in BAD_TEXT), cells
                assert not any(c.lower() in BAD_CELLS for c in cells), cells
                # Every data row carries at least one measured number besides its label column.
                assert any(NUMBER.match(c) for c in cells[1:]), cells
                # Every target verdict is spelled as the README promises.
                if header[-1].startswith(("target", "status")):
                    assert cells[-1] in ("met", "MISSED", "—"), cells

    # The numbers that the rows exist for are present and sane.
    # Row 4: the written-out peer has attn_jax's parameter count, the fused peer 9n more (second GRU biases).
    train = _tables(cpu.split(ROW_TITLES[3])[1])[0][1]
    jax_row = next(r for r in train if r[0] == "attn_jax")
    written = next(r for r in train if r[0].startswith("PyTorch, paper GRU"))
    fused = [r for r in train if r[0].startswith("PyTorch, fused")]
    assert jax_row[2] == written[2]
    # The same network trained through `attn-jax train` (row4_cli asserts its parameter count too).
    cli = next(r for r in train if r[0] == "attn_jax, `attn-jax train`")
    assert cli[2] == jax_row[2] and float(cli[3].replace(",", "")) > 0, cli
    assert "1" in {r[1] for r in fused}
    hidden = int(re.search(r", n=(\d+),", cpu.split(ROW_TITLES[3])[1]).group(1))
    assert all(int(r[2].replace(",", "")) == int(jax_row[2].replace(",", "")) + 9 * hidden for r in fused)
    compiles = _tables(cpu.split(ROW_TITLES[5])[1])[0][1]
    assert [c[-1] for c in compiles] == ["met"] * len(compiles), compiles
