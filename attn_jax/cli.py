"""The ``attn-jax`` command: one argparse subcommand per task (``data`` so far)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from attn_jax.cli_data import add_data_parser
from attn_jax.cli_evaluate import add_evaluate_parser
from attn_jax.cli_train import add_train_parser
from attn_jax.cli_translate import add_translate_parser


def build_parser() -> argparse.ArgumentParser:
    """The ``attn-jax`` parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="attn-jax", description="Attention for neural machine translation in JAX."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_data_parser(subparsers)
    add_train_parser(subparsers)
    add_translate_parser(subparsers)
    add_evaluate_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``attn-jax``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # a multi-process train re-runs itself as its worker (attn_jax/cli_supervise.py)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
