"""Row 8: peak RSS and start-up of `attn-jax train` as a prepared plain-text corpus grows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

from harness import REPO, Ctx, Section, fmt_bytes, fmt_ratio, fmt_time, verdict

# Targets (README.md says where each comes from).
CORPUS_RSS_RATIO_MAX = 1.5  # peak RSS at 5·10^6 pairs under 1.5x that at 10^5 (prepared data)


def _write_corpus(directory: str, n: int, seed: int = 0) -> None:
    """``n`` generated pairs as ``train.src`` / ``train.tgt``: 3-13 words of 2,000 (1 % of pairs 20 words, over
    the smoke config's limit of 14), the target the source reversed with other spellings. Written in blocks."""
    import numpy as np

    rng = np.random.default_rng(seed)
    src_words = np.array([f"s{k}" for k in range(2000)])
    tgt_words = np.array([f"t{k}" for k in range(2000)])
    block = 50_000
    with (
        open(os.path.join(directory, "train.src"), "w", encoding="utf-8") as fs,
        open(os.path.join(directory, "train.tgt"), "w", encoding="utf-8") as ft,
    ):
        for start in range(0, n, block):
            m = min(block, n - start)
            lengths = np.where(rng.random(m) < 0.01, 20, rng.integers(3, 14, m))
            ids = rng.zipf(1.3, int(lengths.sum())) % 2000
            ends = np.cumsum(lengths)
            src, tgt = src_words[ids], tgt_words[ids]
            fs.write("".join(" ".join(src[e - k : e]) + "\n" for e, k in zip(ends, lengths, strict=True)))
            ft.write(
                "".join(" ".join(tgt[e - k : e][::-1]) + "\n" for e, k in zip(ends, lengths, strict=True))
            )


def _run_measured(argv: list[str], env: dict[str, str], mark: str) -> tuple[float, float | None, int, str]:
    """Run a command; ``(wall s, s until the first output line starting with mark or None, peak RSS bytes of
    the process, output)``. The peak is the child's own ``ru_maxrss`` (``os.wait4``)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen, lines = None, []
    for line in p.stdout:
        lines.append(line)
        if seen is None and line.startswith(mark):
            seen = time.perf_counter() - t0
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:5])} exited {p.returncode}: {''.join(lines[-5:]).strip()}")
    return wall, seen, usage.ru_maxrss * 1024, "".join(lines)


def row_large_corpus(ctx: Ctx) -> Section:
    """Peak RSS and start-up of a 30-update `attn-jax train` as the plain-text corpus grows (data.prepared_dir)."""
    import tempfile

    sizes = ctx.sizes
    smoke = os.path.join(REPO, "configs", "rnnsearch_cpu.py:smoke")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH", "")]))
    cli = [sys.executable, "-m", "attn_jax.cli"]
    sec = Section(
        "8. Corpora larger than memory: peak RSS and start-up of `attn-jax train` against corpus size",
        "Generated plain-text corpora (3-13 words of 2,000 a side, 1 % of pairs over the length limit). "
        "`attn-jax data --prepare` writes the training split as memory-mapped arrays; then a 30-update "
        "`attn-jax train` of `configs/rnnsearch_cpu.py:smoke` (RNNsearch, hidden 24, batches of 16, no "
        "validation) reads it with `data.prepared_dir`, and, up to "
        f"{sizes.corpus_in_memory_up_to:,} pairs, the same run reads the text into memory as before. Each command "
        "is a fresh process; peak RSS is its `ru_maxrss`; start-up is launch to the `model:` line, printed once "
        "the data are read, the vocabularies built and the batch schedule made (JAX's import included, "
        "compilation not).",
    )
    rows, peaks = [], {}
    with tempfile.TemporaryDirectory(prefix="attn_jax_bench_corpus_") as tmp:
        for n in sizes.corpus_sizes:
            row, peaks[n] = _corpus_row(ctx, tmp, n, (cli, env, smoke))
            rows.append(row)
    sec.table(
        [
            "pairs",
            "generate",
            "prepare: process wall (pairs/s preparing)",
            "prepare: peak RSS",
            "train (prepared): start-up",
            "train (prepared): wall",
            "train (prepared): peak RSS",
            "train (in memory): start-up",
            "train (in memory): peak RSS",
        ],
        rows,
    )
    small, large = min(peaks), max(peaks)
    ratio = peaks[large] / peaks[small]
    sec.notes.append(
        f"peak RSS at {large:,} / at {small:,} pairs (prepared): {fmt_ratio(ratio)} "
        f"(target < {CORPUS_RSS_RATIO_MAX}: {verdict(ratio < CORPUS_RSS_RATIO_MAX)})"
    )
    return sec


def _corpus_row(ctx: Ctx, tmp: str, n: int, run) -> tuple[list[str], int]:
    """Generate ``n`` pairs in ``tmp``, prepare them, train from them (and from memory up to the limit).

    ``run`` is ``(cli argv, environment, config)``. Returns the table row and the peak RSS of the training
    run from prepared data.
    """
    cli, env, smoke = run
    sizes = ctx.sizes
    d = os.path.join(tmp, f"c{n}")
    os.makedirs(d)
    ctx.log(f"row 8: generating {n:,} pairs")
    t0 = time.perf_counter()
    _write_corpus(d, n)
    generated = time.perf_counter() - t0
    common = [
        "--config",
        smoke,
        "--config.data.corpus=plain",
        f"--config.data.source_path={d}/{{split}}.src",
        f"--config.data.target_path={d}/{{split}}.tgt",
        "--config.data.eval_split=none",
    ]
    prepared = os.path.join(tmp, f"p{n}")
    ctx.log(f"row 8: preparing {n:,} pairs")
    prep_s, _, prep_rss, out = _run_measured([*cli, "data", "--prepare", "--out", prepared, *common], env, "")
    rate = re.search(r"data: prepared [\d,]+ pairs in [\d.]+ s \(([\d,]+) pairs/s\)", out)
    train = [
        "train",
        "--progress",
        "lines",
        *common,
        "--config.checkpoint_every=30",
        "--config.tensorboard=false",
        "--config.async_checkpoints=false",
    ]
    ctx.log(f"row 8: training 30 updates from the prepared {n:,} pairs")
    wall, start, rss, out = _run_measured(
        [
            *cli,
            *train,
            "--workdir",
            os.path.join(tmp, f"r{n}"),
            f"--config.data.prepared_dir={prepared}",
        ],
        env,
        "model: ",
    )
    if "data: reusing prepared train split" not in out:
        raise RuntimeError(f"the run did not reuse {prepared}: {out[-500:]}")
    row = [
        f"{n:,}",
        fmt_time(generated),
        f"{fmt_time(prep_s)} ({rate.group(1) if rate else '?'} pairs/s)",
        fmt_bytes(prep_rss),
        fmt_time(start),
        fmt_time(wall),
        fmt_bytes(rss),
    ]
    if n <= sizes.corpus_in_memory_up_to:
        ctx.log(f"row 8: training 30 updates from {n:,} pairs in memory")
        _, mem_start, mem_rss, _ = _run_measured(
            [*cli, *train, "--workdir", os.path.join(tmp, f"m{n}")], env, "model: "
        )
        row += [fmt_time(mem_start), fmt_bytes(mem_rss)]
    else:
        row += ["—", "—"]
    shutil.rmtree(d)
    shutil.rmtree(prepared)
    return row, rss
