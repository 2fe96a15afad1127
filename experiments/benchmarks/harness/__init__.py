"""The benchmark harness every row shares: sizes and context, timing, the RESULTS.md report."""

from harness.context import BENCH_DIR, DEFAULT_OUT, FULL, GIB, MIB, QUICK, REPO, Ctx, Sizes
from harness.report import (
    NO_GPU,
    Section,
    device_section,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    machine_info,
    section_marker,
    verdict,
    write_results,
)
from harness.timing import Timing, compiled_bytes, jax_call, measure, measure_interleaved, torch_sync

__all__ = [
    "BENCH_DIR",
    "DEFAULT_OUT",
    "FULL",
    "GIB",
    "MIB",
    "NO_GPU",
    "QUICK",
    "REPO",
    "Ctx",
    "Section",
    "Sizes",
    "Timing",
    "compiled_bytes",
    "device_section",
    "fmt_bytes",
    "fmt_ratio",
    "fmt_time",
    "jax_call",
    "machine_info",
    "measure",
    "measure_interleaved",
    "section_marker",
    "torch_sync",
    "verdict",
    "write_results",
]
