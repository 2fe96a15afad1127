"""Library noise after a failure goes to ``<workdir>/debug.log``, so the command's own error line stands alone.

After a full disk or a damaged file, the libraries under the trainer report the same failure again in their own
way: tensorboardX's writer thread and atexit flush, asyncio tasks of orbax whose loop is closed, coroutines
never awaited. Those reports are Python's "unraisable" exceptions, exceptions in threads that are not ours, and
``RuntimeWarning: coroutine ... was never awaited``. :func:`route_library_noise` appends them to the run's debug
log instead of stderr; ``-v`` keeps them on stderr. Exceptions of attn_jax's own threads are never rerouted.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable

__all__ = ["DEBUG_LOG", "route_library_noise"]

# The debug log inside the run directory.
DEBUG_LOG = "debug.log"


def _ours(tb) -> bool:
    """Whether the innermost frame of ``tb`` that is not the standard library's belongs to attn_jax."""
    frames = traceback.extract_tb(tb)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return any(f.filename.startswith(package) for f in frames)


def route_library_noise(workdir: str, command: str) -> Callable[[], None]:
    """Send library noise to ``workdir/debug.log`` until the process ends; returns a function that undoes it.

    At exit, one stderr line says how many reports the log received (or could not receive: a full disk).
    """
    path = os.path.join(workdir, DEBUG_LOG)
    counts = {"logged": 0, "lost": 0}

    def write(text: str) -> None:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(text if text.endswith("\n") else text + "\n")
            counts["logged"] += 1
        except OSError:
            counts["lost"] += 1

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
        logged, lost = counts["logged"], counts["lost"]
        if not (logged or lost):
            return
        what = f"attn-jax {command}: {logged or lost} library report(s) (tracebacks of the same failure)"
        if not logged:
            where = f"could not be written to {path} (a full disk?)"
        else:
            where = f"are in {path}" + (f"; {lost} more could not be written there" if lost else "")
        print(f"{what} {where} (-v shows them here)", file=sys.stderr)

    def undo() -> None:
        sys.unraisablehook, threading.excepthook, warnings.showwarning = (
            previous_unraisable,
            previous_thread,
            previous_show,
        )
        atexit.unregister(summary)

    sys.unraisablehook, threading.excepthook, warnings.showwarning = unraisable, thread_exception, show
    atexit.register(summary)
    return undo
