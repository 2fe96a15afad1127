"""Save on preemption: SIGTERM or SIGINT during training ends the run at the next step boundary, saved.

A spot VM, a TPU maintenance event or a scheduler's ``scancel`` sends SIGTERM and kills the process a grace
period later. The trainer catches the signal, finishes the update in flight, writes a checkpoint of that step,
waits for it to be committed and raises :class:`Preempted`; ``attn-jax train`` exits with
:data:`REQUEUE_STATUS` (75, ``EX_TEMPFAIL``), which a requeue script or a Slurm ``--requeue`` wrapper reads as
"run me again with ``--resume``". Resumption is exact (see :mod:`attn_jax.train._loop`).

A second SIGINT (Ctrl-C twice) interrupts at once, as before: the last good checkpoint stays intact.

In a multi-process run every process must save the same step, or the collective write would hang. There the
processes agree through JAX's preemption sync manager (``multihost_utils.reached_preemption_sync_point``),
which ``jax.distributed.initialize`` starts: it catches SIGTERM itself and picks one step for all.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import jax
from jax.experimental import multihost_utils

__all__ = ["REQUEUE_STATUS", "Preempted", "StopRequest", "stop_requests"]

REQUEUE_STATUS = 75  # EX_TEMPFAIL from sysexits.h: a temporary failure, try again


class Preempted(Exception):
    """Training stopped on a signal after saving the checkpoint of ``step``; ``--resume`` continues it."""

    def __init__(self, signal_name: str, step: int, directory: str):
        super().__init__(
            f"stopped by {signal_name} at step {step}: checkpoint {step} saved in {directory}; "
            "continue with --resume"
        )
        self.signal_name, self.step, self.directory = signal_name, step, directory


class StopRequest:
    """The signal received so far, if any; :meth:`due` says at a step boundary whether to save and stop."""

    def __init__(self, multi_process: bool):
        self.signal_name: str | None = None
        self.multi_process = multi_process

    def due(self, step: int) -> bool:
        """Whether the run saves and stops after update ``step``: one answer for every process."""
        if self.multi_process:
            if multihost_utils.reached_preemption_sync_point(step):
                self.signal_name = self.signal_name or "SIGTERM"
                return True
            return False
        return self.signal_name is not None


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """Catch SIGTERM and SIGINT for the duration of the training loop.

    Handlers go in only on the main thread (Python allows no other); elsewhere, as under a test runner's
    worker thread, the signals keep their old meaning. In a multi-process run SIGTERM stays with JAX's
    preemption notifier and SIGINT interrupts at once, as before.
    """
    request = StopRequest(multi_process=jax.process_count() > 1)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    caught = [] if request.multi_process else [signal.SIGTERM, signal.SIGINT]
    previous = {s: signal.getsignal(s) for s in caught}

    def handler(number, frame):
        if number == signal.SIGINT and request.signal_name is not None:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, unsaved
        request.signal_name = signal.Signals(number).name

    try:
        for s in caught:
            if previous[s] is not signal.SIG_IGN:  # a background job ignores SIGINT: so does its trainer
                signal.signal(s, handler)
        yield request
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
