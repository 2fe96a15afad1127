"""Library noise after a failure goes to ``<workdir>/debug.log``, so the command's own error line stands alone.

After a full disk or a damaged file, the libraries under a command report the same failure again in their own
way: tensorboardX's writer thread and atexit flush, asyncio tasks of orbax whose loop is closed, coroutines
never awaited, ERROR records of orbax and asyncio. Those reports are Python's "unraisable" exceptions,
exceptions in threads that are not ours, ``RuntimeWarning: coroutine ... was never awaited`` and log records.
:func:`route_library_noise` appends them to the run's debug log instead of stderr; ``-v`` keeps them on stderr.
Exceptions of attn_jax's own threads are never rerouted.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import Callable

__all__ = ["DEBUG_LOG", "add_verbose_flag", "debug_log_path", "route_library_noise"]

# The debug log inside the run directory.
DEBUG_LOG = "debug.log"


def _ours(tb) -> bool:
    """Whether the innermost frame of ``tb`` that is not the standard library's belongs to attn_jax."""
    frames = traceback.extract_tb(tb)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return any(f.filename.startswith(package) for f in frames)


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    """``-v``: the libraries' own reports on stderr, for a command that reads a run (``translate`` and others)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the libraries' own reports of a failure (background tracebacks) on stderr instead of "
        "WORKDIR/debug.log",
    )
    parser.set_defaults(library_noise=True)


def debug_log_path(workdir: str, command: str) -> str:
    """``workdir/debug.log`` when it can be appended to, else a file in the temporary directory (a run read
    from a read-only place or by another user)."""
    workdir = os.path.abspath(workdir)
    path = os.path.join(workdir, DEBUG_LOG)
    if os.path.exists(path):
        writable = os.path.isfile(path) and os.access(path, os.W_OK)
    else:  # not created here: a command that meets no noise leaves the run as it was
        writable = os.path.isdir(workdir) and os.access(workdir, os.W_OK)
    if writable:
        return path
    return os.path.join(tempfile.gettempdir(), f"attn-jax-{command}-{os.getpid()}-{DEBUG_LOG}")


class _ToLog(logging.Filter):
    """Sends ERROR records to ``write``: orbax's (through absl) and asyncio's (``Task exception was never
    retrieved``)."""

    def __init__(self, write: Callable[[str], None]):
        super().__init__()
        self.write = write

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:  # attn_jax logs through neither logger
            return True
        self.write(logging.Formatter("%(levelname)s:%(name)s:%(message)s").format(record))
        return False


def route_library_noise(workdir: str, command: str, *, path: str | None = None) -> Callable[[], None]:
    """Send library noise to ``workdir/debug.log`` (or ``path``) until the process ends; returns a function that
    undoes it.

    At exit, or when undone, one stderr line says how many reports the log received (or could not receive: a
    full disk). Reports that come later, while the interpreter shuts down, add one line naming the log if none
    was printed.
    """
    path = path or os.path.join(workdir, DEBUG_LOG)
    counts = {"logged": 0, "lost": 0}
    state = {"summarised": False, "named": False}

    def write(text: str) -> None:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
            counts["logged"] += 1
        except OSError:
            counts["lost"] += 1
        if state["summarised"] and not state["named"]:  # a report at shutdown, after the summary
            state["named"] = True
            try:
                print(
                    f"attn-jax {command}: library reports at exit are in {path} (-v shows them here)",
                    file=sys.stderr,
                )
            except (OSError, ValueError, AttributeError):  # stderr already closed at shutdown
                pass

    previous_unraisable, previous_thread, previous_show = (
        sys.unraisablehook,
        threading.excepthook,
        warnings.showwarning,
    )

    def unraisable(u) -> None:
        if u.exc_traceback is not None and _ours(u.exc_traceback):
            previous_unraisable(u)
            return
        where = f"{u.err_msg or 'Exception ignored in'}: {u.object!r}\n"
        write(where + "".join(traceback.format_exception(u.exc_type, u.exc_value, u.exc_traceback)))

    def thread_exception(args) -> None:
        if args.exc_traceback is not None and _ours(args.exc_traceback):
            previous_thread(args)
            return
        name = args.thread.name if args.thread is not None else "?"
        write(
            f"Exception in thread {name}:\n"
            + "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        )

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, RuntimeWarning) and "was never awaited" in str(message):
            write(warnings.formatwarning(message, category, filename, lineno, line))
        else:
            previous_show(message, category, filename, lineno, file, line)

    def summary() -> None:
        state["summarised"] = True
        logged, lost = counts["logged"], counts["lost"]
        if not (logged or lost):
            return
        state["named"] = True
        what = f"attn-jax {command}: {logged or lost} library report(s) (tracebacks of the same failure)"
        if not logged:
            where = f"could not be written to {path} (a full disk?)"
        else:
            where = f"are in {path}" + (f"; {lost} more could not be written there" if lost else "")
        print(f"{what} {where} (-v shows them here)", file=sys.stderr)

    loggers = [logging.getLogger("asyncio"), logging.getLogger("absl")]
    to_log = _ToLog(write)

    def undo() -> None:
        summary()
        for logger in loggers:
            logger.removeFilter(to_log)
        sys.unraisablehook, threading.excepthook, warnings.showwarning = (
            previous_unraisable,
            previous_thread,
            previous_show,
        )
        atexit.unregister(summary)

    sys.unraisablehook, threading.excepthook, warnings.showwarning = unraisable, thread_exception, show
    for logger in loggers:
        logger.addFilter(to_log)
    atexit.register(summary)
    return undo
