"""Checkpoint averaging (``attn_jax.train.average_checkpoints``, ``attn-jax average``): the mean equals a float64
NumPy mean of each step's parameters read back through orbax, the averaged run translates and evaluates, the
source run is left as it was, a failed write leaves nothing, and errors are one line."""

import doctest
import io
import json
import os

import jax
import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.train import (
    AverageError,
    CheckpointManager,
    average_checkpoints,
    last_steps,
    load_checkpoint,
)
from tests.test_cli_translate import make_run

STEPS = (1, 2, 3)


def _add_steps(run: str, steps, shift=lambda k, path, x: x, config=None) -> None:
    """Save ``steps`` to ``run`` with step 1's state and parameters drawn afresh (N(0, 0.5²), seed = step), so
    every step differs; ``shift(step, path, x)`` may change a parameter (another shape, for a mismatch)."""
    base = load_checkpoint(run, step=1)
    manager = CheckpointManager(os.path.join(run, "checkpoints"), keep=10, async_save=False)
    for step in steps:
        rng = np.random.default_rng(step)
        state = dict(base.state)
        state["params"] = jax.tree_util.tree_map_with_path(
            lambda path, p, step=step, rng=rng: shift(
                step,
                jax.tree_util.keystr(path),
                rng.normal(0.0, 0.5, np.shape(p)).astype(np.asarray(p).dtype),
            ),
            base.state["params"],
        )
        manager.save(step, state, {}, config or base.config, None)
    manager.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("run"))  # step 1, with validation metrics
    _add_steps(run, STEPS[1:])
    return run


def _listing(run: str) -> dict[str, float]:
    """Every file under ``run/checkpoints`` with its size and mtime: a changed or removed file shows."""
    out = {}
    for root, _, files in os.walk(os.path.join(run, "checkpoints")):
        for name in files:
            st = os.stat(os.path.join(root, name))
            out[os.path.join(root, name)] = (st.st_size, st.st_mtime_ns)
    return out


def _numpy_mean(run: str, steps) -> dict:
    """The reference: each step's parameters read with orbax's own restore, averaged with ``np.mean`` in float64."""
    trees = [load_checkpoint(run, step=s).state["params"] for s in steps]
    return jax.tree.map(
        lambda *xs: np.mean(np.stack([np.asarray(x, np.float64) for x in xs]), axis=0).astype(
            np.asarray(xs[0]).dtype
        ),
        *trees,
    )


def test_average_equals_a_float64_numpy_mean(run_dir):
    got = average_checkpoints(run_dir, [3, 1, 2])  # any order; averaged ascending
    assert got.steps == STEPS
    assert got.config == load_checkpoint(run_dir, step=3).config
    want = _numpy_mean(run_dir, STEPS)
    assert jax.tree.structure(got.params) == jax.tree.structure(want)
    for path, a in jax.tree_util.tree_leaves_with_path(got.params):
        b = want
        for key in path:
            b = b[key.key]
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
        # Both sum three float64 values (in another order) and round once to float32: at most one ulp apart.
        np.testing.assert_allclose(a, b, rtol=1.2e-7, atol=0, err_msg=jax.tree_util.keystr(path))
    # The mean is not one of its terms (the steps' parameters differ), and two steps give another mean.
    first = load_checkpoint(run_dir, step=1).state["params"]
    leaf = lambda t: jax.tree.leaves(t)[0]  # noqa: E731
    assert not np.allclose(leaf(got.params), leaf(first))
    pair = average_checkpoints(run_dir, [2, 3]).params
    np.testing.assert_allclose(leaf(pair), leaf(_numpy_mean(run_dir, (2, 3))), rtol=1.2e-7, atol=0)
    assert last_steps(run_dir, 2) == [2, 3] and last_steps(run_dir, 3) == [1, 2, 3]


@pytest.mark.slow  # compiles beam search for translate and evaluate
def test_cli_average_then_translate_and_evaluate(run_dir, tmp_path, capsys, monkeypatch):
    before = _listing(run_dir)
    assert main(["average", "--workdir", run_dir, "--last", "2"]) == 0
    out, err = capsys.readouterr()
    output = os.path.join(run_dir, "averaged-last-2")
    assert err == "" and out.count("\n") == 1
    assert "steps 2, 3" in out and output in out
    assert _listing(run_dir) == before  # the source checkpoints are only read
    assert sorted(os.listdir(run_dir)) == ["averaged-last-2", "checkpoints", "vocab"]  # no temporary left
    record = json.load(open(os.path.join(output, "averaged.json")))
    assert record["steps"] == [2, 3] and record["step"] == 3 and record["source_workdir"] == run_dir
    assert CheckpointManager(os.path.join(output, "checkpoints"), read_only=True).all_steps() == [3]

    # translate loads the average: its parameters, one line out per line in (a warning: no validation metrics)
    from attn_jax.pipeline import load_model

    loaded = load_model(output)
    assert loaded.step == 3 and "no kept checkpoint has validation metrics" in loaded.note
    from flax import nnx

    want = _numpy_mean(run_dir, (2, 3))
    got = nnx.to_pure_dict(nnx.state(loaded.model, nnx.Param))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1.2e-7, atol=0)
    lines = ["the dog slept .", "", "every monk stood quietly ."]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["translate", "--workdir", output, "--beam", "2", "--checkpoint", "last"]) == 0
    out, err = capsys.readouterr()
    assert "error" not in err  # an untrained model may run to the length limit: translate warns about that
    assert len(out.splitlines()) == len(lines) and out.splitlines()[1] == ""

    status = main(
        ["evaluate", "--workdir", output, "--split", "test", "--beam", "1", "--max-examples", "3",
         "--heatmaps", "0", "--checkpoint", "last", "--out", str(tmp_path / "eval")]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "checkpoint step 3" in out and (tmp_path / "eval" / "evaluation.json").is_file()

    # a second average to the same place is refused, and the first one is left as it was
    assert main(["average", "--workdir", run_dir, "--last", "2"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "already exists" in err
    assert CheckpointManager(os.path.join(output, "checkpoints"), read_only=True).all_steps() == [3]


def test_a_failed_write_leaves_nothing(run_dir, tmp_path, monkeypatch):
    from attn_jax.train import _average, write_averaged_run

    averaged = average_checkpoints(run_dir, [1, 2])

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_average.CheckpointManager, "save", full_disk)
    with pytest.raises(AverageError, match="No space left on device"):
        write_averaged_run(run_dir, tmp_path / "avg", averaged)
    assert os.listdir(tmp_path) == []  # neither the output nor its temporary directory


def _average_cli(argv, capsys):
    try:
        status = main(["average", *argv])
    except SystemExit as e:  # argparse's bad-flag exit
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--last", "1"], 1, "at least 2 checkpoints, got --last 1"),
        (["--steps", "2"], 1, "at least 2 checkpoints, got 1: [2]"),
        (["--last", "4"], 1, "keeps 3 checkpoint(s) [1, 2, 3], fewer than the 4 asked for"),
        (["--steps", "1,7,9"], 1, "no checkpoint at step(s) [7, 9] (kept: [1, 2, 3])"),
        (["--steps", "2,2"], 1, "step(s) [2] given more than once"),
        (["--steps", "two,3"], 2, "expected comma-separated step numbers"),
        ([], 2, "one of the arguments --last --steps is required"),
    ],
)
def test_errors_are_one_line(run_dir, capsys, argv, status, message):
    got, out, err = _average_cli(
        ["--workdir", run_dir, "--output", os.path.join(run_dir, "x"), *argv], capsys
    )
    assert got == status and out == "" and message in err
    if status == 1:  # argparse's own errors (status 2) come after its usage line
        assert err.count("\n") == 1
    assert not os.path.exists(os.path.join(run_dir, "x"))


def test_missing_run_and_missing_vocabularies(tmp_path, capsys):
    status, _, err = _average_cli(["--workdir", str(tmp_path / "nope"), "--last", "2"], capsys)
    assert status == 1 and err == f"attn-jax average: error: {tmp_path / 'nope'}: no such run directory\n"
    status, _, err = _average_cli(["--workdir", str(tmp_path), "--last", "2"], capsys)
    assert status == 1 and "no checkpoint" in err and err.count("\n") == 1


def test_mismatched_shapes_name_the_parameter(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    target = {}

    def grow(step, path, x):
        if step == 2 and not target:  # one parameter of step 2 gets another row
            target["path"], target["shape"] = path, x.shape
            return np.concatenate([x, x[:1]], axis=0)
        return x

    _add_steps(run, [2], shift=grow)
    status, out, err = _average_cli(["--workdir", run, "--steps", "1,2"], capsys)
    path, shape = target["path"], list(target["shape"])
    grown = [shape[0] + 1, *shape[1:]]
    assert status == 1 and out == "" and err.count("\n") == 1
    assert f"parameter {path} is float32{shape} in step 1 but float32{grown} in step 2" in err
    assert not os.path.exists(os.path.join(run, "averaged-steps-1-2"))


def test_mismatched_model_configs_are_refused(tmp_path):
    run = make_run(tmp_path / "run")
    config = load_checkpoint(run, step=1).config
    old = config["model"]["attention_init"]
    config["model"] = {**config["model"], "attention_init": "other"}  # same shapes, another model
    _add_steps(run, [2], config=config)
    with pytest.raises(
        AverageError, match=rf"different model configs \(model.attention_init: '{old}' vs 'other'\)"
    ):
        average_checkpoints(run, [1, 2])


def test_docstring_example():
    from attn_jax.train import _average

    result = doctest.testmod(_average, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 1
