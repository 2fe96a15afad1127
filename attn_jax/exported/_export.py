"""Write a trained run's encoder and search as serialized StableHLO (``jax.export``) beside its weights.

The model code runs only here, at export time: :func:`export_run` traces the beam search and greedy decoding of
``attn_jax.decoding`` once per padded source width, with a symbolic batch, and :func:`attn_jax.exported.load`
runs them later with jax and numpy alone.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from attn_jax.exported._load import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MODES,
    WEIGHTS_FILE,
    ExportError,
    _one_line,
    _sha256,
    padded_width,
)

__all__ = ["PLATFORMS", "export_run"]

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # what jax.export can lower for


def _source_widths(max_source_tokens: int) -> list[int]:
    """The padded widths (16, 32, ...) that hold every source of up to ``max_source_tokens`` tokens and ``</s>``."""
    widths, width = [], padded_width(1)
    while width <= padded_width(max_source_tokens + 1):
        widths.append(width)
        width *= 2
    return widths


def _check_options(
    beam_size, alpha, beta, platforms, max_source_length, batch_size, no_repeat_ngram, min_length
):
    """Raise a one-line ExportError for an option out of range."""
    for name, value in (("beam size", beam_size), ("batch size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ExportError(f"{name} must be an int >= 1, got {value!r}")
    for name, value in (("no_repeat_ngram", no_repeat_ngram), ("min_length", min_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ExportError(f"{name} must be an int >= 0, got {value!r}")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ExportError(f"{name} must be a finite number >= 0, got {value!r}")
    if max_source_length is not None and (not isinstance(max_source_length, int) or max_source_length < 1):
        raise ExportError(f"max source length must be an int >= 1, got {max_source_length!r}")
    unknown = [p for p in platforms if p not in PLATFORMS]
    if not platforms or unknown or len(set(platforms)) != len(platforms):
        raise ExportError(
            f"platforms must be distinct names among {', '.join(PLATFORMS)}, got {', '.join(platforms) or 'none'}"
        )


def _search_function(graphdef, treedef, *, length, beam_size, alpha, beta, no_repeat_ngram, min_length):
    """``(params, src, src_mask, limits) -> (tokens, lengths, scores, truncated)``: the jitted search of
    ``attn_jax.decoding.beam_search`` with the model's weights as arguments and the options fixed."""
    import jax
    import jax.numpy as jnp

    from attn_jax.decoding._beam import _search_jit

    def search(params, src, src_mask, limits):
        state = jax.tree.unflatten(treedef, params)
        out = _search_jit(
            (graphdef,),
            (state,),
            src,
            src_mask,
            jnp.clip(limits, 1, length),
            jnp.float32(alpha),
            jnp.float32(beta),
            None,
            beam_size=beam_size,
            num_return=1,
            length=length,
            bos_id=1,
            eos_id=2,
            pad_id=0,
            no_repeat_ngram=no_repeat_ngram,
            min_length=min_length,
        )
        if out.attention is None and beta > 0:
            raise ExportError(
                "beta > 0 (the coverage penalty) needs attention weights, but the model has none"
            )
        return out.tokens, out.lengths, out.scores, out.truncated

    return jax.jit(search)


def export_run(
    workdir: str | os.PathLike,
    output: str | os.PathLike,
    *,
    checkpoint: str | int = "best",
    weights: str = "raw",
    beam_size: int = 12,
    alpha: float = 0.6,
    beta: float = 0.0,
    max_length: int | None = None,
    max_length_ratio: float | None = None,
    max_length_offset: int | None = None,
    max_source_length: int | None = None,
    platforms: Sequence[str] = ("cpu",),
    batch_size: int = 32,
    no_repeat_ngram: int = 0,
    min_length: int = 0,
    modes: Sequence[str] = MODES,
) -> dict[str, Any]:
    """Export a run's encoder with beam search and greedy decoding as StableHLO, with weights and vocabularies.

    One function per mode (``beam``, ``greedy``) and padded source width (16, 32, ... up to the width of
    ``max_source_length`` tokens), each with a symbolic batch size. The search's output width is static and
    grows with the source width (the length limit), so each width keeps its own, as in ``attn-jax
    translate``'s compiled searches; one function with a symbolic width would carry the longest buffers. The weights are
    arguments, stored once in ``weights.npz``, not constants in each function. ``output`` gets
    ``manifest.json``, ``weights.npz``, ``<mode>_<width>.jaxexport`` and ``vocab/{source,target}``.

    Args:
      workdir: the run directory.
      output: the export directory to create (absent or empty).
      checkpoint, weights: which checkpoint and parameters, as ``attn_jax.pipeline.load_model``.
      beam_size, alpha, beta: the beam search's options, fixed in the export (greedy: 1, 0, 0).
      max_length, max_length_ratio, max_length_offset: the length limit, as ``attn-jax translate``'s flags
        (``attn_jax.pipeline.length_limit``); None: the run's default.
      max_source_length: the longest source (tokens) the export takes; None: the run's
        ``data.max_source_length``.
      platforms: what to lower for, among ``cpu``, ``cuda``, ``rocm`` and ``tpu``.
      batch_size: sentences per batch the loader uses by default (``attn-jax translate``'s ``--batch-size``).
      no_repeat_ngram, min_length: repetition control, as ``beam_search``'s (0: off).
      modes: which searches to export, ``beam`` and/or ``greedy``.

    Returns:
      The manifest written.

    Raises:
      ExportError: in one line: a run that cannot be loaded, an option out of range, a model the export does
        not support (source copying), a function that does not lower for a platform, or an output directory
        that exists and is not empty.
    """
    import jax

    from attn_jax.pipeline import TranslateError, length_limit, load_model, model_length_cap

    platforms, modes = tuple(platforms), tuple(modes)
    if not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
        raise ExportError(f"modes must be distinct names among {', '.join(MODES)}, got {modes!r}")
    _check_options(
        beam_size, alpha, beta, platforms, max_source_length, batch_size, no_repeat_ngram, min_length
    )
    output = os.fspath(output)
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise ExportError(f"{output}: exists and is not an empty directory (give a new one)")
    try:
        loaded = load_model(workdir, checkpoint, weights)
        rule = length_limit(
            loaded.config,
            max_length=max_length,
            max_length_ratio=max_length_ratio,
            max_length_offset=max_length_offset,
        )
    except (TranslateError, ValueError) as e:
        raise ExportError(_one_line(e)) from None
    config = loaded.config
    if config.model.get("copy", False):
        raise ExportError(
            f"{loaded.workdir}: a model that copies source words (model.copy) cannot be exported"
        )
    if max_source_length is None:
        max_source_length = int(config.data.get("max_source_length") or 0)
        if max_source_length < 1:
            raise ExportError(
                f"{loaded.workdir}: the run sets no data.max_source_length; give --max-source-length"
            )
    cap = model_length_cap(loaded.model)
    widths = _source_widths(max_source_length)

    from flax import nnx

    graphdef, state = nnx.split(loaded.model)
    leaves, treedef = jax.tree.flatten(state)
    (batch,) = jax.export.symbolic_shape("b")
    param_specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves]
    options = {"beam": (beam_size, alpha, beta), "greedy": (1, 0.0, 0.0)}
    blobs, functions = {}, {mode: {} for mode in modes}
    for mode in modes:
        k, a, b = options[mode]
        for width in widths:
            length = rule.tokens(width - 1) + 1  # the static output width of this source width
            length = min(length, cap) if cap else length
            fn = _search_function(
                graphdef,
                treedef,
                length=length,
                beam_size=k,
                alpha=a,
                beta=b,
                no_repeat_ngram=no_repeat_ngram,
                min_length=min_length,
            )
            specs = (
                param_specs,
                jax.ShapeDtypeStruct((batch, width), np.int32),
                jax.ShapeDtypeStruct((batch, width), np.bool_),
                jax.ShapeDtypeStruct((batch,), np.int32),
            )
            try:
                exported = jax.export.export(fn, platforms=platforms)(*specs)
            except ExportError:
                raise
            except Exception as e:  # noqa: BLE001 - a lowering failure of any kind is reported in one line
                raise ExportError(
                    f"the {mode} search at source width {width} does not export for {', '.join(platforms)}: "
                    f"{type(e).__name__}: {_one_line(e)}"
                ) from None
            name = f"{mode}_{width}.jaxexport"
            blobs[name] = exported.serialize()
            functions[mode][str(width)] = {"file": name, "output_length": length}

    tmp = f"{output.rstrip(os.sep)}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        for name, blob in blobs.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(blob)
        np.savez(
            os.path.join(tmp, WEIGHTS_FILE), **{f"p{i:05d}": np.asarray(x) for i, x in enumerate(leaves)}
        )
        shutil.copytree(os.path.join(loaded.workdir, "vocab"), os.path.join(tmp, "vocab"))
        files = {}
        for root, _, names in os.walk(tmp):
            for n in sorted(names):
                path = os.path.join(root, n)
                files[os.path.relpath(path, tmp)] = _sha256(path)
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "jax_version": jax.__version__,
            "platforms": list(platforms),
            "run": {
                "workdir": os.path.abspath(loaded.workdir),
                "step": loaded.step,
                "checkpoint": checkpoint,
                "weights": loaded.weights,
                "arch": config.model.get("arch"),
                "note": loaded.note,  # another checkpoint than the one asked for, and why ("" if none)
            },
            "dtype": {
                "params": sorted({str(x.dtype) for x in leaves}),
                "compute": "bfloat16" if config.get("mixed_precision", False) else "float32",
            },
            "batch": "symbolic: any number of rows",
            "source_widths": widths,
            "functions": functions,
            "inputs": "weights (the arrays of weights.npz, in order), src int32 [b, W] (ids then </s>, then "
            "<pad>), src_mask bool [b, W], limits int32 [b] (tokens with </s>)",
            "outputs": "tokens int32 [b, 1, L], lengths int32 [b, 1] (with </s>), scores float32 [b, 1], "
            "truncated bool [b, 1]",
            "decoding": {
                "beam_size": beam_size,
                "alpha": float(alpha),
                "beta": float(beta),
                "no_repeat_ngram": no_repeat_ngram,
                "min_length": min_length,
                "batch_size": batch_size,
                "greedy": "beam_size 1, alpha 0, beta 0",
            },
            "length_limit": {
                "minimum": rule.minimum,
                "ratio": rule.ratio,
                "offset": rule.offset,
                "rule": rule.describe(),
                "model_cap": None if not cap else cap - 1,
            },
            "tokens": {"pad": 0, "bos": 1, "eos": 2, "unk": 3},
            "vocab": {"source": "vocab/source", "target": "vocab/target"},
            "weights": {
                "file": WEIGHTS_FILE,
                "arrays": len(leaves),
                "parameters": int(sum(np.size(x) for x in leaves)),
            },
            "files": files,
        }
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
        if os.path.isdir(output):
            os.rmdir(output)  # empty, checked above
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        os.replace(tmp, output)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"{output}: cannot write ({e.strerror or _one_line(e)})") from None
    return manifest
