"""``attn-jax export``: write a trained run's encoder and search as StableHLO, for use without the model code.

    attn-jax export --workdir runs/rnnsearch_cpu --output exports/rnnsearch
    attn-jax export --workdir runs/X --output exports/X --platforms cpu,cuda,tpu --beam 4 --alpha 0.6

The export holds the beam search and greedy decoding, one function per padded source width (16, 32, ... up to
``--max-source-length``) with any batch size, the weights as arrays and the run's vocabularies.
``attn_jax.exported.load(DIR).translate(lines)`` runs it with jax and numpy alone; its translations equal
``attn-jax translate``'s with the same options. docs/export.md describes the files and the manifest.

Exit status: 0 done; 1 a run that cannot be loaded, a model that cannot be exported, an output that exists;
2 a bad flag.
"""

from __future__ import annotations

import argparse
import math
import sys

from attn_jax.cli._errors import error_line
from attn_jax.cli._translate import add_length_limit_flags, add_repetition_flags, parse_checkpoint
from attn_jax.pipeline import WEIGHTS

__all__ = ["add_export_parser", "run_export"]


def _platforms(value: str) -> tuple[str, ...] | str:
    """The comma-separated ``--platforms``, or what is wrong with it in one line."""
    from attn_jax.exported import PLATFORMS

    names = tuple(p.strip() for p in value.split(",") if p.strip())
    bad = [p for p in names if p not in PLATFORMS]
    if not names or bad or len(set(names)) != len(names):
        return f"--platforms must be distinct names among {','.join(PLATFORMS)}, got {value!r}"
    return names


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_export`."""
    from attn_jax.cli._help import summary

    p = subparsers.add_parser(
        "export",
        help="write a trained run's beam search as serialized StableHLO (jax.export), weights and vocabularies",
        description=summary(__doc__),
        epilog="Load it with attn_jax.exported.load(DIR).translate(lines). Exit status: 0 done, 1 run or "
        "export problem, 2 bad flag.",
    )
    p.add_argument("--workdir", required=True, metavar="DIR", help="the training run's directory")
    p.add_argument(
        "--output", required=True, metavar="DIR", help="the export directory to create (new or empty)"
    )
    p.add_argument(
        "--checkpoint",
        type=parse_checkpoint,
        default="best",
        metavar="best|last|STEP",
        help="which checkpoint (default: %(default)s, as in translate)",
    )
    p.add_argument(
        "--weights", choices=WEIGHTS, default="raw", help="raw or ema parameters (as in translate)"
    )
    p.add_argument("--beam", type=int, default=12, metavar="K", help="beam size (default: %(default)s)")
    p.add_argument(
        "--alpha", type=float, default=0.6, help="length-normalisation weight α (default: %(default)s)"
    )
    p.add_argument("--beta", type=float, default=0.0, help="coverage-penalty weight β (default: %(default)s)")
    add_repetition_flags(p)
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        metavar="N",
        help="sentences per batch when loaded (default: %(default)s)",
    )
    p.add_argument(
        "--max-source-length",
        type=int,
        default=None,
        metavar="N",
        help="the longest source (tokens) the export takes (default: the run's data.max_source_length)",
    )
    p.add_argument(
        "--platforms",
        default="cpu",
        metavar="P[,P...]",
        help="lower for these, among cpu, cuda, rocm and tpu (default: cpu)",
    )
    add_length_limit_flags(p)
    p.set_defaults(func=run_export)
    return p


def _error(message: object, status: int = 1) -> int:
    return error_line("export", message, status)


def run_export(args: argparse.Namespace) -> int:
    """Run ``attn-jax export`` with parsed arguments; returns the exit status."""
    from attn_jax.cli._options import flag_worded
    from attn_jax.exported import ExportError, export_run
    from attn_jax.pipeline import length_limit, quiet_checkpoint_logs

    for flag, value in (("--beam", args.beam), ("--batch-size", args.batch_size)):
        if value < 1:
            return _error(f"{flag} must be >= 1, got {value}", 2)
    if args.max_source_length is not None and args.max_source_length < 1:
        return _error(f"--max-source-length must be >= 1, got {args.max_source_length}", 2)
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if not (math.isfinite(value) and value >= 0):
            return _error(f"{flag} must be a finite number >= 0, got {value}", 2)
    platforms = _platforms(args.platforms)
    if isinstance(platforms, str):
        return _error(platforms, 2)
    try:  # the length flags alone, before the run is read
        length_limit(
            None,
            max_length=args.max_length,
            max_length_ratio=args.max_length_ratio,
            max_length_offset=args.max_length_offset,
        )
    except ValueError as e:
        return _error(flag_worded(str(e)), 2)
    quiet_checkpoint_logs()
    try:
        manifest = export_run(
            args.workdir,
            args.output,
            checkpoint=args.checkpoint,
            weights=args.weights,
            beam_size=args.beam,
            alpha=args.alpha,
            beta=args.beta,
            max_length=args.max_length,
            max_length_ratio=args.max_length_ratio,
            max_length_offset=args.max_length_offset,
            max_source_length=args.max_source_length,
            platforms=platforms,
            batch_size=args.batch_size,
            no_repeat_ngram=args.no_repeat_ngram,
            min_length=args.min_length,
        )
    except (ExportError, ValueError) as e:
        return _error(e)
    if manifest["run"]["note"]:
        print(f"attn-jax export: warning: {manifest['run']['note']}", file=sys.stderr)
    widths = manifest["source_widths"]
    print(
        f"exported {manifest['run']['workdir']} step {manifest['run']['step']} to {args.output}: beam "
        f"{args.beam} and greedy, source widths {widths[0]}-{widths[-1]} (up to {widths[-1] - 1} tokens), "
        f"any batch size, for {','.join(manifest['platforms'])}"
    )
    return 0
