"""``attn-jax average``: average the parameters of a run's last N (or chosen) checkpoints into a run of its own.

    attn-jax average --workdir runs/X --last 5                 # -> runs/X/averaged-last-5
    attn-jax average --workdir runs/X --steps 1000,1500,2000 --output runs/X-avg
    attn-jax translate --workdir runs/X/averaged-last-5 --input test.en

The element-wise mean of the checkpoints' parameters (summed in float64, cast back to each parameter's dtype),
as OpenNMT-py's ``average_models`` and fairseq's ``average_checkpoints.py``. The output directory holds the run's
vocabularies and config (copied), one checkpoint at the newest averaged step, and ``averaged.json`` naming the
source run and steps; ``attn-jax translate`` and ``attn-jax evaluate`` take it as ``--workdir`` (with a warning
that it has no validation metrics, under the default ``--checkpoint best``). It holds parameters only: it cannot
be resumed. The source run is only read; the output is written to a temporary directory and renamed into place
when complete, and never overwrites an existing directory.

Exit status: 0 done; 1 a missing run or step, fewer than 2 checkpoints, checkpoints that differ in shape or
cannot be read, an existing output, a run another process trains (it holds ``WORKDIR/.lock``); 2 a bad flag.
"""

from __future__ import annotations

import argparse
import os

from attn_jax.cli._errors import error_line


def parse_steps(value: str) -> list[int]:
    """``1000,1500,2000`` -> ``[1000, 1500, 2000]`` (argparse type)."""
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated step numbers, got {value!r}")
    return [int(p) for p in parts]


def add_average_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``average`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_average`."""
    from attn_jax.cli._help import summary

    p = subparsers.add_parser(
        "average",
        help="average the parameters of a run's last N checkpoints into a run that translate/evaluate load",
        description=summary(__doc__),
        epilog=(
            "Writes OUTPUT/{vocab/, config.json, checkpoints/STEP/, averaged.json}; STEP is the newest averaged "
            "step. The average has no validation metrics: translate/evaluate warn under --checkpoint best "
            "(pass --checkpoint last). Exit status: 0 done, 1 missing run/step, mismatched or unreadable "
            "checkpoints or an existing output, 2 bad flag."
        ),
    )
    p.add_argument("--workdir", required=True, metavar="DIR", help="the training run's directory")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, metavar="N", help="the N newest kept checkpoints (N >= 2)")
    which.add_argument(
        "--steps", type=parse_steps, metavar="S1,S2,...", help="these checkpoint steps (at least 2)"
    )
    p.add_argument(
        "--output",
        default=None,
        metavar="DIR",
        help="the averaged run's directory, which must not exist (default: WORKDIR/averaged-last-N or "
        "WORKDIR/averaged-steps-S1-S2-...)",
    )
    p.set_defaults(func=run_average)
    return p


def _error(message: object, status: int = 1) -> int:
    return error_line("average", message, status)


def run_average(args: argparse.Namespace) -> int:
    """Run ``attn-jax average`` with parsed arguments; returns the exit status."""
    from attn_jax.pipeline import quiet_checkpoint_logs
    from attn_jax.train import (
        AverageError,
        RunLocked,
        average_checkpoints,
        check_average_output,
        last_steps,
        lock_run,
        write_averaged_run,
    )

    quiet_checkpoint_logs()
    workdir = args.workdir
    lock = None
    try:
        if os.path.isdir(workdir):  # a missing run is the averaging's own error
            # a run that trains may add or delete checkpoints meanwhile; the source run gets no new file
            lock = lock_run(workdir, "average", create=False)
        if args.last is not None:
            steps = last_steps(workdir, args.last)
            name = f"averaged-last-{args.last}"
        else:
            steps = args.steps
            name = "averaged-steps-" + "-".join(str(s) for s in args.steps)
        output = args.output if args.output is not None else os.path.join(workdir, name)
        check_average_output(workdir, output)  # before the (possibly long) averaging
        averaged = average_checkpoints(workdir, steps)
        write_averaged_run(workdir, output, averaged)
    except (AverageError, RunLocked) as e:
        return _error(e)
    finally:
        if lock is not None:
            lock.release()
    listed = ", ".join(str(s) for s in averaged.steps)
    print(
        f"averaged {len(averaged.steps)} checkpoints of {workdir} (steps {listed}) into {output} "
        f"(checkpoint step {averaged.steps[-1]}; attn-jax translate --workdir {output})"
    )
    return 0
