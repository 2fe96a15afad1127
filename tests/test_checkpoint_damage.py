"""A damaged checkpoint (a truncated or deleted file inside a step directory) is neither a traceback nor a silent
substitute: ``translate``, ``evaluate`` and ``train --resume`` name the step that cannot be read and use the next
one that loads, or stop with one line and exit status 1 when none does."""

import glob
import json
import os
import shutil

import jax
import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.cli._noise import DEBUG_LOG
from attn_jax.train import CheckpointManager, load_checkpoint, read_metrics
from tests.test_cli_translate import make_run

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = "the dog slept .\nevery monk stood , because the torch bit fragile lazy bananas .\n"


def _two_step_run(source_run: str, workdir) -> str:
    """A copy of ``source_run`` with checkpoints 2 (validation NLL 2.0) and 4 (1.0: the latest and the best);
    step 4's parameters are step 2's plus one, so the two translate differently."""
    shutil.copytree(os.path.join(source_run, "vocab"), os.path.join(workdir, "vocab"))
    reader = CheckpointManager(os.path.join(source_run, "checkpoints"), async_save=False, read_only=True)
    restored = reader.restore(reader.latest_step())
    reader.close()
    manager = CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False)
    for k, (step, nll) in enumerate(((2, 2.0), (4, 1.0))):
        state = dict(restored.state)
        state["params"] = jax.tree.map(lambda p, k=k: np.asarray(p) + k, restored.state["params"])
        manager.save(step, state, {}, restored.config, {"nll_per_token": nll})
    manager.close()
    return str(workdir)


def _largest_array_file(step_dir) -> str:
    return max(glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")), key=os.path.getsize)


def _damage(step_dir, how: str) -> None:
    """Truncate or delete the largest array data file of a finished step (what a full disk or a stray ``rm``
    leaves)."""
    path = _largest_array_file(step_dir)
    if how == "truncate":
        with open(path, "r+b") as f:
            f.truncate(100)
    else:
        os.remove(path)


@pytest.fixture(scope="module")
def intact_run(tmp_path_factory):
    return _two_step_run(make_run(tmp_path_factory.mktemp("source")), tmp_path_factory.mktemp("intact"))


@pytest.fixture(scope="module")
def input_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("input") / "in.txt"
    path.write_text(SENTENCES, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def translations(intact_run, input_file):
    """Output of ``translate`` from each intact step."""
    out = {}
    for step in (2, 4):
        buf = os.path.join(os.path.dirname(input_file), f"out{step}.txt")
        assert (
            main(
                ["translate", "--workdir", intact_run, "--input", input_file, "--beam", "2"]
                + ["--checkpoint", str(step), "--output", buf]
            )
            == 0
        )
        with open(buf, encoding="utf-8") as f:
            out[step] = f.read()
    assert out[2] != out[4]  # so that an equality with one of them says which step was used
    return out


def _copy(run, tmp_path) -> str:
    target = str(tmp_path / "run")
    shutil.copytree(run, target)
    return target


def _nonblank(err: str) -> list[str]:
    """stderr's lines, less the length-limit warning that every translation of this untrained run triggers and
    the line naming the debug log (there when orbax or asyncio reported the failure too, which is timing-bound).
    """
    lines = [line for line in err.splitlines() if line.strip() and "stopped at the length limit" not in line]
    log = [line for line in lines if " library report(s) " in line]
    assert len(log) <= 1 and all(f"/{DEBUG_LOG} (-v shows them here)" in line for line in log), log
    return [line for line in lines if line not in log]


@pytest.mark.parametrize("checkpoint", ["best", "last"])
@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_translate_uses_the_previous_step_and_names_the_damaged_one(
    intact_run, input_file, translations, tmp_path, capsys, how, checkpoint
):
    run = _copy(intact_run, tmp_path)
    _damage(os.path.join(run, "checkpoints", "4"), how)
    argv = ["translate", "--workdir", run, "--input", input_file, "--beam", "2", "--checkpoint", checkpoint]
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out == translations[2]
    (line,) = _nonblank(err)  # one line: no orbax or asyncio traceback
    assert line.startswith("attn-jax translate: warning: cannot read checkpoint step 4 (")
    order = "next best" if checkpoint == "best" else "newest"
    assert line.endswith(f"using step 2, the {order} one that loads")
    assert os.path.isdir(os.path.join(run, "checkpoints", "4"))  # reading never moves or deletes anything


def test_the_damaged_step_asked_for_by_number_is_an_error(intact_run, input_file, tmp_path, capsys):
    run = _copy(intact_run, tmp_path)
    _damage(os.path.join(run, "checkpoints", "4"), "truncate")
    status = main(["translate", "--workdir", run, "--input", input_file, "--checkpoint", "4"])
    out, err = capsys.readouterr()
    assert status == 1 and out == ""
    (line,) = _nonblank(err)
    assert line.startswith("attn-jax translate: error: cannot read checkpoint step 4 in ")
    assert line.endswith("choose another (kept: [2, 4])")


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_no_readable_checkpoint_is_one_line_and_exit_1(intact_run, input_file, tmp_path, capsys, command):
    run = _copy(intact_run, tmp_path)
    _damage(os.path.join(run, "checkpoints", "4"), "truncate")
    _damage(os.path.join(run, "checkpoints", "2"), "delete")
    extra = ["--input", input_file] if command == "translate" else ["--out", str(tmp_path / "eval")]
    status = main([command, "--workdir", run, *extra])
    out, err = capsys.readouterr()
    assert status == 1 and out == ""
    (line,) = _nonblank(err)
    assert line.startswith(
        f"attn-jax {command}: error: no checkpoint in {run}/checkpoints can be read: step 4 ("
    )
    assert "; step 2 (" in line


def test_evaluate_falls_back_and_records_which_step(intact_run, tmp_path, capsys):
    run = _copy(intact_run, tmp_path)
    _damage(os.path.join(run, "checkpoints", "4"), "delete")
    out_dir = tmp_path / "eval"
    status = main(
        ["evaluate", "--workdir", run, "--beam", "1", "--max-examples", "2", "--heatmaps", "0"]
        + ["--out", str(out_dir)]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    warnings = [line for line in err.splitlines() if "cannot read checkpoint" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: cannot read checkpoint step 4 (")
    assert "checkpoint step 2" in out
    record = json.loads((out_dir / "evaluation.json").read_text(encoding="utf-8"))
    assert record["step"] == 2 and "cannot read checkpoint step 4" in record["checkpoint_note"]


# --- train --resume -----------------------------------------------------------------------------------------

TRAIN = [
    "train",
    "--config",
    os.path.join(_ROOT, "configs", "rnnsearch_cpu.py:smoke"),
    "--config.num_train_steps=4",
    "--config.checkpoint_every=2",
    "--config.eval_every=2",
    "--config.log_every=1",
    "--config.tensorboard=false",
    "--progress=lines",
]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny trained run with checkpoints at steps 2 and 4 (one compilation, shared by the module)."""
    workdir = str(tmp_path_factory.mktemp("trained") / "run")
    assert main([*TRAIN, "--workdir", workdir]) == 0
    return workdir


def _params(workdir, step):
    return jax.tree.leaves(load_checkpoint(workdir, step).state["params"])


def test_resume_sets_the_damaged_step_aside_and_resumes_from_the_previous(trained_run, tmp_path, capsys):
    run = _copy(trained_run, tmp_path)
    damaged = _largest_array_file(os.path.join(run, "checkpoints", "4"))
    _damage(os.path.join(run, "checkpoints", "4"), "truncate")
    damaged_bytes = open(damaged, "rb").read()
    capsys.readouterr()
    status = main([*TRAIN, "--workdir", run, "--resume"])
    out, err = capsys.readouterr()
    assert status == 0, err
    aside = os.path.join(run, "damaged-checkpoints", "4")
    warnings = [line for line in out.splitlines() if line.startswith("warning: cannot read checkpoint")]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: cannot read checkpoint step 4 (")
    assert warnings[0].endswith(
        f"moved it to {aside} (kept, not deleted) and resuming from step 2, the newest checkpoint that loads"
    )
    assert "resumed from step 2" in out
    # The damaged step is kept as it was (moved, not deleted, not overwritten by the resumed run's own step 4).
    with open(damaged.replace(os.path.join(run, "checkpoints", "4"), aside), "rb") as f:
        assert f.read() == damaged_bytes
    # Steps 3 and 4 were trained again: the same compiled program on the same state, so bit for bit.
    for a, b in zip(_params(run, 4), _params(trained_run, 4), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    steps = [r["step"] for r in read_metrics(os.path.join(run, "metrics.jsonl")) if r["split"] == "train"]
    assert steps == [1, 2, 3, 4]


def test_resume_with_no_readable_checkpoint_is_one_line_and_moves_nothing(trained_run, tmp_path, capsys):
    run = _copy(trained_run, tmp_path)
    _damage(os.path.join(run, "checkpoints", "4"), "truncate")
    _damage(os.path.join(run, "checkpoints", "2"), "delete")
    capsys.readouterr()
    status = main([*TRAIN, "--workdir", run, "--resume"])
    _, err = capsys.readouterr()
    assert status == 1
    (line,) = _nonblank(err)
    assert line.startswith(
        f"attn-jax train: error: cannot resume: no checkpoint in {run}/checkpoints can be read: step 4 ("
    )
    assert "; step 2 (" in line and line.endswith(
        "(nothing was moved or deleted; move them away or use another --workdir to start afresh)"
    )
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["2", "4"]
    assert not os.path.exists(os.path.join(run, "damaged-checkpoints"))
