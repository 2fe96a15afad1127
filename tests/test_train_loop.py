"""The training loop on the smoke config, in process: the loss falls, metrics.jsonl and TensorBoard hold sane
values, checkpoints keep the last K plus the best, resumption is exact, a NaN stops the run cleanly.

One smoke run (module fixture) is shared; the other runs reuse its compiled steps (same static StepConfig).
"""

import io
import json
import math
import os
import pathlib
import shutil

import jax
import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.data import load_vocabularies
from attn_jax.train import (
    CheckpointManager,
    ConfigError,
    StepConfig,
    apply_overrides,
    evaluate,
    init_train_state,
    load_checkpoint,
    load_config,
    make_inputs,
    model_config,
    optimizer_config,
    read_metrics,
    train_and_evaluate,
)

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
SMOKE = f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    config = load_config(SMOKE)
    out = io.StringIO()
    result = train_and_evaluate(config, workdir, stream=out, tty=False)
    return config, workdir, result, out.getvalue()


def _records(workdir, split):
    return [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if r["split"] == split]


def _leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True))


def test_loss_falls(smoke_run):
    _, workdir, result, log = smoke_run
    train = _records(workdir, "train")
    assert [r["step"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["loss"] < train[0]["loss"] - 0.3, [r["loss"] for r in train]
    val = _records(workdir, "validation")
    assert [r["step"] for r in val] == [10, 20, 30]
    assert val[-1]["loss"] < val[0]["loss"] - 0.2
    assert result.step == 30 and {"step": 30, "split": "validation", **result.validation} == val[-1]
    assert "step 30/30: loss" in log and "validation @ step 30" in log  # plain lines when not a TTY


def test_metrics_jsonl_values_are_sane(smoke_run):
    _, workdir, _, _ = smoke_run
    for r in _records(workdir, "train") + _records(workdir, "validation"):
        assert r["ppl"] == pytest.approx(math.exp(r["nll_per_token"]))
        assert r["loss"] == pytest.approx(r["nll_per_token"])  # no label smoothing in this config
        assert r["nll_per_sentence"] == pytest.approx(r["nll_per_token"] * r["tokens"] / r["sentences"])
    for r in _records(workdir, "train"):
        assert (
            r["tokens_per_s"] >= 0
            and r["grad_norm"] > 0
            and r["learning_rate"] == pytest.approx(load_config(SMOKE).optimizer.learning_rate)
        )
        assert r["tokens"] > 0 and r["sentences"] == 5 * 16  # 5 steps of 16 sentences per window
    for r in _records(workdir, "validation"):
        assert r["sentences"] == 33  # every validation pair within the length limit, once
        assert 0 <= r["attn_entropy"] <= math.log(16)
        for key in (
            "attn_entropy_norm",
            "attn_coverage_low",
            "attn_diag_band",
            "attn_gold_mass",
            "attn_gold_hit",
        ):
            assert 0.0 <= r[key] <= 1.0 + 1e-6, key
        assert r["attn_coverage_dev"] >= 0
        assert r["attn_diag_corr"] is None or -1.0 <= r["attn_diag_corr"] <= 1.0


def test_attention_at_init_is_uniform_entropy_by_hand(smoke_run, tmp_path):
    """Freshly initialised additive attention (weights ~N(0, 0.01²)) is nearly uniform: its mean entropy is the
    mean of log(S_b) over the real target rows, computed here from the batches by hand."""
    config, _, _, _ = smoke_run
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False)
    step_cfg = StepConfig(
        model=model_config(config, inputs.src_vocab.size, inputs.tgt_vocab.size),
        optimizer=optimizer_config(config),
    )
    state = init_train_state(step_cfg, config.seed)
    got = evaluate(state.params, inputs.validation, step_cfg)
    logs = [
        math.log(s)
        for b in inputs.validation
        for s, t in zip(b.src_len, b.tgt_len, strict=True)
        for _ in range(t)
    ]
    assert got["attn_entropy"] == pytest.approx(np.mean(logs), rel=1e-3)
    assert got["attn_entropy_norm"] == pytest.approx(1.0, abs=1e-3)
    # uniform weights: coverage of a word is T_b / S_b
    covs = [
        t / s
        for b in inputs.validation
        for s, t in zip(b.src_len, b.tgt_len, strict=True)
        if s
        for _ in range(s)
    ]
    assert got["attn_coverage_dev"] == pytest.approx(np.mean(np.abs(np.array(covs) - 1)), rel=1e-2)
    assert got["ppl"] == pytest.approx(inputs.tgt_vocab.size, rel=0.05)  # untrained: about uniform over V


def test_tensorboard_scalars_read_by_tensorboard(smoke_run):
    """TensorBoard's own reader finds, per split, one event file whose scalars are metrics.jsonl's numbers."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, workdir, _, _ = smoke_run
    for split in ("train", "validation"):
        logdir = pathlib.Path(workdir) / "tensorboard" / split
        assert len(list(logdir.glob("events.out.tfevents.*"))) == 1
        acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
        acc.Reload()
        records = _records(workdir, split)
        numeric = {
            k
            for r in records
            for k, v in r.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
        }
        assert set(acc.Tags()["scalars"]) == numeric
        for tag in numeric:
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            want = [(r["step"], r[tag]) for r in records if r.get(tag) is not None]
            assert [s for s, _ in got] == [s for s, _ in want], tag
            # float32 on disk (simple_value), float64 in the JSON
            assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), tag


def test_checkpoints_vocab_and_config(smoke_run):
    config, workdir, result, _ = smoke_run
    ckpt = load_checkpoint(workdir)
    assert ckpt.step == 30 and ckpt.data["next_index"] == 30
    assert _leaves_equal(ckpt.state["params"], result.state.params)
    assert ckpt.config == json.loads(config.to_json())
    assert sorted(
        int(p.name) for p in (pathlib.Path(workdir) / "checkpoints").iterdir() if p.name.isdigit()
    ) == [10, 20, 30]
    val = {r["step"]: r["nll_per_token"] for r in _records(workdir, "validation")}
    assert result.best_step == min(val, key=val.get)
    assert load_checkpoint(workdir, best=True).step == result.best_step
    src, tgt = load_vocabularies(os.path.join(workdir, "vocab"))
    assert ckpt.state["params"]["src_embed"]["embedding"].shape[0] == src.size
    assert ckpt.state["params"]["tgt_embed"]["embedding"].shape[0] == tgt.size


def test_existing_checkpoints_need_resume(smoke_run):
    config, workdir, _, _ = smoke_run
    with pytest.raises(ConfigError, match="already holds checkpoints.*--resume"):
        train_and_evaluate(config, workdir, stream=io.StringIO())


def test_resume_continues_exactly(smoke_run, tmp_path):
    """Stop at step 20 (a finished run), resume to 30: same losses and bit-identical parameters as one run."""
    config, ref_dir, ref, _ = smoke_run
    first = train_and_evaluate(
        apply_overrides(config, ["num_train_steps=20"]), tmp_path, stream=io.StringIO(), tty=False
    )
    assert first.step == 20
    out = io.StringIO()
    resumed = train_and_evaluate(config, tmp_path, resume=True, stream=out, tty=True)
    assert resumed.step == 30 and _leaves_equal(resumed.state.params, ref.state.params)
    assert _leaves_equal(resumed.state.opt_state, ref.state.opt_state)
    for split, keys in (
        ("train", ("loss", "grad_norm", "learning_rate")),
        ("validation", ("loss", "attn_entropy")),
    ):
        keys = ("step", "nll_per_token", "tokens", "sentences", *keys)
        got = [{k: r[k] for k in keys} for r in _records(tmp_path, split)]
        want = [{k: r[k] for k in keys} for r in _records(ref_dir, split)]
        assert got == want, split
    log = out.getvalue()
    assert "resumed from step 20" in log and "num_train_steps" in log  # the changed key is named
    assert "\r" in log and "tok/s" in log and "ETA" in log  # the TTY progress bar
    assert "step 30/30: loss" in log  # and above it the loss history, printed as permanent lines (issue 17)


def test_nan_stops_the_run_with_the_last_checkpoint_intact(smoke_run, tmp_path, capsys):
    workdir = tmp_path / "nan"
    status = main(
        [
            "train",
            "--config",
            SMOKE,
            "--workdir",
            str(workdir),
            "--config.debug.inject_nan_at_step=15",
            "--progress=lines",
        ]
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("attn-jax train: error: ")]
    assert status == 3 and len(lines) == 1, err
    assert "training diverged: loss nan" in lines[0] and "at step 15" in lines[0]
    assert "last good checkpoint is step 10" in lines[0] and "Traceback" not in err
    ckpt = load_checkpoint(workdir)
    assert ckpt.step == 10
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(ckpt.state))
    _, ref_dir, _, _ = smoke_run
    assert _leaves_equal(ckpt.state["params"], load_checkpoint(ref_dir, step=10).state["params"])
    assert max(r["step"] for r in read_metrics(workdir / "metrics.jsonl")) == 10


def _tree(x):
    return {"w": np.full((3,), x, np.float32), "step": np.int32(x)}


def test_keeps_last_k_and_the_best(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2, keep_best=True, async_save=False)
    for step in range(1, 7):
        metrics = {2: 0.5, 4: 1.0, 6: 2.0}.get(step)
        manager.save(
            step,
            _tree(step),
            {"next_index": step},
            {"seed": 0},
            None if metrics is None else {"nll_per_token": metrics},
        )
    assert manager.all_steps() == [2, 5, 6] and manager.best_step() == 2 and manager.latest_step() == 6
    manager.close()


def test_half_written_save_never_hides_the_last_good_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3, async_save=False)
    for step in (1, 2):
        manager.save(step, _tree(step), {"next_index": step}, {"seed": 0})
    manager.close()
    # What a process killed during orbax's save of step 3 leaves: a temporary directory, never renamed.
    partial = tmp_path / "3.orbax-checkpoint-tmp-1234567"
    shutil.copytree(tmp_path / "2", partial)
    shutil.rmtree(partial / "state")
    (partial / "commit_success.txt").unlink(missing_ok=True)
    manager = CheckpointManager(tmp_path, keep=3, async_save=False)
    assert manager.latest_step() == 2
    restored = manager.restore(2, jax.eval_shape(lambda: _tree(0)))
    assert restored.data == {"next_index": 2} and np.array_equal(
        restored.state["w"], np.full(3, 2.0, np.float32)
    )
    manager.save(3, _tree(3), {"next_index": 3}, {"seed": 0})  # the step can be written again
    assert manager.latest_step() == 3
    manager.close()


def _numpy_state(cfg, scale=0.5):
    """A fresh :class:`TrainState` for ``cfg`` without compiling the initialiser: the structure and dtypes are
    ``init_train_state``'s own (``jax.eval_shape``: traced, not compiled), parameters N(0, scale²) from NumPy,
    everything else zero, which is what a fresh Adam state (count and moments) and step are. (Compiling the real
    initialiser costs ~10 s per model config; the smoke run above uses it.)"""
    abstract = jax.eval_shape(lambda: init_train_state(cfg, 0))
    rng = np.random.default_rng(0)
    zeros = lambda s: np.zeros(s.shape, s.dtype)  # noqa: E731
    return abstract.replace(
        step=zeros(abstract.step),
        params=jax.tree.map(lambda s: rng.normal(0.0, scale, s.shape).astype(s.dtype), abstract.params),
        opt_state=jax.tree.map(zeros, abstract.opt_state),
        rng=zeros(abstract.rng),  # RNNsearch has no dropout: the run key is never read
    )


@pytest.mark.slow  # two more train-step compilations (~10 s each on 2 loaded cores)
def test_mixed_precision_keeps_float32_params_and_optimizer_state(rng):
    """bf16 compute: the step's loss is close to float32's, parameters and Adam moments stay float32."""
    from attn_jax.data import Batch
    from attn_jax.models import small_config
    from attn_jax.train import OptimizerConfig, train_step

    base = small_config("rnnsearch", src_vocab=13, tgt_vocab=11, embed=8, hidden=12, maxout=6, align=10)
    opt = OptimizerConfig(name="adam", learning_rate=1e-3, eps=1e-8)
    lens = np.array([5, 3, 4], np.int32)
    mask = np.arange(6)[None] < lens[:, None]
    batch = Batch(
        src=np.where(mask, rng.integers(4, 13, (3, 6)), 0).astype(np.int32),
        src_len=lens,
        tgt_in=np.where(mask, rng.integers(4, 11, (3, 6)), 0).astype(np.int32),
        tgt_out=np.where(mask, rng.integers(4, 11, (3, 6)), 0).astype(np.int32),
        tgt_len=lens,
        example_id=np.arange(3, dtype=np.int32),
    )
    losses = {}
    for dtype in ("float32", "bfloat16"):
        cfg = StepConfig(model=base.replace(dtype=dtype), optimizer=opt)
        # The same N(0, 0.5²) parameters for both (param_dtype is float32 in both configs); at this spread the
        # logits matter (loss 4.8 nats vs log V = 2.4), unlike at the paper's N(0, 0.01²) initialisation.
        state, metrics = train_step(_numpy_state(cfg), batch, cfg)
        losses[dtype] = float(metrics.loss.loss / metrics.loss.tokens)
        assert {x.dtype for x in jax.tree.leaves(state.params)} == {np.dtype("float32")}
        assert {x.dtype for x in jax.tree.leaves(state.opt_state)} <= {np.dtype("float32"), np.dtype("int32")}
    # bf16 matmul operands (8 bits of mantissa): logits differ by ~1e-3 relative (measured loss: 1e-4 relative).
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=1e-2)
