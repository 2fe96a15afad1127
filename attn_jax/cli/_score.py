"""``attn-jax score``: the log-probability a trained run gives each given translation (teacher forcing).

    attn-jax score --workdir runs/rnnsearch_cpu --src test.en --tgt test.fr --out scores.txt

Input: two files with one sentence a line, tokenised as the training corpus; line ``k`` of ``--tgt`` is scored as
a translation of line ``k`` of ``--src``. Output: one line per pair, ``total<TAB>per_token``: ``total`` is
``log P(target | source)`` summed over the target tokens and ``</s>``, and ``per_token`` is ``total`` divided by
that count (target tokens + 1). Both are natural logarithms; the trainer's loss on the pair is ``-total``.
Pairs longer than the model can read are refused, never truncated.

Exit status: 0 done; 1 a missing run, checkpoint or file, files of different line counts, or a pair too long
(one line on stderr); 2 a bad flag.
"""

from __future__ import annotations

import argparse
import sys

from attn_jax.cli._errors import error_line
from attn_jax.pipeline import TranslateError, load_ensemble, quiet_checkpoint_logs, score_pairs


def add_score_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``score`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_score`."""
    from attn_jax.cli._help import summary
    from attn_jax.cli._translate import parse_checkpoint

    p = subparsers.add_parser(
        "score",
        help="score given translations: log-probability of each target line given its source line",
        description=summary(__doc__),
        epilog=(
            "Output: one line per pair, 'total<TAB>per_token': total = log P(target | source), natural log, "
            "summed over the target tokens and </s>; per_token = total / (target tokens + 1). Exit status: "
            "0 done, 1 missing run/file, different line counts or a pair too long, 2 bad flag."
        ),
    )
    from attn_jax.cli._options import add_workdir_flag

    add_workdir_flag(p)
    p.add_argument("--src", required=True, metavar="FILE", help="source sentences, one a line")
    p.add_argument(
        "--tgt", required=True, metavar="FILE", help="target sentences, one a line, as many as --src"
    )
    p.add_argument(
        "--checkpoint",
        type=parse_checkpoint,
        default="best",
        metavar="best|last|STEP",
        help="which checkpoint (default: %(default)s, as in translate)",
    )
    p.add_argument("--out", default="-", metavar="FILE", help="where to write ('-': stdout, the default)")
    p.add_argument(
        "--batch-size", type=int, default=32, metavar="N", help="pairs per batch (default: %(default)s)"
    )
    p.set_defaults(func=run_score)
    return p


def _error(message: object, status: int = 1) -> int:
    return error_line("score", message, status)


def run_score(args: argparse.Namespace) -> int:
    """Run ``attn-jax score`` with parsed arguments; returns the exit status."""
    from attn_jax.cli._translate import _read_lines

    if args.batch_size < 1:
        return _error(f"--batch-size must be >= 1, got {args.batch_size}", 2)
    checkpoint = args.checkpoint
    try:
        sources, targets = _read_lines(args.src), _read_lines(args.tgt)
        if len(sources) != len(targets):
            raise TranslateError(
                f"{args.src} has {len(sources)} lines but {args.tgt} has {len(targets)}; "
                "line k of each must form pair k"
            )
        quiet_checkpoint_logs()
        loaded = load_ensemble(args.workdir, checkpoint)
        if loaded.note:
            print(f"attn-jax score: warning: {loaded.note}", file=sys.stderr)
        scores = score_pairs(loaded, sources, targets, batch_size=args.batch_size)
    except TranslateError as e:
        return _error(e)
    unk = sum(1 for s in scores if s.target_unk)
    if unk:  # never silent: an unknown target word is scored as <unk>, which flatters the score
        print(
            f"attn-jax score: warning: {unk} of {len(scores)} targets have words outside the target vocabulary, "
            "scored as <unk>",
            file=sys.stderr,
        )
    text = "".join(f"{s.total:.6f}\t{s.per_token:.6f}\n" for s in scores)
    try:
        if args.out == "-":
            sys.stdout.write(text)
        else:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(text)
    except OSError as e:
        return _error(f"{args.out}: {e.strerror or e}")
    return 0
