"""Checkpoints with orbax's ``CheckpointManager``: train state, data-iterator position and config, atomically.

Layout of ``<workdir>/checkpoints/<step>/``: ``state/`` (the :class:`TrainState` pytree: params, optimiser state,
step, RNG), ``data/`` (the batch iterator's ``get_state()`` JSON), ``config/`` (the run's config as JSON) and
``metrics/`` (the validation metrics the step was ranked by, when it was evaluated, with ``best_metric``: the
name of the ranking metric, ``attn_jax.train.BEST_METRICS``).

Multi-process runs: every process calls :meth:`CheckpointManager.save` and :meth:`~CheckpointManager.restore`
(orbax coordinates them through ``jax.distributed``): each array's shards are written by the processes that hold
them, the JSON items by process 0, and the step is committed once all are written. Restoring into
:func:`attn_jax.train.abstract_sharded_state` targets reads every array straight into the current mesh's
shardings, whatever mesh or process count wrote it; without a target (:func:`load_checkpoint`) arrays come back
on the first local device.

Kept: the last ``keep`` checkpoints, plus the best one by the run's ``checkpoint.best_metric`` (validation NLL
per token, lower is better; or BLEU or chrF, higher is better; ties go to the earlier step). A checkpoint records
the metric it was ranked by, so a run read back (``load_checkpoint(best=True)``, ``--checkpoint best``) is ranked
the same way; checkpoints written before the metric was recorded are ranked by NLL. A save is atomic: orbax writes ``<step>.orbax-checkpoint-tmp*`` and renames it to ``<step>`` only
after every item is written (``AtomicRenameTemporaryPath.finalize``), and the step listing ignores temporary
directories, so a process killed half-way through a save leaves the previous checkpoint as the latest one.

Failures are never silent. A save that fails, in the caller's thread or in orbax's background thread (a full
disk, a read-only filesystem), raises :class:`CheckpointSaveError` naming the step and the last good checkpoint;
:meth:`CheckpointManager.poll` reports a failed background save as soon as it has failed, not only at the next
save. A finished checkpoint that cannot be read (a truncated or deleted file) makes :func:`load_checkpoint` fall
back to the newest (or next best) one that loads and say so in :attr:`Restored.note`; when none loads it raises
:class:`CheckpointUnreadable` with one line per reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import os
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as ocm
from orbax.checkpoint import metadata as ocp_metadata

from attn_jax.train._config import BEST_METRICS

__all__ = [
    "BEST_METRIC",
    "CheckpointManager",
    "CheckpointSaveError",
    "CheckpointUnreadable",
    "Restored",
    "load_checkpoint",
    "metric_rank",
]

BEST_METRIC = "nll_per_token"  # the validation metric of runs that record none (lower is better)
_ITEMS = ("state", "data", "config")


class Restored(NamedTuple):
    """A restored checkpoint: the train state (or its raw pytree), the iterator state and the config dict.

    ``note`` is empty, or one line saying which checkpoint was restored instead of the one asked for (the
    latest, when ``best`` was asked for and no kept checkpoint has validation metrics); callers print it.
    """

    step: int
    state: Any
    data: dict
    config: dict
    note: str = ""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (e.g. a full disk); the message is one line naming the step, the reason
    and the last good checkpoint, which is left intact."""


class CheckpointUnreadable(RuntimeError):
    """No checkpoint of the ones tried can be read (damaged files); the message is one line naming each step and
    why it failed, :attr:`failed` lists them as ``(step, reason)``."""

    def __init__(self, message: str, failed: Iterable[tuple[int, str]] = ()):
        super().__init__(message)
        self.failed = list(failed)


def failure_reason(error: BaseException) -> str:
    """One line saying why orbax could not read (or write) a checkpoint: the innermost cause's type and first
    line (orbax wraps TensorStore's ``OUT_OF_RANGE``/``NOT_FOUND`` errors in a bare ``Exception`` whose message
    is a page of TensorStore spec)."""
    while error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, OSError) and error.strerror:
        text = f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    else:
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = " ".join(text.split()).split(" [tensorstore_spec=")[0]  # the spec repeats the path, as JSON
    if len(text) > 300:  # TensorStore puts the cause (``No space left on device``) last
        text = f"{text[:120]} ... {text[-170:]}"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def metric_rank(metrics: dict | None, best_metric: str = "nll") -> float | None:
    """The rank of a checkpoint's validation ``metrics`` by ``best_metric`` (a key of
    ``attn_jax.train.BEST_METRICS``): lower is better (BLEU and chrF are negated); None when the metric is
    missing or not finite, so the checkpoint is not ranked.

    >>> metric_rank({"nll_per_token": 2.5, "bleu": 10.0}), metric_rank({"nll_per_token": 2.5, "bleu": 10.0}, "bleu")
    (2.5, -10.0)
    """
    key, higher = BEST_METRICS[best_metric]
    value = None if not metrics else metrics.get(key)
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return -float(value) if higher else float(value)


def recorded_best_metric(metrics: dict | None) -> str | None:
    """The ``best_metric`` a checkpoint's metrics name, or None (a checkpoint saved before it was recorded)."""
    name = None if not metrics else metrics.get("best_metric")
    return name if name in BEST_METRICS else None


@dataclasses.dataclass
class _KeepBest:
    """orbax preservation policy: keep the checkpoint of lowest rank (:func:`metric_rank`), the earliest on ties."""

    best_metric: str

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        del context
        ranked = [
            (r, c.step) for c in checkpoints if (r := metric_rank(c.metrics, self.best_metric)) is not None
        ]
        best = min(ranked, default=(None, None))[1]
        return [c.step == best for c in checkpoints]


class CheckpointManager:
    """The trainer's view of an orbax ``CheckpointManager`` rooted at ``directory``.

    Args:
      directory: where step directories live (created if missing).
      keep: how many of the latest checkpoints to keep (>= 1).
      keep_best: also keep the best checkpoint by ``best_metric``.
      best_metric: the validation metric that ranks checkpoints (``nll``, ``bleu`` or ``chrf``); a run read
        back ranks by the metric its newest ranked checkpoint recorded (:meth:`recorded_best_metric`).
      async_save: write in a background thread (orbax's async checkpointing); the arrays are copied to host
        memory before ``save`` returns, so the caller may donate them to the next step right away.
      read_only: only read (never creates, saves or deletes).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep: int = 3,
        keep_best: bool = True,
        best_metric: str = "nll",
        async_save: bool = True,
        read_only: bool = False,
    ):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if best_metric not in BEST_METRICS:
            raise ValueError(f"best_metric must be one of {', '.join(BEST_METRICS)}, got {best_metric!r}")
        self.best_metric = best_metric
        policies: list[ocm.PreservationPolicy] = [ocm.LatestN(n=keep)]
        if keep_best:
            policies.append(_KeepBest(best_metric))

        def rank(metrics: dict) -> float:
            r = metric_rank(metrics, self.best_metric)
            return math.inf if r is None else r

        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocm.AnyPreservationPolicy(policies),
            best_fn=rank if keep_best else None,  # orbax writes metrics only then; best_step ranks them
            best_mode="min",
            enable_async_checkpointing=async_save,
            create=not read_only,
            read_only=read_only,
        )
        self.directory = os.path.abspath(os.fspath(directory))
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)
        self._pending: int | None = None  # the step of a save not yet known to have finished

    def latest_step(self) -> int | None:
        """The newest finished checkpoint's step (temporary, half-written ones are not listed)."""
        return self._manager.latest_step()

    def best_step(self) -> int | None:
        """The kept step best by :attr:`best_metric` (the earliest on ties); None when no kept checkpoint has
        that metric (:func:`load_checkpoint` then falls back to the latest and says so)."""
        ranked = [(r, s) for s in self.all_steps() if (r := self.metric(s)) is not None]
        return min(ranked, default=(None, None))[1]

    def recorded_best_metric(self) -> str:
        """The ``best_metric`` the newest kept checkpoint with metrics recorded; ``nll`` when none did (a run
        written before checkpoints recorded it)."""
        for step in sorted(self.all_steps(), reverse=True):
            name = recorded_best_metric(self.metrics(step))
            if name is not None:
                return name
        return "nll"

    def all_steps(self) -> list[int]:
        """Steps of every finished checkpoint kept, ascending."""
        return sorted(self._manager.all_steps())

    def save(
        self, step: int, state: Any, data_state: dict, config: dict, metrics: dict | None = None
    ) -> None:
        """Save ``state`` (a pytree of arrays), the iterator's JSON state and the config as step ``step``.

        ``metrics`` (validation metrics: ``nll_per_token``, and ``bleu``/``chrf`` when scored) rank the checkpoint
        for best-keeping; the name of :attr:`best_metric` is saved with them.

        Raises:
          CheckpointSaveError: this save, or the previous (background) one, failed.
        """
        self.wait()  # orbax would wait too, but report the previous save's failure under its own step
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config),
        )
        self._pending = step
        try:
            if metrics is not None:
                metrics = {**metrics, "best_metric": self.best_metric}
            self._manager.save(step, args=args, metrics=metrics, force=True)
        except Exception as e:
            raise self._save_error(step, e) from e
        if not self._manager.is_saving_in_progress():  # synchronous: finished (or failed) already
            self.wait()

    def poll(self) -> None:
        """Raise :class:`CheckpointSaveError` now if a background save has failed (cheap: call it every step).

        Without it a failed asynchronous save (a full disk) would surface only at the next save, possibly hours
        of training later.
        """
        if self._pending is not None and not self._manager.is_saving_in_progress():
            self.wait()

    def _save_error(self, step: int | None, error: BaseException) -> CheckpointSaveError:
        self._pending = None
        with contextlib.suppress(Exception):
            self._manager.reload()  # forget the failed step, so that latest_step is the last good one
        last = self._manager.latest_step()
        good = f"the last good checkpoint is step {last}" if last is not None else "no checkpoint was written"
        return CheckpointSaveError(
            f"cannot write {'a checkpoint' if step is None else f'checkpoint step {step}'} in {self.directory}: "
            f"{failure_reason(error)}; {good} "
            "(intact; resume from it with --resume once the cause is fixed)"
        )

    def restore(self, step: int, abstract_state: Any | None = None) -> Restored:
        """Restore step ``step``; with ``abstract_state`` (``jax.eval_shape`` of a state, or
        :func:`attn_jax.train.abstract_sharded_state`) into its exact pytree type (dataclasses, optax named
        tuples) and shardings, else as nested dicts of arrays on the first local device (whatever mesh wrote
        them).

        A dataclass target's optional fields follow the checkpoint: a field the checkpoint does not hold
        (written before the field existed, or with it off: ``TrainState.ema_params``) comes back ``None``,
        and one the checkpoint holds but the target leaves ``None`` is read and dropped.
        """
        rebuild = None
        if abstract_state is None:
            abstract_state = self._on_one_device(step)
        elif dataclasses.is_dataclass(abstract_state):
            abstract_state, rebuild = _fit_fields(abstract_state, self._saved_tree(step))
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            config=ocp.args.JsonRestore(),
        )
        out = self._manager.restore(step, args=args)
        state = out["state"] if rebuild is None else rebuild(out["state"])
        return Restored(step=step, state=state, data=out["data"], config=out["config"])

    def restore_first(
        self, steps: Iterable[int], abstract_state: Any | None = None
    ) -> tuple[Restored, list[tuple[int, str]]]:
        """Restore the first of ``steps`` that can be read; also return the ``(step, reason)`` of those before it
        that could not (damaged or missing files).

        Raises:
          CheckpointUnreadable: none of ``steps`` can be read (or ``steps`` is empty).
        """
        failed: list[tuple[int, str]] = []
        for step in steps:
            try:
                with _sibling_read_errors_dropped():
                    return self.restore(step, abstract_state), failed
            except MemoryError:
                raise
            except Exception as e:  # orbax raises bare Exceptions for TensorStore read errors
                failed.append((step, failure_reason(e)))
        raise CheckpointUnreadable(
            f"no checkpoint in {self.directory} can be read: {_describe(failed)}"
            if failed
            else f"{self.directory}: no finished checkpoint",
            failed,
        )

    def metrics(self, step: int) -> dict | None:
        """The validation metrics saved with step ``step``, or None (not evaluated, or unreadable)."""
        try:
            return self._manager.metrics(step) or None
        except Exception:  # a damaged metrics file: the step is merely not ranked
            return None

    def metric(self, step: int) -> float | None:
        """Step ``step``'s rank by :attr:`best_metric` (:func:`metric_rank`: lower is better), or None (not
        evaluated, the metric not scored, or unreadable)."""
        return metric_rank(self.metrics(step), self.best_metric)

    def _on_one_device(self, step: int):
        """The saved state's structure as ``ShapeDtypeStruct``s on the first local device (from its metadata).

        orbax would otherwise restore each array onto the shardings it was saved with, which fails when the
        checkpoint was written on a mesh of other devices (another process count or topology).
        """
        return _on_first_device(self._saved_tree(step))

    def _saved_tree(self, step: int):
        """The saved state's tree of ``ArrayMetadata`` (nested dicts), read from its metadata only."""
        metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(self.directory) / str(step) / "state")
        return getattr(metadata, "tree", metadata)

    def wait(self) -> None:
        """Block until every pending (async) save has been finalised.

        Raises:
          CheckpointSaveError: the pending save failed (its partial ``<step>.orbax-checkpoint-tmp`` directory is
            left; the next save of that step replaces it).
        """
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise self._save_error(step, e) from e
        if step is not None and jax.process_index() == 0 and not os.path.isdir(self._step_dir(step)):
            # orbax logs, but does not raise, some failures of its last commit step (Skipping finalization).
            raise self._save_error(step, RuntimeError("the save did not finish (see orbax's log)"))

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def set_aside(self, step: int, destination: str | os.PathLike) -> str:
        """Move step ``step``'s directory into ``destination`` (created; never overwriting: ``<step>-1``, ...) so
        that it is no longer listed; returns the new path."""
        os.makedirs(destination, exist_ok=True)
        target, k = os.path.join(destination, str(step)), 0
        while os.path.lexists(target):
            k += 1
            target = os.path.join(destination, f"{step}-{k}")
        os.rename(self._step_dir(step), target)
        self._manager.reload()
        return target

    def close(self) -> None:
        """Finish pending saves and release the manager.

        Raises:
          CheckpointSaveError: the pending save failed.
        """
        try:
            self.wait()
        finally:
            with contextlib.suppress(
                Exception
            ):  # a failed save was reported by wait(); orbax would raise it again
                self._manager.close()


def _on_first_device(tree):
    """``ShapeDtypeStruct``s on the first local device for a tree of orbax ``ArrayMetadata``."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
        tree,
        is_leaf=lambda x: isinstance(x, ocp_metadata.ArrayMetadata),
    )


def _fit_fields(target, saved):
    """``(restore target, rebuild)`` for a dataclass ``target`` whose fields the ``saved`` tree may not match.

    ``rebuild`` is None when they match. Otherwise the target is a dict of the saved fields: those the
    target wants restore into its shardings, the others onto the first device (``None`` stays ``None``);
    ``rebuild`` turns the restored dict into ``target``'s type, ``None`` where the target or the checkpoint
    has no value.
    """
    names = [f.name for f in dataclasses.fields(target)]
    if not isinstance(saved, dict):
        return target, None
    wanted = {n: getattr(target, n) for n in names}
    if set(saved) == set(names) and all((saved[n] is None) == (wanted[n] is None) for n in names):
        return target, None
    partial = {}
    for name, value in saved.items():
        if value is None:
            partial[name] = None
        elif wanted.get(name) is not None:
            partial[name] = wanted[name]
        else:
            partial[name] = _on_first_device(value)  # read, then dropped: the target has no use for it

    def rebuild(restored: dict):
        return type(target)(**{n: restored.get(n) if wanted[n] is not None else None for n in names})

    return partial, rebuild


class _NotUnretrieved(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "exception was never retrieved" not in record.getMessage()


@contextlib.contextmanager
def _sibling_read_errors_dropped():
    """Drop asyncio's "Task exception was never retrieved" tracebacks of a failed restore: orbax reads the arrays
    in concurrent tasks and raises the first error (which the caller reports), and every other array of a damaged
    file logs its own page-long traceback when its task is collected."""
    asyncio_logger = logging.getLogger("asyncio")
    quiet = _NotUnretrieved()
    asyncio_logger.addFilter(quiet)
    try:
        yield
    except BaseException:
        gc.collect()  # collect the failed tasks now, while the filter is on
        raise
    finally:
        asyncio_logger.removeFilter(quiet)


def _describe(failed: list[tuple[int, str]]) -> str:
    """``step 4 (reason); step 2 (reason)``."""
    return "; ".join(f"step {step} ({reason})" for step, reason in failed)


def load_checkpoint(workdir: str | os.PathLike, step: int | None = None, *, best: bool = False) -> Restored:
    """Read a checkpoint of a training run: ``step``, else the best (``best=True``) or the latest one.

    The state comes back as nested dicts of arrays (``state["params"]`` is the model's parameter dict, what
    ``attn_jax.train.build_module`` takes); ``config`` is the run's config as a dict.

    ``best=True`` on a run where no kept checkpoint has validation metrics (stopped before its first
    evaluation, or ``checkpoint_every < eval_every`` and killed) restores the latest finished checkpoint
    instead, and says so in :attr:`Restored.note` (never silently).

    The best checkpoint is the best by the metric the run ranked its checkpoints by (``checkpoint.best_metric``,
    recorded with each checkpoint's metrics; validation NLL per token for a run that recorded none), the
    earliest on ties. A best or latest checkpoint that cannot be read (a truncated or deleted file) is skipped
    for the next best (by that metric, then the newest unranked ones) or the next newest one that loads;
    :attr:`Restored.note` names each skipped step and why. A ``step`` asked for by number is never replaced.

    Raises:
      FileNotFoundError: ``workdir/checkpoints`` holds no finished checkpoint.
      CheckpointUnreadable: no candidate checkpoint (or the ``step`` asked for) can be read.
    """
    directory = os.path.join(os.fspath(workdir), "checkpoints")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no checkpoints directory")
    manager = CheckpointManager(directory, async_save=False, read_only=True)
    try:
        notes = []
        steps = manager.all_steps()
        manager.best_metric = manager.recorded_best_metric()
        if step is not None:
            candidates = [step]
        elif not steps:
            raise FileNotFoundError(f"{directory}: no finished checkpoint")
        else:
            newest_first = sorted(steps, reverse=True)
            candidates = newest_first
            if best:
                ranked = {s: m for s in steps if (m := manager.metric(s)) is not None}
                if ranked:
                    candidates = sorted(ranked, key=lambda s: (ranked[s], s))  # best_step's order
                    candidates += [s for s in newest_first if s not in candidates]
                else:
                    what = (
                        "validation metrics"
                        if manager.best_metric == "nll"
                        else f"a validation {manager.best_metric}"
                    )
                    notes.append(
                        f"no kept checkpoint has {what}, so there is no best one: using the latest "
                        f"finished checkpoint, step {newest_first[0]} (of {steps})"
                    )
        try:
            restored, failed = manager.restore_first(candidates)
        except CheckpointUnreadable as e:
            if step is None or not e.failed:
                raise
            raise CheckpointUnreadable(
                f"cannot read checkpoint step {step} in {directory} ({e.failed[0][1]}); choose another (kept: "
                f"{steps})",
                e.failed,
            ) from None
        if failed:
            order = "next best" if best and step is None and not notes else "newest"
            notes.append(
                f"cannot read checkpoint {_describe(failed)}: using step {restored.step}, the {order} one that "
                "loads"
            )
        restored = restored._replace(note="; ".join(notes))
    finally:
        manager.close()
    return restored
