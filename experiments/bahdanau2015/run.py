"""Bahdanau, Cho & Bengio (2015) at CPU scale: RNNenc vs RNNsearch, with the Transformer beside them, one report.

    python experiments/bahdanau2015/run.py                    # CPU preset -> runs/demo/report.md
    python experiments/bahdanau2015/run.py --smoke --out /tmp/b15   # ~1-2 min: tiny configs, same report
    python experiments/bahdanau2015/run.py --preset paper     # prints the full-size WMT'14 commands, trains nothing

Trains RNNenc (configs/rnnenc_cpu.py), RNNsearch (configs/rnnsearch_cpu.py) and the Transformer
(configs/transformer_cpu.py) on the same generated pairs (the RNN pair also shares sizes, optimiser, batch size and
number of updates; the report states each system's budget), evaluates each on the test split
with beam search (``attn_jax.pipeline.evaluate_workdir``) and writes ``<out>/report.md``: BLEU by source length
(the paper's Figure 2) as a table and a plot, overall BLEU / No-UNK BLEU / AER (Table 1), three RNNsearch attention
heatmaps of long test sentences (Figure 3), the Transformer's cross-attention on the same sentences (last decoder
layer: the mean of its heads and its sharpest single head), the exact configs, seeds, package versions, the machine
and wall times. ``--systems RNNenc,RNNsearch`` runs a subset (the paper's own two).

With two or more usable cores each system trains and decodes in its own process pinned to one core, as many at
once as there are cores (``--jobs``): one thread per system, the seed study's setting. ``--jobs 1`` runs them one
after another in this process on all its cores.

Only calls the library: no model, training or scoring code lives here. Each run's directory
(``<out>/rnnenc_cpu``, ``<out>/rnnsearch_cpu``, ``<out>/transformer_cpu``) is deleted and retrained on every call.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RANGES = os.path.join(HERE, "seed_ranges.json")
sys.path.insert(0, HERE)
import findings as fd  # noqa: E402  (the experiment's own analysis, beside this file)

sys.path.insert(0, os.path.dirname(HERE))
from phases import PhaseTimer  # noqa: E402  (per-phase timing, kept out of the library)

SYSTEMS = (("RNNenc", "rnnenc_cpu"), ("RNNsearch", "rnnsearch_cpu"), ("Transformer", "transformer_cpu"))
# The order in which parallel jobs start: the longest first, so that the last to start is the shortest.
LONGEST_FIRST = ("RNNsearch", "Transformer", "RNNenc")
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "sacrebleu", "numpy", "attn-jax")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

PAPER_COMMANDS = """\
# Full-size Bahdanau et al. (2015) on WMT'14 English->French: for an accelerator (days per model on one GPU),
# not for a CPU. Prepare the TFDS wmt14_translate/fr-en data once on a machine with internet
# (attn_jax/data/README.md), then:
attn-jax train --config configs/rnnenc50.py    --workdir runs/rnnenc50
attn-jax train --config configs/rnnsearch50.py --workdir runs/rnnsearch50
attn-jax evaluate --workdir runs/rnnenc50    --split test --beam 12
attn-jax evaluate --workdir runs/rnnsearch50 --split test --beam 12
# (RNNencdec-30 / RNNsearch-30: the same with configs/rnnenc30.py and configs/rnnsearch30.py;
#  after a preemption add --resume to the train command.)
# Paper, Table 1 (newstest2014, all / no UNK): RNNencdec-50 17.82 / 26.71, RNNsearch-50 26.75 / 34.16.
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/demo", help="output directory (default: %(default)s)")
    p.add_argument("--smoke", action="store_true", help="the configs' :smoke variants (seconds per model)")
    p.add_argument(
        "--preset", choices=("cpu", "paper"), default="cpu", help="cpu: train here; paper: print commands"
    )
    p.add_argument("--beam", type=int, default=None, help="beam size (default: 4; 2 with --smoke)")
    p.add_argument(
        "--max-examples",
        type=int,
        default=None,
        help="test pairs evaluated, spread over length buckets (default: 140; 7 with --smoke, one per bucket)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override applied to every model (e.g. --set num_train_steps=3000); repeatable",
    )
    p.add_argument(
        "--systems",
        default=",".join(s for s, _ in SYSTEMS),
        help="comma-separated systems to train and compare (default: %(default)s)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="systems trained and evaluated at once, each in its own process on one core (default: one per "
        "usable core); 1 runs them one after another in this process on all its cores",
    )
    p.add_argument("--job", default=None, help=argparse.SUPPRESS)  # a child of --jobs: one system
    p.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)  # ... on this core
    args = p.parse_args(argv)
    if args.jobs < 0:
        p.error(f"--jobs: expected N >= 0, got {args.jobs}")
    known = [s for s, _ in SYSTEMS]
    chosen = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in known]
    if unknown or not chosen:
        p.error(f"--systems: unknown system(s) {unknown or chosen!r}; choose from {', '.join(known)}")
    args.systems = [s for s in known if s in chosen]
    return args


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine() -> dict[str, str]:
    import jax

    from attn_jax import host_allocator

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": str(os.cpu_count()),
        "jax_backend": jax.default_backend(),
        "jax_devices": ", ".join(str(d) for d in jax.devices()),
        # what `import attn_jax` set (or why not): speed only, the arithmetic is the same
        "host_allocator": host_allocator().message.removeprefix("host allocator: "),
    }


def _fmt_s(seconds: float) -> str:
    m, s = divmod(seconds, 60)
    return f"{seconds:.1f} s ({int(m)}m{s:04.1f}s)"


def _rel(path: str, start: str) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


def run_numbers(run: dict) -> dict:
    """One system's headline numbers: BLEU per bucket and overall, AER (all, within the training lengths) and,
    for attention models, the validation gold-hit rate at the checkpoint evaluated."""
    ev = run["eval"]
    buckets = {b["bucket"]: (b["bleu"] if b["sentences"] else None) for b in ev["bleu_by_length"]["buckets"]}
    out = {
        "bleu": ev["bleu"],
        "bleu_by_bucket": {k: (None if v is None or v != v else v) for k, v in buckets.items()},
        "step": ev["step"],
        "best_step": run["best_step"],
    }
    if ev.get("aer") is not None:
        out["aer"] = ev["aer"]["aer"]
    if ev.get("aer_within_training_lengths") is not None:
        out["aer_within"] = ev["aer_within_training_lengths"]["aer"]
    hit = validation_at(run["workdir"], ev["step"]).get("attn_gold_hit")
    if hit is not None:
        out["gold_hit"] = hit
    return out


def validation_at(workdir: str, step: int) -> dict:
    """The validation record of ``step`` in the run's metrics.jsonl (empty if there is none)."""
    found = {}
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("split") == "validation" and rec.get("step") == step:
                found = rec
    return found


def recipe(config) -> dict:
    """A run's recipe: its flattened config (``{"data.batch_size": 64, ...}``, JSON-ready) without its ``seed``.
    Two runs of one recipe under different seeds have equal recipes; the seed study records it."""
    from attn_jax.train import flatten_config

    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in sorted(flatten_config(config).items())
        if k != "seed"
    }


def recipe_differences(studied: dict, current: dict) -> list[str]:
    """``"key: study X, this run Y"`` for every setting in which ``current`` differs from the ``studied`` recipe. A
    key the study's version did not have yet counts only when this run sets it away from its default (a newer
    release adding an option does not invalidate a study)."""
    from attn_jax.train import default_config

    defaults = recipe(default_config())
    out = []
    for k in sorted(set(studied) | set(current)):
        if k not in studied and k in defaults and current[k] == defaults[k]:
            continue
        if studied.get(k, "(absent)") != current.get(k, "(absent)"):
            out.append(f"{k}: study {studied.get(k, '(absent)')!r}, this run {current.get(k, '(absent)')!r}")
    return out


def load_ranges(args: argparse.Namespace, recipes: dict[str, dict] | None = None) -> tuple[dict | None, str]:
    """The seed study's ranges (``seed_ranges.json``) and ``""``, or None and why there is no range check: a smoke
    run, overridden configs, no study written, or a study of another recipe (``recipes``: system -> this run's
    :func:`recipe`, compared with the recipes the study recorded)."""
    if args.smoke:
        return None, "a smoke run"
    if args.set:
        return None, "the configs were overridden (--set)"
    if not os.path.exists(RANGES):
        return None, f"no seed study is recorded ({os.path.relpath(RANGES, REPO)} is missing)"
    with open(RANGES, encoding="utf-8") as f:
        ranges = json.load(f)
    studied = ranges.get("recipes", {})
    where = os.path.relpath(RANGES, REPO)
    if not studied:
        return None, f"the seed study ({where}) records no recipe to compare this run's with"
    diffs = [
        f"{s} {d}"
        for s, r in sorted((recipes or {}).items())
        if s in studied
        for d in recipe_differences(studied[s], r)
    ]
    if diffs:
        shown = "; ".join(diffs[:3]) + (f"; {len(diffs) - 3} more" if len(diffs) > 3 else "")
        return None, (
            f"the seed study ({where}) was run with another recipe ({shown}): rerun "
            "experiments/bahdanau2015/seeds.py --write-ranges"
        )
    return ranges, ""


def findings_markdown(checks, numbers, ranges, args, why_no_ranges: str = "") -> list[str]:
    """The report's findings and range-check sections."""
    md = ["## The paper's findings, checked on this run\n", "| finding | holds | evidence |", "|---|---|---|"]
    md += [f"| {c.name} | {'yes' if c.holds else '**no**'} | {c.detail} |" for c in checks]
    md += [
        "",
        "Finding 3's bar fixed before seeds 5-9 of the seed study were run (experiments/bahdanau2015/findings.py).",
    ]
    if ranges is not None:
        held = ranges.get("findings_held", {})
        md[-1] += " In the seed study (experiments/bahdanau2015/README.md): " + "; ".join(
            f"{n}: {k} of {ranges['runs']} runs" for n, k in held.items()
        )
    md += ["", "## This run against the seed study\n"]
    if ranges is None:
        return [*md, f"No range check: {why_no_ranges or 'no seed study'}.\n"]
    study = ranges["ranges"]
    md += [
        f"Expected range: the seed study's mean ± 3 sd, widened to its min-max ({ranges['runs']} runs: seeds "
        f"{ranges['seeds']} under XLA CPU code paths {ranges['code_paths']}"
        + (f" with {ranges['threads']} CPU threads" if ranges.get("threads") else "")
        + "; "
        f"`{ranges['command']}`"
        + (f"; not yet finished: {', '.join(ranges['missing'])}" if ranges.get("missing") else "")
        + "). A number outside it means this machine or version behaves differently from the study's: worth a "
        "look before drawing conclusions.\n",
        "| number | this run | study mean ± sd (min-max) | expected range | inside |",
        "|---|---:|---|---|---|",
    ]
    for name, value, lo, hi, inside in fd.range_check(numbers, study):
        if inside is None:
            md.append(f"| {name} | {value:.2f} | — | not in the study | — |")
            continue
        r = study[name]
        md.append(
            f"| {name} | {value:.2f} | {r['mean']:.2f} ± {r['sd']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | "
            f"{lo:.2f} to {hi:.2f} | {'yes' if inside else '**no**'} |"
        )
    outside = [n for n, _, _, _, inside in fd.range_check(numbers, study) if inside is False]
    md += [
        "",
        f"{len(outside)} of {sum(1 for *_, i in fd.range_check(numbers, study) if i is not None)} numbers "
        "outside the expected range" + (f": {', '.join(outside)}." if outside else ".") + "\n",
    ]
    return md


def _write_results(out: str, runs: dict, results: dict, checks, numbers: dict, recipes: dict) -> None:
    """``results.json``: every system's numbers, the findings, seeds, recipes and XLA flags."""
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "systems": results,
                "findings": [c._asdict() for c in checks],
                "headline": numbers,
                "seeds": {s: r["config"].seed for s, r in runs.items()},
                "threads": {s: r["threads"] for s, r in runs.items()},
                "recipes": recipes,
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
            },
            f,
            indent=1,
            allow_nan=False,
        )


def _heatmaps_markdown(runs: dict, out: str) -> list[str]:
    """The report's attention pictures (Figure 3): each system's chosen test sentences."""
    md: list[str] = []
    for system, caption in (
        ("RNNsearch", "RNNsearch attention on test sentences (Figure 3)"),
        ("Transformer", "Transformer cross-attention on test sentences (last decoder layer)"),
    ):
        if system not in runs:
            continue
        files = runs[system]["eval"]["files"]
        md.append(f"## {caption}\n")
        picks = runs[system]["eval"].get("heatmaps", [])
        limit = runs[system]["eval"].get("training_max_source_length")
        md.append(
            "Chosen as the paper's Figure 3 is (`attn_jax.pipeline.figure3_examples`): the longest test "
            f"sentences within the training lengths (at most {limit} source words) that this system translates "
            "exactly, then one sentence beyond the training lengths as the failure case. Each picture shows the "
            "attention while the system produced its own translation (rows: target words, columns: source words, "
            "white = weight 1).\n"
        )
        if system == "Transformer":
            md.append(
                "Left: the mean of the heads (what beam search and AER use); right: the single head with the "
                "sharpest attention (lowest mean entropy) on the same translation.\n"
            )
        shown = False
        for k, pick in enumerate(picks):
            pics = [files[f] for f in (f"attention_{k}.png", f"attention_{k}_head.png") if f in files]
            if pics:
                kind = {
                    "correct": "translated exactly",
                    "within": "within the training lengths but **not** translated exactly (too few exact ones)",
                    "beyond": "**beyond the training lengths** (the failure case)",
                }[pick["kind"]]
                md.append(f"Test sentence #{pick['index']}, {pick['words']} words, {kind}:\n")
                md.append(" ".join(f"![{os.path.basename(h)}]({_rel(h, out)})" for h in pics) + "\n")
                shown = True
        if not shown:
            md.append("(no heatmap was written)\n")
    return md


def _html_report(runs: dict, out: str) -> list[str]:
    """``report.html`` beside report.md (``attn-jax report`` on the systems' evaluations); its Markdown link."""
    from attn_jax import eval as ev

    evaluated = [
        ev.read_evaluated_run(os.path.dirname(r["eval"]["files"]["evaluation.json"])) for r in runs.values()
    ]
    page = ev.write_report_html(evaluated, os.path.join(out, "report.html"))
    print(f"== report.html: {page['bytes'] / 1e6:.1f} MB", flush=True)
    return [
        "## Sentence by sentence\n",
        f"[report.html]({_rel(page['path'], out)}) (open it in a browser, offline): scores, sacreBLEU's paired "
        "bootstrap between every two systems, every test sentence, and attention heatmaps of every layer and head.\n",
    ]


def _appendix_markdown(
    runs: dict, args: argparse.Namespace, total_s: float, out: str, phase_rows: Sequence[str] = ()
) -> list[str]:
    """The report's closing sections: wall times, seeds, configs, versions, machine and files."""
    from attn_jax.train import flatten_config

    md: list[str] = [
        "## Wall times\n",
        "| system | train | evaluate | best step | last step |",
        "|---|---|---|---|---|",
    ]
    for s, r in runs.items():
        md.append(
            f"| {s} | {_fmt_s(r['train_s'])} | {_fmt_s(r['eval_s'])} | {r['best_step']} | {r['step']} |"
        )
    md += ["", f"Total (train + evaluate all + report): {_fmt_s(total_s)}.\n"]
    threads = sorted({r["threads"] for r in runs.values()})
    jobs = max(r["jobs"] for r in runs.values())
    md.append(
        f"Each system ran in its own process on one core, {jobs} at a time (`--jobs`), so their times overlap.\n"
        if jobs > 1
        else f"The systems ran one after another in one process on {threads[0]} core(s) (`--jobs 1`).\n"
    )
    if phase_rows:
        where = "every process, summed" if jobs > 1 else "this process"
        md += [f"Time per phase ({where}; compile overlaps train and evaluate):\n", *phase_rows, ""]
    md += ["## Seeds\n"]
    for s, r in runs.items():
        c = r["config"]
        md.append(
            f"- {s}: `seed={c.seed}`, corpus `{c.data.corpus}/{c.data.synthetic}`, `data.synthetic_spec.seed={c.data.synthetic_spec.seed}`"
        )
    md += ["", "## Configs\n"]
    if args.set:
        md.append("Overrides applied to every model: " + ", ".join(f"`{o}`" for o in args.set) + "\n")
    for s, r in runs.items():
        flat = {k: (list(v) if isinstance(v, tuple) else v) for k, v in flatten_config(r["config"]).items()}
        md += [
            f"### {s} (`{r['spec']}`)\n",
            "```json",
            json.dumps(flat, indent=1, sort_keys=True, default=str),
            "```\n",
        ]
    md += ["## Versions\n", "| package | version |", "|---|---|"]
    md += [f"| {k} | {v} |" for k, v in package_versions().items()]
    md += ["", "## Machine\n", "| | |", "|---|---|"]
    md += [f"| {k} | {v} |" for k, v in machine().items()]
    md += ["", "## Files\n"]
    md += [
        f"- {s}: run `{_rel(r['workdir'], out)}/`, evaluation `{_rel(os.path.dirname(r['eval']['files']['evaluation.json']), out)}/`"
        for s, r in runs.items()
    ]
    return md


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity), or all of them where affinity is unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _decode_settings(args: argparse.Namespace) -> tuple[int, int]:
    """The beam size and number of test pairs: the flags, or the preset's defaults."""
    beam = args.beam if args.beam is not None else (2 if args.smoke else 4)
    max_examples = args.max_examples if args.max_examples is not None else (7 if args.smoke else 140)
    return beam, max_examples


def system_config(system: str, args: argparse.Namespace):
    """One system's config file (with ``:smoke`` under ``--smoke``) and its config after ``--set``."""
    from attn_jax.train import apply_overrides, load_config

    name = dict(SYSTEMS)[system]
    spec = os.path.join(REPO, "configs", f"{name}.py") + (":smoke" if args.smoke else "")
    return spec, apply_overrides(load_config(spec), args.set)


def run_system(system: str, args: argparse.Namespace, out: str, timer: PhaseTimer) -> dict:
    """Trains and evaluates one system in this process; returns its run record (no arrays, so it pickles)."""
    from attn_jax.pipeline import DecodeOptions, decode_progress, evaluate_workdir
    from attn_jax.train import ProgressLine, train_and_evaluate

    beam, max_examples = _decode_settings(args)
    spec, config = system_config(system, args)
    workdir = os.path.join(out, dict(SYSTEMS)[system])
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"== {system}: training {spec} -> {workdir}", flush=True)
    t0 = time.perf_counter()
    with timer.phase("train"):
        trained = train_and_evaluate(config, workdir, tty=False)
    train_s = time.perf_counter() - t0
    print(f"== {system}: evaluating (test split, beam {beam}, at most {max_examples} pairs)", flush=True)
    t0 = time.perf_counter()
    progress = decode_progress(ProgressLine(sys.stdout, tty=False, label=f"{system}: decoded", every_s=20.0))
    with timer.phase("decode + evaluate"):
        result = evaluate_workdir(
            workdir,
            split="test",
            decode=DecodeOptions(beam_size=beam),
            max_examples=max_examples,
            name=system,
            log=print,
            progress=progress,
            # One compiled search and one teacher-forced pass per system instead of one per width and
            # partial batch: at these sizes compiling costs more than decoding.
            one_shape=True,
            save_attention=True,  # for report.html's heatmaps: two teacher-forced passes of 140 pairs
        )
    return {
        "spec": os.path.relpath(spec, REPO),
        "workdir": workdir,
        "step": trained.step,
        "best_step": trained.best_step,
        "eval": result,
        "train_s": train_s,
        "eval_s": time.perf_counter() - t0,
        "threads": len(usable_cores()),  # the cores XLA's CPU thread pool was sized by
    }


def _job_file(out: str, system: str) -> str:
    return os.path.join(out, dict(SYSTEMS)[system], "job.pkl")


def run_job(args: argparse.Namespace) -> int:
    """``--job SYSTEM``: one system's training and evaluation, in a process pinned to one core (``--core``).
    Writes its run record and phase times to ``<out>/<run>/job.pkl`` for the parent's report."""
    from attn_jax.pipeline import quiet_checkpoint_logs

    quiet_checkpoint_logs()
    out = os.path.abspath(args.out)
    timer = PhaseTimer().listen()
    run = run_system(args.job, args, out, timer)
    timer.close()
    path = _job_file(out, args.job)
    with open(path + ".tmp", "wb") as f:
        pickle.dump({"run": run, "timer": timer.state()}, f)
    os.replace(path + ".tmp", path)
    return 0


def _job_command(system: str, args: argparse.Namespace, out: str) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--job", system, "--out", out]
    cmd += ["--smoke"] if args.smoke else []
    cmd += ["--beam", str(args.beam)] if args.beam is not None else []
    cmd += ["--max-examples", str(args.max_examples)] if args.max_examples is not None else []
    for override in args.set:
        cmd += ["--set", override]
    return cmd


def _relay(system: str, stream, log_path: str) -> None:
    """Prints a job's output lines, each prefixed with its system, and keeps them in its log file."""
    with open(log_path, "w", encoding="utf-8") as log:
        for line in stream:
            log.write(line)
            log.flush()
            print(f"[{system}] {line}", end="", flush=True)


def run_jobs(systems: Sequence[str], args: argparse.Namespace, out: str, cores: Sequence[int]) -> dict:
    """Runs each system as a ``--job`` process pinned to one core of ``cores``, at most one per core at a time,
    longest first. Returns each system's run record and phase times. A failed job stops the others and raises
    ``SystemExit`` naming its log."""
    todo = [s for s in LONGEST_FIRST if s in systems]
    free, running, done = list(cores), {}, {}
    try:
        while todo or running:
            while todo and free:
                system, core = todo.pop(0), free.pop(0)
                log_path = os.path.join(out, f"{dict(SYSTEMS)[system]}.log")
                proc = subprocess.Popen(
                    _job_command(system, args, out) + ["--core", str(core)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    cwd=REPO,
                )
                relay = threading.Thread(target=_relay, args=(system, proc.stdout, log_path), daemon=True)
                relay.start()
                print(f"== {system}: started on core {core} (log {_rel(log_path, out)})", flush=True)
                running[system] = (proc, relay, core, log_path)
            time.sleep(0.5)
            for system, (proc, relay, core, log_path) in list(running.items()):
                if proc.poll() is None:
                    continue
                relay.join()
                del running[system]
                free.append(core)
                if proc.returncode != 0:
                    raise SystemExit(f"error: {system} failed (exit {proc.returncode}); see {log_path}")
                with open(_job_file(out, system), "rb") as f:
                    done[system] = pickle.load(f)
    finally:
        for proc, relay, _, _ in running.values():
            proc.terminate()
            proc.wait()
            relay.join()
    return done


def run_experiment(args: argparse.Namespace) -> str:
    """Train, evaluate and report; returns the path of report.md."""
    from attn_jax import eval as ev
    from attn_jax.pipeline import quiet_checkpoint_logs

    quiet_checkpoint_logs()
    beam, max_examples = _decode_settings(args)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    t_start = time.perf_counter()
    timer = PhaseTimer().listen()

    cores = usable_cores()
    jobs = min(args.jobs or len(cores), len(args.systems), len(cores))
    if jobs > 1 and not hasattr(os, "sched_setaffinity"):  # a job cannot be pinned to one core here
        print(
            f"== --jobs {jobs}: this OS cannot pin a process to a core; running one system at a time",
            flush=True,
        )
        jobs = 1
    runs = {}
    if jobs > 1:
        print(f"== {len(args.systems)} systems, {jobs} at a time, one core each (--jobs)", flush=True)
        for system in args.systems:
            shutil.rmtree(os.path.join(out, dict(SYSTEMS)[system]), ignore_errors=True)
        done = run_jobs(args.systems, args, out, cores[:jobs])
        for system in args.systems:
            runs[system] = done[system]["run"]
            timer.add(done[system]["timer"])
    else:
        for system in args.systems:
            runs[system] = run_system(system, args, out, timer)
    for system, run in runs.items():
        run["config"] = system_config(system, args)[1]
        run["jobs"] = jobs

    timer.start("report")
    results = {s: run_numbers(r) for s, r in runs.items()}
    checks = fd.check_findings(results)
    numbers = fd.headline(results)
    recipes = {s: recipe(r["config"]) for s, r in runs.items()}
    ranges, why_no_ranges = load_ranges(args, recipes)
    _write_results(out, runs, results, checks, numbers, recipes)
    by_length = {s: r["eval"]["bleu_by_length_result"] for s, r in runs.items()}
    scores = {s: r["eval"]["system_scores"] for s, r in runs.items()}
    plot = ev.plot_bleu_by_length(
        by_length, os.path.join(out, "bleu_by_length.png"), title="BLEU by source sentence length (test)"
    )
    total_s = time.perf_counter() - t_start
    names = list(runs)

    md = [
        f"# Bahdanau et al. (2015) at CPU scale: {' vs '.join(names)}\n",
        f"Preset: {'cpu, smoke configs' if args.smoke else 'cpu'}. Every model trained on the same generated pairs ("
        + "; ".join(
            f"{s}: {r['config'].num_train_steps:,} updates of {r['config'].data.batch_size} sentences"
            for s, r in runs.items()
        )
        + f"), evaluated on the test split with beam {beam} on at most {max_examples} "
        "pairs spread over the source-length buckets (decoded in batches of one padded shape per system).\n",
        "## BLEU by source sentence length (Figure 2)\n",
        ev.bleu_by_length_markdown(by_length),
        f"![BLEU by length]({_rel(plot, out)})\n",
        "## Overall BLEU, No-UNK BLEU, AER (Table 1)\n",
        ev.summary_markdown(scores),
    ]
    if "RNNenc" in runs:
        md.append("AER: RNNenc has no attention, so it has no alignment to score.")
    if "Transformer" in runs:
        md.append(
            "AER of the Transformer: its last decoder layer's cross-attention averaged over heads, "
            "teacher-forced on the reference (each reference word linked to its most-attended source word)."
        )
    md.append("")
    md += findings_markdown(checks, numbers, ranges, args, why_no_ranges)
    md += _heatmaps_markdown(runs, out)
    md += _html_report(runs, out)
    timer.stop("report")
    timer.close()
    phase_rows = timer.markdown()
    md += _appendix_markdown(runs, args, total_s, out, phase_rows)
    print("\n".join(phase_rows), flush=True)
    report = os.path.join(out, "report.md")
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.job is not None:
        if args.core is not None:  # before JAX starts: XLA sizes its CPU thread pool by the usable cores
            os.sched_setaffinity(0, {args.core})
        return run_job(args)
    if args.preset == "paper":
        print(PAPER_COMMANDS, end="")
        return 0
    report = run_experiment(args)
    print(f"report written to {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
