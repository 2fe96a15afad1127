"""``train_and_evaluate`` on a device mesh (``parallel.strategy``), in process on the 8 fake CPU devices.

Three runs of the RNNsearch smoke config share a module fixture (its single-device run reuses the steps
``tests/test_train_loop.py`` compiled, when both files run in one session): ``none`` (one device, 6 updates, checkpoints at
3 and 6); ``data`` (data=4, 3 updates); and that run resumed on another mesh, ``data+tensor`` with data=2 ×
model=2, to update 6. The data-parallel run must end where the single-device run is at update 3, and the
resumed run where it ends at 6: the same batches (the iterator position travels in the checkpoint), the same
updates.
"""

import io
import json
import os
import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from attn_jax.train import (
    ConfigError,
    apply_overrides,
    check_config,
    default_config,
    load_checkpoint,
    load_config,
    read_metrics,
    train_and_evaluate,
)

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
SMOKE = f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke"
COMMON = ["eval_every=3", "checkpoint_every=3", "log_every=1", "tensorboard=false"]
DATA4 = ["parallel.strategy=data", "parallel.data=4"]
DATA2_MODEL2 = ["parallel.strategy=data+tensor", "parallel.data=2", "parallel.model=2"]
FSDP4, FSDP2 = (["parallel.strategy=fsdp", f"parallel.data={n}"] for n in (4, 2))

# The sharded step sums per-device partial sums (then all-reduces them) where one device sums the whole batch:
# the same numbers in another order, ~1e-7 relative per reduction. Adam (eps=1e-8) divides each gradient entry
# by its own running scale, so the parameters inherit the gradients' relative roundoff, not the gradients'
# magnitude: after 3-6 updates (the smoke preset's Adam, lr a few 1e-3) the parameters (O(0.01..1)) differ by
# < 1e-6 (measured 7e-7); atol=1e-5 is a few hundredths of one update, so a wrong batch, a skipped or repeated
# update would fail it. Several Adam updates (eps=1e-8, dividing by √v) lie between the compared numbers, not one
# program's rounding, so this is the policy's amplified case (tests/conftest.py): a measured tolerance of its own
# rather than tests.tolerance's single-program formula, and still far above float32 rounding (14× the measurement).
RTOL, ATOL = 1e-5, 1e-5


def _run(tmp, name, overrides, *, resume=False, workdir=None):
    config = apply_overrides(load_config(SMOKE), COMMON + overrides)
    out = io.StringIO()
    result = train_and_evaluate(config, workdir or tmp / name, resume=resume, stream=out, tty=False)
    return result, out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharded_loop")
    none, _ = _run(tmp, "none", ["num_train_steps=6"])
    data4, data4_log = _run(tmp, "data4", ["num_train_steps=3", *DATA4])
    data4_step3 = load_checkpoint(tmp / "data4", step=3)  # before the resumed run adds its checkpoints
    resumed, resumed_log = _run(
        tmp, "data4", ["num_train_steps=6", *DATA2_MODEL2], resume=True, workdir=tmp / "data4"
    )
    return dict(
        tmp=tmp,
        none=none,
        data4=data4,
        data4_log=data4_log,
        data4_step3=data4_step3,
        resumed=resumed,
        resumed_log=resumed_log,
    )


def _close(got, want, rtol=RTOL, atol=ATOL):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves) > 0
    for a, b in zip(got_leaves, want_leaves, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _train_losses(workdir):
    return {
        r["step"]: (r["loss"], r["grad_norm"], r["tokens"])
        for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
        if r["split"] == "train"
    }


@pytest.mark.slow  # the module's three runs compile 3 train steps (~1 min idle, 4 min on 2 loaded cores)
@pytest.mark.heavy
def test_data_parallel_run_equals_the_single_device_run(runs):
    tmp, data4 = runs["tmp"], runs["data4"]
    want = load_checkpoint(tmp / "none", step=3)
    got = runs["data4_step3"]
    assert got.step == want.step == 3
    _close(got.state["params"], want.state["params"])
    _close(got.state["opt_state"], want.state["opt_state"])
    # The updates moved the parameters by far more than the tolerance (a vacuous comparison would not).
    later = load_checkpoint(tmp / "none", step=6).state["params"]
    moved = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(later), jax.tree.leaves(want.state["params"]), strict=True)
    )
    assert moved > 100 * ATOL
    # Per-step losses: the same global batches, in the same order.
    got_losses, want_losses = _train_losses(tmp / "data4"), _train_losses(tmp / "none")
    for step in (1, 2, 3):  # (4-6 come from the resumed run, in the same workdir)
        np.testing.assert_allclose(got_losses[step], want_losses[step], rtol=1e-5)
    # Validation is sharded too, and pools the same sentences.
    val = [r for r in read_metrics(tmp / "none" / "metrics.jsonl") if r["split"] == "validation"]
    assert data4.validation["sentences"] == val[0]["sentences"]
    assert data4.validation["loss"] == pytest.approx(val[0]["loss"], rel=1e-5)
    assert "mesh data=4 × model=1 × stage=1 over 4 devices" in runs["data4_log"]
    # Parameters live on the mesh, replicated (data parallelism splits only the batch).
    embedding = data4.state.params["tgt_embed"]["embedding"]
    assert len(embedding.sharding.device_set) == 4 and embedding.sharding.spec == P(None, None)


@pytest.mark.slow
@pytest.mark.heavy
def test_checkpoint_resumes_on_another_mesh(runs):
    tmp, none, resumed, log = runs["tmp"], runs["none"], runs["resumed"], runs["resumed_log"]
    assert "resumed from step 3" in log and "parallel.strategy" in log  # the changed keys are named
    assert resumed.step == 6
    _close(resumed.state.params, none.state.params)
    _close(resumed.state.opt_state, none.state.opt_state)
    got_losses, want_losses = _train_losses(tmp / "data4"), _train_losses(tmp / "none")
    assert sorted(got_losses) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        np.testing.assert_allclose(got_losses[step], want_losses[step], rtol=1e-5)
    # The restored state lives on the new mesh, split as the data+tensor rules say (align=16 splits over 2).
    w_q = resumed.state.params["attention"]["params"]["w_q"]
    assert len(w_q.sharding.device_set) == 4 and w_q.sharding.spec == P(None, "model")
    assert load_checkpoint(tmp / "data4").data["next_index"] == 6
    assert json.loads((tmp / "data4" / "config.json").read_text())["parallel"]["model"] == 2


@pytest.fixture(scope="module")
def fsdp_runs(runs):
    """A fully sharded run on 4 devices to update 3, resumed on 2 devices (still fully sharded) to update 6."""
    tmp = runs["tmp"]
    first, log = _run(tmp, "fsdp4", ["num_train_steps=3", *FSDP4])
    step3 = load_checkpoint(tmp / "fsdp4", step=3)
    resumed, _ = _run(tmp, "fsdp4", ["num_train_steps=6", *FSDP2], resume=True, workdir=tmp / "fsdp4")
    return dict(first=first, log=log, step3=step3, resumed=resumed)


@pytest.mark.slow
@pytest.mark.heavy
def test_fully_sharded_run_equals_the_single_device_run_and_resumes_on_fewer_devices(runs, fsdp_runs):
    tmp, none = runs["tmp"], runs["none"]
    want = load_checkpoint(tmp / "none", step=3)
    _close(fsdp_runs["step3"].state["params"], want.state["params"])
    _close(fsdp_runs["step3"].state["opt_state"], want.state["opt_state"])
    resumed = fsdp_runs["resumed"]
    assert resumed.step == 6
    _close(resumed.state.params, none.state.params)
    _close(resumed.state.opt_state, none.state.opt_state)
    got_losses, want_losses = _train_losses(tmp / "fsdp4"), _train_losses(tmp / "none")
    for step in range(1, 7):
        np.testing.assert_allclose(got_losses[step], want_losses[step], rtol=1e-5)
    # The parameters and Adam's moments are split over data on either mesh; the log says how much.
    embedding = fsdp_runs["first"].state.params["tgt_embed"]["embedding"]
    assert len(embedding.sharding.device_set) == 4 and "data" in embedding.sharding.spec
    w_q = resumed.state.params["attention"]["params"]["w_q"]
    assert len(w_q.sharding.device_set) == 2 and "data" in w_q.sharding.spec
    assert "sharding: " in fsdp_runs["log"] and "parameter arrays split over the mesh" in fsdp_runs["log"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["parallel.strategy=fsdp+data"], "parallel.strategy='fsdp\\+data': fsdp already splits the batch"),
        (["parallel.strategy=model"], "parallel.strategy must be none or one of data, tensor"),
        (["parallel.strategy=data", "parallel.model=2"], "parallel.model=2 but parallel.strategy='data'"),
        (["parallel.data=2"], "parallel.data=2 but parallel.strategy='none'"),
        (["parallel.strategy=data", "parallel.data=-1"], "parallel.data must be >= 0"),
        (
            ["parallel.strategy=data", "parallel.data=3"],
            "data.batch_size=80 must be a multiple of parallel.data=3",
        ),
        (["parallel.strategy=data+tensor"], "parallel.data and parallel.model are both 0"),
        (["parallel.strategy=pipeline"], "which model.arch='rnnsearch' does not have"),
    ],
)
def test_parallel_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_config(apply_overrides(default_config(), overrides))


def test_gnmt_pipeline_stages_must_match_the_stage_axis():
    gnmt = default_config("gnmt")
    check_config(
        apply_overrides(gnmt, ["parallel.strategy=pipeline", "model.pipeline_stages=2"])
    )  # stage=0: 2
    check_config(
        apply_overrides(
            gnmt, ["parallel.strategy=data+pipeline", "model.pipeline_stages=2", "parallel.stage=2"]
        )
    )
    with pytest.raises(ConfigError, match="parallel.stage=3 differs from model.pipeline_stages=2"):
        check_config(
            apply_overrides(
                gnmt, ["parallel.strategy=pipeline", "model.pipeline_stages=2", "parallel.stage=3"]
            )
        )
    with pytest.raises(ConfigError, match="needs model.pipeline_stages >= 2"):
        check_config(apply_overrides(gnmt, ["parallel.strategy=pipeline"]))
    with pytest.raises(ConfigError, match="model.pipeline_stages=2 needs a pipeline parallel.strategy"):
        check_config(apply_overrides(gnmt, ["parallel.strategy=data", "model.pipeline_stages=2"]))


def test_a_mesh_larger_than_the_devices_is_a_config_error(tmp_path):
    config = apply_overrides(load_config(SMOKE), ["parallel.strategy=data", "parallel.data=16"])
    with pytest.raises(
        ConfigError, match="parallel.data=16 × parallel.model=1 × parallel.stage=1 needs 16 devices"
    ):
        train_and_evaluate(config, tmp_path, stream=io.StringIO())
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
