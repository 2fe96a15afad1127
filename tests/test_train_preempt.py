"""Save on preemption and the profiler trace.

``attn-jax train`` sent SIGTERM mid-run saves the step in flight, exits with 75 (requeue), and ``--resume``
ends with the losses and bit-identical parameters of a run never interrupted. With two processes, a signal to
either one stops both after the same step, saved, and each says which process got which signal. The signal
handlers are checked in process (one signal saves, a second Ctrl-C interrupts, the old handlers come back; with
several processes, against a stand-in for JAX's preemption sync point), and ``profile_steps`` writes a trace
TensorBoard's profile plugin reads.
"""

import datetime
import io
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from attn_jax.train import (
    REQUEUE_STATUS,
    ConfigError,
    apply_overrides,
    check_config,
    load_checkpoint,
    load_config,
    read_metrics,
    train_and_evaluate,
)
from attn_jax.train._preempt import stop_requests
from tests.test_multiprocess import _finish, _pair
from tests.test_train_resume import CONFIGS, _env, _finished_steps, _run

STEPS = 160  # the signal comes at step 20 or later: enough left for it to land mid-run
ARGS = [
    "--config",
    f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke",
    f"--config.num_train_steps={STEPS}",
    "--config.checkpoint_every=1000",  # no save of its own before the end: the one found is the signal's
    f"--config.eval_every={STEPS}",
    "--config.log_every=5",
    "--config.tensorboard=false",
    "--progress=lines",
]


def _command(workdir, *extra):
    return [sys.executable, "-m", "attn_jax.cli", "train", *ARGS, "--workdir", str(workdir), *extra]


def _train_losses(workdir):
    return [
        (r["step"], r["loss"], r["grad_norm"])
        for r in read_metrics(workdir / "metrics.jsonl")
        if r["split"] == "train"
    ]


def test_signals_set_the_request_and_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with stop_requests() as request:
        assert not request.due(1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert request.due(2) and request.signal_name == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before
    with stop_requests() as request:
        os.kill(os.getpid(), signal.SIGINT)
        assert request.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C does not wait for the step to end
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    assert {s: signal.getsignal(s) for s in before} == before


class _Board:
    """The coordination service's key-value store, as far as the stop request uses it."""

    def __init__(self):
        self.values = {}

    def key_value_set(self, key, value, allow_overwrite=False):
        assert allow_overwrite or key not in self.values
        self.values[key] = value

    def key_value_dir_get(self, directory):
        return [(k, v) for k, v in self.values.items() if k.startswith(directory)]


@pytest.fixture
def two_processes(monkeypatch):
    """This process as process 0 of 2, with JAX's sync point at step 7 and a key-value store of its own."""
    import attn_jax.train._preempt as preempt

    board, asked = _Board(), []
    monkeypatch.setattr(preempt.jax, "process_count", lambda: 2)
    monkeypatch.setattr(preempt.jax, "process_index", lambda: 0)
    monkeypatch.setattr(preempt, "_client", lambda: board)
    monkeypatch.setattr(
        preempt.multihost_utils, "reached_preemption_sync_point", lambda step: asked.append(step) or step == 7
    )
    return board, asked


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_process_posts_the_notice_and_stops_at_the_sync_point(two_processes, number):
    board, asked = two_processes
    with stop_requests() as request:
        assert [request.due(step) for step in (4, 5)] == [False, False] and board.values == {}
        os.kill(os.getpid(), number)
        assert [request.due(step) for step in range(6, 9)] == [False, True, False]
        name = signal.Signals(number).name
        assert board.values.pop("attn_jax/preemption/signalled/0") == name
        assert set(board.values) == {"RECEIVED_PREEMPTION_NOTICE"}  # posted once, at step 6
        # The value is the time of death, which absl parses as RFC 3339: now, so the protocol starts at once.
        death = datetime.datetime.fromisoformat(board.values["RECEIVED_PREEMPTION_NOTICE"])
        assert (
            death.tzinfo is not None and abs(datetime.datetime.now(datetime.UTC) - death).total_seconds() < 60
        )
        assert str(request.preempted(7, "/ckpt")) == (
            f"stopped by {name} at step 7: checkpoint 7 saved in /ckpt; continue with --resume"
        )
    assert asked == [4, 5, 6, 7, 8]


def test_a_process_stopped_by_another_says_which_and_by_what(two_processes):
    board, _ = two_processes
    board.values["attn_jax/preemption/signalled/1"] = "SIGINT"  # what process 1 posts with its notice
    with stop_requests() as request:
        assert [request.due(step) for step in (6, 7)] == [False, True]
        assert request.signal_name is None
        error = request.preempted(7, "/ckpt")
    assert error.peers == {1: "SIGINT"}
    assert str(error) == (
        "stopped at step 7, the step all processes agreed on, because process 1 got SIGINT: "
        "checkpoint 7 saved in /ckpt; continue with --resume"
    )
    assert set(board.values) == {"attn_jax/preemption/signalled/1"}  # nothing posted from here


@pytest.mark.slow
def test_sigterm_saves_exits_75_and_resume_is_exact(tmp_path):
    env = _env(tmp_path / "jax_cache")
    _run(_command(tmp_path / "straight"), env)

    stopped = tmp_path / "stopped"
    proc = subprocess.Popen(
        _command(stopped), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        metrics = stopped / "metrics.jsonl"
        while not (metrics.exists() and any(r["step"] >= 20 for r in read_metrics(metrics))):
            assert proc.poll() is None, "the run ended before the signal"
            assert time.monotonic() < deadline, "no training record after 300 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == REQUEUE_STATUS, err[-3000:]
    saved = _finished_steps(stopped)
    assert len(saved) == 1 and 20 <= saved[0] < STEPS, saved
    step = saved[0]
    assert f"stopped by SIGTERM at step {step}: checkpoint {step} saved" in err, err[-2000:]

    resumed = _run(_command(stopped, "--resume"), env)
    assert f"resumed from step {step}" in resumed.stdout
    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(stopped)
    assert a.step == b.step == STEPS and a.data == b.data
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bit for bit
    # The log window that spans the stop averages only the updates after the resume; every other record is
    # the uninterrupted run's.
    spanning = -(-step // 5) * 5 if step % 5 else None
    got, want = _train_losses(stopped), _train_losses(tmp_path / "straight")
    assert [r[0] for r in got] == [r[0] for r in want]
    assert [r for r in got if r[0] != spanning] == [r for r in want if r[0] != spanning]


MP_STEPS = 14  # room for two stops, each at least 3 steps after the last, then a few steps more
MP_ARGS = [
    f"--config.num_train_steps={MP_STEPS}",
    "--config.checkpoint_every=1000",  # as above: the checkpoints found are the signals'
    "--config.data.eval_split=none",  # no validation programs to compile
]
MP_TIMEOUT = 300  # seconds per run: a hang fails, not blocks


def _pair_stopped(workdir, logs, name, cache, after, number, target, *extra):
    """Two processes training into ``workdir``; signal ``number`` to process ``target`` once process 0 has
    logged step ``after``. Each process's ``(returncode, stdout, stderr)``."""
    procs = _pair(workdir, logs, name, *MP_ARGS, *extra, cache=cache)
    try:
        deadline = time.monotonic() + MP_TIMEOUT
        metrics = workdir / "metrics.jsonl"
        while not (metrics.exists() and any(r["step"] >= after for r in read_metrics(metrics))):
            assert all(p.poll() is None for p in procs), "a process ended before the signal"
            assert time.monotonic() < deadline, f"no training record of step {after} after {MP_TIMEOUT} s"
            time.sleep(0.01)
        procs[target].send_signal(number)
    finally:
        results = [_finish(p, MP_TIMEOUT) for p in procs]
    return results


def _stopped_at(results, workdir, before: int, signalled: int, name: str) -> int:
    """The step both processes stopped at (exit 75, one new checkpoint), each one's line checked."""
    codes, errs = [r[0] for r in results], [r[2] for r in results]
    assert codes == [REQUEUE_STATUS] * 2 and "train: error" not in "".join(errs), (
        errs[0][-3000:] + errs[1][-3000:]
    )
    new = [s for s in _finished_steps(workdir) if s > before]
    assert len(new) == 1 and new[0] < MP_STEPS, _finished_steps(workdir)
    step = new[0]
    saved = f"checkpoint {step} saved in {workdir / 'checkpoints'}; continue with --resume"
    assert f"stopped by {name} at step {step}: {saved}" in errs[signalled], errs[signalled][-2000:]
    other = errs[1 - signalled]
    agreed = (
        f"stopped at step {step}, the step all processes agreed on, because process {signalled} got {name}"
    )
    assert f"{agreed}: {saved}" in other, other[-2000:]
    return step


@pytest.mark.slow
@pytest.mark.heavy  # four 2-process runs: ~2 minutes on 2 loaded cores; `make test-all` runs it
def test_a_signal_to_one_of_two_processes_stops_both_at_one_step_and_resume_is_exact(tmp_path):
    # Process 0 alone writes the compilation cache (JAX's rule); both processes of the later runs read it.
    cache, straight, stopped = tmp_path / "jax_cache", tmp_path / "straight", tmp_path / "stopped"
    results = [_finish(p, MP_TIMEOUT) for p in _pair(straight, tmp_path, "straight", *MP_ARGS, cache=cache)]
    assert [r[0] for r in results] == [0, 0], results[0][2][-3000:] + results[1][2][-3000:]

    # SIGTERM (a scheduler) to process 1, then SIGINT (Ctrl-C) to process 0, the coordinator.
    first = _stopped_at(
        _pair_stopped(stopped, tmp_path, "term", cache, 3, signal.SIGTERM, 1), stopped, 0, 1, "SIGTERM"
    )
    results = _pair_stopped(stopped, tmp_path, "int", cache, first + 3, signal.SIGINT, 0, "--resume")
    assert f"resumed from step {first}" in results[0][1]
    second = _stopped_at(results, stopped, first, 0, "SIGINT")

    results = [
        _finish(p, MP_TIMEOUT) for p in _pair(stopped, tmp_path, "end", *MP_ARGS, "--resume", cache=cache)
    ]
    assert [r[0] for r in results] == [0, 0], results[0][2][-3000:] + results[1][2][-3000:]
    assert f"resumed from step {second}" in results[0][1]
    a, b = load_checkpoint(straight), load_checkpoint(stopped)
    assert a.step == b.step == MP_STEPS and a.data == b.data
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bit for bit


def test_profile_steps_write_a_trace(tmp_path):
    config = apply_overrides(
        load_config(f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke"),
        ["num_train_steps=6", "profile_steps=2,4", "eval_every=6", "checkpoint_every=6"],
    )
    out = io.StringIO()
    train_and_evaluate(config, tmp_path, stream=out, tty=False)
    traces = list((tmp_path / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0, traces
    assert "profile: trace of updates 3..4 written to" in out.getvalue()


@pytest.mark.parametrize("steps", ["4,2", "3,3", "-1,2", "1,2,3"])
def test_bad_profile_steps_are_one_line(steps):
    config = apply_overrides(load_config(f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke"), [f"profile_steps={steps}"])
    with pytest.raises(ConfigError, match="profile_steps must be two ints a < b"):
        check_config(config)
