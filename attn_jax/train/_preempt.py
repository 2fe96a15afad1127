"""Save on preemption: SIGTERM or SIGINT during training ends the run at the next step boundary, saved.

A spot VM, a TPU maintenance event or a scheduler's ``scancel`` sends SIGTERM and kills the process a grace
period later. The trainer catches the signal, finishes the update in flight, writes a checkpoint of that step,
waits for it to be committed and raises :class:`Preempted`; ``attn-jax train`` exits with
:data:`REQUEUE_STATUS` (75, ``EX_TEMPFAIL``), which a requeue script or a Slurm ``--requeue`` wrapper reads as
"run me again with ``--resume``". Resumption is exact (see :mod:`attn_jax.train._loop`).

A second SIGINT (Ctrl-C twice) interrupts at once, as before: the last good checkpoint stays intact.

In a multi-process run every process must save the same step, or the collective write would hang. There the
processes agree through JAX's preemption sync point (``multihost_utils.reached_preemption_sync_point``), which
``jax.distributed.initialize`` starts. A process that gets either signal posts its index and the signal's name
in the coordination service's key-value store, then the preemption notice that starts JAX's sync protocol; the
protocol picks one step for all, and each process that got no signal reads who did. The handlers here stand in
for JAX's own notifier, which hears SIGTERM only and names no process; the notice is the key that notifier
writes (``RECEIVED_PREEMPTION_NOTICE`` in XLA's ``preemption_sync_manager.cc``).
"""

from __future__ import annotations

import contextlib
import datetime
import signal
import threading
from collections.abc import Iterator

import jax
from jax.experimental import multihost_utils

__all__ = ["REQUEUE_STATUS", "Preempted", "StopRequest", "stop_requests"]

REQUEUE_STATUS = 75  # EX_TEMPFAIL from sysexits.h: a temporary failure, try again

# The key JAX's preemption sync manager watches; its value is the time of death, RFC 3339.
_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"
# One key per signalled process under this directory, its value the signal's name.
_SIGNALLED_DIR = "attn_jax/preemption/signalled/"


class Preempted(Exception):
    """Training stopped on a signal after saving the checkpoint of ``step``; ``--resume`` continues it.

    When this process got no signal (a multi-process run stops together), ``signal_name`` is None and
    ``peers`` maps each other process that got one to the signal's name.
    """

    def __init__(
        self, signal_name: str | None, step: int, directory: str, peers: dict[int, str] | None = None
    ):
        self.signal_name, self.step, self.directory = signal_name, step, directory
        self.peers = dict(peers or {})
        if signal_name is not None:
            why = f"stopped by {signal_name} at step {step}"
        elif self.peers:
            got = " and ".join(f"process {i} got {name}" for i, name in sorted(self.peers.items()))
            why = f"stopped at step {step}, the step all processes agreed on, because {got}"
        else:  # a notice this module did not post: JAX's own notifier, before the loop began
            why = f"stopped at step {step}, the step all processes agreed on after a preemption notice"
        super().__init__(f"{why}: checkpoint {step} saved in {directory}; continue with --resume")


def _client():
    """The client of ``jax.distributed``'s coordination service, for which JAX has no public accessor."""
    from jax._src import distributed

    return distributed.global_state.client


def _post(process: int, signal_name: str) -> None:
    """Tell every process that ``process`` got ``signal_name``, then start JAX's preemption sync protocol."""
    client = _client()
    client.key_value_set(f"{_SIGNALLED_DIR}{process}", signal_name, allow_overwrite=True)
    # Death time now: the protocol starts at once. A second signalled process finds the notice set already.
    client.key_value_set(_NOTICE_KEY, datetime.datetime.now(datetime.UTC).isoformat(), allow_overwrite=True)


def _signalled() -> dict[int, str]:
    """The processes that posted a signal so far, by index."""
    return {int(key.rsplit("/", 1)[1]): name for key, name in _client().key_value_dir_get(_SIGNALLED_DIR)}


class StopRequest:
    """The signal received so far, if any; :meth:`due` says at a step boundary whether to save and stop."""

    def __init__(self, multi_process: bool):
        self.signal_name: str | None = None
        self.multi_process = multi_process
        self._posted = False
        self._peers: dict[int, str] = {}

    def due(self, step: int) -> bool:
        """Whether the run saves and stops after update ``step``: one answer for every process."""
        if not self.multi_process:
            return self.signal_name is not None
        if self.signal_name is not None and not self._posted:
            _post(jax.process_index(), self.signal_name)
            self._posted = True
        if not multihost_utils.reached_preemption_sync_point(step):
            return False
        if self.signal_name is None:
            self._peers = {i: name for i, name in _signalled().items() if i != jax.process_index()}
        return True

    def preempted(self, step: int, directory: str) -> Preempted:
        """The exception that ends the run after the checkpoint of ``step`` (when :meth:`due` said so)."""
        return Preempted(self.signal_name, step, directory, self._peers)


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequest]:
    """Catch SIGTERM and SIGINT for the duration of the training loop.

    Handlers go in only on the main thread (Python allows no other); elsewhere, as under a test runner's
    worker thread, the signals keep their old meaning. On leaving, the handlers Python knew before come back;
    in a multi-process run SIGTERM then has its default meaning, not JAX's notifier.
    """
    request = StopRequest(multi_process=jax.process_count() > 1)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(number, frame):
        if number == signal.SIGINT and request.signal_name is not None:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, unsaved
        request.signal_name = request.signal_name or signal.Signals(number).name

    try:
        for s in previous:
            if previous[s] is not signal.SIG_IGN:  # a background job ignores SIGINT: so does its trainer
                signal.signal(s, handler)
        yield request
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
