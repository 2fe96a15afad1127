"""data.pack in the trainer: the config key, its refusal for other models, a packed smoke run, and a packed
train step whose loss sums equal those of the same pairs unpacked."""

import io
import json
import os
import pathlib

import jax
import numpy as np
import pytest

from attn_jax.data import assemble_batch, assemble_packed_batch
from attn_jax.train import (
    ConfigError,
    StepConfig,
    apply_overrides,
    check_config,
    default_config,
    init_train_state,
    load_config,
    model_config,
    optimizer_config,
    read_metrics,
    train_and_evaluate,
)
from attn_jax.train._step import eval_step
from tests.test_data_packing import _fake
from tests.tolerance import assert_close_f32

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
SMOKE = f"{CONFIGS / 'transformer_cpu.py'}:smoke"


def test_pack_defaults_off_and_needs_the_transformer():
    assert default_config("transformer").data.pack is False
    assert default_config().data.pack is False
    with pytest.raises(ConfigError, match=r"data.pack=True needs model.arch=transformer") as e:
        check_config(apply_overrides(default_config(), ["data.pack=true"]))
    assert "\n" not in str(e.value)
    check_config(apply_overrides(default_config("transformer"), ["data.pack=true"]))


def test_packed_step_counts_pairs_and_matches_unpacked_loss():
    config = apply_overrides(load_config(SMOKE), ["model.dropout=0.0"])
    step_cfg = StepConfig(
        model=model_config(config, 50, 50), optimizer=optimizer_config(config), label_smoothing=0.1
    )
    params = init_train_state(step_cfg, 0).params
    corpus = _fake([(3, 2), (4, 5), (2, 3), (6, 4), (5, 6)], seed=2)
    packed = assemble_packed_batch(corpus, [np.array([0, 1, 2]), np.array([3, 4])], 16)
    alone = assemble_batch(corpus, np.arange(5), 16)
    p = jax.device_get(eval_step(params, packed, step_cfg).loss)
    a = jax.device_get(eval_step(params, alone, step_cfg).loss)
    assert p.sentences == 5 and a.sentences == 5  # pairs, not rows
    assert p.tokens == a.tokens == sum(t + 1 for t in (2, 5, 3, 4, 6))
    assert_close_f32([p.loss, p.nll], [a.loss, a.nll], reduction=16 * 5)


def test_packed_smoke_run(tmp_path):
    config = apply_overrides(load_config(SMOKE), ["data.pack=true", "num_train_steps=10", "eval_every=10"])
    out = io.StringIO()
    result = train_and_evaluate(config, str(tmp_path), stream=out, tty=False)
    log = out.getvalue()
    assert result.step == 10
    assert "data: packed " in log and "pairs longer than a row dropped" in log and "(data.pack)" in log
    train = [r for r in read_metrics(os.path.join(tmp_path, "metrics.jsonl")) if r["split"] == "train"]
    # a packed batch of 16 rows of width 16 carries more than the 16 pairs of an unpacked one
    assert all(r["sentences"] > 16 * r_steps for r, r_steps in zip(train, [5, 5], strict=True))
    assert all(np.isfinite(r["loss"]) and r["tokens_per_batch"] > 0 for r in train)
    val = [r for r in read_metrics(os.path.join(tmp_path, "metrics.jsonl")) if r["split"] == "validation"]
    with open(os.path.join(tmp_path, "data.json"), encoding="utf-8") as f:
        kept = json.load(f)["validation"]["kept"]
    assert val and val[-1]["sentences"] == kept  # validation stays unpacked: every kept pair, one a row
