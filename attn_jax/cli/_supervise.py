"""The parent of a multi-process ``attn-jax train``: runs the real trainer as a child (the *worker*) and turns
the JAX runtime terminating it into one line and a documented exit status.

Why a second process: when a peer is lost the JAX runtime may terminate this process from one of its own
threads (``SIGABRT`` and a C++ stack trace on stderr), faster than any Python code can react and with no hook
left to Python (``missed_heartbeat_callback`` cannot be called from Python in jaxlib 0.10). The worker's own
watch (``attn_jax/parallel/_peers.py``) names most lost peers first; what remains -- the coordinator (process 0)
killed, whose loss the runtime sees at once, or a peer that hangs until the heartbeat timeout -- ends the worker
by signal, and only a parent outlives that.

The worker's stdout is this process's (the progress bar sees the terminal); its stderr passes through here, each
line held back ``_HOLD_S`` seconds so that the runtime's last words before terminating it (its log lines and the
stack trace) can be dropped and replaced by one line; when the worker itself ends on a lost peer (status 4, its
own line), the runtime's log lines about that loss are dropped the same way. The worker runs in a session of its
own: signals sent to this process (Ctrl-C, ``kill``) reach it once, forwarded from here; if this process is
killed, the worker sees its pipe from here close and exits.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time

# Set in the worker: the fd of the pipe from its parent (closed: the parent is gone).
WORKER_ENV = "ATTN_JAX_TRAIN_WORKER"
LOST = 4  # the exit status of a process whose run lost (or never gathered) another process
_HOLD_S = 2.0  # the runtime's log lines come within milliseconds of its abort: a generous margin


def watch_parent() -> None:
    """In the worker: exit at once when the parent is gone (its pipe closes), so no orphan trains alone."""
    fd = int(os.environ[WORKER_ENV])

    def wait() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:  # not a pipe from a parent after all (the variable set by hand): nothing to watch
            return
        os._exit(4)

    threading.Thread(target=wait, name="attn-jax parent watch", daemon=True).start()


def _what_stopped(text: str, coordinator: str, num_processes: int, process_id: int, heartbeat_s: int) -> str:
    """One line from the runtime's last words on stderr (``text``) when it terminated this process's worker."""
    unhealthy = re.search(r"Task (\d+) heartbeat timeout|stopped sending heartbeats\):\s*(\d+)", text)
    if unhealthy:
        lost = unhealthy.group(1) or unhealthy.group(2)
        return (
            f"process {lost} of {num_processes} sent no heartbeat for {heartbeat_s} s (--heartbeat-timeout: "
            f"hung or dead) in the run coordinated at {coordinator}; process {process_id} stops too"
        )
    if process_id != 0 and re.search(r"leader task|Failed to send RPC to coordination service", text):
        return (
            # The words of the worker's own watch, which sees the same loss when it wins the race.
            f"process 0 (the coordinator, {coordinator}) stopped without a goodbye (killed or crashed); "
            f"process {process_id} stops too"
        )
    return (
        f"the JAX runtime stopped process {process_id} of {num_processes} (SIGABRT) in the run coordinated at "
        f"{coordinator}: another process most likely died or hangs (see its log); process {process_id} stops too"
    )


def supervise(
    argv: list[str], coordinator: str, num_processes: int, process_id: int, heartbeat_s: int
) -> int:
    """Run ``attn-jax <argv>`` as the worker and return its exit status, or 4 with one line if the runtime
    terminated it (``128 + N`` if another signal N killed it)."""
    pipe_read, pipe_write = os.pipe()
    env = dict(os.environ, **{WORKER_ENV: str(pipe_read)})
    worker = subprocess.Popen(
        [sys.executable, "-m", "attn_jax.cli", *argv],
        env=env,
        stderr=subprocess.PIPE,
        pass_fds=(pipe_read,),
        start_new_session=True,
    )
    os.close(pipe_read)  # pipe_write stays open until this process ends
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    lock = threading.Lock()

    def read() -> None:
        for line in worker.stderr:
            with lock:
                held.append((time.monotonic(), line))

    def release(before: float) -> None:
        with lock:
            while held and held[0][0] <= before:
                sys.stderr.buffer.write(held.popleft()[1])
        sys.stderr.buffer.flush()

    reader = threading.Thread(target=read, name="attn-jax worker stderr", daemon=True)
    reader.start()
    # Forwarded unless ignored here (a background job of a script ignores SIGINT: so does its worker).
    forwarded = [
        s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) != signal.SIG_IGN
    ]
    previous = {s: signal.signal(s, lambda s, _: worker.send_signal(s)) for s in forwarded}
    try:
        while worker.poll() is None:
            release(time.monotonic() - _HOLD_S)
            time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    reader.join(
        timeout=2.0
    )  # the rest of its stderr (a child of its own could keep the pipe open: not waited on)
    status = worker.returncode
    if status == LOST:
        # Its watch named the lost process; the runtime's log lines about the same loss (a preemption-notice
        # warning when the coordinator's connection closes) came within milliseconds and say nothing more.
        with lock:
            kept = [(t, line) for t, line in held if line.startswith(b"attn-jax train: ")]
            held.clear()
            held.extend(kept)
    if status >= 0:
        release(float("inf"))
        return status
    number = -status
    if number != signal.SIGABRT:  # not the runtime: its stderr is the worker's own, keep it
        release(float("inf"))
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        why = " (out of memory?)" if number == signal.SIGKILL else ""
        message = f"process {process_id} of {num_processes} was killed by {name}{why}; the others stop too"
        status = 128 + number
    else:  # the runtime's log lines and stack trace: read for the cause, not shown
        with lock:
            last_words = b"".join(line for _, line in held).decode("utf-8", "replace")
            held.clear()
        message = _what_stopped(last_words, coordinator, num_processes, process_id, heartbeat_s)
        status = LOST
    print(
        f"attn-jax train: error: {message}; restart every process with --resume", file=sys.stderr, flush=True
    )
    return status
