"""Load a trained run: its checkpoint (best, last or a step), vocabularies and config."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["WEIGHTS", "LoadedModel", "TranslateError", "load_ensemble", "load_model", "quiet_checkpoint_logs"]

WEIGHTS = ("raw", "ema")  # which parameters of a checkpoint: the trained ones, or their moving average


class TranslateError(ValueError):
    """A run cannot be loaded or an input cannot be translated; the message is one line."""


class LoadedModel(NamedTuple):
    """A trained model restored from a run directory, with its vocabularies and config.

    An ensemble (:func:`load_ensemble`) holds a tuple of modules in ``model``, its runs in ``members`` and
    the first run's vocabularies, config, step and directory.
    """

    model: Any  # flax.nnx.Module with the step interface, or a tuple of them (an ensemble)
    src_vocab: Any  # attn_jax.data.Vocabulary
    tgt_vocab: Any
    config: Any  # ml_collections.ConfigDict of the run
    step: int
    workdir: str
    note: str = ""  # one line when another checkpoint than the one asked for was loaded (print it)
    weights: str = "raw"  # "ema": the moving average of the weights (optimizer.ema_decay)
    members: tuple[LoadedModel, ...] = ()  # an ensemble's runs, in the order given; empty for one run


def _checkpoint_steps(workdir: str) -> list[int]:
    """The steps of ``workdir/checkpoints/<step>``, ascending; TranslateError when there is none."""
    ckpt_dir = os.path.join(workdir, "checkpoints")
    steps = (
        sorted(
            int(d) for d in os.listdir(ckpt_dir) if d.isdigit() and os.path.isdir(os.path.join(ckpt_dir, d))
        )
        if os.path.isdir(ckpt_dir)
        else []
    )
    if not steps:
        raise TranslateError(f"{workdir}: no checkpoint (expected {ckpt_dir}/<step>; train first)")
    return steps


def load_model(
    workdir: str | os.PathLike, checkpoint: str | int = "best", weights: str = "raw"
) -> LoadedModel:
    """Restore the model of a training run: its checkpoint (``best``, ``last`` or a step), vocabularies, config.

    ``best`` falls back to the latest finished checkpoint when none of the kept ones has validation metrics
    (a run stopped before its first evaluation), and ``best``/``last`` to the next best/newest checkpoint that
    loads when theirs cannot be read (a truncated or deleted file); :attr:`LoadedModel.note` then says so, for
    the caller to print.

    Args:
      workdir: the run directory (``checkpoints/<step>``, ``vocab/``).
      checkpoint: ``"best"`` (by the run's ``checkpoint.best_metric``: lowest validation loss, or highest BLEU
        or chrF), ``"last"`` or a step number.
      weights: ``"raw"``, the trained parameters, or ``"ema"``, their moving average (a run trained with
        ``optimizer.ema_decay > 0``).

    Returns:
      A :class:`LoadedModel`.

    Raises:
      TranslateError: no such workdir, no (such) checkpoint, none that can be read (or the step asked for
        cannot be), ``weights="ema"`` on a checkpoint without a moving average, missing vocabularies or an
        unusable config.
    """
    import ml_collections

    from attn_jax import data
    from attn_jax.train import CheckpointUnreadable, build_module, load_checkpoint, model_config

    workdir = os.fspath(workdir)
    if weights not in WEIGHTS:
        raise TranslateError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if not os.path.isdir(workdir):
        raise TranslateError(f"{workdir}: no such run directory")
    steps = _checkpoint_steps(workdir)
    if isinstance(checkpoint, int) and checkpoint not in steps:
        raise TranslateError(f"{workdir}: no checkpoint at step {checkpoint} (kept: {steps})")
    try:
        step = checkpoint if isinstance(checkpoint, int) else None
        # An imported run has one checkpoint and no validation metrics: "best" is that checkpoint.
        imported = os.path.isfile(os.path.join(workdir, "imported.json"))
        restored = load_checkpoint(workdir, step, best=checkpoint == "best" and not imported)
    except (FileNotFoundError, CheckpointUnreadable) as e:
        raise TranslateError(str(e)) from None
    try:
        src_vocab, tgt_vocab = data.load_vocabularies(os.path.join(workdir, "vocab"))
    except (ValueError, OSError) as e:
        raise TranslateError(f"{workdir}: cannot read the vocabularies: {e}") from None
    config = ml_collections.ConfigDict(restored.config)
    params = restored.state["params"]
    if weights == "ema":
        params = restored.state.get("ema_params")
        if params is None:
            raise TranslateError(
                f"{workdir}: checkpoint {restored.step} holds no moving average of the weights (trained "
                "without optimizer.ema_decay, or an averaged run): use --weights raw"
            )
    try:
        model = build_module(model_config(config, src_vocab.size, tgt_vocab.size), params)
    except (ValueError, KeyError, TypeError) as e:
        raise TranslateError(f"{workdir}: checkpoint {restored.step} does not fit its config: {e}") from None
    return LoadedModel(
        model, src_vocab, tgt_vocab, config, int(restored.step), workdir, restored.note, weights
    )


def load_ensemble(
    workdirs: Sequence[str | os.PathLike], checkpoint: str | int = "best", weights: str = "raw"
) -> LoadedModel:
    """Restore several runs to decode as one model: beam search and scoring average their log-probabilities.

    Each run is restored by :func:`load_model` with the same ``checkpoint`` and ``weights``. The runs must
    share their vocabularies, compared file by file in ``vocab/`` before any checkpoint is read. A copy model
    (``model.copy``) cannot join an ensemble. One run gives :func:`load_model`'s result.

    Returns:
      A :class:`LoadedModel` whose ``model`` is the tuple of the runs' modules (``attn_jax.decoding.beam_search``
      takes it as an ensemble) and whose ``members`` are the runs; ``note`` joins the runs' notes.

    Raises:
      TranslateError: no run, runs with different vocabularies (one line naming both), a copy model, or
        :func:`load_model`'s errors.
    """
    paths = [os.fspath(w) for w in workdirs]
    if not paths:
        raise TranslateError("an ensemble needs at least one run directory")
    if len(paths) == 1:
        return load_model(paths[0], checkpoint, weights)
    first = _vocab_files(paths[0])
    for path in paths[1:]:
        side = _vocab_difference(first, _vocab_files(path))
        if side:
            raise TranslateError(
                f"{paths[0]} and {path} have different {side} vocabularies (vocab/{side}): an ensemble needs "
                "the same vocabularies"
            )
    members = tuple(load_model(p, checkpoint, weights) for p in paths)
    for m in members:
        if getattr(getattr(m.model, "config", None), "copy", False):
            raise TranslateError(f"{m.workdir}: a copy model (model.copy) cannot join an ensemble")
    head = members[0]
    note = "; ".join(f"{m.workdir}: {m.note}" for m in members if m.note)
    return head._replace(model=tuple(m.model for m in members), note=note, members=members)


def _vocab_files(workdir: str) -> dict[str, dict[str, bytes]]:
    """The files of ``workdir/vocab/source`` and ``vocab/target``, by side and name (empty when absent:
    :func:`load_model` then names the problem)."""
    out: dict[str, dict[str, bytes]] = {}
    for side in ("source", "target"):
        directory = os.path.join(workdir, "vocab", side)
        files = {}
        if os.path.isdir(directory):
            for name in sorted(os.listdir(directory)):
                path = os.path.join(directory, name)
                if os.path.isfile(path):
                    with open(path, "rb") as f:
                        files[name] = f.read()
        out[side] = files
    return out


def _vocab_difference(a: dict[str, dict[str, bytes]], b: dict[str, dict[str, bytes]]) -> str | None:
    """The first side (``source`` or ``target``) whose vocabulary files differ, or None."""
    for side in ("source", "target"):
        if a[side] and b[side] and a[side] != b[side]:
            return side
    return None


def quiet_checkpoint_logs() -> None:
    """Silence orbax's read-only-directory warnings on stderr (a command's stderr carries only its own errors)."""
    try:
        from absl import logging as absl_logging
    except ImportError:  # pragma: no cover - absl comes with orbax
        return
    absl_logging.set_verbosity(absl_logging.ERROR)
