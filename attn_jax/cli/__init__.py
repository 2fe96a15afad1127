"""The ``attn-jax`` command: one argparse subcommand per task (``data``, ``train``, ``translate``, ``evaluate``, ``score``, ``average``, ``export``, ``import-hf``, ``serve``, ``report``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from attn_jax._extras import missing_extra
from attn_jax.cli._average import add_average_parser
from attn_jax.cli._data import add_data_parser
from attn_jax.cli._evaluate import add_evaluate_parser
from attn_jax.cli._export import add_export_parser
from attn_jax.cli._import_hf import add_import_hf_parser
from attn_jax.cli._noise import add_verbose_flag, debug_log_path, route_library_noise
from attn_jax.cli._report import add_report_parser
from attn_jax.cli._score import add_score_parser
from attn_jax.cli._serve import add_serve_parser
from attn_jax.cli._train import add_train_parser
from attn_jax.cli._translate import add_translate_parser


def version_line() -> str:
    """``attn-jax 0.1.0 (jax 0.10.2, flax 0.12.8)``: the installed versions, read from package metadata."""
    from importlib import metadata

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            if name == "attn-jax":  # run from a source tree that was never installed
                from attn_jax import __version__

                return __version__
            return "not installed"

    return f"attn-jax {installed('attn-jax')} (jax {installed('jax')}, flax {installed('flax')})"


class _VersionAction(argparse.Action):
    """``--version``: like argparse's own, but reads the versions only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    """The ``attn-jax`` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="attn-jax", description="Attention for neural machine translation in JAX."
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print the versions of attn-jax, jax and flax, and exit"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_data_parser(subparsers)
    add_train_parser(subparsers)
    readers = (
        add_translate_parser,
        add_evaluate_parser,
        add_score_parser,
        add_average_parser,
        add_export_parser,
        add_import_hf_parser,
    )
    for add_reader in readers:
        add_verbose_flag(add_reader(subparsers))
    # A server keeps the libraries' reports (uvicorn's, asyncio's) on stderr, where its operator reads them.
    add_serve_parser(subparsers)
    add_report_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``attn-jax``; returns the exit status."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # a multi-process train re-runs itself as its worker (attn_jax/cli/_supervise.py)
    undo = None
    if getattr(args, "library_noise", False) and not args.verbose:
        # An ensemble's first run keeps the log (``--workdir`` repeats for translate, evaluate and score).
        workdir = args.workdir[0] if isinstance(args.workdir, list) else args.workdir
        path = debug_log_path(workdir, args.command)
        undo = route_library_noise(workdir, args.command, path=path)
    try:
        return args.func(args)
    except ModuleNotFoundError as e:  # an optional package the subcommand imports on its way
        message = missing_extra(e)
        if message is None:
            raise
        print(f"attn-jax {args.command}: error: needs {message}", file=sys.stderr)
        return 1
    finally:
        if undo is not None and not from_command_line:
            undo()  # a call from Python gets its hooks back; a command keeps them for the reports at exit


if __name__ == "__main__":
    raise SystemExit(main())
