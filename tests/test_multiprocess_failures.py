"""A multi-process ``attn-jax train`` whose peer never starts or dies mid-run: the survivor exits with status 4 and
one stderr line naming the missing process and the coordinator's address, within the configured timeout, without
the JAX runtime's ``SIGABRT`` and C++ stack trace (attn_jax/parallel/_peers.py, the roll call and the watch).

Every process is a subprocess of its own on 127.0.0.1 only, with a port taken from a socket bound to port 0, one
CPU device each (the 2-process mesh is data=2) and a hard timeout, so a hang fails instead of blocking.
"""

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from attn_jax.parallel import DistributedError, initialize
from tests.conftest import TEST_XLA_FLAGS

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
TRAIN = [
    "--config",
    f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke",
    "--config.parallel.strategy=data",
    "--config.num_train_steps=100000",  # still training when the peer is killed
    "--config.log_every=1",
    "--config.eval_every=100000",
    "--config.checkpoint_every=100000",
    "--config.tensorboard=false",
    "--progress=lines",
]
# What the JAX runtime prints when it terminates a process (absl's fatal log and its stack trace, glog lines).
ABORT = re.compile(r"Traceback|SIGABRT|Aborted|Check failure|^\s+@\s+0x|^[FE]\d{4} ", re.MULTILINE)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, port: int, process_id: int, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count=1 {TEST_XLA_FLAGS}",
        JAX_PLATFORMS="cpu",
        PYTHONUNBUFFERED="1",
    )
    cmd = [
        *(sys.executable, "-m", "attn_jax.cli", "train", *TRAIN, "--workdir", str(tmp_path / "run")),
        *(f"--coordinator=127.0.0.1:{port}", "--num-processes=2", f"--process-id={process_id}"),
        *extra,
    ]
    out = open(tmp_path / f"p{process_id}.out", "w")  # noqa: SIM115 - closed by _finish
    err = open(tmp_path / f"p{process_id}.err", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
    proc.files, proc.logs = (out, err), (tmp_path / f"p{process_id}.out", tmp_path / f"p{process_id}.err")
    return proc


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait for ``proc`` (killing it after ``timeout``): ``(returncode, stdout, stderr)``."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        for f in proc.files:
            f.close()
    return proc.returncode, proc.logs[0].read_text(), proc.logs[1].read_text()


def _one_line(code: int, out: str, err: str) -> str:
    """The survivor's one stderr line, after checking its exit status and that the runtime did not abort it."""
    assert code == 4, f"exit status {code}\n{out[-2000:]}\n{err[-3000:]}"
    assert not ABORT.search(err), err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("attn-jax train: error: "), err[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_peer_that_never_starts_is_named_after_the_timeout(tmp_path):
    port, timeout = _free_port(), 10
    started = time.monotonic()
    code, out, err = _finish(_start(tmp_path, port, 0, f"--distributed-timeout={timeout}"), 60)
    took = time.monotonic() - started
    line = _one_line(code, out, err)
    assert line == (
        f"attn-jax train: error: process 0 waited {timeout} s at 127.0.0.1:{port} for process 1 of 2, which "
        "never joined (is every process started, with the same --coordinator and --num-processes?)"
    )
    # It said what it waits for, then gave up after the timeout (plus start-up: importing JAX), not at 300 s.
    assert (
        f"waiting up to {timeout} s (--distributed-timeout) for all 2 processes to join at 127.0.0.1:{port}"
        in out
    )
    assert took < timeout + 40, f"exited after {took:.0f} s"
    print(f"process 0 alone exited with 4 after {took:.1f} s")


@pytest.mark.heavy  # make test-all: the same timeout path as a peer that never starts, seen from the other side
def test_a_coordinator_that_never_starts_is_named_after_the_timeout(tmp_path):
    port, timeout = _free_port(), 5
    code, out, err = _finish(_start(tmp_path, port, 1, f"--distributed-timeout={timeout}"), 60)
    assert _one_line(code, out, err) == (
        f"attn-jax train: error: process 1 could not reach process 0 (the coordinator) at 127.0.0.1:{port} "
        f"within {timeout} s (is process 0 started, with this --coordinator?)"
    )


@pytest.mark.slow
# Killing the coordinator instead is the same detection path, minutes of two-process compiling more: make test-all.
@pytest.mark.parametrize(
    "victim", [1, pytest.param(0, marks=pytest.mark.heavy)], ids=["process-1", "the-coordinator"]
)
def test_a_peer_killed_mid_run_is_named_by_the_survivor(tmp_path, victim):
    port = _free_port()
    # The runtime's own heartbeat timeout (60 s) is far off: the survivor must not wait for it.
    procs = [
        _start(tmp_path, port, i, "--distributed-timeout=60", "--heartbeat-timeout=60") for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 50
        while not re.search(r"^step 1/", procs[0].logs[0].read_text(), re.MULTILINE):
            assert all(p.poll() is None for p in procs), "a process ended before training began"
            assert time.monotonic() < deadline, "no training step was logged within 50 s"
            time.sleep(0.1)
        procs[victim].send_signal(signal.SIGKILL)  # the process the user started (its trainer is its child)
        killed_at = time.monotonic()
        code, out, err = _finish(procs[1 - victim], 30)
        waited = time.monotonic() - killed_at
    finally:
        for p in procs:
            _finish(p, 0)  # kills what still runs; closes the log files
    lost = (
        f"process 1 of 2 stopped without a goodbye (killed or crashed) in the run coordinated at 127.0.0.1:{port}"
        if victim == 1
        else f"process 0 (the coordinator, 127.0.0.1:{port}) stopped without a goodbye (killed or crashed)"
    )
    assert _one_line(code, out, err) == (
        f"attn-jax train: error: {lost}; process {1 - victim} stops too; restart every process with --resume"
    )
    assert waited < 15, f"the survivor took {waited:.0f} s"
    print(f"survivor exited with 4, {waited:.1f} s after the kill")


def test_initialize_names_the_missing_process_without_touching_jax(tmp_path):
    # The roll call happens before jax.distributed (and before the Gloo setting): nothing global changes here.
    port = _free_port()
    with pytest.raises(
        DistributedError, match=rf"process 0 waited 1 s at 127.0.0.1:{port} for process 1 of 2"
    ):
        initialize(f"127.0.0.1:{port}", 2, 0, timeout_s=1)
