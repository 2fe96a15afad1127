"""Run bench.py rows and print every interleaved measurement's per-side ``getrusage``, one side alone or all.

    PY=/work/main/.venv/bin/python
    $PY experiments/benchmarks/probes/row_usage.py --rows 5 --quick                 # every side, as bench.py
    $PY experiments/benchmarks/probes/row_usage.py --rows 5 --quick --keep jax      # PyTorch sides not run
    $PY experiments/benchmarks/probes/row_usage.py --rows 5 --quick --keep torch    # JAX sides not run
    OMP_WAIT_POLICY=PASSIVE $PY experiments/benchmarks/probes/row_usage.py --rows 5 --quick

``measure_interleaved`` is wrapped, not changed: with ``--keep`` it times only the kept sides and hands the
row a kept side's timing for the others, so the row's table is meaningless and goes to a temporary file. What
counts is stdout: one line per measurement and side (ms per call, user/sys CPU ms, minor faults, switches), and
the whole process's ``getrusage`` at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench.py, harness, rows

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--rows", default="5")
p.add_argument("--quick", action="store_true")
p.add_argument("--keep", choices=("all", "jax", "torch"), default="all")
p.add_argument("--sync-dispatch", action="store_true", help="jax_cpu_enable_async_dispatch=False")
args = p.parse_args()

import bench  # noqa: E402
import harness.timing as timing  # noqa: E402

original = timing.measure_interleaved


def is_torch(name: str) -> bool:
    return name.startswith("torch")


def wrapped(ctx, calls):
    kept = {n: c for n, c in calls.items() if args.keep == "all" or is_torch(n) == (args.keep == "torch")}
    if args.sync_dispatch:
        ctx.jax.config.update("jax_cpu_enable_async_dispatch", False)
    out = original(ctx, kept or calls)
    for n, t in out.items():
        u = t.usage
        print(
            f"USAGE {args.keep:5s} {n:18s} {1e3 * t.median:9.1f} ms  user {1e3 * u.user_s:8.1f}  "
            f"sys {1e3 * u.system_s:7.1f}  faults {u.minor_faults:8.0f}  switches {u.voluntary_switches:7.0f}/{u.involuntary_switches:.0f}",
            flush=True,
        )
    spare = next(iter(out.values()))
    return {n: out.get(n, spare) for n in calls}


timing.measure_interleaved = wrapped
for mod in list(sys.modules.values()):  # rows that imported it by name
    if getattr(mod, "measure_interleaved", None) is original:
        mod.measure_interleaved = wrapped
out = os.path.join(tempfile.mkdtemp(), "R.md")
rc = bench.main(["--rows", args.rows, "--out", out] + (["--quick"] if args.quick else []))
r = resource.getrusage(resource.RUSAGE_SELF)
print(
    f"PROCESS keep={args.keep} user {r.ru_utime:.1f} s sys {r.ru_stime:.1f} s faults {r.ru_minflt} "
    f"vol {r.ru_nvcsw} invol {r.ru_nivcsw} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} "
    f"load1 {os.getloadavg()[0]:.2f}",
    flush=True,
)
sys.exit(rc)
