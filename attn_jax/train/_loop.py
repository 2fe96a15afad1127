"""The training loop: ``train_and_evaluate(config, workdir)``.

One loop for every experiment (an experiment is a config). Per update: one jitted :func:`train_step` on the
next batch (with ``optimizer.accumulate = k``: the gradient sums of the next k batches, then one update:
:func:`attn_jax.train.accumulated_train_step`); every ``log_every`` updates a train record (token-level loss,
perplexity, per-sentence NLL, gradient norm, learning rate, tokens/s); every ``eval_every`` a pass over the
validation batches (loss, perplexity, attention diagnostics) and, with ``validation.bleu``, a translation of the
validation split scored with BLEU and chrF (:mod:`attn_jax.train._validation`), both with the moving average of
the weights when ``optimizer.ema_decay > 0``; every ``checkpoint_every`` an orbax checkpoint (train state,
iterator position, config); validation and a checkpoint also at the last step.

The best checkpoint is the best by ``checkpoint.best_metric`` (``nll``, ``bleu`` or ``chrf``).
``early_stopping.patience = N`` stops the run after N validations without improvement of that metric by more
than ``early_stopping.min_delta`` (:mod:`attn_jax.train._early_stopping`): it saves a checkpoint at that step,
logs one line naming the best step, and :attr:`TrainResult.stopped_early` is True. The count is saved in every
checkpoint, so a resumed run stops where the uninterrupted one would; a stopped run resumed has nothing to do
(raise the patience to go on).

``workdir`` layout: ``checkpoints/<step>/``, ``vocab/{source,target}/``, ``metrics.jsonl``,
``validation/{sources,references,hypotheses-<step>}.txt`` (with ``validation.bleu``),
``tensorboard/{train,validation}/``, ``config.json``, ``data.json`` (each split's pairs read, kept, and dropped by
reason: :class:`attn_jax.train.SplitReport`; the start-up log says the same in one line per split).

Without a validation split (``data.eval_split=none``) no validation runs, no checkpoint is ranked, and the
latest checkpoint stands for the best (:attr:`TrainResult.best_step`; ``translate``/``evaluate --checkpoint best``
then load the latest and say so).

**Sharded and multi-process runs** (``parallel.strategy`` other than ``none``): the loop is the same; what
changes is where things live. The mesh (``parallel.data × model × stage``) spans the devices of every process
(``jax.devices()``; join the processes first with :func:`attn_jax.parallel.initialize`, as ``attn-jax train
--coordinator ...`` does). The train state is initialised directly into its shardings (the init is jitted with
``out_shardings``), the step is :func:`attn_jax.train.make_sharded_train_step`, and every process reads only its
block of rows of each global batch and contributes it to the global ``jax.Array`` with
``jax.make_array_from_process_local_data``. Validation is the eval step jitted with the same shardings; its sums
are replicated, so every process computes the same metrics. Validation by translation gathers the parameters
to every process, and each decodes the whole split on its first device (the same hypotheses everywhere).
Everything runs under ``jax.set_mesh(mesh)`` (GNMT's
pipeline reads the ambient mesh). Process 0 alone writes ``metrics.jsonl``, TensorBoard, ``config.json``, the
vocabularies and the terminal output; checkpoints are written by all processes together (orbax writes each
array's shards from the process that holds them and commits the step once all are written), so ``workdir`` must
be on a filesystem every process sees. A checkpoint restores into the current mesh's shardings
(:func:`attn_jax.train.abstract_sharded_state`), whatever mesh or process count wrote it, and the iterator
position is process-independent (:func:`attn_jax.train._inputs.data_state`).

Resumption (``resume=True``) restores the latest checkpoint's state and iterator position; since the batch
schedule is a pure function of (corpus, batch config, batch index), parameters and per-step randomness are a
pure function of (seed, step), and a CPU computation is deterministic, the resumed run's losses and final
parameters equal an uninterrupted run's bit for bit.

A non-finite loss or gradient norm stops the run before anything is saved (:class:`TrainingDiverged`); the
last good checkpoint stays the latest one.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import IO, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from attn_jax._host_memory import host_allocator
from attn_jax.data import Batch
from attn_jax.parallel import batch_sharding, make_mesh, replicated, rules_for, sharding_report
from attn_jax.train._checkpoint import CheckpointManager, CheckpointUnreadable, Restored, _describe
from attn_jax.train._config import (
    BEST_METRICS,
    MESH_KEYS,
    ConfigError,
    check_config,
    flatten_config,
    has_eval_split,
    model_config,
    optimizer_config,
    parallel_axes,
)
from attn_jax.train._diagnostics import summarize_attention
from attn_jax.train._early_stopping import EarlyStopping, early_stopping_update
from attn_jax.train._inputs import (
    choose_prepared_dir,
    data_state,
    describe_batches,
    describe_copy,
    describe_packing,
    describe_split,
    make_inputs,
    restore_data_state,
)
from attn_jax.train._lock import lock_run
from attn_jax.train._metrics import MetricsLogger, format_duration
from attn_jax.train._preempt import StopRequest, stop_requests
from attn_jax.train._sharded import (
    abstract_sharded_state,
    make_sharded_accumulation,
    make_sharded_eval_step,
    make_sharded_train_step,
    train_state_shardings,
)
from attn_jax.train._step import (
    EvalMetrics,
    StepConfig,
    TrainState,
    _graphdef,
    accumulated_train_step,
    all_finite,
    eval_step,
    init_train_state,
    param_count,
    train_step,
)
from attn_jax.train._validation import TranslationValidator, host_params, write_lines

__all__ = ["TrainResult", "TrainingDiverged", "WorkdirError", "evaluate", "train_and_evaluate"]


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN or infinite; nothing was saved after the last good step."""


class WorkdirError(OSError):
    """The run directory cannot be created or written: a file where it or a parent should be, a read-only or full
    filesystem, no permission. The message is one line; ``errno`` is the underlying error's."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.errno = code


def _prepare_workdir(workdir: str) -> None:
    """Create ``workdir`` and check that it takes a file, so that a bad ``--workdir`` fails at once, not after
    the corpus is read and the step compiled."""
    if os.path.lexists(workdir) and not os.path.isdir(workdir):
        raise WorkdirError(f"{workdir} exists and is not a directory; choose another --workdir", errno.EEXIST)
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as e:
        parent = workdir
        while parent != os.path.dirname(parent) and not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        blocker = f" ({parent} is a file)" if os.path.lexists(parent) and not os.path.isdir(parent) else ""
        raise WorkdirError(
            f"cannot write the run directory {workdir}: {e.strerror or e}{blocker}", e.errno
        ) from None


class TrainResult(NamedTuple):
    """What :func:`train_and_evaluate` returns.

    Attributes:
      step: the last step trained.
      state: the final :class:`TrainState`.
      train: the last train record (as in ``metrics.jsonl``), or None if no update ran.
      validation: the last validation record, or None.
      best_step: the kept checkpoint best by ``checkpoint.best_metric`` (lowest validation NLL per token, or
        highest BLEU or chrF); the latest without a validation split (None without checkpoints).
      checkpoint_dir: where the checkpoints are.
      stopped_early: True when early stopping ended the run before ``num_train_steps`` (now or, for a resumed
        run, in the run it resumes).
      early_stopping: where early stopping stands: the best value of the best metric, its step and the
        validations since (None without validation).
    """

    step: int
    state: TrainState
    train: dict | None
    validation: dict | None
    best_step: int | None
    checkpoint_dir: str
    stopped_early: bool = False
    early_stopping: EarlyStopping | None = None


def _attention_label(m) -> str:
    """What the training log says of a model's attention (RNNenc has none)."""
    arch = getattr(m, "arch", None)
    if arch is None:  # your own model: model.arch names its class
        return "your own model's"
    if arch == "rnnenc":
        return "none, fixed-length context"
    if arch == "transformer":
        return f"multi-head scaled dot-product, {m.heads} heads"
    return str(getattr(m, "scorer", None) or getattr(m, "attention", None))


def _sum(tree, coverage=None) -> dict[str, float]:
    """A :class:`LossSums` as floats, plus the coverage-loss sum under ``coverage`` when there is one."""
    out = {k: float(np.asarray(v, np.float64)) for k, v in tree._asdict().items()}
    if coverage is not None:
        out["coverage"] = float(np.asarray(coverage, np.float64))
    return out


def evaluate(
    params: dict,
    batches: Iterable,
    config: StepConfig,
    *,
    step: Callable[[dict, Batch], EvalMetrics] | None = None,
) -> dict[str, float | None]:
    """Validation metrics of ``params`` over ``batches`` (pooled exactly over tokens and sentences).

    Returns ``loss`` (the training objective per token, label-smoothed if the config smooths),
    ``nll_per_token``, ``ppl`` = exp(``nll_per_token``), ``nll_per_sentence``, ``tokens``, ``sentences`` and,
    for a model with attention, the diagnostics of :mod:`attn_jax.train._diagnostics`, and ``align_loss`` (the
    guided-alignment loss per supervised word) with ``lambda_align > 0`` on gold batches. ``step(params, batch)``
    replaces :func:`eval_step` (e.g. one jitted for a mesh; its metrics must be fully replicated).
    """
    if step is None:

        def step(params, batch):
            return eval_step(params, batch, config)

    loss: dict[str, float] | None = None
    attn = align = None
    for batch in batches:
        m = jax.device_get(step(params, batch))
        step_loss = _sum(m.loss, m.coverage)
        loss = step_loss if loss is None else {k: loss[k] + step_loss[k] for k in loss}
        if m.attention is not None:
            a = m.attention
            attn = (
                a
                if attn is None
                else type(a)(*(np.float64(x) + np.float64(y) for x, y in zip(attn, a, strict=True)))
            )
        if getattr(m, "align", None) is not None:
            a = [np.float64(x) for x in m.align]
            align = a if align is None else [x + y for x, y in zip(align, a, strict=True)]
    if loss is None:
        raise ValueError("no validation batches")
    out = _loss_record(loss)
    if attn is not None:
        out.update(summarize_attention(attn))
    if align is not None:
        out["align_loss"] = float(align[0] / max(align[1], 1.0))
    return out


def _loss_record(s: dict[str, float]) -> dict[str, float]:
    tokens, sentences = max(s["tokens"], 1.0), max(s["sentences"], 1.0)
    nll = s["nll"] / tokens
    out = {
        "loss": s["loss"] / tokens,
        "nll_per_token": nll,
        "ppl": math.exp(nll) if nll < 700 else math.inf,
        "nll_per_sentence": s["nll"] / sentences,
        "tokens": s["tokens"],
        "sentences": s["sentences"],
    }
    if "coverage" in s:  # lambda_coverage > 0: the unweighted coverage loss per token (``loss`` holds λ · it)
        out["coverage_loss"] = s["coverage"] / tokens
    return out


class _Window:
    """Train metrics accumulated between two log steps.

    Throughput counts only the time spent in training steps (batch, update, metrics), and not the run's first
    step, which compiles: evaluation and checkpointing do not make the tokens/s of the next window look slow.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self.sums = {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "sentences": 0.0}
        self.grad_norm = 0.0
        self.align = None  # [Σ alignment loss, supervised words] with lambda_align > 0
        self.steps = 0
        self.timed_tokens = 0.0
        self.timed_seconds = 0.0
        self.timed_steps = 0

    def add(self, loss: dict[str, float], grad_norm: float, seconds: float | None, align=None):
        for k in loss:
            self.sums[k] = self.sums.get(k, 0.0) + loss[k]
        if align is not None:
            a = [float(np.asarray(x, np.float64)) for x in align]
            self.align = a if self.align is None else [x + y for x, y in zip(self.align, a, strict=True)]
        self.grad_norm += grad_norm
        self.steps += 1
        if seconds is not None:
            self.timed_tokens += loss["tokens"]
            self.timed_seconds += seconds
            self.timed_steps += 1

    @property
    def tokens_per_s(self) -> float:
        return self.timed_tokens / self.timed_seconds if self.timed_seconds > 0 else 0.0

    @property
    def seconds_per_step(self) -> float | None:
        return self.timed_seconds / self.timed_steps if self.timed_steps else None

    def record(self, learning_rate: float, epoch: float) -> dict[str, float]:
        out = _loss_record(self.sums)
        out.update(
            grad_norm=self.grad_norm / max(self.steps, 1),
            learning_rate=learning_rate,
            tokens_per_s=self.tokens_per_s,
            tokens_per_batch=self.sums["tokens"] / max(self.steps, 1),
            epoch=epoch,
        )
        if self.align is not None:
            out["align_loss"] = self.align[0] / max(self.align[1], 1.0)
        return out


def _validation_line(step: int, v: dict) -> str:
    line = (
        f"validation @ step {step}: loss {v['loss']:.4f} | ppl {v['ppl']:.2f} | "
        f"nll/sentence {v['nll_per_sentence']:.2f}"
    )
    if "coverage_loss" in v:
        line += f" | coverage loss {v['coverage_loss']:.4f}"
    if "attn_entropy" in v:
        corr = v["attn_diag_corr"]
        line += (
            f" | attention: entropy {v['attn_entropy']:.3f} (norm {v['attn_entropy_norm']:.3f}), "
            f"coverage |c-1| {v['attn_coverage_dev']:.3f}, low {v['attn_coverage_low']:.3f}, "
            f"diagonal band {v['attn_diag_band']:.3f}, corr {'n/a' if corr is None else f'{corr:.3f}'}"
        )
        if "attn_gold_hit" in v:
            line += f", gold hit {v['attn_gold_hit']:.3f}"
    if "align_loss" in v:
        line += f" | align {v['align_loss']:.4f}"
    if "bleu" in v:
        line += (
            f" | BLEU {v['bleu']:.2f} | chrF {v['chrf']:.2f} ({v['translations']} translations, "
            f"{v['stopped_at_limit']} stopped at the length limit)"
        )
    return line


def _config_diff(saved: dict, current: dict) -> list[str]:
    a, b = flatten_config(saved), flatten_config(current)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _diverged(what: str, step: int, ckpt: CheckpointManager) -> TrainingDiverged:
    ckpt.wait()
    last = ckpt.latest_step()
    where = (
        f"the last good checkpoint is step {last} in {ckpt.directory} (continue with --resume, e.g. with a "
        "lower learning rate)"
        if last is not None
        else "no checkpoint had been written yet"
    )
    return TrainingDiverged(f"training diverged: {what} at step {step}; stopped without saving; {where}")


def _restore_newest_readable(ckpt: CheckpointManager, target, logger) -> Restored:
    """Restore the newest checkpoint that can be read; newer ones that cannot (truncated or deleted files) are
    moved to ``<workdir>/damaged-checkpoints/`` (never deleted, never overwritten by the resumed run's saves) and
    a warning names each."""
    try:
        restored, failed = ckpt.restore_first(sorted(ckpt.all_steps(), reverse=True), target)
    except CheckpointUnreadable as e:
        raise CheckpointUnreadable(
            f"cannot resume: {e} (nothing was moved or deleted; move them away or use another --workdir to "
            "start afresh)",
            e.failed,
        ) from None
    if failed and jax.process_count() > 1:  # the processes would have to agree on what to move: the user does
        raise CheckpointUnreadable(
            f"cannot resume from checkpoint {_describe(failed)} in {ckpt.directory}; step {restored.step} can be "
            "read: move the damaged step directories out of it and resume again",
            failed,
        )
    aside = os.path.join(os.path.dirname(ckpt.directory), "damaged-checkpoints")
    for step, why in failed:
        moved = ckpt.set_aside(step, aside)
        logger.log(
            f"warning: cannot read checkpoint step {step} ({why}); moved it to {moved} (kept, not deleted) and "
            f"resuming from step {restored.step}, the newest checkpoint that loads"
        )
    return restored


class _QuietLogger:
    """The logger of processes other than 0: process 0 alone writes metrics, TensorBoard and the terminal."""

    tty = False

    def truncate_after(self, step: int) -> None:
        pass

    def write(self, split: str, step: int, values: dict) -> None:
        pass

    def log(self, line: str) -> None:
        pass

    def progress(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


class _OneDevice:
    """``parallel.strategy=none``: state and steps on the first local device, batches as NumPy arrays."""

    rows = (0, 1)  # this process's block of every global batch: (index, count)
    data_axis = 1  # token batches round their rows down to a multiple of this
    context = contextlib.nullcontext
    lines: tuple[str, ...] = ()  # start-up log lines about the placement

    def __init__(self, config: ml_collections.ConfigDict):
        if jax.process_count() > 1:
            raise ConfigError(
                f"a run of {jax.process_count()} processes needs a parallel.strategy (e.g. data), not none"
            )
        # Committed to one device, as a restored state is: jit keys its cache on committedness, and a resumed
        # run must not compile its steps twice.
        self.device = jax.local_devices()[0]

    def bind(self, step_cfg: StepConfig) -> None:
        self.step_cfg = step_cfg

    def init_state(self, seed: int) -> TrainState:
        return jax.device_put(init_train_state(self.step_cfg, seed), self.device)

    def restore_target(self, state: TrainState | None):
        return jax.eval_shape(lambda: state)

    def place(self, restored: TrainState) -> TrainState:
        return jax.device_put(restored, self.device)

    def batch(self, local: Batch) -> Batch:
        return local

    def train_step(self, state: TrainState, batch: Batch):
        return train_step(state, batch, self.step_cfg)

    def accumulated_step(self, state: TrainState, batches: Iterable[Batch]):
        return accumulated_train_step(state, batches, self.step_cfg)

    def eval_step(self, params: dict, batch: Batch) -> EvalMetrics:
        return eval_step(params, batch, self.step_cfg)

    def all_finite(self, params: dict) -> bool:
        return bool(all_finite(params))

    def decode_params(self, params: dict) -> dict:
        return params


def _size(n: int) -> str:
    """``n`` bytes with a decimal unit and three significant digits (``1.23 MB``)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _sharding_line(abstract: TrainState, shardings: TrainState) -> str:
    """One log line: how many parameter arrays the rules split, which stay replicated (with their bytes), and
    what one device holds of the train state (parameters, optimiser moments, moving average)."""
    params, state = sharding_report(abstract.params, shardings.params), sharding_report(abstract, shardings)
    kept = params.arrays - params.split
    names = ", ".join(p.replace("']['", "/").strip("[']") for p in params.replicated_paths[:4])
    more = f" and {kept - 4} more" if kept > 4 else ""
    return (
        f"sharding: {params.split} of {params.arrays} parameter arrays split over the mesh, {kept} replicated "
        f"({_size(params.replicated_bytes)} of {_size(params.total_bytes)}{': ' + names + more if kept else ''}); "
        f"each device holds {_size(state.device_bytes)} of the train state's {_size(state.total_bytes)}"
    )


def _mesh_shape(config: ml_collections.ConfigDict, num_devices: int, processes: int) -> dict[str, int]:
    """``{"data", "model", "stage"}`` sizes from ``config.parallel`` (0: inferred) for ``num_devices`` devices."""
    p, used = config.parallel, parallel_axes(config)
    sizes = {axis: p[axis] if axis in used else 1 for axis in MESH_KEYS}
    if "stage" in used and sizes["stage"] == 0:
        sizes["stage"] = config.model.pipeline_stages
    known = math.prod(v for v in sizes.values() if v)
    missing = [axis for axis, v in sizes.items() if v == 0]
    if missing:
        if num_devices % known:
            raise ConfigError(
                f"parallel.{missing[0]}=0 cannot be inferred: the other mesh axes take {known} devices, which "
                f"does not divide the {num_devices} devices"
            )
        sizes[missing[0]] = num_devices // known
    total = math.prod(sizes.values())
    if total > num_devices or (total < num_devices and processes > 1):
        shape = " × ".join(f"parallel.{k}={v}" for k, v in sizes.items())
        raise ConfigError(
            f"{shape} needs {total} devices, but there are {num_devices}"
            + (f" in {processes} processes (a multi-process run must use them all)" if processes > 1 else "")
        )
    # Token batches round their rows down to a multiple of the data axis instead (make_inputs' data_axis).
    for key in (
        ("eval_batch_size",) if config.data.get("batch_tokens", 0) else ("batch_size", "eval_batch_size")
    ):
        if config.data[key] % sizes["data"]:
            raise ConfigError(
                f"data.{key}={config.data[key]} must be a multiple of the data axis (parallel.data={sizes['data']})"
            )
    return sizes


def _process_rows(sharding: jax.sharding.NamedSharding) -> tuple[int, int]:
    """``(index, count)``: this process holds rows block ``index`` of ``count`` equal blocks of every batch."""
    blocks = math.prod(sharding.mesh.shape[a] for a in jax.tree.leaves(tuple(sharding.spec)[:1]))
    mine = sorted(
        {
            i
            for index in sharding.addressable_devices_indices_map((blocks,)).values()
            for i in range(*index[0].indices(blocks))
        }
    )
    size = len(mine)
    if blocks % size or mine != list(range(mine[0], mine[0] + size)) or mine[0] % size:
        raise ConfigError(
            f"this process's devices hold batch blocks {mine} of {blocks}, not one contiguous block; use a "
            "mesh whose data axis runs over the processes in order"
        )
    return mine[0] // size, blocks // size


class _Mesh:
    """Any other strategy: a mesh over every process's devices, sharded state, global batches, jitted steps."""

    def __init__(self, config: ml_collections.ConfigDict):
        devices = jax.devices()
        sizes = _mesh_shape(config, len(devices), jax.process_count())
        self.mesh = make_mesh(**sizes, devices=devices[: math.prod(sizes.values())])
        self.data_axis = sizes["data"]
        self.rules, self.strict = rules_for(config.parallel.strategy), config.parallel.strict_sharding
        self.batch_sharding = batch_sharding(self.mesh, self.rules)
        self.rows = _process_rows(self.batch_sharding)
        shape = " × ".join(f"{k}={v}" for k, v in sizes.items())
        self.lines = [
            f"parallel: strategy {config.parallel.strategy}, mesh {shape} over {self.mesh.size} devices in "
            f"{jax.process_count()} process(es); each process reads 1/{self.rows[1]} of every batch"
        ]

    def bind(self, step_cfg: StepConfig) -> None:
        rules, strict = self.rules, self.strict
        self.step_cfg = step_cfg
        # The module structure, built here (cached): under ``jax.set_mesh`` ``nnx.eval_shape`` would read the
        # params' logical axis names as mesh axes.
        _graphdef(step_cfg.model)
        try:
            self.shardings = train_state_shardings(step_cfg, self.mesh, rules, strict=strict)
        except ValueError as e:
            raise ConfigError(f"parallel.strict_sharding: {e}") from None
        if any(axis is not None for name, axis in rules if name != "batch"):  # the rules split parameters
            self.lines.append(
                _sharding_line(
                    abstract_sharded_state(step_cfg, self.mesh, rules, strict=strict), self.shardings
                )
            )
        metrics = replicated(self.mesh)
        self._init = jax.jit(functools.partial(init_train_state, step_cfg), out_shardings=self.shardings)
        self._train = make_sharded_train_step(step_cfg, self.mesh, rules, strict=strict)
        if step_cfg.optimizer.accumulate > 1:
            self._accumulation = make_sharded_accumulation(step_cfg, self.mesh, rules, strict=strict)
        self._eval = make_sharded_eval_step(step_cfg, self.mesh, rules, strict=strict)
        self._finite = jax.jit(all_finite, out_shardings=metrics)

    def context(self):
        return jax.set_mesh(self.mesh)

    def init_state(self, seed: int) -> TrainState:
        return self._init(seed)

    def restore_target(self, state: TrainState | None):
        return abstract_sharded_state(self.step_cfg, self.mesh, self.rules, strict=self.strict)

    def place(self, restored: TrainState) -> TrainState:
        return restored  # restored straight into the target shardings

    def batch(self, local: Batch) -> Batch:
        count = self.rows[1]

        def global_array(x):
            x = np.asarray(x)
            return jax.make_array_from_process_local_data(
                self.batch_sharding, x, (x.shape[0] * count, *x.shape[1:])
            )

        return jax.tree.map(global_array, local)

    def train_step(self, state: TrainState, batch: Batch):
        return self._train(state, batch)

    def accumulated_step(self, state: TrainState, batches: Iterable[Batch]):
        zero, add, apply = self._accumulation
        sums = zero(state.params)
        for batch in batches:
            sums = add(sums, state, batch)
        return apply(state, sums)

    def eval_step(self, params: dict, batch: Batch) -> EvalMetrics:
        return self._eval(params, batch)

    def all_finite(self, params: dict) -> bool:
        return bool(self._finite(params))

    def decode_params(self, params: dict) -> dict:
        return host_params(params)  # every process decodes the whole split on its own first device


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    *,
    resume: bool = False,
    stream: IO[str] | None = None,
    tty: bool | None = None,
) -> TrainResult:
    """Train the model ``config`` describes, writing checkpoints and metrics to ``workdir``.

    Args:
      config: a config with :func:`attn_jax.train.default_config`'s schema (see ``configs/``).
      workdir: the run directory (created if missing).
      resume: continue from the latest checkpoint in ``workdir`` (a fresh start if there is none). Without it,
        a ``workdir`` that already holds checkpoints is an error, so a finished run is never overwritten.
      stream: where progress and log lines go (default stdout).
      tty: force the progress bar on or off (default: whether ``stream`` is a terminal).

    With ``parallel.strategy`` other than ``none`` the run is sharded over a mesh of every process's devices
    (see the module docstring); in a multi-process run every process calls this with the same arguments.

    Returns:
      A :class:`TrainResult` (under a mesh its ``state`` holds global, sharded arrays).

    Raises:
      ConfigError: an invalid config, a mesh that does not fit the devices or the batch size, or checkpoints
        in ``workdir`` without ``resume``.
      attn_jax.data.CorpusError: the corpus cannot be read or leaves no batch.
      TrainingDiverged: the loss or gradient norm became non-finite.
      WorkdirError: ``workdir`` cannot be created or written (a file in its way, read-only, no space).
      RunLocked: another process (named in the message) trains or averages in ``workdir``.
      CheckpointSaveError: a checkpoint could not be written (a full disk); the last good one is intact.
      CheckpointUnreadable: ``resume`` and no checkpoint can be read.
    """
    check_config(config)
    workdir = os.path.abspath(os.fspath(workdir))
    _prepare_workdir(workdir)
    allocator = host_allocator()  # set by `import attn_jax`; its line is logged below
    place = _OneDevice(config) if config.parallel.strategy == "none" else _Mesh(config)
    lead = jax.process_index() == 0  # the process that writes files and talks to the terminal
    # One run per directory: a second train, resume or average is refused; a multi-process run holds one lock.
    lock = lock_run(workdir, "train") if lead else None
    ckpt = CheckpointManager(
        os.path.join(workdir, "checkpoints"),
        keep=config.keep_checkpoints,
        keep_best=config.keep_best and has_eval_split(config.data),  # nothing ranks them without validation
        best_metric=config.checkpoint.best_metric,
        async_save=config.async_checkpoints,
    )
    total = config.num_train_steps
    logger = (
        MetricsLogger(workdir, total, tensorboard=config.tensorboard, stream=stream, tty=tty)
        if lead
        else _QuietLogger()
    )
    try:
        latest = ckpt.latest_step()
        if latest is not None and not resume:
            raise ConfigError(
                f"{workdir} already holds checkpoints (latest: step {latest}); pass --resume to continue that "
                "run or choose another --workdir"
            )
        logger.log(allocator.message)
        where = _tfds_location(config.data) if lead else None
        if where is not None:
            logger.log(where)
        prepared_dir = choose_prepared_dir(config, workdir, log=logger.log)

        def read_inputs():
            return make_inputs(
                config,
                os.path.join(workdir, "vocab"),
                reuse_vocab=latest is not None,
                process_index=place.rows[0],
                process_count=place.rows[1],
                save_vocab=lead,
                data_axis=place.data_axis,
                prepared_dir=prepared_dir,
                build_prepared=lead,
                log=logger.log,
            )

        if prepared_dir and jax.process_count() > 1:  # the first process prepares; the others then open it
            inputs = read_inputs() if lead else None
            multihost_utils.sync_global_devices("attn_jax: prepared training data")
            inputs = inputs or read_inputs()
        else:
            inputs = read_inputs()
        step_cfg = StepConfig(
            model=model_config(config, inputs.src_vocab.size, inputs.tgt_vocab.size),
            optimizer=optimizer_config(config),
            label_smoothing=config.label_smoothing,
            lambda_coverage=config.lambda_coverage,
            coverage_start_step=config.get("coverage_start_step", 0),
            lambda_align=config.lambda_align,
        )
        place.bind(step_cfg)
        config_dict = json.loads(config.to_json())
        if lead:
            with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
                json.dump(config_dict, f, indent=2, sort_keys=True)
        m = step_cfg.model
        logger.log(
            f"model: {getattr(m, 'arch', config.model.arch)} (attention: {_attention_label(m)}) with {param_count(m):,} parameters, vocabularies "
            f"{m.src_vocab:,} / {m.tgt_vocab:,}, compute {getattr(m, 'dtype', 'float32')}; optimizer {step_cfg.optimizer.name}; "
            f"training batches in {len(inputs.train.plan.shapes)} shape(s) {inputs.train.plan.shapes}"
        )
        for line in _data_lines(config, inputs) + _optimizer_lines(step_cfg):
            logger.log(line)
        if lead:
            _write_data_report(workdir, inputs)
        for line in place.lines:
            logger.log(line)
        with place.context(), stop_requests() as request:
            return _train(config, config_dict, place, inputs, ckpt, logger, latest, request)
    finally:
        ckpt.close()
        logger.close()
        if lock is not None:
            lock.release()


def _tfds_location(d: ml_collections.ConfigDict) -> str | None:
    """Where a TFDS-read corpus comes from, said before reading it (it may be built there first); None when the
    corpus is not read through TFDS (the built-in corpus in memory, plain text, TSV)."""
    from attn_jax import data

    if d.corpus == "synthetic" and d.use_tfds:
        name = f"attn_jax_synthetic/{d.synthetic}"
        where = data.prepare_tfds_dataset(name, data_dir=d.data_dir or None, build=True)  # offline, seconds
        if where.built:
            return f"data: built {name} in {where.path} ({where.bytes / 1e6:.1f} MB written; data.data_dir)"
        return f"data: reading {name} from {where.path} (prepared earlier; data.data_dir)"
    if d.corpus == "tfds":
        where = data.prepare_tfds_dataset(d.tfds_name, data_dir=d.data_dir or None, build=False)
        if where.prepared:
            return f"data: reading {d.tfds_name} from {where.path} (data.data_dir)"
        return (
            f"data: {d.tfds_name} is not prepared in {where.data_dir}: TFDS downloads and builds it there now "
            "(needs internet; `tfds build` does it ahead; data.data_dir)"
        )
    return None


def _data_lines(config: ml_collections.ConfigDict, inputs) -> list[str]:
    """The start-up lines on the data: each split read, the pairs kept and every drop with its reason."""
    d = config.data
    unit = "words" if inputs.src_vocab.word_level and inputs.tgt_vocab.word_level else "tokens"
    lines = [describe_split(inputs.train_report, "training", d, unit)]
    if inputs.vocab_line:
        lines.insert(0, inputs.vocab_line)
    if inputs.packing is not None:
        lines.append(describe_packing(inputs.packing, inputs.packed_rows))
    if inputs.batch_stats:
        lines.extend(describe_batches(config, inputs.batch_stats))
    if inputs.copy_counts is not None:
        lines.append(describe_copy(inputs.copy_counts))
    v = inputs.validation_report
    if v is None:
        lines.append(
            f"data: no validation split (data.eval_split={d.eval_split!r}): no validation runs, and the best "
            "checkpoint is the latest one"
        )
        return lines
    lines.append(describe_split(v, "validation", d, unit))
    if v.name == inputs.train_report.name:  # a path without {split}: the same files for both splits
        lines.append(
            "warning: the validation split reads the same files as the training split (the corpus paths have "
            "no {split}); validation measures training pairs; data.eval_split=none trains without validation"
        )
    return lines


def _optimizer_lines(step_cfg: StepConfig) -> list[str]:
    """Start-up lines on gradient accumulation and the moving average of the weights, when they are on."""
    o, lines = step_cfg.optimizer, []
    if o.accumulate > 1:
        lines.append(
            f"optimizer: each update accumulates {o.accumulate} batches (micro-batches), its loss normalised "
            "by the target tokens of all of them (optimizer.accumulate)"
        )
    if o.ema_decay > 0:
        lines.append(
            f"optimizer: a moving average of the weights with decay min({o.ema_decay}, (1+t)/(10+t)) after "
            "update t; validation uses it (optimizer.ema_decay; translate/evaluate --weights ema)"
        )
    return lines


def _write_data_report(workdir: str, inputs) -> None:
    """``data.json``: every split's pairs read, kept and dropped by reason (the start-up lines, for programs)."""
    report = {}
    for role, r in (("train", inputs.train_report), ("validation", inputs.validation_report)):
        report[role] = None if r is None else {**r._asdict(), "read": r.read, "dropped": r.dropped}
    if inputs.batch_stats:  # data.batch_tokens: what each bucket's batches hold over epoch 0
        report["train_batches"] = [b._asdict() for b in inputs.batch_stats]
    with open(os.path.join(workdir, "data.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)


def _train(config, config_dict, place, inputs, ckpt, logger, latest, request: StopRequest) -> TrainResult:
    """The loop of :func:`train_and_evaluate` from the initial (or restored) state on; a signal in
    ``request`` saves the step it ends and raises :class:`Preempted`."""
    total, step_cfg = config.num_train_steps, place.step_cfg
    state = None
    if latest is None or isinstance(place, _OneDevice):  # the single-device path keeps today's exact steps
        state = place.init_state(config.seed)
    start = 0
    validating = inputs.validation_report is not None
    best_metric, patience = config.checkpoint.best_metric, config.early_stopping.patience
    stopping = EarlyStopping(best_metric)
    validation_dir = os.path.join(os.path.dirname(ckpt.directory), "validation")
    validator = None
    if validating and config.validation.bleu:
        validator = _validator(config, inputs, step_cfg, validation_dir, logger)
    if validating and (patience or best_metric != "nll"):
        es = config.early_stopping
        logger.log(
            f"checkpoints: the best is the best by validation {best_metric} (checkpoint.best_metric); "
            + (
                f"early stopping after {patience} validations without improvement"
                + (f" by more than {es.min_delta:g}" if es.min_delta else "")
                + " (early_stopping.patience)"
                if patience
                else "no early stopping (early_stopping.patience=0)"
            )
        )
    if latest is not None:
        restored = _restore_newest_readable(ckpt, place.restore_target(state), logger)
        latest = restored.step
        state = place.place(restored.state)
        data = dict(restored.data)
        saved = data.pop("early_stopping", None)
        stopping = EarlyStopping.from_json(saved, best_metric) or stopping
        if saved is not None and stopping.best is None and saved.get("best") is not None:
            logger.log(
                f"note: early stopping followed {saved.get('metric')} before, checkpoint.best_metric is "
                f"{best_metric} now: its count starts afresh"
            )
        try:
            restore_data_state(inputs, data)
        except ValueError as e:
            raise ConfigError(f"cannot resume: the data or batching config changed ({e})") from None
        changed = _config_diff(restored.config, config_dict)
        if changed:
            logger.log(f"note: config differs from checkpoint {latest} in {', '.join(changed)}")
        start = int(state.step)
        logger.log(f"resumed from step {start} ({ckpt.directory})")
        if step_cfg.optimizer.ema_decay > 0 and state.ema_params is None:
            state = state.replace(ema_params=jax.tree.map(jnp.copy, state.params))
            logger.log(
                f"note: checkpoint {latest} holds no moving average of the weights: it starts from the "
                f"parameters of step {start} (optimizer.ema_decay={step_cfg.optimizer.ema_decay})"
            )
        if patience and stopping.bad >= patience:
            logger.log(f"nothing to do: {_stop_line(stopping, config, start)}")
            return TrainResult(start, state, None, None, ckpt.best_step(), ckpt.directory, True, stopping)
    logger.truncate_after(start)

    step, window, accumulate = start, _Window(), step_cfg.optimizer.accumulate
    last_train = last_val = None
    batches_per_epoch = inputs.train.plan.batches_per_epoch
    run_start = time.monotonic()
    step_seconds = None  # recent seconds per step, for the ETA
    overhead_s = (
        0.0  # seconds spent in validation and checkpoints so far, amortised over the steps in the ETA
    )
    profiler = _Profiler(
        config.profile_steps, os.path.join(os.path.dirname(ckpt.directory), "tensorboard"), logger
    )
    while step < total:
        ckpt.poll()  # a failed background save (a full disk) stops the run now, not at the next save
        tic = time.monotonic()
        if config.debug.inject_nan_at_step == step + 1:
            state = state.replace(params=jax.tree.map(lambda p: p * jnp.nan, state.params))
        profiler.before(step)
        with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
            if accumulate == 1:
                state, metrics = place.train_step(state, place.batch(next(inputs.train)))
            else:  # the iterator's position counts micro-batches, so resumption stays exact
                micro = (place.batch(next(inputs.train)) for _ in range(accumulate))
                state, metrics = place.accumulated_step(state, micro)
        step += 1
        m = jax.device_get(metrics)
        profiler.after(step, state)
        loss, grad_norm = _sum(m.loss, m.coverage), float(m.grad_norm)
        if not (math.isfinite(loss["loss"]) and math.isfinite(grad_norm)):
            raise _diverged(f"loss {loss['loss']}, gradient norm {grad_norm}", step, ckpt)
        window.add(loss, grad_norm, None if step == start + 1 else time.monotonic() - tic, m.align)
        if step == start + 1:  # the silent stretch before the first progress line is mostly this compilation
            shapes = len(inputs.train.plan.shapes)
            logger.log(
                f"step {step}: train step compiled and run in {time.monotonic() - tic:.1f}s"
                + (f" (the other {shapes - 1} batch shape(s) compile when first drawn)" if shapes > 1 else "")
            )

        elapsed = time.monotonic() - run_start
        step_seconds = window.seconds_per_step or step_seconds or elapsed / (step - start)
        eta = (step_seconds + overhead_s / (step - start)) * (total - step)
        logger.progress(step, loss["loss"] / max(loss["tokens"], 1.0), window.tokens_per_s, eta)

        if step % config.log_every == 0 or step == total:
            last_train = window.record(float(m.learning_rate), step * accumulate / batches_per_epoch)
            logger.write("train", step, {**last_train, "elapsed_s": elapsed})
            # On a terminal too: the line is printed above the bar, so the loss history stays on screen.
            logger.log(
                f"step {step}/{total}: loss {last_train['loss']:.4f} | ppl {last_train['ppl']:.2f} | "
                f"nll/sentence {last_train['nll_per_sentence']:.2f} | |g| {last_train['grad_norm']:.3f} | "
                + (f"align {last_train['align_loss']:.4f} | " if "align_loss" in last_train else "")
                + f"{last_train['tokens_per_s']:,.0f} tok/s | ETA {format_duration(eta)}"
            )
            window.reset()

        val, tic, stop = None, time.monotonic(), False
        if validating and (step % config.eval_every == 0 or step == total):
            batches = (place.batch(b) for b in inputs.validation)
            ema = state.ema_params is not None  # validation measures the moving average when there is one
            weights = state.ema_params if ema else state.params
            val = evaluate(weights, batches, step_cfg, step=place.eval_step)
            if validator is not None:
                params = place.decode_params(weights)
                val.update(_translate_validation(validator, params, step, validation_dir, logger))
            logger.write("validation", step, val)
            logger.log(_validation_line(step, val) + (" | EMA weights" if ema else ""))
            last_val = val
            stopping = early_stopping_update(
                stopping, val[BEST_METRICS[best_metric][0]], step, min_delta=config.early_stopping.min_delta
            )
            stop = patience > 0 and stopping.bad >= patience and step < total
        preempted = request.due(step)  # every process asks at every step: one answer for all
        if step % config.checkpoint_every == 0 or step == total or stop or preempted:
            if not place.all_finite(state.params):
                raise _diverged("non-finite parameters", step, ckpt)
            metrics_for_best = None
            if val is not None:
                metrics_for_best = {k: val[k] for k in ("nll_per_token", "bleu", "chrf") if k in val}
            position = data_state(inputs)
            if jax.process_count() > 1:  # every process consumed the same global batches (lockstep updates)
                multihost_utils.assert_equal(position["next_index"], "iterator positions differ")
            position["early_stopping"] = stopping.to_json()
            ckpt.save(step, state, position, config_dict, metrics=metrics_for_best)
        overhead_s += time.monotonic() - tic
        if preempted:
            ckpt.wait()  # committed before the exit: the scheduler's kill may follow at once
            raise request.preempted(step, ckpt.directory)
        if stop:
            logger.log(_stop_line(stopping, config, step))
            break
    profiler.after(step, state, last=True)  # the run ended inside the range (early stopping)
    ckpt.wait()
    if not validating:  # nothing ranks the checkpoints: the latest stands for the best
        best, best_label = ckpt.latest_step(), "the latest, no validation"
    else:
        best = ckpt.best_step()
        best_label = f"{best}, by validation {best_metric}"
    if step > start:
        logger.log(
            f"done: step {step} in {format_duration(time.monotonic() - run_start)}; checkpoints "
            f"{ckpt.all_steps()} (best: {best_label}) in {ckpt.directory}"
        )
    else:
        logger.log(f"nothing to do: the run is already at step {step} of {total}")
    return TrainResult(
        step,
        state,
        last_train,
        last_val,
        best,
        ckpt.directory,
        step < total,
        stopping if validating else None,
    )


class _Profiler:
    """A ``jax.profiler`` trace of updates ``a+1 .. b`` (``profile_steps=(a, b)``) into ``directory``, where
    TensorBoard's profile plugin finds it; ``(0, 0)`` traces nothing."""

    def __init__(self, steps, directory: str, logger):
        self.start, self.stop = (int(x) for x in steps)
        self.directory, self.logger, self.running = directory, logger, False

    def before(self, step: int) -> None:
        """Start the trace before update ``start + 1`` (or at once, on a resume inside the range)."""
        if self.start < self.stop and self.start <= step < self.stop and not self.running:
            jax.profiler.start_trace(self.directory)
            self.running = True
            if step > self.start:
                self.logger.log(
                    f"profile: resumed at step {step}, inside profile_steps=({self.start}, {self.stop}): "
                    f"the trace starts at update {step + 1}"
                )

    def after(self, step: int, state, last: bool = False) -> None:
        """Stop the trace once update ``stop`` (or, with ``last``, the run's last update) has finished."""
        if self.running and (step >= self.stop or last):
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.running = False
            self.logger.log(
                f"profile: trace of updates {self.start + 1}..{step} written to "
                f"{os.path.join(self.directory, 'plugins', 'profile')} (profile_steps; view it with "
                f"tensorboard --logdir {self.directory}, Profile tab)"
            )


def _validator(config, inputs, step_cfg, directory: str, logger) -> TranslationValidator:
    """The validation translator, its start-up line and BLEU warning (if any); ``sources.txt`` and
    ``references.txt`` in ``directory``."""
    sources, references = inputs.validation_text
    validator = TranslationValidator(
        config, sources, references, inputs.src_vocab, inputs.tgt_vocab, step_cfg.model
    )
    logger.log(validator.describe())
    if validator.options["warning"]:
        logger.log(f"warning: {validator.options['warning']}")
    if jax.process_index() == 0:
        os.makedirs(directory, exist_ok=True)
        write_lines(os.path.join(directory, "references.txt"), references)
        write_lines(os.path.join(directory, "sources.txt"), sources)
    return validator


def _translate_validation(validator, params, step: int, directory: str, logger) -> dict:
    """Translate and score the validation split; write ``hypotheses-<step>.txt`` in ``directory``."""
    tic = time.monotonic()
    first = validator.signatures is None
    scores = validator(params)
    if jax.process_index() == 0:
        write_lines(os.path.join(directory, f"hypotheses-{step}.txt"), scores.hypotheses)
    if first and validator.signatures is not None:
        logger.log(
            f"validation: BLEU signature {validator.signatures[0]}; chrF signature {validator.signatures[1]} "
            f"(translated and scored in {time.monotonic() - tic:.1f}s)"
        )
    return scores.record


def _stop_line(stopping: EarlyStopping, config, step: int) -> str:
    """The line that says why the run stopped early and where its best validation was."""
    es = config.early_stopping
    better = "lower" if not BEST_METRICS[stopping.metric][1] else "higher"
    by = f" by more than {es.min_delta:g}" if es.min_delta else ""
    return (
        f"early stopping at step {step} of {config.num_train_steps}: validation {stopping.metric} has not "
        f"improved ({better} is better){by} in {stopping.bad} validations (early_stopping.patience="
        f"{es.patience}); the best, {stopping.best:.4f}, was at step {stopping.best_step}"
    )
