"""Save on preemption and the profiler trace.

``attn-jax train`` sent SIGTERM mid-run saves the step in flight, exits with 75 (requeue), and ``--resume``
ends with the losses and bit-identical parameters of a run never interrupted. The signal handlers are checked
in process (one signal saves, a second Ctrl-C interrupts, the old handlers come back), and
``profile_steps`` writes a trace TensorBoard's profile plugin reads.
"""

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


def test_several_processes_stop_where_the_preemption_sync_point_says(monkeypatch):
    # In a multi-process run JAX's preemption notifier keeps SIGTERM and picks one step for all processes;
    # the request only asks it at each step.
    import attn_jax.train._preempt as preempt

    asked = []
    monkeypatch.setattr(preempt.jax, "process_count", lambda: 2)
    monkeypatch.setattr(
        preempt.multihost_utils, "reached_preemption_sync_point", lambda step: asked.append(step) or step == 7
    )
    before = signal.getsignal(signal.SIGTERM)
    with stop_requests() as request:
        assert signal.getsignal(signal.SIGTERM) == before  # left to JAX's notifier
        assert [request.due(step) for step in range(5, 9)] == [False, False, True, False]
        assert request.signal_name == "SIGTERM"
    assert asked == [5, 6, 7, 8]


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
