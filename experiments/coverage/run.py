"""Coverage (Tu et al. 2016; See et al. 2017) against the demo's looping on long sentences: RNNsearch with and
without ``model.coverage`` (+ the coverage loss), several seeds at one budget, on configs/rnnsearch_cpu.py's corpus.

    nice -n 5 python experiments/coverage/run.py --seeds 0,1,2 --steps 1500 --out runs/coverage  # one run at a time
    python experiments/coverage/run.py --table --out runs/coverage    # the README's table from results.jsonl
    python experiments/coverage/run.py --smoke --seeds 0 --steps 30 --max-examples 7 --out /tmp/cov_smoke

Each (variant, seed) trains configs/rnnsearch_cpu.py with ``num_train_steps=--steps`` (evaluation and the one
checkpoint at the end), the ``coverage`` variant adding ``model.coverage=true lambda_coverage=--lam``, then evaluates
the test split with beam search (``attn_jax.pipeline.evaluate_workdir``, ``--max-examples`` pairs spread evenly over
the seven length buckets) and appends one line to ``<out>/results.jsonl``. A finished (variant, seed) is skipped on
a rerun, so the runs can be done one at a time.

Measured on the hypotheses of sources with 40 or more words (the buckets 40-49, 50-59, 60+, all beyond the 30
training words):
  * ``rep3``: the share of hypotheses in which some word 3-gram occurs twice or more;
  * ``rep3_rate``: repeated 3-gram occurrences (each occurrence of a 3-gram after its first) over all 3-grams;
  * ``bleu40``: corpus BLEU (sacreBLEU 13a) of those hypotheses;
and the same two repetition numbers for the references (the corpus' own repetitions), and the overall BLEU.
Only calls the library.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)  # this checkout's attn_jax and experiments/, wherever the script is run from

from experiments._results import load_results, mean_sd_cell, read_lines  # noqa: E402

LONG = 40  # source words: the "40+" sentences


def repeats(sentence: str, n: int = 3) -> tuple[int, int]:
    """``(repeated n-gram occurrences, n-grams)`` of one whitespace-tokenised sentence.

    >>> repeats("a b c a b c a")
    (2, 5)
    """
    words = sentence.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    counts = collections.Counter(grams)
    return sum(c - 1 for c in counts.values()), len(grams)


def repetition(sentences: list[str]) -> dict[str, float]:
    """``rep3`` (share of sentences with a repeated 3-gram) and ``rep3_rate`` (repeated over all 3-grams)."""
    pairs = [repeats(s) for s in sentences]
    total = sum(n for _, n in pairs)
    return {
        "rep3": sum(r > 0 for r, _ in pairs) / max(len(pairs), 1),
        "rep3_rate": sum(r for r, _ in pairs) / max(total, 1),
    }


def run_one(args, variant: str, seed: int) -> dict:
    from attn_jax import eval as ev
    from attn_jax.pipeline import DecodeOptions, evaluate_workdir, quiet_checkpoint_logs
    from attn_jax.train import apply_overrides, load_config, train_and_evaluate

    quiet_checkpoint_logs()
    overrides = [
        f"seed={seed}",
        f"num_train_steps={args.steps}",
        f"eval_every={args.steps}",
        f"checkpoint_every={args.steps}",
        "log_every=50",
        "tensorboard=false",
        "async_checkpoints=false",
    ]
    if variant == "coverage":
        overrides += ["model.coverage=true", f"lambda_coverage={args.lam}"]
        if args.coverage_start:
            overrides.append(f"coverage_start_step={args.coverage_start}")
    spec = os.path.join(REPO, "configs", "rnnsearch_cpu.py") + (":smoke" if args.smoke else "")
    config = apply_overrides(load_config(spec), overrides)
    workdir = os.path.join(args.out, f"{variant}_s{seed}")
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"== {variant} seed {seed}: training ({' '.join(overrides)}) -> {workdir}", flush=True)
    t0 = time.perf_counter()
    trained = train_and_evaluate(config, workdir, tty=False)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = evaluate_workdir(
        workdir,
        split="test",
        decode=DecodeOptions(beam_size=args.beam),
        max_examples=args.max_examples,
        num_heatmaps=0,
    )
    eval_s = time.perf_counter() - t0
    files = result["files"]
    sources, refs, hyps = (read_lines(files[k]) for k in ("sources.txt", "references.txt", "hypotheses.txt"))
    long = [i for i, s in enumerate(sources) if len(s.split()) >= LONG]
    hyp_long, ref_long = [hyps[i] for i in long], [refs[i] for i in long]
    record = {
        "variant": variant,
        "seed": seed,
        "steps": args.steps,
        "lambda_coverage": args.lam if variant == "coverage" else 0.0,
        "coverage_start_step": args.coverage_start if variant == "coverage" else 0,
        "beam": args.beam,
        "pairs": len(sources),
        "long_pairs": len(long),
        "bleu": result["bleu"],
        "bleu40": ev.corpus_bleu(hyp_long, ref_long).score if long else None,
        **{k: v for k, v in repetition(hyp_long).items()},
        **{f"ref_{k}": v for k, v in repetition(ref_long).items()},
        "rep3_all": repetition(hyps)["rep3"],
        "validation_nll": (trained.validation or {}).get("nll_per_token"),
        "coverage_loss": (trained.validation or {}).get("coverage_loss"),
        "gold_hit": (trained.validation or {}).get("attn_gold_hit"),
        "train_s": round(train_s, 1),
        "eval_s": round(eval_s, 1),
    }
    print(json.dumps(record), flush=True)
    return record


def table(records: list[dict]) -> str:
    """Mean ± sd over seeds per variant (markdown)."""
    cols = [
        ("rep3", "hyps with a repeated 3-gram, 40+ (%)", 100),
        ("rep3_rate", "repeated 3-grams, 40+ (%)", 100),
        ("bleu40", "BLEU 40+", 1),
        ("bleu", "BLEU all", 1),
        ("validation_nll", "val. NLL/token", 1),
        ("gold_hit", "val. gold hit", 1),
    ]
    lines = [
        "| variant | seeds | " + " | ".join(c[1] for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]

    # one row per (variant, lambda_coverage, coverage_start_step): several studies' results.jsonl concatenated
    def group_of(r):
        return r["variant"], r["lambda_coverage"], r.get("coverage_start_step", 0)

    groups = sorted({group_of(r) for r in records}, key=lambda g: (g[0] != "baseline", g[1], g[2]))
    for variant, lam, start in groups:
        rs = [r for r in records if group_of(r) == (variant, lam, start)]
        cells = []
        for key, _, scale in cols:
            cells.append(mean_sd_cell([r[key] * scale for r in rs if r.get(key) is not None]))
        seeds = ",".join(str(r["seed"]) for r in rs)
        name = variant if variant == "baseline" else f"{variant}, λ = {lam:g}"
        if start:
            name += f" from update {start}"
        lines.append(f"| {name} | {seeds} | " + " | ".join(cells) + " |")
    refs = [r for r in records if r["long_pairs"]]
    if refs:
        lines.append(
            f"\nReferences (the corpus itself, same sentences): {100 * refs[0]['ref_rep3']:.1f} % with a repeated "
            f"3-gram, {100 * refs[0]['ref_rep3_rate']:.2f} % repeated 3-grams; {refs[0]['long_pairs']} of "
            f"{refs[0]['pairs']} test pairs have 40+ source words."
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/coverage")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--variants", default="baseline,coverage")
    p.add_argument("--steps", type=int, default=400, help="updates per run (the demo: 1500)")
    p.add_argument("--lam", type=float, default=1.0, help="lambda_coverage of the coverage variant")
    p.add_argument(
        "--coverage-start",
        type=int,
        default=0,
        help="coverage_start_step of the coverage variant: the loss joins after this many updates (See et al.)",
    )
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-examples", type=int, default=140)
    p.add_argument("--table", action="store_true", help="print the table of results.jsonl and exit")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="configs/rnnsearch_cpu.py:smoke (checks the script, measures nothing)",
    )
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    if args.table:
        print(table(load_results(args.out)))
        return
    done = {(r["variant"], r["seed"]) for r in load_results(args.out)}
    for seed in (int(s) for s in args.seeds.split(",")):
        for variant in args.variants.split(","):
            if (variant, seed) in done:
                print(f"== {variant} seed {seed}: done already, skipped", flush=True)
                continue
            record = run_one(args, variant, seed)
            with open(os.path.join(args.out, "results.jsonl"), "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
    print(table(load_results(args.out)))


if __name__ == "__main__":
    main()
