"""Guided alignment (``lambda_align``) on the built-in corpus: AER and validation gold hit with and without it.

    python experiments/guided_alignment/run.py --out runs/guided_alignment            # 2 x 3 seeds, reduced budget
    python experiments/guided_alignment/run.py --smoke --out /tmp/ga                  # tiny configs, seconds

Trains configs/rnnsearch_cpu.py (the demo's RNNsearch and corpus) once per (lambda_align, seed), one run at a
time, with a reduced budget (``--steps`` updates, validation on ``--eval-pairs`` pairs at the end only), then
evaluates each run's last checkpoint on the test split with ``attn_jax.pipeline.evaluate_workdir`` (greedy,
``--test-per-bucket`` pairs in each of the 7 source-length buckets, no heatmaps): AER of the teacher-forced attention
against the corpus' gold links (overall and within the training lengths) and BLEU. Writes ``<out>/results.json``
(one row per run) and ``<out>/table.md`` (mean ± sd over seeds). Only calls the library.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(REPO, "configs", "rnnsearch_cpu.py")
sys.path.insert(0, REPO)  # this checkout's attn_jax, not another installed copy


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/guided_alignment", help="output directory (default: %(default)s)")
    p.add_argument("--smoke", action="store_true", help="the config's :smoke variant")
    p.add_argument(
        "--lambdas", default="0,1", help="comma-separated lambda_align values (default: %(default)s)"
    )
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: %(default)s)")
    p.add_argument("--steps", type=int, default=150, help="updates per run (default: %(default)s)")
    p.add_argument(
        "--train-size", type=int, default=4000, help="generated training pairs (default: %(default)s)"
    )
    p.add_argument("--eval-pairs", type=int, default=200, help="validation pairs (default: %(default)s)")
    p.add_argument(
        "--test-per-bucket",
        type=int,
        default=5,
        help="test pairs per source-length bucket 0-9, ..., 60+ (default: %(default)s)",
    )
    return p.parse_args(argv)


def run_one(args, lam: float, seed: int) -> dict:
    from attn_jax.pipeline import DecodeOptions, evaluate_workdir
    from attn_jax.train import apply_overrides, load_config, read_metrics, train_and_evaluate

    config = load_config(CONFIG + (":smoke" if args.smoke else ""))
    steps = config.num_train_steps if args.smoke else args.steps
    overrides = [
        f"seed={seed}",
        f"lambda_align={lam}",
        f"num_train_steps={steps}",
        f"eval_every={steps}",
        f"checkpoint_every={steps}",
        "keep_checkpoints=1",
        "tensorboard=False",
        "async_checkpoints=False",
    ]
    if not args.smoke:
        overrides += [
            f"data.synthetic_spec.train_size={args.train_size}",
            f"data.max_eval_examples={args.eval_pairs}",
            f"optimizer.warmup_steps={min(100, steps // 3)}",
        ]
    config = apply_overrides(config, overrides)
    workdir = os.path.join(args.out, f"lambda{lam:g}_seed{seed}")
    shutil.rmtree(workdir, ignore_errors=True)
    t0 = time.perf_counter()
    with open(os.devnull, "w") as quiet:
        train_and_evaluate(config, workdir, stream=quiet, tty=False)
    train_s = time.perf_counter() - t0
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    val = [r for r in records if r["split"] == "validation"][-1]
    t0 = time.perf_counter()
    result = evaluate_workdir(
        workdir,
        split="test",
        decode=DecodeOptions(beam_size=1),
        test_per_bucket=None if args.smoke else args.test_per_bucket,
        checkpoint="last",
        num_heatmaps=0,
    )
    eval_s = time.perf_counter() - t0
    aer, within = result["aer"], result["aer_within_training_lengths"]
    return {
        "lambda_align": lam,
        "seed": seed,
        "steps": steps,
        "val_gold_hit": val.get("attn_gold_hit"),
        "val_nll_per_token": val["nll_per_token"],
        "val_align_loss": val.get("align_loss"),
        "test_aer": aer["aer"] if aer else None,
        "test_aer_within": within["aer"] if within else None,
        "test_bleu": result["bleu"],
        "test_sentences": result["num_sentences"],
        "train_s": round(train_s, 1),
        "eval_s": round(eval_s, 1),
        "overrides": overrides,
    }


def _mean_sd(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| lambda_align | seeds | test AER | test AER within training lengths | val gold hit | val NLL/token | "
        "test BLEU (greedy) |",
        "|---|---|---|---|---|---|---|",
    ]
    for lam in sorted({r["lambda_align"] for r in rows}):
        rs = [r for r in rows if r["lambda_align"] == lam]
        lines.append(
            f"| {lam:g} | {len(rs)} | {_mean_sd(r['test_aer'] for r in rs)} | "
            f"{_mean_sd(r['test_aer_within'] for r in rs)} | {_mean_sd(r['val_gold_hit'] for r in rs)} | "
            f"{_mean_sd(r['val_nll_per_token'] for r in rs)} | {_mean_sd(r['test_bleu'] for r in rs)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    rows = json.load(open(path)) if os.path.exists(path) else []
    for seed in (int(s) for s in args.seeds.split(",")):
        for lam in (float(x) for x in args.lambdas.split(",")):
            row = run_one(args, lam, seed)
            rows = [r for r in rows if (r["lambda_align"], r["seed"]) != (lam, seed)] + [row]
            with open(path, "w") as f:
                json.dump(rows, f, indent=2)
            print(json.dumps({k: v for k, v in row.items() if k != "overrides"}), flush=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
