"""``attn-jax train``: train a model from a config file, with checkpoints, metrics and exact resumption.

    attn-jax train --config configs/rnnsearch_cpu.py --workdir runs/rnnsearch_cpu
    attn-jax train --config configs/rnnsearch_cpu.py:smoke --workdir /tmp/smoke          # a seconds-long variant
    attn-jax train --config configs/rnnsearch50.py --workdir runs/rnnsearch50 --config.data.batch_size=40
    attn-jax train --config configs/rnnsearch50.py --workdir runs/rnnsearch50 --resume   # after a crash/kill
    attn-jax train --config configs/rnnsearch50.py --workdir runs/r50 --config.parallel.strategy=data  # all devices

Your own plain-text corpus (one sentence a line, line-aligned; ``{split}`` stands for the split name)::

    attn-jax train --config configs/rnnsearch_cpu.py --workdir runs/mine --config.data.corpus=plain
        --config.data.source_path='data/{split}.en' --config.data.target_path='data/{split}.fr'    # one command

reads ``data/train.*`` and, for validation, ``data/validation.*`` or else ``data/valid.*`` or ``data/dev.*``
(one line names the files used; an error if both ``valid`` and ``dev`` exist: set ``--config.data.eval_split``).
``--config.data.eval_split=none`` trains without validation (the best checkpoint is then the latest). At start-up
one line per split says which files it read, how many pairs were kept, and how many were dropped for each reason
(source over ``data.max_source_length``, target over ``data.max_target_length``, both, an empty side, beyond
``data.max_train_examples``/``max_eval_examples``); ``WORKDIR/data.json`` holds the same counts.
``attn-jax data --src 'data/{split}.en' --tgt 'data/{split}.fr'`` shows the corpus' statistics first.

Several processes (hosts) train one model together: start the same command on each, with the address of process
0 and each process's index (``--coordinator HOST:PORT --num-processes N --process-id I``), the workdir on a
filesystem all of them see, and a ``parallel.strategy`` other than ``none``; under Slurm (``srun``), ``mpirun``
or a multi-host TPU slice the three flags are detected. Restart every process with ``--resume`` after a failure.

With the three flags, each process first says ``waiting up to T s (--distributed-timeout) for all N processes to
join at HOST:PORT`` and the processes meet in a roll call on that port; one missing after ``--distributed-timeout``
seconds is named (``process 0 waited T s at HOST:PORT for process 1 of 2, which never joined ...``; a process
other than 0: ``process 1 could not reach process 0 (the coordinator) at HOST:PORT within T s ...``). During the
run a process that is killed or crashes is named by the others at once (``process 1 of 2 stopped without a
goodbye (killed or crashed) in the run coordinated at HOST:PORT; process 0 stops too; ...``, or ``process 0 (the
coordinator, HOST:PORT) stopped without a goodbye ...``), one that hangs after ``--heartbeat-timeout`` seconds
(``process 1 of 2 sent no heartbeat for S s ...``), and one that ends with an error by its exit status (``process
1 of 2 left with exit status 3 ...``): every survivor prints that one line and exits with 4. To keep the JAX
runtime's own reaction (``SIGABRT`` and a C++ stack trace) off the terminal, such a process runs the trainer as
a child of itself and relays its output (``attn_jax/cli/_supervise.py``). Under a cluster launcher the launcher
handles lost tasks instead.

Every config field can be overridden with ``--config.<key>=<value>`` (or ``--config.<key> <value>``); the value
is parsed as the field's type (``true``/``false`` for booleans, ``16,32`` for tuples). ``--print-config`` prints
the resulting config, one ``KEY=VALUE`` a line for every key, and exits without training; ``--help-config``
also prints each key's meaning below it, read from the code that defines the key. The workdir receives
``checkpoints/``, ``vocab/``, ``metrics.jsonl``, ``tensorboard/`` and ``config.json``.

Exit status (every failure is one line on stderr, no traceback): 0 done; 1 the corpus cannot be read, the
workdir cannot be created or written (a file in its place or in its path, read-only, no permission), a
checkpoint cannot be written (a full disk: the failed save is reported as soon as it fails, the last good
checkpoint is left intact), no checkpoint can be read on ``--resume``, or the machine ran out of memory; 2 a bad
flag, config file (including one whose ``get_config`` raises), key or value, found before anything is trained;
3 training diverged (NaN/inf loss; nothing saved after the last good checkpoint); 4 the processes of a
multi-process run could not join (a process missing after ``--distributed-timeout``, named) or another process
was lost (killed, crashed, hung, or ended with an error; named); 75 stopped by SIGTERM or SIGINT after saving
the step in flight (requeue and continue with ``--resume``); 130 interrupted by a second Ctrl-C (the last
checkpoint intact); ``128 + N`` this process of a multi-process run was killed by signal N (e.g. 137:
``SIGKILL``, out of memory).

``--resume`` restores the newest checkpoint that can be read. A newer one that cannot (a truncated or deleted
file) is moved to ``<workdir>/damaged-checkpoints/<step>`` (kept, never deleted, so the resumed run's own saves
cannot collide with it) and a warning line names it, the reason and the step resumed from.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import re
import sys

from attn_jax.cli._errors import error_line

_PREFIX = "--config."


def _split_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Separate ``--config.key=value`` / ``--config.key value`` items (as ``key=value``) from the rest."""
    overrides, rest = [], []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(_PREFIX):
            if "=" in arg:
                overrides.append(arg[len(_PREFIX) :])
            elif i + 1 < len(args):
                overrides.append(f"{arg[len(_PREFIX) :]}={args[i + 1]}")
                i += 1
            else:
                overrides.append(arg[len(_PREFIX) :])  # no value: reported by apply_overrides
        else:
            rest.append(arg)
        i += 1
    return overrides, rest


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``train`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_train`."""
    from attn_jax.cli._help import summary

    p = subparsers.add_parser(
        "train",
        help="train a model from a config file (checkpoints, metrics, --resume)",
        description=summary(__doc__),
        epilog=(
            "Config overrides: --config.KEY=VALUE for any field of the config (e.g. --config.model.hidden=256 "
            "--config.optimizer.name=adam --config.data.bucket_boundaries=16,32); --print-config lists every "
            "key with its value, --help-config also its meaning. A config file is PATH.py or PATH.py:VARIANT (e.g. "
            ":smoke). Set JAX_COMPILATION_CACHE_DIR to reuse compiled steps across runs. Exit status: 0 done, "
            "1 corpus, workdir, checkpoint or memory error, 2 bad flag/config, 3 diverged (NaN/inf), "
            "4 multi-process failure (a process missing or lost: named), 75 stopped by SIGTERM/SIGINT after "
            "saving (requeue with --resume), 130 interrupted."
        ),
    )
    p.add_argument(
        "--config",
        required=True,
        metavar="FILE[:VARIANT]",
        help="config file defining get_config(), e.g. configs/rnnsearch_cpu.py",
    )
    p.add_argument(
        "--workdir", metavar="DIR", help="run directory: checkpoints, vocab, metrics (required to train)"
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the config after the --config.KEY=VALUE overrides, every key as KEY=VALUE (each line a valid "
        "override), and exit without training",
    )
    p.add_argument(
        "--help-config",
        action="store_true",
        help="print every key of the config after the overrides: KEY=VALUE, then its meaning from the code "
        "that defines it; exit without training",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --workdir (bit-for-bit as if never interrupted)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the libraries' own reports of a failure (background tracebacks, un-awaited coroutines) on "
        "stderr instead of WORKDIR/debug.log",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "lines"),
        default="auto",
        help="progress bar (a terminal) or plain log lines (default: %(default)s = bar on a terminal)",
    )
    group = p.add_argument_group(
        "multi-process runs",
        "the same command on every process; needs --config.parallel.strategy other than none",
    )
    group.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="address of process 0 (it listens on PORT on every interface)",
    )
    group.add_argument("--num-processes", type=int, metavar="N", help="number of processes in the run")
    group.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 .. N-1")
    group.add_argument(
        "--distributed-timeout",
        type=int,
        default=300,
        metavar="SECONDS",
        help="how long to wait for every process to join; a missing one is then named and this process exits "
        "with 4 (default: %(default)s)",
    )
    group.add_argument(
        "--heartbeat-timeout",
        type=int,
        default=60,
        metavar="SECONDS",
        help="a process silent this long (hung) is declared lost and the others exit with 4; a killed one is "
        "noticed at once (default: %(default)s)",
    )
    p.set_defaults(func=run_train, overrides=[])
    accept_config_overrides(p)
    return p


def accept_config_overrides(p: argparse.ArgumentParser) -> None:
    """Let subcommand ``p`` take ``--config.KEY=VALUE`` overrides into ``args.overrides``.

    argparse cannot declare "any --config.<key>" option, so they are taken out before parsing.
    """
    parse_known_args = p.parse_known_args

    def parse_with_overrides(args=None, namespace=None):
        overrides, rest = _split_overrides(list(sys.argv[1:] if args is None else args))
        ns, extras = parse_known_args(rest, namespace)
        ns.overrides = overrides
        return ns, extras

    p.parse_known_args = parse_with_overrides


def _error(message: str, status: int) -> int:
    from attn_jax.parallel import leaving

    leaving(status)  # first: in a multi-process run the others then report this process, not the reverse
    return error_line("train", message, status)


def _peer_lost(message: str) -> None:
    """A multi-process run's watch found a peer gone (from a background thread): one line, exit 4 at once."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    print(
        f"attn-jax train: error: {message}; restart every process with --resume", file=sys.stderr, flush=True
    )
    os._exit(4)  # not sys.exit: the JAX runtime's exit barrier would wait for the lost peer, then abort


# How the XLA runtime words a failed operation (a collective whose peer is gone raises ValueError, not
# JaxRuntimeError: "UNKNOWN: Gloo all-reduce failed: ... Connection reset by peer").
_RUNTIME_STATUS = re.compile(r"[A-Z][A-Z_]+: ")


class _NotOrbaxNoise(logging.Filter):
    """Drops orbax's ERROR records and asyncio's "exception was never retrieved" ones (a traceback per background
    thread or array when a save or restore fails): every orbax failure reaches the trainer as an exception,
    reported in one line with its exit status."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname:
            return False
        return "exception was never retrieved" not in record.getMessage()


@contextlib.contextmanager
def _orbax_noise_quieted():
    """While training, keep the tracebacks orbax and TensorStore print when a checkpoint write fails (a full
    disk) off stderr; the failure itself is raised and reported in one line."""
    quiet = _NotOrbaxNoise()
    loggers = [logging.getLogger("absl"), logging.getLogger("asyncio")]
    for logger in loggers:
        logger.addFilter(quiet)
    previous = sys.unraisablehook

    def unraisable(u):  # TensorStore callbacks into orbax's event loop after it closed on the failed write
        if not (isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"):
            previous(u)

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        gc.collect()  # the failed write's tasks report "never retrieved" when collected: while the filter is on
        sys.unraisablehook = previous
        for logger in loggers:
            logger.removeFilter(quiet)


def _override_text(value) -> str:
    """A config value as ``--config.KEY=VALUE`` parses it back (``apply_overrides``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(_override_text(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


# reST markup in the help text: ``code`` and :class:`~a.b.Name` roles, printed as code and Name.
_ROLE = re.compile(r":\w+:`~?(?:[\w.]*\.)?([^`.]+)`")


def _plain(text: str) -> str:
    """A help line without its reST markup, for the terminal."""
    return _ROLE.sub(r"\1", text).replace("``", "")


def _print_config(args: argparse.Namespace, explain: bool = False) -> int:
    """``--print-config``: every key as ``KEY=VALUE``; ``--help-config`` adds each key's meaning below it."""
    import shutil
    import textwrap

    from attn_jax.train import (
        ConfigError,
        apply_overrides,
        check_config,
        config_help,
        flatten_config,
        load_config,
    )

    try:
        config = apply_overrides(load_config(args.config), args.overrides)
        check_config(config)
    except ConfigError as e:
        print(f"attn-jax train: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    meaning = config_help(config) if explain else {}
    width = min(shutil.get_terminal_size((100, 24)).columns, 100)
    for key, value in flatten_config(config).items():
        print(f"{key}={_override_text(value)}")
        if explain:
            text = _plain(meaning[key]) or "(no help: document the key where it is defined)"
            print(textwrap.fill(text, width, initial_indent="    ", subsequent_indent="    "))
    return 0


def run_train(args: argparse.Namespace) -> int:
    """Run ``attn-jax train`` with parsed arguments; returns the exit status."""
    from attn_jax.cli._supervise import WORKER_ENV, supervise, watch_parent

    if getattr(args, "print_config", False) or getattr(args, "help_config", False):
        return _print_config(args, explain=getattr(args, "help_config", False))
    if getattr(args, "workdir", None) is None:
        print("attn-jax train: error: the following arguments are required: --workdir", file=sys.stderr)
        return 2

    flags = [getattr(args, name, None) for name in ("coordinator", "num_processes", "process_id")]
    timeout = getattr(args, "distributed_timeout", 300)
    heartbeat = getattr(args, "heartbeat_timeout", 60)
    multi = None not in flags and isinstance(flags[1], int) and flags[1] > 1
    if multi and WORKER_ENV not in os.environ and getattr(args, "argv", None) is not None:
        return supervise(args.argv, *flags, heartbeat)  # the trainer runs in a child; see cli/_supervise.py
    if WORKER_ENV in os.environ:
        watch_parent()
    import jax  # lazy: `attn-jax --help` and `attn-jax data` stay fast

    from attn_jax.parallel import DistributedError, initialize, leaving

    if multi and isinstance(flags[2], int) and 0 <= flags[2] < flags[1]:  # bad flags: initialize says so
        coordinator, count, index = flags
        print(
            f"attn-jax train: process {index} of {count}: waiting up to {timeout} s (--distributed-timeout) "
            f"for all {count} processes to join at {coordinator}",
            flush=True,
        )
    try:  # before anything touches a device
        joined = initialize(
            *flags,
            timeout_s=timeout,
            heartbeat_timeout_s=heartbeat,
            on_peer_lost=_peer_lost,
        )
    except ValueError as e:  # a bad combination of the multi-process flags
        return _error(e, 2)
    except DistributedError as e:
        return _error(e, 4)
    if not joined:
        return _train(args, joined)
    print(
        f"attn-jax train: process {jax.process_index()} of {jax.process_count()} joined: "
        f"{jax.local_device_count()} local devices, {jax.device_count()} in all",
        flush=True,
    )
    from attn_jax.train import REQUEUE_STATUS

    status = _train(args, joined)
    # A failure's line is printed and the others are told: skip the runtime's exit barrier. A requeue is no
    # failure: the preemption sync point stops every process after the same step, so all of them end here
    # together, through the exit barrier, and none reports another as lost.
    if status not in (0, REQUEUE_STATUS):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    leaving(0)
    return status


def _train(args: argparse.Namespace, joined: bool) -> int:
    import jax

    from attn_jax.data import CorpusError
    from attn_jax.parallel import await_peer_report
    from attn_jax.train import (
        REQUEUE_STATUS,
        CheckpointSaveError,
        CheckpointUnreadable,
        ConfigError,
        Preempted,
        RunLocked,
        TrainingDiverged,
        WorkdirError,
        apply_overrides,
        check_config,
        load_config,
        train_and_evaluate,
    )

    try:
        try:
            config = apply_overrides(load_config(args.config), args.overrides)
            check_config(config)
            tty = {"auto": None, "bar": True, "lines": False}[args.progress]
            if not getattr(args, "verbose", False):
                from attn_jax.cli._noise import route_library_noise

                route_library_noise(os.path.abspath(args.workdir), "train")
            with _orbax_noise_quieted():
                result = train_and_evaluate(config, args.workdir, resume=args.resume, tty=tty)
        except Exception:
            # A lost peer surfaces here as a failed collective, barrier or checkpoint write; the watch names
            # the peer (and ends this process) within moments, a better line than this failure's own.
            if joined:
                await_peer_report(3.0)
            raise
    except ConfigError as e:
        return _error(e, 2)
    except CorpusError as e:
        return _error(e, 1)
    except TrainingDiverged as e:
        return _error(e, 3)
    except (WorkdirError, RunLocked, CheckpointSaveError, CheckpointUnreadable) as e:
        return _error(e, 1)
    except OSError as e:  # any other file the run writes (metrics, vocabularies, TensorBoard): a full disk
        where = f"{e.filename}: " if e.filename else ""
        return _error(f"{where}{e.strerror or e}", 1)
    except (MemoryError, ValueError, jax.errors.JaxRuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, ValueError) and not (joined and _RUNTIME_STATUS.match(first)):
            raise
        if isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in first or "memory" in first.lower():
            return _error(f"out of memory (model or batch too large for this machine): {first[:300]}", 1)
        if joined:
            return _error(f"multi-process run failed (did another process die?): {first[:300]}", 4)
        raise
    except Preempted as e:
        print(f"attn-jax train: {e}", file=sys.stderr)
        return REQUEUE_STATUS
    except KeyboardInterrupt:
        from attn_jax.parallel import leaving

        leaving(130)
        print("attn-jax train: interrupted; resume with --resume", file=sys.stderr)
        return 130
    if result.validation is not None and jax.process_index() == 0:
        v = result.validation
        bleu = f", BLEU {v['bleu']:.2f}, chrF {v['chrf']:.2f}" if "bleu" in v else ""
        print(
            f"final validation: loss {v['loss']:.4f}, ppl {v['ppl']:.2f}{bleu} "
            f"(best checkpoint: step {result.best_step}){'; stopped early' if result.stopped_early else ''}"
        )
    return 0
