"""A training run with gradient accumulation and a moving average of the weights (EMA), end to end.

One tiny run (module fixture: the smoke config at tiny widths, 4 updates of 2 micro-batches each) is shared: its
log and checkpoints say what it did, a resumed run equals it bit for bit, ``--weights ema`` loads the checkpoint's
moving average, and averaging its checkpoints still works. A run without a moving average (an averaged run)
answers ``--weights ema`` with one line; checkpoints written without the field restore into the new state.
"""

import io
import os
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from attn_jax.cli import main
from attn_jax.pipeline import TranslateError, load_model
from attn_jax.train import (
    CheckpointManager,
    TrainState,
    apply_overrides,
    average_checkpoints,
    load_checkpoint,
    load_config,
    read_metrics,
    train_and_evaluate,
    write_averaged_run,
)

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
K, STEPS = 2, 4
OVERRIDES = [
    "model.embed=8",
    "model.hidden=10",
    "model.maxout=6",
    "model.align=7",
    f"num_train_steps={STEPS}",
    "log_every=2",
    "eval_every=2",
    "checkpoint_every=2",
    "tensorboard=false",
    f"optimizer.accumulate={K}",
    "optimizer.ema_decay=0.5",
]


def _config(*extra):
    return apply_overrides(load_config(f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke"), [*OVERRIDES, *extra])


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ema")
    out = io.StringIO()
    result = train_and_evaluate(_config(), workdir, stream=out, tty=False)
    return str(workdir), result, out.getvalue()


def _equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
    )


def _records(workdir, split):
    return [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if r["split"] == split]


@pytest.mark.slow  # shares a module fixture that compiles its programs (~10-30 s)
def test_log_and_checkpoint_of_an_accumulating_ema_run(ema_run):
    workdir, result, log = ema_run
    assert f"each update accumulates {K} batches (micro-batches)" in log
    assert "moving average of the weights with decay min(0.5, (1+t)/(10+t))" in log
    assert "validation @ step 2:" in log and log.count("| EMA weights") == 2  # steps 2 and 4
    ckpt = load_checkpoint(workdir, step=STEPS)
    assert ckpt.data["next_index"] == K * STEPS  # the iterator's position counts micro-batches
    assert _equal(ckpt.state["ema_params"], result.state.ema_params)  # saved and restored unchanged
    assert _equal(ckpt.state["params"], result.state.params)
    assert not _equal(ckpt.state["ema_params"], ckpt.state["params"])
    train = _records(workdir, "train")
    assert [r["step"] for r in train] == [2, 4] and all(np.isfinite(r["loss"]) for r in train)
    # A train record pools the tokens of every micro-batch: its update count times K batches of 16 sentences.
    assert all(r["sentences"] == 2 * K * 16 for r in train)


@pytest.mark.slow  # shares a module fixture that compiles its programs (~10-30 s)
def test_resumed_accumulating_run_equals_the_uninterrupted_one(ema_run, tmp_path):
    workdir, result, _ = ema_run
    train_and_evaluate(_config("num_train_steps=2"), tmp_path, stream=io.StringIO(), tty=False)
    out = io.StringIO()
    resumed = train_and_evaluate(_config(), tmp_path, resume=True, stream=out, tty=False)
    assert "resumed from step 2" in out.getvalue()
    assert _equal(resumed.state.params, result.state.params)
    assert _equal(resumed.state.ema_params, result.state.ema_params)
    assert _equal(resumed.state.opt_state, result.state.opt_state)
    for split in ("train", "validation"):
        keys = ("step", "loss", "tokens", "sentences")
        got = [{k: r[k] for k in keys} for r in _records(tmp_path, split)]
        assert got == [{k: r[k] for k in keys} for r in _records(workdir, split)], split


def _params(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


@pytest.mark.slow  # shares a module fixture that compiles its programs (~10-30 s)
def test_weights_ema_loads_the_checkpoints_moving_average(ema_run):
    workdir, _, _ = ema_run
    ckpt = load_checkpoint(workdir, step=STEPS)
    ema = load_model(workdir, "last", weights="ema")
    raw = load_model(workdir, "last")
    assert ema.weights == "ema" and raw.weights == "raw" and ema.step == raw.step == STEPS
    assert _equal(_params(ema.model), ckpt.state["ema_params"])
    assert _equal(_params(raw.model), ckpt.state["params"])


@pytest.mark.slow  # shares a module fixture that compiles its programs (~10-30 s)
def test_averaging_an_ema_run_and_weights_ema_on_a_run_without_it(ema_run, tmp_path, capsys):
    workdir, _, _ = ema_run
    averaged = average_checkpoints(workdir, [2, 4])
    steps = [load_checkpoint(workdir, step=s).state["params"] for s in (2, 4)]
    want = jax.tree.map(lambda a, b: ((np.float64(a) + np.float64(b)) / 2).astype(np.float32), *steps)
    assert _equal(averaged.params, want)
    out = write_averaged_run(workdir, tmp_path / "avg", averaged)
    with pytest.raises(TranslateError, match="holds no moving average of the weights"):
        load_model(out, "last", weights="ema")
    for command in ("translate", "evaluate"):
        status = main([command, "--workdir", out, "--checkpoint", "last", "--weights", "ema"])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert status == 1 and len(lines) == 1, lines
        assert lines[0].startswith(f"attn-jax {command}: error: ") and "--weights raw" in lines[0]


def test_checkpoints_with_and_without_the_field_restore_into_either_state(tmp_path):
    """A checkpoint written before ``ema_params`` existed restores with it ``None`` (the trainer then starts the
    average from the parameters); one holding it restores into a state without it by dropping it."""
    params = {"w": np.arange(3, dtype=np.float32)}
    old = {"step": np.int32(3), "params": params, "opt_state": (), "rng": np.zeros(2, np.uint32)}
    new = TrainState(**old, ema_params={"w": np.full(3, 7.0, np.float32)})
    manager = CheckpointManager(tmp_path, async_save=False)
    manager.save(1, old, {}, {})
    manager.save(2, new, {}, {})
    without = jax.eval_shape(lambda: TrainState(**old))
    with_ema = jax.eval_shape(lambda: new)
    for step, target, ema in (
        (1, without, None),
        (1, with_ema, None),
        (2, without, None),
        (2, with_ema, 7.0),
    ):
        state = manager.restore(step, target).state
        assert isinstance(state, TrainState) and int(state.step) == 3
        assert np.array_equal(state.params["w"], params["w"])
        assert (state.ema_params is None) if ema is None else np.all(state.ema_params["w"] == ema)
    manager.close()
