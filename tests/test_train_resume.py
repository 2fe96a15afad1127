"""Kill-and-resume: ``attn-jax train`` killed with SIGKILL in the middle of writing a checkpoint (after an earlier
one finished), then resumed, ends with the same losses and bit-identical parameters as a run that was never
interrupted; the half-written save does not disturb the resumption.

Three subprocesses share a JAX compilation cache, so only the first one compiles, and compile with XLA's backend
(LLVM) optimisation level 0: half the compile time, and steps this small run as fast. All three use the same
flags, so they run the same compiled programs.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from attn_jax.train import load_checkpoint, read_metrics
from tests.conftest import TEST_XLA_FLAGS

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
STEPS = 50
# Frequent checkpoints (every 5 updates of a few milliseconds): the run spends most of its time saving. The kill
# comes during a save after step 20 (one of six, at 25, 30, ..., 50; in practice the one at 25), so the resumed
# run typically trains 30 more updates, validating (at 25 and 50) and saving on the way.
ARGS = [
    "--config",
    f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke",
    f"--config.num_train_steps={STEPS}",
    "--config.checkpoint_every=5",
    "--config.keep_checkpoints=2",
    "--config.eval_every=25",
    "--config.log_every=5",
    "--config.tensorboard=false",
    "--progress=lines",
]


def _command(workdir, *extra):
    return [sys.executable, "-m", "attn_jax.cli", "train", *ARGS, "--workdir", str(workdir), *extra]


def _env(cache):
    env = dict(os.environ)
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {TEST_XLA_FLAGS}",
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    return env


def _run(cmd, env, timeout=600):
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _temporary(workdir):
    d = pathlib.Path(workdir) / "checkpoints"
    return sorted(p.name for p in d.iterdir() if ".orbax-checkpoint-tmp" in p.name) if d.is_dir() else []


def _finished_steps(workdir):
    d = pathlib.Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    env = _env(tmp_path / "jax_cache")
    _run(_command(tmp_path / "straight"), env)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_command(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Wait for a finished checkpoint at step >= 20, then for the next save to be under way (orbax's
        # temporary directory exists only while a save is being written), and kill the process right then.
        deadline = time.monotonic() + 300
        while not (any(s >= 20 for s in _finished_steps(killed)) and _temporary(killed)):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    last = max(_finished_steps(killed))
    assert last < STEPS, "the kill came too late to interrupt anything"
    left_over = _temporary(
        killed
    )  # usually the half-written save (unless it was renamed just before the kill)
    print(f"killed after step {last}; temporary directories left: {left_over}")

    resumed = _run(_command(killed, "--resume"), env)
    assert f"resumed from step {last}" in resumed.stdout

    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(killed)
    assert a.step == b.step == STEPS and a.data == b.data
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b.state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bit for bit

    def losses(workdir):
        return [
            (r["step"], r["loss"], r["grad_norm"])
            for r in read_metrics(workdir / "metrics.jsonl")
            if r["split"] == "train"
        ]

    assert losses(killed) == losses(tmp_path / "straight")
    assert len(losses(killed)) == STEPS // 5
