"""The benchmark's code (experiments/benchmarks: bench.py, harness/, rows/) imported for the tests of its pieces."""

import importlib
import importlib.util
import os
import sys

BENCH_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "benchmarks"
)


def import_harness(monkeypatch):
    """The ``harness`` package beside bench.py; its directory joins ``sys.path`` for this test only."""
    monkeypatch.syspath_prepend(BENCH_DIR)
    return importlib.import_module("harness")


def load_bench(monkeypatch, name: str = "bench_under_test"):
    """A fresh ``bench`` module (a script, not a package) registered in ``sys.modules`` for this test only."""
    monkeypatch.syspath_prepend(BENCH_DIR)  # restored after the test, with what bench.py adds itself
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH_DIR, "bench.py"))
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod
