"""Checkpoint averaging: the element-wise mean of several checkpoints' parameters, written as a run of its own.

As OpenNMT-py's ``average_models`` and fairseq's ``scripts/average_checkpoints.py``: for each parameter,

    θ̄ = (1/n) Σ_k θ_k        over the checkpoints k = 1..n of one run,

summed in float64 and cast back to each parameter's dtype (Vaswani et al., 2017, §6.1, average the last 5 or 20
checkpoints). Only the parameters are averaged; optimiser state, data position and RNG are not (an average of Adam
moments means nothing), so the averaged run translates and evaluates but does not resume.

The averaged run (:func:`write_averaged_run`) is a directory that ``attn-jax translate`` and ``attn-jax evaluate``
load like a training run: ``vocab/`` and ``config.json`` copied from the source run, ``checkpoints/<step>/``
holding ``{"params", "step"}`` at the newest averaged step with the newest step's config, and ``averaged.json``
naming the source run and steps. It has no validation metrics, so ``--checkpoint best`` loads it with a warning
that says so. It is written to a temporary sibling directory and renamed into place only once complete; the
source run is only read.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attn_jax.train._checkpoint import (
    CheckpointManager,
    CheckpointSaveError,
    CheckpointUnreadable,
    failure_reason,
)

__all__ = [
    "AverageError",
    "Averaged",
    "average_checkpoints",
    "check_average_output",
    "kept_steps",
    "last_steps",
    "write_averaged_run",
]

AVERAGED_JSON = "averaged.json"


class AverageError(ValueError):
    """Checkpoints cannot be averaged or the result cannot be written; the message is one line."""


class Averaged(NamedTuple):
    """The mean parameters of ``steps`` (ascending) of one run, and the newest of those steps' config dict."""

    params: Any
    steps: tuple[int, ...]
    config: dict


def _checkpoints_dir(workdir: str | os.PathLike) -> str:
    return os.path.join(os.fspath(workdir), "checkpoints")


def kept_steps(workdir: str | os.PathLike) -> list[int]:
    """Steps of the finished checkpoints of the run in ``workdir``, ascending.

    Raises:
      AverageError: ``workdir`` or its ``checkpoints/`` directory does not exist.
    """
    workdir = os.fspath(workdir)
    if not os.path.isdir(workdir):
        raise AverageError(f"{workdir}: no such run directory")
    directory = _checkpoints_dir(workdir)
    if not os.path.isdir(directory):
        raise AverageError(f"{workdir}: no checkpoint (expected {directory}/<step>; train first)")
    manager = CheckpointManager(directory, async_save=False, read_only=True)
    try:
        return manager.all_steps()
    finally:
        manager.close()


def last_steps(workdir: str | os.PathLike, n: int) -> list[int]:
    """The ``n`` newest finished checkpoints' steps of the run in ``workdir``, ascending.

    Raises:
      AverageError: ``n < 2``, or the run keeps fewer than ``n`` checkpoints.
    """
    if n < 2:
        raise AverageError(f"averaging needs at least 2 checkpoints, got --last {n}")
    steps = kept_steps(workdir)
    if len(steps) < n:
        raise AverageError(
            f"{workdir} keeps {len(steps)} checkpoint(s) {steps}, fewer than the {n} asked for "
            "(config.keep_checkpoints sets how many training keeps)"
        )
    return steps[-n:]


def _leaves(tree) -> dict[str, Any]:
    """``{"['decoder']['embed']": leaf, ...}``: the tree's leaves by path."""
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _mismatch(first_step: int, first: dict, step: int, other: dict) -> str | None:
    """One line naming the first leaf whose path, shape or dtype differs between two params trees, or None."""
    for path in sorted(first.keys() | other.keys()):
        if path not in other:
            return f"parameter {path} is in step {first_step} but not in step {step}"
        if path not in first:
            return f"parameter {path} is in step {step} but not in step {first_step}"
        a, b = first[path], other[path]
        if a.shape != b.shape or a.dtype != b.dtype:
            return (
                f"parameter {path} is {a.dtype}{list(a.shape)} in step {first_step} but {b.dtype}{list(b.shape)} "
                f"in step {step}"
            )
    return None


def average_checkpoints(workdir: str | os.PathLike, steps: Sequence[int]) -> Averaged:
    """The element-wise mean of the parameters of checkpoints ``steps`` of the run in ``workdir``.

    ``θ̄ = (1/n) Σ_k θ_k``, accumulated in float64 one checkpoint at a time (memory: one train state plus a
    float64 copy of the parameters) and cast back to each parameter's dtype. A step asked for is never replaced
    by another one.

    Args:
      workdir: a training run's directory (``checkpoints/<step>/``).
      steps: at least 2 distinct steps of its finished checkpoints.

    Returns:
      :class:`Averaged`: the mean parameters (the nested dict of NumPy arrays that ``state["params"]`` of
      :func:`attn_jax.train.load_checkpoint` holds), the steps ascending, the newest step's config dict.

    Raises:
      AverageError: fewer than 2 steps, a step given twice, a step the run does not keep, one that cannot be
        read, parameter trees that differ in a path, shape or dtype (naming it), a non-float parameter, or
        steps trained with different model configs.

    >>> average_checkpoints("runs/missing", [1, 2])
    Traceback (most recent call last):
    ...
    attn_jax.train._average.AverageError: runs/missing: no such run directory
    """
    steps = [int(s) for s in steps]
    if len(steps) < 2:
        raise AverageError(f"averaging needs at least 2 checkpoints, got {len(steps)}: {steps}")
    if len(set(steps)) != len(steps):
        twice = sorted({s for s in steps if steps.count(s) > 1})
        raise AverageError(f"step(s) {twice} given more than once: each checkpoint counts once")
    steps = sorted(steps)
    kept = kept_steps(workdir)
    missing = [s for s in steps if s not in kept]
    if missing:
        raise AverageError(f"{workdir}: no checkpoint at step(s) {missing} (kept: {kept})")

    manager = CheckpointManager(_checkpoints_dir(workdir), async_save=False, read_only=True)
    total: dict[str, np.ndarray] = {}
    first: dict[str, Any] = {}
    treedef = None
    config: dict = {}
    try:
        for step in steps:
            try:
                restored, _ = manager.restore_first([step])
            except CheckpointUnreadable as e:
                reason = e.failed[0][1] if e.failed else str(e)
                raise AverageError(f"cannot read checkpoint step {step} in {workdir}: {reason}") from None
            params = restored.state["params"]
            leaves = {path: np.asarray(leaf) for path, leaf in _leaves(params).items()}
            if treedef is None:
                treedef = jax.tree.structure(params)
                first = {p: jax.ShapeDtypeStruct(x.shape, x.dtype) for p, x in leaves.items()}
                for path, x in leaves.items():
                    if not jnp.issubdtype(x.dtype, jnp.floating):
                        raise AverageError(
                            f"parameter {path} of step {step} is {x.dtype}, not a float: cannot average"
                        )
                total = {p: np.zeros(x.shape, np.float64) for p, x in leaves.items()}
                first_config = restored.config
            else:
                problem = _mismatch(steps[0], first, step, leaves)
                if problem:
                    raise AverageError(f"cannot average {workdir}: {problem}")
                if restored.config.get("model") != first_config.get("model"):
                    diff = _config_diff(first_config.get("model") or {}, restored.config.get("model") or {})
                    raise AverageError(
                        f"cannot average {workdir}: steps {steps[0]} and {step} have different model configs "
                        f"({diff})"
                    )
            for path, x in leaves.items():
                total[path] += x.astype(np.float64)
            config = restored.config
            del restored, params, leaves  # free this state before reading the next
    finally:
        manager.close()
    n = len(steps)
    mean = [(total[p] / n).astype(first[p].dtype) for p in first]
    # ``first``'s order is the tree's leaf order (built from tree_leaves_with_path), so unflatten matches.
    return Averaged(jax.tree.unflatten(treedef, mean), tuple(steps), config)


def _config_diff(a: dict, b: dict, prefix: str = "model") -> str:
    """``model.hidden: 10 vs 12`` for the first differing keys (at most three)."""
    out = []
    for key in sorted(a.keys() | b.keys()):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            if x != y:
                out.append(_config_diff(x, y, f"{prefix}.{key}"))
        elif x != y:
            out.append(f"{prefix}.{key}: {x!r} vs {y!r}")
    return "; ".join(out[:3])


def check_average_output(workdir: str | os.PathLike, output: str | os.PathLike) -> None:
    """Refuse, before any averaging, an ``output`` that exists or a source run without vocabularies.

    Raises:
      AverageError: ``output`` exists (it is never overwritten), or ``workdir/vocab`` is missing.
    """
    if os.path.lexists(output):
        raise AverageError(
            f"{output} already exists (never overwritten): choose another --output or remove it"
        )
    vocab = os.path.join(os.fspath(workdir), "vocab")
    if not os.path.isdir(vocab):
        raise AverageError(
            f"{workdir}: no vocabularies ({vocab} is missing), so the average could not translate"
        )


def write_averaged_run(workdir: str | os.PathLike, output: str | os.PathLike, averaged: Averaged) -> str:
    """Write ``averaged`` as a run directory ``output`` that translate/evaluate load; returns its path.

    ``output`` gets ``vocab/`` and ``config.json`` (when the source has one) copied from ``workdir``,
    ``checkpoints/<newest step>/`` with ``{"params", "step"}`` and the newest step's config (no validation
    metrics), and ``averaged.json`` (``source_workdir``, ``steps``, ``step``). Everything is written to a
    temporary sibling of ``output``, renamed to ``output`` only when complete (removed on failure), so a crash
    leaves no partial run under that name; ``workdir`` is only read.

    Raises:
      AverageError: ``output`` exists, ``workdir`` has no vocabularies, or writing fails (the reason).
    """
    workdir, output = os.path.abspath(os.fspath(workdir)), os.path.abspath(os.fspath(output))
    check_average_output(workdir, output)
    parent = os.path.dirname(output)
    step = averaged.steps[-1]
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.tmp-", dir=parent)
    except OSError as e:
        raise AverageError(f"cannot write {output}: {e.strerror or e}") from None
    try:
        shutil.copytree(os.path.join(workdir, "vocab"), os.path.join(tmp, "vocab"))
        if os.path.isfile(os.path.join(workdir, "config.json")):
            shutil.copy2(os.path.join(workdir, "config.json"), os.path.join(tmp, "config.json"))
        manager = CheckpointManager(
            os.path.join(tmp, "checkpoints"), keep=1, keep_best=False, async_save=False
        )
        try:
            state = {"params": averaged.params, "step": np.asarray(step, np.int32)}
            manager.save(step, state, {}, averaged.config, None)
        finally:
            manager.close()
        record = {
            "source_workdir": workdir,
            "steps": list(averaged.steps),
            "step": step,
            "method": "element-wise mean of the parameters, summed in float64, cast to each parameter's dtype",
            "resumable": False,
        }
        with open(os.path.join(tmp, AVERAGED_JSON), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        os.rename(tmp, output)  # atomic; fails rather than replace a non-empty output created meanwhile
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (OSError, CheckpointSaveError)):
            raise AverageError(f"cannot write {output}: {failure_reason(e)}") from None
        raise
    return output
