"""Multi-process runs: joining the processes of one training run with ``jax.distributed``.

JAX is multi-controller: every process runs the same program on its own devices, and ``jax.devices()`` lists the
devices of all processes once they have joined (``jax.local_devices()``: this process's). Process 0 hosts the
coordination service the others connect to::

    attn-jax train --config C --workdir /shared/run --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0
    attn-jax train --config C --workdir /shared/run --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 1

Under a cluster launcher (Slurm with several tasks, Open MPI's ``mpirun``, a multi-host Cloud TPU slice) no flag
is needed: :func:`cluster_environment` recognises it and ``jax.distributed.initialize()`` reads the coordinator,
process count and id from it. Without flags and without a launcher the run is a single process.

**A dead peer.** Every process sends heartbeats to the coordination service; a process silent for
``heartbeat_timeout_s`` is declared dead and the service stops every other process: the JAX runtime terminates
it (``SIGABRT``, exit status 134) with ``Terminating process because the JAX distributed service detected fatal
errors. This most likely indicates that another task died`` on stderr. When the coordinator (process 0) dies,
the others notice at once (the service's connection closes). So a run never hangs on a lost peer for longer than
the heartbeat timeout; restart all processes with ``--resume``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import jax

__all__ = ["DistributedError", "cluster_environment", "initialize"]


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
      timeout_s: how long to wait for every process to join.
      heartbeat_timeout_s: a process silent this long is declared dead and the others are stopped (see the
        module docstring); the same bound applies to waiting for the others when exiting.

    Returns:
      True when this process is part of a multi-process run (``jax.distributed`` initialised), else False.

    Raises:
      ValueError: inconsistent or missing arguments (naming them).
      DistributedError: JAX already in use, the launcher's detection failed, or joining failed. (When the
        coordinator cannot be reached within ``timeout_s``, the JAX runtime itself terminates the process with
        ``DEADLINE_EXCEEDED ... RegisterTask`` on stderr.)

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
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator,
            num_processes,
            process_id,
            local_device_ids=local_device_ids,
            initialization_timeout=timeout_s,
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
    return True
