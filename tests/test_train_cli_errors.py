"""``attn-jax train`` failures are one line on stderr with the documented exit status, never a traceback: a
workdir that cannot be made or written (1), a full disk during a checkpoint save (1, reported as soon as the
background save fails, the last good checkpoint intact), a negative seed (2, before anything runs) and a config
file whose ``get_config`` raises (2)."""

import errno
import os
import tempfile
import time

import pytest

from attn_jax.cli import main
from attn_jax.train import CheckpointManager, ConfigError, check_config, load_checkpoint, read_metrics
from attn_jax.train import load_config as _load_config

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(_ROOT, "configs", "rnnsearch_cpu.py:smoke")
TRAIN = ["train", "--config", SMOKE, "--config.tensorboard=false", "--progress=lines"]


def _one_line(capsys, status: int, expected_status: int) -> str:
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == expected_status, err
    assert len(lines) == 1 and lines[0].startswith("attn-jax train: error: "), err
    return lines[0][len("attn-jax train: error: ") :]


# --- the workdir ----------------------------------------------------------------------------------------------


def test_workdir_that_is_a_regular_file(tmp_path, capsys):
    path = tmp_path / "run"
    path.write_text("not a run\n")
    line = _one_line(capsys, main([*TRAIN, "--workdir", str(path)]), 1)
    assert line == f"{path} exists and is not a directory; choose another --workdir"
    assert path.read_text() == "not a run\n"


@pytest.mark.parametrize("below", ["run", "a/b/run"])
def test_workdir_under_a_regular_file(tmp_path, capsys, below):
    blocker = tmp_path / "file"
    blocker.write_text("")
    workdir = blocker / below
    line = _one_line(capsys, main([*TRAIN, "--workdir", str(workdir)]), 1)
    assert line == f"cannot write the run directory {workdir}: Not a directory ({blocker} is a file)"


def test_workdir_on_a_read_only_filesystem(tmp_path, capsys, monkeypatch):
    # As root a directory cannot be made read-only with chmod; the filesystem's answer is simulated instead.
    real_makedirs = os.makedirs
    workdir = tmp_path / "ro" / "run"

    def makedirs(name, *args, **kwargs):
        if os.path.abspath(name) == str(workdir):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(name))
        return real_makedirs(name, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs)
    line = _one_line(capsys, main([*TRAIN, "--workdir", str(workdir)]), 1)
    assert line == f"cannot write the run directory {workdir}: Read-only file system"


def test_existing_workdir_that_takes_no_file(tmp_path, capsys, monkeypatch):
    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), dir)

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    line = _one_line(capsys, main([*TRAIN, "--workdir", str(tmp_path)]), 1)
    assert line == f"cannot write the run directory {tmp_path}: Permission denied"


# --- config errors: exit 2, before anything runs ------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 2**63])
def test_seed_out_of_range_is_a_config_error(tmp_path, capsys, seed):
    workdir = tmp_path / "run"
    line = _one_line(capsys, main([*TRAIN, "--workdir", str(workdir), f"--config.seed={seed}"]), 2)
    assert line == f"seed must be an int in [0, 2**63 - 1], got {seed}"
    assert not workdir.exists()  # refused before the workdir, the corpus or a compilation
    config = _load_config(SMOKE)
    config.seed = 2**63 - 1
    check_config(config)  # the largest seed is accepted
    config.seed = -1
    with pytest.raises(ConfigError, match="^seed must be"):
        check_config(config)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "    c = default_config()\n    return c.model.hiden\n",
            'AttributeError: \'hiden\' Did you mean "hidden" instead of "hiden"?',  # ml_collections' own words
        ),
        ("    raise RuntimeError('needs a GPU')\n", "RuntimeError: needs a GPU"),
    ],
)
def test_get_config_that_raises_is_a_config_error(tmp_path, capsys, body, message):
    path = tmp_path / "x.py"
    path.write_text(f"from attn_jax.train import default_config\n\ndef get_config(arg=None):\n{body}")
    line = _one_line(capsys, main(["train", "--config", str(path), "--workdir", str(tmp_path / "run")]), 2)
    assert line == f"{path}: get_config raised {message}"


# --- a full disk during a checkpoint save -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_disk_full_during_a_save_stops_at_once_with_one_line(tmp_path, capsys, monkeypatch, mode):
    """Saves at 3, 6 and 9 of 9 updates; the one at 6 runs out of space. The failure must stop the run before
    update 7 (not at the next save, 9) and leave step 3 as the intact latest checkpoint."""
    import orbax.checkpoint as ocp

    handler = ocp.handlers.JsonCheckpointHandler
    real_write = handler._save_fn

    async def write(self, x, directory):  # the background writer of the data/config items
        if f"{os.sep}6.orbax-checkpoint-tmp" in str(directory):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return await real_write(self, x, directory)

    monkeypatch.setattr(handler, "_save_fn", write)
    real_save = CheckpointManager.save

    def save_then_let_it_fail(self, step, *args, **kwargs):
        # The trainer outpaces the background write; let the failing write finish before the next update, so
        # that "at once" is the next update whatever the machine's speed.
        real_save(self, step, *args, **kwargs)
        deadline = time.monotonic() + 60
        while self._manager.is_saving_in_progress() and time.monotonic() < deadline:
            time.sleep(0.01)

    monkeypatch.setattr(CheckpointManager, "save", save_then_let_it_fail)
    workdir = tmp_path / "run"
    argv = [*TRAIN, "--workdir", str(workdir), "--config.num_train_steps=9", "--config.checkpoint_every=3"]
    argv += ["--config.eval_every=100", "--config.log_every=1"]
    argv += [f"--config.async_checkpoints={'true' if mode == 'async' else 'false'}"]
    line = _one_line(capsys, main(argv), 1)
    checkpoints = workdir / "checkpoints"
    assert line.startswith(
        f"cannot write checkpoint step 6 in {checkpoints}: OSError: No space left on device"
    )
    assert line.endswith(
        "the last good checkpoint is step 3 (intact; resume from it with --resume once the cause is fixed)"
    )
    train_steps = [r["step"] for r in read_metrics(workdir / "metrics.jsonl") if r["split"] == "train"]
    assert train_steps == [1, 2, 3, 4, 5, 6]  # stopped at once, not at the save after step 9
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.isdigit()) == ["3"]
    restored = load_checkpoint(workdir)
    assert restored.step == 3 and restored.note == ""


def test_any_other_write_failure_is_one_line(tmp_path, capsys, monkeypatch):
    from attn_jax.train import MetricsLogger

    def full(self, split, step, values):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)

    monkeypatch.setattr(MetricsLogger, "write", full)
    workdir = tmp_path / "run"
    argv = [*TRAIN, "--workdir", str(workdir), "--config.num_train_steps=2", "--config.log_every=1"]
    line = _one_line(capsys, main(argv), 1)
    assert line == f"{workdir / 'metrics.jsonl'}: No space left on device"
