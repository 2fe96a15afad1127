"""One writer per run directory: an OS file lock on ``<workdir>/.lock`` that names its holder's process id.

``train`` (with or without ``--resume``) and ``average`` take the lock; ``translate`` and ``evaluate`` do not,
since they only read finished checkpoints. The lock is ``flock`` on an open file, so the kernel releases it
when the holder ends in any way, ``kill -9`` included: a lock file left on disk is never stale by itself. The
holder writes ``PID COMMAND`` into the file, and a refused process names that process in its one error line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

__all__ = ["LOCK_NAME", "RunLock", "RunLocked", "lock_run"]

# The lock file inside the run directory.
LOCK_NAME = ".lock"


class RunLocked(OSError):
    """Another process holds the run directory's lock (its process id is in the message, one line)."""

    def __init__(self, message: str, pid: int | None = None):
        super().__init__(message)
        self.errno = errno.EAGAIN
        self.pid = pid


class RunLock:
    """A held run-directory lock; :meth:`release` (or the end of the process) frees it."""

    def __init__(self, fd: int | None):
        self._fd = fd

    def release(self) -> None:
        """Free the lock; the file stays (removing it would let two processes lock two different files)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # a holder dropped on an error path frees the run too
        self.release()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> tuple[int | None, str]:
    """``(pid, command)`` the holder wrote; it writes them just after locking, so an empty file is re-read."""
    deadline = time.monotonic() + 1.0
    while True:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
        if text or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if text and text[0].isdigit():
        return int(text[0]), " ".join(text[1:])
    return None, ""


def lock_run(workdir: str | os.PathLike, command: str, *, create: bool = True) -> RunLock:
    """Take ``workdir``'s lock for ``command`` (``"train"``, ``"average"``) or raise :class:`RunLocked`.

    The directory must exist. Without ``create`` (a reader such as ``average``, which leaves the run as it
    is), or where the lock file cannot be created (read-only), a missing lock file means that no trainer
    has ever locked the run: the caller proceeds without a lock.
    """
    path = os.path.join(os.fspath(workdir), LOCK_NAME)
    fd = None
    if create:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:  # a read-only run: an existing lock file can still be locked
            pass
    writable = fd is not None
    if fd is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no lock file (never locked), or one this user cannot open: nothing to hold
            return RunLock(None)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid, what = _holder(fd)
        os.close(fd)
        holder = f"process {pid}" + (f" (attn-jax {what})" if what else "") if pid else "another process"
        raise RunLocked(
            f"{os.fspath(workdir)} is in use by {holder}, which holds {path}; wait for it to end, or stop it, "
            "before running attn-jax " + command + " on it",
            pid,
        ) from None
    if writable:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    return RunLock(fd)
