"""Multi-process runs: joining the processes of one training run with ``jax.distributed``.

JAX is multi-controller: every process runs the same program on its own devices, and ``jax.devices()`` lists the
devices of all processes once they have joined (``jax.local_devices()``: this process's). Process 0 hosts the
coordination service the others connect to::

    attn-jax train --config C --workdir /shared/run --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0
    attn-jax train --config C --workdir /shared/run --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 1

Under a cluster launcher (Slurm with several tasks, Open MPI's ``mpirun``, a multi-host Cloud TPU slice) no flag
is needed: :func:`cluster_environment` recognises it and ``jax.distributed.initialize()`` reads the coordinator,
process count and id from it. Without flags and without a launcher the run is a single process.

**A lost peer.** Before joining, the processes meet in a roll call on the coordinator's port (process 0 listens
there; see ``_peers.py``) and keep those connections open for the whole run. So a process that never starts is
named after ``timeout_s`` (``process 0 waited 10 s at HOST:PORT for process 1 of 2, which never joined``), and
one that is killed or crashes mid-run is named at once by the others (``process 1 of 2 stopped without a goodbye
(killed or crashed) in the run coordinated at HOST:PORT``): each survivor calls ``on_peer_lost`` with that line,
which by default prints it and ends the process with status 4, before the JAX runtime would terminate it with
``SIGABRT`` and a C++ stack trace. Restart every process with ``--resume``. Three cases are beyond this process's
reach, because the runtime terminates it from its own threads first: the coordinator (process 0) lost (its
connection closes, and the runtime reacts within milliseconds), a peer that hangs without dying (the runtime's
heartbeat timeout, ``heartbeat_timeout_s``), and runs whose coordinator, process count and id come from a
cluster launcher (Slurm, ``mpirun``, TPU; the launcher stops the remaining tasks). ``attn-jax train`` covers the
first two with a parent process (``attn_jax/cli/_supervise.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence

import jax

from attn_jax.parallel._peers import RollCallError, Watch, roll_call

__all__ = ["DistributedError", "await_peer_report", "cluster_environment", "initialize", "leaving"]

PEER_LOST_STATUS = 4  # the exit status of the default on_peer_lost
_watch: Watch | None = None  # this process's watch over the others, once joined with explicit arguments


class DistributedError(RuntimeError):
    """The processes of a multi-process run could not join (JAX already in use, the launcher, the network)."""


def _count(name: str) -> int:
    try:
        return int(os.environ.get(name, "0"))
    except ValueError:
        return 0


def cluster_environment() -> str | None:
    """The multi-process launcher this process runs under, if ``jax.distributed.initialize()`` can detect it.

    ``"slurm"`` (``srun`` with several tasks: ``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST``, ``SLURM_NTASKS`` > 1,
    ``SLURM_PROCID``, ``SLURM_LOCALID``), ``"openmpi"`` (``mpirun``: ``OMPI_MCA_orte_hnp_uri`` with
    ``OMPI_COMM_WORLD_SIZE`` > 1) or ``"tpu"`` (a multi-host Cloud TPU slice: ``TPU_WORKER_HOSTNAMES`` lists
    several hosts); None otherwise (a single process, or a launcher that needs explicit arguments).

    >>> cluster_environment() in (None, "slurm", "openmpi", "tpu")
    True
    """
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID")
    if all(v in os.environ for v in slurm) and _count("SLURM_NTASKS") > 1:
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in os.environ and _count("OMPI_COMM_WORLD_SIZE") > 1:
        return "openmpi"
    if len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]) > 1:
        return "tpu"
    return None


def _stop(message: str) -> None:
    """The default ``on_peer_lost``: the line on stderr, then exit at once with :data:`PEER_LOST_STATUS`."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    print(f"attn_jax: error: {message}", file=sys.stderr, flush=True)
    # Not sys.exit: the runtime's exit barrier would wait for the lost peer, then abort.
    os._exit(PEER_LOST_STATUS)


def _check_seconds(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive whole number of seconds, got {value!r}")
    return value


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: int | Sequence[int] | None = None,
    timeout_s: int = 300,
    heartbeat_timeout_s: int = 60,
    on_peer_lost: Callable[[str], object] = _stop,
) -> bool:
    """Join this process to a multi-process run (``jax.distributed.initialize``), or do nothing for one process.

    With none of ``coordinator``, ``num_processes``, ``process_id`` given: under a launcher that
    :func:`cluster_environment` recognises, ``jax.distributed.initialize()`` detects all three; otherwise nothing
    happens (a single-process run). With some given, the others must come from such a launcher. On CPU the
    processes' collectives go over TCP with Gloo (``jax_cpu_collectives_implementation``, set to ``gloo``
    unless already set). Must run before anything touches a JAX device. Calling it again once initialised is a
    no-op.

    Args:
      coordinator: ``HOST:PORT`` of process 0, which listens there (on every interface) for the others.
      num_processes: how many processes the run has.
      process_id: this process's index, ``0 <= process_id < num_processes``.
      local_device_ids: restrict this process to these local accelerators (GPUs), e.g. one GPU per process.
      timeout_s: how long to wait for every process to join (the roll call), and then for the JAX runtime to
        connect them.
      heartbeat_timeout_s: a process silent this long is declared dead by the JAX runtime and the others are
        terminated (see the module docstring); the same bound applies to waiting for the others when exiting.
      on_peer_lost: called once, from a background thread, with one line naming the process that is gone
        (killed, crashed, or ended with an error) and the coordinator's address; it should end this process
        at once (``os._exit``: a normal exit would wait for the lost peer). The default prints the line on
        stderr and exits with status :data:`PEER_LOST_STATUS` (4). With explicit arguments only (see the
        module docstring).

    Returns:
      True when this process is part of a multi-process run (``jax.distributed`` initialised), else False.

    Raises:
      ValueError: inconsistent or missing arguments (naming them).
      DistributedError: JAX already in use, the launcher's detection failed, or joining failed: a process
        missing after ``timeout_s`` (named, with the coordinator's address), process 0 unreachable, or flags
        that disagree between processes.

    >>> initialize() if cluster_environment() is None else False  # no flags, no launcher: nothing to join
    False
    """
    if jax.distributed.is_initialized():
        return True
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    environment = cluster_environment()
    if all(v is None for v in given.values()) and environment is None:
        return False
    missing = [f"{name} (--{name.replace('_', '-')})" for name, value in given.items() if value is None]
    if missing and environment is None:
        raise ValueError(
            f"a multi-process run needs {' and '.join(missing)} as well (no cluster launcher such as Slurm or "
            "mpirun was detected to supply it)"
        )
    if coordinator is not None and not re.fullmatch(r"\[?[\w.:-]+\]?:\d{1,5}", coordinator):
        raise ValueError(f"coordinator must be HOST:PORT (process 0's address), got {coordinator!r}")
    if num_processes is not None and (
        isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1
    ):
        raise ValueError(f"num_processes must be a positive int, got {num_processes!r}")
    if process_id is not None and (
        isinstance(process_id, bool)
        or not isinstance(process_id, int)
        or process_id < 0
        or (num_processes is not None and process_id >= num_processes)
    ):
        raise ValueError(
            f"process_id must be an int in [0, num_processes={num_processes}), got {process_id!r}"
        )
    timeout_s = _check_seconds("timeout_s", timeout_s)
    heartbeat_timeout_s = _check_seconds("heartbeat_timeout_s", heartbeat_timeout_s)
    global _watch
    explicit = None not in (coordinator, num_processes, process_id) and num_processes > 1
    if explicit and _watch is None:
        try:
            _watch = roll_call(coordinator, num_processes, process_id, timeout_s, on_peer_lost)
        except RollCallError as e:
            raise DistributedError(str(e)) from None
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    stuck = None
    if explicit:  # every process answered, yet the runtime's own join can still fail: end it before it aborts
        stuck = threading.Timer(
            timeout_s,
            on_peer_lost,
            [
                f"process {process_id}: all {num_processes} processes answered the roll call at {coordinator}, "
                f"but the JAX runtime did not connect them within {timeout_s} s"
            ],
        )
        stuck.daemon = True
        stuck.start()
    try:
        jax.distributed.initialize(
            coordinator,
            num_processes,
            process_id,
            local_device_ids=local_device_ids,
            # With a roll call the timer above ends a stuck join first: the runtime's own deadline aborts.
            initialization_timeout=timeout_s + 60 if explicit else timeout_s,
            heartbeat_timeout_seconds=heartbeat_timeout_s,
            shutdown_timeout_seconds=heartbeat_timeout_s,
        )
    except RuntimeError as e:  # JaxRuntimeError (connect timed out, ...) is a RuntimeError too
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        who = "this process" if process_id is None else f"process {process_id}"
        where = coordinator or f"the coordinator of the {environment} job"
        size = "" if num_processes is None else f" with {num_processes} processes"
        if "must be called before" in first:
            raise DistributedError(
                "jax.distributed must be initialised before anything uses a JAX device; call "
                "attn_jax.parallel.initialize() first"
            ) from None
        raise DistributedError(
            f"{who} could not join {where}{size} within {timeout_s} s "
            f"(is every process started, with the same --coordinator and --num-processes?): {first[:300]}"
        ) from None
    except ValueError as e:  # jax's own checks of what the launcher supplied
        raise DistributedError(f"cannot initialise jax.distributed: {e}") from None
    finally:
        if stuck is not None:
            stuck.cancel()
    return True


def leaving(status: int) -> None:
    """Tell the other processes of the run that this one ends with exit status ``status``.

    Call it once, before printing this process's own error line: with a non-zero ``status`` the lost peers are
    no longer reported from here (this process's line is the one to print), and the others report this one as
    ``left with exit status N``. After a non-zero status end the process with ``os._exit`` (a normal exit waits
    in the JAX runtime's exit barrier for peers that will not come, then aborts). A no-op in a single process.
    """
    if _watch is not None:
        _watch.leave(status)


def await_peer_report(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a lost peer to be reported (``on_peer_lost``); True if one was.

    After a failure in a multi-process run (a collective that failed, a barrier that timed out), give the
    watch a moment: a lost peer is the likelier cause and the better message. False at once in a single
    process.
    """
    return _watch is not None and _watch.await_report(timeout_s)
