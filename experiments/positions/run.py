"""Position schemes in the demo's Transformer: sinusoidal vs ALiBi vs Shaw relative, BLEU by source length.

    nice -n 5 python experiments/positions/run.py                  # the reduced CPU budget of the README
    python experiments/positions/run.py --smoke --out /tmp/pos    # seconds per run: tiny configs, same table

Trains configs/transformer_cpu.py once per (seed, ``model.positions``) with every other setting equal, evaluates
each run on the test split with beam search (``attn_jax.pipeline.evaluate_workdir``, the same pairs for every
run) and writes ``<out>/results.json`` (after every run, so an interrupted study keeps what it measured) and
``<out>/table.md``: BLEU per source-length bucket, mean ± sample sd over the seeds. Only calls the library.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(REPO, "configs", "transformer_cpu.py")
sys.path.insert(0, REPO)  # this checkout's attn_jax, even where another checkout is the installed one


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/positions", help="output directory (default: %(default)s)")
    p.add_argument("--positions", default="sinusoidal,alibi,relative", help="default: %(default)s")
    p.add_argument("--seeds", default="0,1,2", help="default: %(default)s")
    p.add_argument("--steps", type=int, default=800, help="updates per run (default: %(default)s)")
    p.add_argument("--beam", type=int, default=4, help="default: %(default)s")
    p.add_argument(
        "--max-examples",
        type=int,
        default=70,
        help="test pairs, spread over the buckets (default: %(default)s)",
    )
    p.add_argument("--smoke", action="store_true", help="the config's :smoke variant (seconds per run)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra override, repeatable"
    )
    return p.parse_args(argv)


def overrides(args: argparse.Namespace, positions: str, seed: int) -> list[str]:
    every = max(1, args.steps // 2)
    return [
        f"seed={seed}",
        f"model.positions={positions}",
        f"num_train_steps={args.steps}",
        f"eval_every={every}",
        f"checkpoint_every={every}",
        *args.set,
    ]


def table(results: list[dict], positions: list[str]) -> str:
    """Markdown: one row per bucket (and overall), ``mean ± sd (n)`` per position scheme."""
    buckets = list(dict.fromkeys(b for r in results for b in r["bleu_by_bucket"]))
    lines = ["| source length | " + " | ".join(positions) + " |", "|---" * (len(positions) + 1) + "|"]

    def cell(values):
        values = [v for v in values if v is not None]
        if not values:
            return "–"
        if len(values) == 1:
            return f"{values[0]:.1f} (1 seed)"
        return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f} ({len(values)})"

    for bucket in [*buckets, "all"]:
        row = [bucket]
        for pos in positions:
            runs = [r for r in results if r["positions"] == pos]
            row.append(
                cell([r["bleu"] if bucket == "all" else r["bleu_by_bucket"].get(bucket) for r in runs])
            )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from attn_jax.pipeline import DecodeOptions, evaluate_workdir, quiet_checkpoint_logs
    from attn_jax.train import apply_overrides, load_config, train_and_evaluate

    quiet_checkpoint_logs()
    positions = args.positions.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    results = []
    for seed in seeds:  # seeds outermost: an interrupted study still compares every scheme
        for pos in positions:
            config = apply_overrides(
                load_config(CONFIG + (":smoke" if args.smoke else "")), overrides(args, pos, seed)
            )
            workdir = os.path.join(out, f"{pos}_seed{seed}")
            shutil.rmtree(workdir, ignore_errors=True)
            print(f"== {pos} seed {seed}: training -> {workdir}", flush=True)
            t0 = time.perf_counter()
            with open(os.path.join(out, f"{pos}_seed{seed}.train.log"), "w", encoding="utf-8") as log:
                trained = train_and_evaluate(config, workdir, tty=False, stream=log)
            train_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            ev = evaluate_workdir(
                workdir,
                split="test",
                decode=DecodeOptions(beam_size=args.beam),
                max_examples=args.max_examples,
                name=f"Transformer ({pos})",
                num_heatmaps=0,
            )
            eval_s = time.perf_counter() - t0
            buckets = {b["bucket"]: b["bleu"] for b in ev["bleu_by_length"]["buckets"] if b["sentences"]}
            results.append(
                {
                    "positions": pos,
                    "seed": seed,
                    "bleu": ev["bleu"],
                    "bleu_by_bucket": buckets,
                    "sentences_by_bucket": {
                        b["bucket"]: b["sentences"] for b in ev["bleu_by_length"]["buckets"]
                    },
                    "step": ev["step"],
                    "best_step": trained.best_step,
                    "train_s": round(train_s, 1),
                    "eval_s": round(eval_s, 1),
                    "overrides": overrides(args, pos, seed),
                }
            )
            print(
                f"   BLEU {ev['bleu']:.2f} (checkpoint {ev['step']}); train {train_s:.0f} s, eval {eval_s:.0f} s",
                flush=True,
            )
            with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
                json.dump({"args": vars(args), "runs": results}, f, indent=1)
            with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
                f.write(table(results, positions))
    print(table(results, positions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
