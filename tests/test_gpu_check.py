"""experiments/benchmarks/gpu_check.py (`make gpu-check`) without a GPU: it says so, runs every section at tiny
sizes, exits 0 and leaves RESULTS.md alone; and the bench's writer keeps the section gpu_check.py writes."""

import hashlib
import os
import subprocess
import sys

import pytest

from tests.bench_module import import_harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(REPO, "experiments", "benchmarks")
SCRIPT = os.path.join(HERE, "gpu_check.py")
RESULTS = os.path.join(HERE, "RESULTS.md")
JSON = os.path.join(HERE, "gpu_check.json")


def _state(path: str):
    """Content hash and modification time of ``path`` (None if it does not exist)."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns


# heavy (make test-all): a fresh interpreter compiling every section's programs at tiny sizes, 50-80 s of the two
# CI cores for a script meant for a GPU; the section-keeping writer below stays in make test.
@pytest.mark.heavy
def test_without_a_gpu_it_says_so_checks_every_section_and_writes_nothing():
    before = _state(RESULTS), _state(JSON)
    # The test session's environment pins JAX to the CPU (tests/conftest.py), as on a machine without a GPU.
    p = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=900, cwd=REPO)
    out = p.stdout
    assert p.returncode == 0, out[-4000:] + p.stderr[-4000:]
    assert out.splitlines()[0].startswith("No GPU: JAX's default backend is 'cpu'"), out[:500]
    assert "nothing was measured" in out.splitlines()[0]
    # every section ran at tiny sizes and reported a number (or, for the tests, that they were skipped)
    summary = out.split("\nSummary:\n", 1)[1]
    assert "tests: " in summary and "skipped" in summary and "FAILED" not in summary, summary
    for line in (
        "matmul: bfloat16 peak",
        "attention L=",
        "rnnsearch float32:",
        "gnmt float32:",
        "remat full:",
    ):
        assert line in summary, summary
    assert "Tiny check passed" in out
    assert (_state(RESULTS), _state(JSON)) == before


def test_bench_rewriting_its_sections_keeps_the_gpu_check_section(tmp_path, monkeypatch):
    harness = import_harness(monkeypatch)
    path = str(tmp_path / "RESULTS.md")
    harness.write_results(path, "gpu-check", "## GPU check\n\nnumbers from the GPU")
    harness.write_results(path, "cpu", "## CPU\n\nnew CPU numbers")
    harness.write_results(path, "gpu-check", "## GPU check\n\nnewer numbers from the GPU")
    text = open(path, encoding="utf-8").read()
    sections = {
        d: text.split(f"<!-- section:{d} -->\n")[1].split(f"\n<!-- /section:{d} -->")[0]
        for d in ("cpu", "gpu", "gpu-check")
    }
    assert sections == {
        "cpu": "## CPU\n\nnew CPU numbers",
        "gpu": f"## GPU\n\n{harness.NO_GPU}.",
        "gpu-check": "## GPU check\n\nnewer numbers from the GPU",
    }
    assert text.count("section:gpu-check") == 2  # replaced in place, never appended twice
