"""data.pack at the same budget: configs/transformer_cpu.py with a reduced number of updates, seeds x {off, on}.

    nice -n 5 .venv/bin/python experiments/packing/run.py --steps 300 --seeds 0,1,2 --out runs/packing

Each run trains in its own workdir (``<out>/pack{0,1}_seed{s}``) through ``attn_jax.train.train_and_evaluate``,
then decodes the test split greedily (``evaluate_workdir``, beam 1, no heatmaps). A run already finished (its
``result.json`` exists) is read, not redone, so the script can be stopped and started again. The table (mean ±
sample sd over seeds) goes to stdout and ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time

from attn_jax.pipeline import DecodeOptions, evaluate_workdir
from attn_jax.train import apply_overrides, load_config, read_metrics, train_and_evaluate

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "transformer_cpu.py")


def run_one(out: str, seed: int, pack: bool, steps: int, eval_max: int | None) -> dict:
    workdir = os.path.join(out, f"pack{int(pack)}_seed{seed}")
    done = os.path.join(workdir, "result.json")
    if os.path.exists(done):
        with open(done, encoding="utf-8") as f:
            return json.load(f)
    config = apply_overrides(
        load_config(CONFIG),
        [
            f"seed={seed}",
            f"num_train_steps={steps}",
            f"eval_every={steps}",
            f"checkpoint_every={steps}",
            f"log_every={max(steps // 6, 1)}",
            f"data.pack={pack}",
            "tensorboard=false",
        ],
    )
    tic = time.monotonic()
    result = train_and_evaluate(config, workdir, stream=io.StringIO(), tty=False)
    train_s = time.monotonic() - tic
    train = [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if r["split"] == "train"]
    ev = evaluate_workdir(
        workdir, split="test", decode=DecodeOptions(beam_size=1), num_heatmaps=0, max_examples=eval_max
    )
    record = {
        "seed": seed,
        "pack": pack,
        "steps": steps,
        "train_seconds": train_s,
        "val_nll_per_token": result.validation["nll_per_token"],
        "test_bleu": ev["bleu"],
        "test_sentences": ev["num_sentences"],
        "train_tokens": sum(r["tokens"] for r in train),
        "train_sentences": sum(r["sentences"] for r in train),
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in train[1:] or train),
    }
    with open(done, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    return record


def _ms(xs):
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default="runs/packing")
    p.add_argument("--eval-max", type=int, default=0, help="test pairs decoded (0: all)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    records = []
    for seed in seeds:  # alternate, so a slow spell of the shared machine hits both settings
        for pack in (False, True):
            r = run_one(args.out, seed, pack, args.steps, args.eval_max or None)
            records.append(r)
            print(json.dumps(r), flush=True)
    print(
        "| data.pack | seeds | train pairs seen | train tokens | tokens/s | val NLL/token | test BLEU (greedy) |"
    )
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for pack in (False, True):
        rs = [r for r in records if r["pack"] == pack]
        row = {k: [r[k] for r in rs] for k in ("train_sentences", "train_tokens", "tokens_per_s")}
        row |= {k: [r[k] for r in rs] for k in ("val_nll_per_token", "test_bleu")}
        summary[str(pack)] = row
        print(
            f"| {pack} | {len(rs)} | {statistics.mean(row['train_sentences']):,.0f} | "
            f"{statistics.mean(row['train_tokens']):,.0f} | {statistics.mean(row['tokens_per_s']):,.0f} | "
            f"{_ms(row['val_nll_per_token'])} | {_ms(row['test_bleu'])} |"
        )
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"steps": args.steps, "seeds": seeds, "records": records, "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
