"""Row 4 as `attn-jax train` gives it: the same RNNsearch size trained by the command line, in a fresh process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile

from harness import CLI, REPO, Ctx, subprocess_env

from rows.rnnsearch import ADAM_EPS, CLIP_NORM, LEARNING_RATE

CONFIG = os.path.join(REPO, "configs", "rnnsearch_cpu.py")
SPECIALS = 4  # <pad> <s> </s> <unk>: the vocabulary sizes in the config count words without them


def write_corpus(directory: str, vocab: int, length: int, pairs: int, seed: int = 0) -> None:
    """``pairs`` random pairs as ``train.src`` / ``train.tgt`` with ``vocab - 4`` words a side.

    Each side has ``length/2 - 1`` to ``length - 1`` words, so with ``</s>`` its tokens are in ``[length/2,
    length]``, as row 4's random batches. The words run through shuffled copies of the whole word list, so every
    word occurs and the learnt vocabulary has ``vocab`` entries, as the in-process model.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    words = vocab - SPECIALS
    for side, prefix in (("src", "s"), ("tgt", "t")):
        lengths = rng.integers(length // 2 - 1, length, pairs)
        copies = -(-int(lengths.sum()) // words)
        stream = np.concatenate([rng.permutation(words) for _ in range(copies)])
        ends = np.cumsum(lengths)
        with open(os.path.join(directory, f"train.{side}"), "w", encoding="utf-8") as f:
            f.write(
                "".join(
                    " ".join(f"{prefix}{k}" for k in stream[e - n : e]) + "\n"
                    for e, n in zip(ends, lengths, strict=True)
                )
            )


def cli_command(cfg, batch: int, length: int, steps: int, data: str, workdir: str) -> list[str]:
    """`attn-jax train` of ``configs/rnnsearch_cpu.py`` at row 4's size, optimiser and batch shape.

    One bucket of padded length ``length`` gives one batch shape, as in-process. ``2 + steps`` updates, logged
    every 2: the first window times step 2 only (the loop never times step 1, which compiles), so the windows
    after it time the same steps as row 4's timed ones. No validation; everything else is the config's.
    """
    return [
        *CLI,
        "train",
        "--config",
        CONFIG,
        "--workdir",
        workdir,
        "--progress",
        "lines",
        f"--config.model.embed={cfg.embed}",
        f"--config.model.hidden={cfg.hidden}",
        f"--config.model.maxout={cfg.maxout}",
        f"--config.model.align={cfg.align}",
        "--config.model.attention_init=fan_in",
        f"--config.optimizer.learning_rate={LEARNING_RATE}",
        f"--config.optimizer.eps={ADAM_EPS}",
        f"--config.optimizer.clip_norm={CLIP_NORM}",
        "--config.optimizer.warmup_steps=0",
        "--config.data.corpus=plain",
        f"--config.data.source_path={data}/{{split}}.src",
        f"--config.data.target_path={data}/{{split}}.tgt",
        "--config.data.eval_split=none",
        f"--config.data.src_vocab_size={cfg.src_vocab - SPECIALS}",
        f"--config.data.tgt_vocab_size={cfg.tgt_vocab - SPECIALS}",
        f"--config.data.max_source_length={length - 1}",
        f"--config.data.max_target_length={length - 1}",
        f"--config.data.batch_size={batch}",
        f"--config.data.bucket_boundaries={length}",
        f"--config.num_train_steps={2 + steps}",
        "--config.log_every=2",
        f"--config.checkpoint_every={2 + steps}",
    ]


class CliRuns:
    """`attn-jax train` at row 4's size, one fresh process per :meth:`run`, on one generated corpus.

    Use as a context manager: the corpus and the runs' work directories live in a temporary directory.
    """

    def __init__(self, ctx: Ctx, cfg, batch: int, length: int, steps: int):
        self.ctx, self.cfg, self.batch, self.length, self.steps = ctx, cfg, batch, length, steps
        self.env = subprocess_env(JAX_PLATFORMS="cpu")
        self.tokens_per_s: list[float] = []
        self.step_s: list[float] = []
        self.parameters: int | None = None

    def __enter__(self) -> CliRuns:
        self._tmp = tempfile.TemporaryDirectory(prefix="attn_jax_bench_cli_")
        self.data = os.path.join(self._tmp.name, "data")
        os.makedirs(self.data)
        write_corpus(self.data, self.cfg.tgt_vocab, self.length, self.batch * (self.steps + 2) * 2)
        return self

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()

    def run(self) -> None:
        """One training process; appends its tokens/s and seconds a step over the timed steps (step 3 on)."""
        work = os.path.join(self._tmp.name, f"run{len(self.tokens_per_s)}")
        argv = cli_command(self.cfg, self.batch, self.length, self.steps, self.data, work)
        p = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=REPO, timeout=1800)
        if p.returncode != 0:
            tail = (p.stdout + p.stderr).strip().splitlines()[-5:]
            raise RuntimeError(f"attn-jax train exited {p.returncode}: {' | '.join(tail)}")
        found = re.search(r"with ([\d,]+) parameters", p.stdout + p.stderr)
        if found is None:
            raise RuntimeError("attn-jax train printed no 'with N parameters' line")
        self.parameters = int(found.group(1).replace(",", ""))
        tokens, seconds, timed = _timed(os.path.join(work, "metrics.jsonl"))
        self.tokens_per_s.append(tokens / seconds)
        self.step_s.append(seconds / timed)
        self.ctx.log(
            f"row 4 (attn-jax train): process {len(self.tokens_per_s)}: {tokens / seconds:,.0f} tokens/s"
        )


def _timed(path: str) -> tuple[float, float, int]:
    """Target tokens, seconds and steps of the train windows after step 2 in a ``metrics.jsonl``."""
    tokens = seconds = 0.0
    timed = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["split"] != "train" or rec["step"] <= 2:
                continue
            tokens += rec["tokens"]
            seconds += rec["tokens"] / rec["tokens_per_s"]
            timed += round(rec["tokens"] / rec["tokens_per_batch"])
    if not timed:
        raise RuntimeError(f"{path} has no train record after step 2")
    return tokens, seconds, timed
