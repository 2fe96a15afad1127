"""Checkpoints with orbax's ``CheckpointManager``: train state, data-iterator position and config, atomically.

Layout of ``<workdir>/checkpoints/<step>/``: ``state/`` (the :class:`TrainState` pytree: params, optimiser state,
step, RNG), ``data/`` (the batch iterator's ``get_state()`` JSON), ``config/`` (the run's config as JSON) and
``metrics/`` (the validation metrics the step was ranked by, when it was evaluated).

Multi-process runs: every process calls :meth:`CheckpointManager.save` and :meth:`~CheckpointManager.restore`
(orbax coordinates them through ``jax.distributed``): each array's shards are written by the processes that hold
them, the JSON items by process 0, and the step is committed once all are written. Restoring into
:func:`attn_jax.train.abstract_sharded_state` targets reads every array straight into the current mesh's
shardings, whatever mesh or process count wrote it; without a target (:func:`load_checkpoint`) arrays come back
on the first local device.

Kept: the last ``keep`` checkpoints, plus the best one by validation NLL per token (orbax ``LatestN`` ∪
``BestN``). A save is atomic: orbax writes ``<step>.orbax-checkpoint-tmp*`` and renames it to ``<step>`` only
after every item is written (``AtomicRenameTemporaryPath.finalize``), and the step listing ignores temporary
directories, so a process killed half-way through a save leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as ocm
from orbax.checkpoint import metadata as ocp_metadata

__all__ = ["BEST_METRIC", "CheckpointManager", "Restored", "load_checkpoint"]

BEST_METRIC = "nll_per_token"  # validation metric a checkpoint is ranked by (lower is better)
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


def _best_metric(metrics: dict) -> float:
    return float(metrics[BEST_METRIC])


class CheckpointManager:
    """The trainer's view of an orbax ``CheckpointManager`` rooted at ``directory``.

    Args:
      directory: where step directories live (created if missing).
      keep: how many of the latest checkpoints to keep (>= 1).
      keep_best: also keep the checkpoint with the lowest validation NLL per token.
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
        async_save: bool = True,
        read_only: bool = False,
    ):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        policies: list[ocm.PreservationPolicy] = [ocm.LatestN(n=keep)]
        if keep_best:
            policies.append(
                ocm.BestN(
                    get_metric_fn=_best_metric, reverse=True, n=1, keep_checkpoints_without_metrics=False
                )
            )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocm.AnyPreservationPolicy(policies),
            best_fn=_best_metric if keep_best else None,
            best_mode="min",
            enable_async_checkpointing=async_save,
            create=not read_only,
            read_only=read_only,
        )
        self.directory = os.path.abspath(os.fspath(directory))
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)

    def latest_step(self) -> int | None:
        """The newest finished checkpoint's step (temporary, half-written ones are not listed)."""
        return self._manager.latest_step()

    def best_step(self) -> int | None:
        """The step with the lowest validation NLL per token; None when no kept checkpoint was evaluated
        (:func:`load_checkpoint` then falls back to the latest and says so)."""
        return self._manager.best_step()

    def all_steps(self) -> list[int]:
        """Steps of every finished checkpoint kept, ascending."""
        return sorted(self._manager.all_steps())

    def save(
        self, step: int, state: Any, data_state: dict, config: dict, metrics: dict | None = None
    ) -> None:
        """Save ``state`` (a pytree of arrays), the iterator's JSON state and the config as step ``step``.

        ``metrics`` (validation metrics, with ``nll_per_token``) rank the checkpoint for best-keeping.
        """
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config),
        )
        self._manager.save(step, args=args, metrics=metrics, force=True)

    def restore(self, step: int, abstract_state: Any | None = None) -> Restored:
        """Restore step ``step``; with ``abstract_state`` (``jax.eval_shape`` of a state, or
        :func:`attn_jax.train.abstract_sharded_state`) into its exact pytree type (dataclasses, optax named
        tuples) and shardings, else as nested dicts of arrays on the first local device (whatever mesh wrote
        them)."""
        if abstract_state is None:
            abstract_state = self._on_one_device(step)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            config=ocp.args.JsonRestore(),
        )
        out = self._manager.restore(step, args=args)
        return Restored(step=step, state=out["state"], data=out["data"], config=out["config"])

    def _on_one_device(self, step: int):
        """The saved state's structure as ``ShapeDtypeStruct``s on the first local device (from its metadata).

        orbax would otherwise restore each array onto the shardings it was saved with, which fails when the
        checkpoint was written on a mesh of other devices (another process count or topology).
        """
        metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(self.directory) / str(step) / "state")
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
            getattr(metadata, "tree", metadata),
            is_leaf=lambda x: isinstance(x, ocp_metadata.ArrayMetadata),
        )

    def wait(self) -> None:
        """Block until every pending (async) save has been finalised."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager."""
        self._manager.close()


def load_checkpoint(workdir: str | os.PathLike, step: int | None = None, *, best: bool = False) -> Restored:
    """Read a checkpoint of a training run: ``step``, else the best (``best=True``) or the latest one.

    The state comes back as nested dicts of arrays (``state["params"]`` is the model's parameter dict, what
    ``attn_jax.train.build_module`` takes); ``config`` is the run's config as a dict.

    ``best=True`` on a run where no kept checkpoint has validation metrics (stopped before its first
    evaluation, or ``checkpoint_every < eval_every`` and killed) restores the latest finished checkpoint
    instead, and says so in :attr:`Restored.note` (never silently).

    Raises:
      FileNotFoundError: ``workdir/checkpoints`` holds no finished checkpoint.
    """
    directory = os.path.join(os.fspath(workdir), "checkpoints")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no checkpoints directory")
    manager = CheckpointManager(directory, async_save=False, read_only=True)
    try:
        note = ""
        if step is None:
            step = manager.best_step() if best else manager.latest_step()
            if step is None and best and manager.latest_step() is not None:
                step = manager.latest_step()
                note = (
                    f"no kept checkpoint has validation metrics, so there is no best one: using the latest "
                    f"finished checkpoint, step {step} (of {manager.all_steps()})"
                )
        if step is None:
            raise FileNotFoundError(f"{directory}: no finished checkpoint")
        restored = manager.restore(step)._replace(note=note)
    finally:
        manager.close()
    return restored
