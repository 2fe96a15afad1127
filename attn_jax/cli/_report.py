"""``attn-jax report``: one HTML page comparing evaluated systems, to open offline in a browser.

    attn-jax evaluate --workdir runs/rnnsearch_cpu --save-attention
    attn-jax evaluate --workdir runs/transformer_cpu --save-attention
    attn-jax report runs/rnnsearch_cpu runs/transformer_cpu --out runs/report

Each RUN is an ``attn-jax evaluate`` output directory, or a run directory whose ``eval/SPLIT`` is one; all
were evaluated on the same sentences. The page, ``DIR/report.html``, holds BLEU, chrF and TER overall and by
source length, sacreBLEU's paired bootstrap test between every two systems, a sortable sentence table that
filters by length and by "A better or worse than B", and per sentence an attention heatmap of every decoder
layer and head (from ``attention.npz``, which ``evaluate --save-attention`` writes). The user guide's
evaluation page (``docs/evaluation.md``) describes it.

Exit status: 0 done; 1 a missing evaluation or runs evaluated on different sentences; 2 a bad flag.
"""

from __future__ import annotations

import argparse
import os

from attn_jax.cli._errors import error_line

__all__ = ["add_report_parser", "run_report"]


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``report`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_report`."""
    from attn_jax.cli._help import summary

    p = subparsers.add_parser(
        "report",
        help="an offline HTML page comparing evaluated runs: scores, significance, sentences, attention",
        description=summary(__doc__),
        epilog="Writes DIR/report.html. Exit status: 0 done, 1 missing evaluation or different sentences, "
        "2 bad flag.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="evaluate output directories (or run directories)")
    p.add_argument("--out", required=True, metavar="DIR", help="where report.html goes")
    p.add_argument(
        "--split", default="test", help="a run directory's eval/SPLIT to read (default: %(default)s)"
    )
    p.add_argument("--title", default=None, help="the page's title (default: the systems, corpus and split)")
    p.add_argument(
        "--bootstrap-samples",
        type=int,
        default=1000,
        metavar="N",
        help="paired bootstrap resamples (default: %(default)s, sacreBLEU's)",
    )
    p.set_defaults(func=run_report)
    return p


def run_report(args: argparse.Namespace) -> int:
    """Run ``attn-jax report`` with parsed arguments; returns the exit status."""
    from attn_jax.eval import read_evaluated_run, write_report_html

    if args.bootstrap_samples < 1:
        return error_line("report", f"--bootstrap-samples must be >= 1, got {args.bootstrap_samples}", 2)
    try:
        runs = [read_evaluated_run(r, args.split) for r in args.runs]
        r = write_report_html(
            runs,
            os.path.join(args.out, "report.html"),
            title=args.title,
            bootstrap_samples=args.bootstrap_samples,
        )
    except (OSError, ValueError) as e:
        return error_line("report", e)
    without = [run.system for run in runs if run.attention is None]
    print(f"{r['path']}: {len(r['systems'])} systems, {r['sentences']} sentences, {r['bytes'] / 1e6:.1f} MB")
    if without:  # never silent: the page says it too
        print(f"no attention.npz for {', '.join(without)} (evaluate with --save-attention): no heatmaps")
    return 0
