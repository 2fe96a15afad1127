"""experiments/benchmarks/bench.py loaded as a module (it is a script, not a package), for the tests of its pieces."""

import importlib.util
import os
import sys

BENCH_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "benchmarks"
)


def load_bench(monkeypatch, name: str = "bench_under_test"):
    """A fresh ``bench`` module registered in ``sys.modules`` for this test only (its dataclasses look it up there)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH_DIR, "bench.py"))
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod
