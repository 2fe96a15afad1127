"""One run per directory: a second ``train``, ``train --resume`` or ``average`` on a run another process holds is
refused in one line naming that process; ``kill -9`` of the holder frees the run at once.

The holder is a real process: a tiny Python that loads ``attn_jax/train/_lock.py`` by path (no JAX import, so it
starts in a fraction of a second), takes the lock as ``train`` does and sleeps.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from attn_jax.cli import main
from attn_jax.train import RunLocked, lock_run

LOCK_MODULE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "attn_jax", "train", "_lock.py")
HOLDER = textwrap.dedent(
    """
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("lock", sys.argv[1])
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    held = lock.lock_run(sys.argv[2], "train")
    print("locked", flush=True)
    time.sleep(120)
    """
)
SMOKE = "configs/rnnsearch_cpu.py:smoke"


@pytest.fixture
def holder(tmp_path):
    """``(workdir, process)``: a process that holds ``workdir``'s lock until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, LOCK_MODULE, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield tmp_path, proc
    finally:
        proc.kill()
        proc.wait()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_second_process_is_refused_naming_the_holder(holder, capsys):
    workdir, proc = holder
    with pytest.raises(RunLocked, match=rf"in use by process {proc.pid} \(attn-jax train\)") as caught:
        lock_run(workdir, "train")
    assert caught.value.pid == proc.pid
    for argv, status in [
        (["train", "--config", SMOKE, "--workdir", str(workdir)], 1),
        (["train", "--config", SMOKE, "--workdir", str(workdir), "--resume"], 1),
        (["average", "--workdir", str(workdir), "--last", "2"], 1),
    ]:
        assert main(argv) == status, argv
        line = _one_line(capsys)
        command = argv[0]
        assert line.startswith(f"attn-jax {command}: error: {workdir} is in use by process {proc.pid} "), line
    assert not os.path.exists(workdir / "checkpoints")  # refused before anything was written
    assert proc.poll() is None  # the holder is untouched


def test_kill_9_of_the_holder_frees_the_run(holder):
    workdir, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with lock_run(workdir, "train"):  # the kernel released the lock; the file left behind is not a lock
        assert (workdir / ".lock").read_text().split()[0] == str(os.getpid())
    with lock_run(workdir, "average", create=False):  # released on exit of the block
        pass


def test_average_leaves_a_run_never_locked_as_it_is(tmp_path):
    """``average`` only reads its source run: where no trainer ever made a lock file, it makes none."""
    with lock_run(tmp_path, "average", create=False):
        assert not (tmp_path / ".lock").exists()
        with lock_run(tmp_path, "train"):  # nothing held: a trainer may start
            pass
