"""Row 8: peak RSS and start-up of `attn-jax train` as a plain-text corpus grows, with no data flag."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

from harness import CLI, REPO, Ctx, Section, fmt_bytes, fmt_ratio, fmt_time, subprocess_env, verdict

# Targets (README.md says where each comes from).
CORPUS_RSS_RATIO_MAX = 1.2  # peak RSS at 5·10^6 pairs under 1.2x that at 10^5, with no data flag


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


# A small process forks the measured command and reports its ru_maxrss. Linux carries the high-water mark
# across fork and exec, so a child of the bench's own (large) process would start at the bench's RSS.
_LAUNCH = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _run_measured(argv: list[str], env: dict[str, str], mark: str) -> tuple[float, float | None, int, str]:
    """Run a command; ``(wall s, s until the first output line starting with mark or None, peak RSS bytes of
    the process, output)``. The peak is the command's own ``ru_maxrss``, taken by a small launcher."""
    import tempfile

    with tempfile.NamedTemporaryFile("r", suffix=".maxrss") as peak:
        t0 = time.perf_counter()
        launch = [sys.executable, "-c", _LAUNCH, peak.name, *argv]
        p = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        seen, lines = None, []
        for line in p.stdout:
            lines.append(line)
            if seen is None and line.startswith(mark):
                seen = time.perf_counter() - t0
        p.wait()
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[2:5])} exited {p.returncode}: {''.join(lines[-5:]).strip()}")
        kib = int(peak.read())
    return wall, seen, kib * 1024, "".join(lines)


def row_large_corpus(ctx: Ctx) -> Section:
    """Peak RSS and start-up of a 30-update `attn-jax train` as the plain-text corpus grows, with no data flag."""
    import tempfile

    sizes = ctx.sizes
    smoke = os.path.join(REPO, "configs", "rnnsearch_cpu.py:smoke")
    env = subprocess_env(JAX_PLATFORMS="cpu")
    cli = list(CLI)
    above = sizes.corpus_prepare_above
    flag = (
        "no data flag (`data.prepare_above`'s default decides)"
        if above is None
        else f"`data.prepare_above={above}` (the smoke sizes lower the default so that preparing runs)"
    )
    sec = Section(
        "8. Corpora larger than memory: peak RSS and start-up of `attn-jax train` against corpus size",
        "Generated plain-text corpora (3-13 words of 2,000 a side, 1 % of pairs over the length limit). A "
        "30-update `attn-jax train` of `configs/rnnsearch_cpu.py:smoke` (RNNsearch, hidden 24, batches of 16, "
        f"no validation) with {flag}: a training file over the threshold is prepared on first use in "
        "`<workdir>/prepared` (memory-mapped token arrays) and streamed; a smaller one is read into memory. Up "
        f"to {sizes.corpus_in_memory_up_to:,} pairs the same run with `data.prepare_above=0` reads the text into "
        "memory, for comparison. Each command is a fresh process; peak RSS is its `ru_maxrss`; start-up is "
        "launch to the `model:` line, printed once the data are read (or prepared), the vocabularies built and "
        "the batch schedule made (JAX's import included, compilation not).",
    )
    rows, peaks = [], {}
    with tempfile.TemporaryDirectory(prefix="attn_jax_bench_corpus_") as tmp:
        for n in sizes.corpus_sizes:
            row, peaks[n] = _corpus_row(ctx, tmp, n, (cli, env, smoke))
            ctx.log(f"row 8: {' | '.join(row)}")
            rows.append(row)
    sec.table(
        [
            "pairs",
            "generate",
            "train: data path",
            "train: start-up",
            "train: wall",
            "train: peak RSS",
            "in memory (data.prepare_above=0): start-up",
            "in memory: peak RSS",
        ],
        rows,
    )
    small, large = min(peaks), max(peaks)
    ratio = peaks[large] / peaks[small]
    sec.notes.append(
        f"peak RSS at {large:,} / at {small:,} pairs: {fmt_ratio(ratio)} "
        f"(target < {CORPUS_RSS_RATIO_MAX}: {verdict(ratio < CORPUS_RSS_RATIO_MAX)})"
    )
    return sec


def _corpus_row(ctx: Ctx, tmp: str, n: int, run) -> tuple[list[str], int]:
    """Generate ``n`` pairs in ``tmp`` and train from them as they are (and in memory up to the limit).

    ``run`` is ``(cli argv, environment, config)``. Returns the table row and the peak RSS of the run with
    no data flag.
    """
    cli, env, smoke = run
    sizes = ctx.sizes
    d = os.path.join(tmp, f"c{n}")
    os.makedirs(d)
    ctx.log(f"row 8: generating {n:,} pairs")
    t0 = time.perf_counter()
    _write_corpus(d, n)
    generated = time.perf_counter() - t0
    above = sizes.corpus_prepare_above
    train = [
        *cli,
        "train",
        "--config",
        smoke,
        "--config.data.corpus=plain",
        f"--config.data.source_path={d}/{{split}}.src",
        f"--config.data.target_path={d}/{{split}}.tgt",
        "--config.data.eval_split=none",
        *([f"--config.data.prepare_above={above}"] if above is not None else []),
        "--progress",
        "lines",
        "--config.checkpoint_every=30",
        "--config.tensorboard=false",
        "--config.async_checkpoints=false",
    ]
    ctx.log(f"row 8: training 30 updates on {n:,} pairs")
    work = os.path.join(tmp, f"r{n}")
    wall, start, rss, out = _run_measured([*train, "--workdir", work], env, "model: ")
    prepared = "data: preparing the train split in " in out
    rate = re.search(r"data: prepared [\d,]+ pairs in [\d.]+ s \(([\d,]+) pairs/s\)", out)
    path = f"prepared on first use ({rate.group(1)} pairs/s)" if prepared and rate else "in memory"
    row = [f"{n:,}", fmt_time(generated), path, fmt_time(start), fmt_time(wall), fmt_bytes(rss)]
    shutil.rmtree(work)
    if prepared and n <= sizes.corpus_in_memory_up_to:
        ctx.log(f"row 8: training 30 updates on {n:,} pairs in memory")
        memory = os.path.join(tmp, f"m{n}")
        _, mem_start, mem_rss, _ = _run_measured(
            [*train, "--workdir", memory, "--config.data.prepare_above=0"], env, "model: "
        )
        row += [fmt_time(mem_start), fmt_bytes(mem_rss)]
        shutil.rmtree(memory)
    else:
        row += ["—", "—"]
    shutil.rmtree(d)
    return row, rss
