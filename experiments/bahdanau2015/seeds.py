"""The seed study: the demo's RNNenc / RNNsearch recipe under several training seeds and XLA CPU code paths.

    python experiments/bahdanau2015/seeds.py                                  # 5 seeds x 2 code paths -> runs/seeds
    python experiments/bahdanau2015/seeds.py --seeds 0,1 --code-paths default --out /tmp/s   # a subset
    python experiments/bahdanau2015/seeds.py --threads 2 --jobs 1             # two threads per run
    python experiments/bahdanau2015/seeds.py --write-ranges experiments/bahdanau2015/seed_ranges.json

Each (code path, seed) is one ``run.py --systems RNNenc,RNNsearch --set seed=K --jobs 1`` in a subprocess whose
``XLA_FLAGS`` selects the code path (``default``: whatever the CPU offers; ``AVX2``: ``--xla_cpu_max_isa=AVX2``,
as on a CPU without AVX-512); ``--threads T`` (a list: ``1,2``) pins each run to T cores, so XLA's CPU thread
pool has T threads -- how the work of one op is split between threads is a further source of rounding;
``make demo`` runs each system on one core, as ``--threads 1`` does; ``--jobs N`` runs N at once (N x T cores at most). Runs with one thread
live in ``<out>/<path>/seed<k>``, with T > 1 in ``<out>/<path>-<T>threads/seed<k>``. A run already finished in
``--out`` (its ``results.json`` exists) is reused, so an interrupted study continues where it stopped.

Writes ``<out>/seed_study.md`` (every run's row, then mean ± sd (min-max) per number and whether each finding
held in every run) and ``<out>/seed_study.json``; ``--write-ranges`` also writes the ranges ``run.py``'s report
checks a run against. The corpus (``data.synthetic_spec.seed``) stays fixed: the seed varies parameter
initialisation and batch order, the code path the rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import findings as fd  # noqa: E402

CODE_PATHS = {"default": "", "AVX2": "--xla_cpu_max_isa=AVX2", "SSE4_2": "--xla_cpu_max_isa=SSE4_2"}
ROWS = (
    ("RNNenc", "BLEU all"),
    ("RNNsearch", "BLEU all"),
    ("RNNsearch", "BLEU 0-9"),
    ("RNNsearch", "BLEU 20-29"),
    ("RNNsearch", "BLEU 40-49"),
    ("RNNsearch", "gold hit"),
    ("RNNsearch", "AER within training lengths"),
    ("RNNsearch", "AER"),
)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4", help="training seeds (default: %(default)s)")
    p.add_argument(
        "--code-paths", default="default,AVX2", help=f"XLA CPU code paths among {', '.join(CODE_PATHS)}"
    )
    p.add_argument("--out", default="runs/seeds", help="output directory (default: %(default)s)")
    p.add_argument(
        "--threads",
        default="1",
        help="CPU threads (cores) per run, a list such as 1,2 (default: %(default)s)",
    )
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each pinned to its cores (default: 1)")
    p.add_argument("--write-ranges", metavar="PATH", help="also write the ranges run.py checks against")
    p.add_argument(
        "--collect",
        action="store_true",
        help="start no run: summarise the runs already finished in --out (the missing ones are listed)",
    )
    args = p.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    args.code_paths = [c.strip() for c in args.code_paths.split(",") if c.strip()]
    bad = [c for c in args.code_paths if c not in CODE_PATHS]
    if bad or not args.code_paths or not args.seeds:
        p.error(f"--code-paths: unknown {bad!r}; choose from {', '.join(CODE_PATHS)}")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    try:
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        p.error(f"--threads: expected comma-separated integers, got {args.threads!r}")
    ncores = len(_cores()) or (os.cpu_count() or 1)
    if not args.threads or min(args.threads) < 1 or args.jobs * max(args.threads) > ncores:
        p.error(
            f"--threads {args.threads} with --jobs {args.jobs} needs up to {args.jobs * max(args.threads or [1])}"
            f" cores; this process may use {ncores}"
        )
    return args


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def run_label(path: str, threads: int) -> str:
    """A run's directory name and label: the code path, with the thread count when it is not 1."""
    return path if threads == 1 else f"{path}-{threads}threads"


def _command(out_dir: str, seed: int) -> list[str]:
    run = os.path.join(HERE, "run.py")
    # --jobs 1: both systems in one process on the run's own cores, so --threads sets XLA's thread count.
    return [
        sys.executable,
        run,
        "--systems",
        "RNNenc,RNNsearch",
        "--set",
        f"seed={seed}",
        "--jobs",
        "1",
        "--out",
        out_dir,
    ]


def run_all(args) -> list[dict]:
    """Run every missing (code path, seed) and return every run's results.json, with its key."""
    todo, done = [], []
    labels = [run_label(p, t) for t in args.threads for p in args.code_paths]
    for seed in args.seeds:  # seeds outermost, so that a partial study already covers every code path
        for threads in args.threads:
            for path in args.code_paths:
                label = run_label(path, threads)
                d = os.path.join(os.path.abspath(args.out), label, f"seed{seed}")
                item = (path, threads, label, seed, d)
                (done if os.path.exists(os.path.join(d, "results.json")) else todo).append(item)
    if args.collect:
        args.missing = [(label, seed) for _, _, label, seed, _ in todo]
        todo = []
    cores = _cores()
    running: list[tuple] = []
    free = list(range(args.jobs))
    while todo or running:
        while todo and free:
            slot = free.pop(0)
            path, threads, label, seed, d = todo.pop(0)
            os.makedirs(d, exist_ok=True)
            env = dict(os.environ)
            env["XLA_FLAGS"] = CODE_PATHS[path]
            # Pinned to `threads` cores of its own (XLA sizes its CPU thread pool by the cores it may use).
            pin = set(cores[slot * threads : (slot + 1) * threads]) if cores else None
            log = open(os.path.join(d, "run.log"), "w", encoding="utf-8")  # noqa: SIM115
            proc = subprocess.Popen(
                _command(d, seed),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                preexec_fn=(lambda p=pin: os.sched_setaffinity(0, p)) if pin else None,
            )
            where = f" (cores {','.join(map(str, sorted(pin)))})" if pin else ""
            print(f"started {label} seed {seed} -> {d}{where}", flush=True)
            running.append((proc, log, slot, path, threads, label, seed, d, time.perf_counter()))
        time.sleep(5)
        for item in list(running):
            proc, log, slot, path, threads, label, seed, d, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            free.append(slot)
            status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {d}/run.log)"
            print(f"{status}: {label} seed {seed} in {time.perf_counter() - t0:.0f} s", flush=True)
            if proc.returncode == 0:
                done.append((path, threads, label, seed, d))
    out = []
    for path, threads, label, seed, d in sorted(done, key=lambda x: (labels.index(x[2]), x[3])):
        with open(os.path.join(d, "results.json"), encoding="utf-8") as f:
            out.append(
                {
                    "code_path": label,
                    "xla_flags": CODE_PATHS[path],
                    "threads": threads,
                    "seed": seed,
                    "dir": os.path.relpath(d, os.path.abspath(args.out)),
                    **json.load(f),
                }
            )
    return out


def study_markdown(runs: list[dict], command: str) -> tuple[str, dict]:
    """The seed-study tables, and the ranges (``{number: summarize(...)}``) of every headline number."""
    names = [f.name for f in fd.check_findings(runs[0]["systems"])]
    head = [f"{s} {w}" for s, w in ROWS]
    md = [
        "| code path | seed | "
        + " | ".join(head)
        + " | "
        + " | ".join(f"finding {k + 1}" for k in range(len(names)))
        + " | finding 3, first study's bar |",
        "|---|---:|" + "---:|" * len(head) + "---|" * len(names) + "---|",
    ]
    # Findings recomputed with this findings.py (a run's results.json keeps those of the code that ran it).
    helds = [{f.name: f.holds for f in fd.check_findings(r["systems"])} for r in runs]
    for r, held in zip(runs, helds, strict=True):
        vals = [r["headline"].get(h) for h in head]
        md.append(
            f"| {r['code_path']} | {r['seed']} | "
            + " | ".join("—" if v is None else _fmt(h, v) for h, v in zip(head, vals, strict=True))
            + " | "
            + " | ".join("yes" if held.get(n) else "**no**" for n in names)
            + f" | {'yes' if fd.meets_first_study_bar(r['systems'].get('RNNsearch', {})) else 'no'} |"
        )
    keys = sorted({k for r in runs for k in r["headline"]})
    ranges = {k: fd.summarize([r["headline"][k] for r in runs if k in r["headline"]]) for k in keys}
    md += ["", "| number | mean ± sd (min-max) over all runs |", "|---|---|"]
    for h in head:
        if h in ranges:
            r = ranges[h]
            md.append(
                f"| {h} | {_fmt(h, r['mean'])} ± {_fmt(h, r['sd'])} ({_fmt(h, r['min'])}-{_fmt(h, r['max'])}) |"
            )
    md += ["", "| finding | runs in which it held |", "|---|---|"]
    for n in names:
        k = sum(1 for held in helds if held.get(n))
        md.append(f"| {n} | {k} of {len(runs)} |")
    k = sum(1 for r in runs if fd.meets_first_study_bar(r["systems"].get("RNNsearch", {})))
    md.append(
        f"| the same, at the first study's bar (gold hit >= {fd.STRICT_GOLD_HIT_MIN:.0%}, AER within the training "
        f"lengths <= {fd.STRICT_AER_MAX:.0%}) | {k} of {len(runs)} |"
    )
    md += ["", f"Command: `{command}`"]
    return "\n".join(md) + "\n", ranges


def _recipes(runs: list[dict]) -> dict[str, dict]:
    """system -> the recipe every run recorded (run.py's ``recipe``: the flattened config without the seed); a
    study whose runs followed different recipes is refused, as its ranges would mix them."""
    out: dict[str, set] = {}
    for r in runs:
        for system, rec in r.get("recipes", {}).items():
            out.setdefault(system, set()).add(json.dumps(rec, sort_keys=True))
    mixed = sorted(s for s, fps in out.items() if len(fps) > 1)
    if mixed:
        raise SystemExit(
            f"seeds.py: the runs followed different recipes for {', '.join(mixed)}; not writing ranges"
        )
    return {s: json.loads(next(iter(fps))) for s, fps in sorted(out.items())}


def _fmt(name: str, v: float) -> str:
    return f"{100 * v:.1f}%" if ("AER" in name or "gold hit" in name) else f"{v:.2f}"


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = run_all(args)
    if not runs:
        print("no finished run", file=sys.stderr)
        return 1
    command = "python experiments/bahdanau2015/seeds.py " + " ".join(
        [
            f"--seeds {','.join(map(str, args.seeds))}",
            f"--code-paths {','.join(args.code_paths)}",
            f"--threads {','.join(map(str, args.threads))}",
        ]
    )
    md, ranges = study_markdown(runs, command)
    missing = getattr(args, "missing", [])
    if missing:
        md += (
            f"\nNot finished, so not in these numbers ({len(missing)} of {len(missing) + len(runs)} runs): "
            + ", ".join(f"{label} seed {seed}" for label, seed in missing)
            + ".\n"
        )
    out = os.path.abspath(args.out)
    with open(os.path.join(out, "seed_study.md"), "w", encoding="utf-8") as f:
        f.write(md)
    with open(os.path.join(out, "seed_study.json"), "w", encoding="utf-8") as f:
        json.dump({"runs": runs, "ranges": ranges}, f, indent=1)
    print(md)
    if args.write_ranges:
        with open(args.write_ranges, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "command": command,
                    "runs": len(runs),
                    "missing": [f"{label} seed {seed}" for label, seed in missing],
                    "seeds": sorted({r["seed"] for r in runs}),
                    "code_paths": sorted({r["code_path"] for r in runs}),
                    "threads": sorted({r["threads"] for r in runs}),
                    "recipes": _recipes(runs),
                    "ranges": ranges,
                    "findings_held": {  # recomputed with this findings.py, as in the table
                        f.name: sum(
                            1
                            for r in runs
                            for g in fd.check_findings(r["systems"])
                            if g.name == f.name and g.holds
                        )
                        for f in fd.check_findings(runs[0]["systems"])
                    },
                },
                f,
                indent=1,
                sort_keys=True,
            )
        print(f"ranges written to {args.write_ranges}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
