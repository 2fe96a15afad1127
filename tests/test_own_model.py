"""Bring your own model (issue 17 item 4): a model that is none of the library's -- examples/own_model.py -- is
trained by the trainer, decoded by beam search and evaluated through the public API, named as
``model.arch = "module:Class"``; and a bad name is a one-line config error.

Independent checks: teacher forcing equals a Python loop over the model's own ``decode_step``; beam search with
beam 1 equals a greedy loop written here; the trainer lowers the loss of the custom model.
"""

import json
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))
import own_model  # noqa: E402

from attn_jax.decoding import beam_search  # noqa: E402
from attn_jax.pipeline import DecodeOptions, evaluate_workdir, load_model, translate_sentences  # noqa: E402
from attn_jax.train import (  # noqa: E402
    ConfigError,
    apply_overrides,
    build_module,
    default_config,
    model_config,
    read_metrics,
    train_and_evaluate,
)

ARCH = "own_model:TinyConfig"


def _small_model(key=0):
    return own_model.TinyConfig(src_vocab=13, tgt_vocab=11, embed=6, hidden=10).build(rngs=nnx.Rngs(key))


def test_teacher_forcing_equals_its_own_step_loop(rng):
    model = _small_model()
    src = jnp.asarray(rng.integers(4, 13, (3, 7)), jnp.int32)
    src_mask = jnp.arange(7)[None, :] < jnp.array([[7], [4], [2]])
    tgt_in = jnp.asarray(rng.integers(4, 11, (3, 5)), jnp.int32)
    logits, weights = model(src, src_mask, tgt_in)
    enc = model.encode(src, src_mask)
    state = model.init_decoder_state(enc)
    for i in range(5):
        step_logits, state, step_weights = model.decode_step(enc, state, tgt_in[:, i])
        np.testing.assert_allclose(logits[:, i], step_logits, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(weights[:, i], step_weights, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(weights)[~np.broadcast_to(np.asarray(src_mask)[:, None], weights.shape)] == 0.0)


def test_beam_one_is_a_greedy_loop(rng):
    model = _small_model(1)
    src = jnp.asarray(rng.integers(4, 13, (2, 6)), jnp.int32)
    src_mask = jnp.arange(6)[None, :] < jnp.array([[6], [3]])
    result = beam_search(model, src, src_mask, beam_size=1, max_length=8, length_penalty_alpha=0.0)
    enc = model.encode(src, src_mask)
    state = model.init_decoder_state(enc)
    prev = jnp.ones((2,), jnp.int32)  # BOS
    greedy, done = [[], []], [False, False]
    for _ in range(8):
        logits, state, _ = model.decode_step(enc, state, prev)
        prev = jnp.argmax(logits, -1).astype(jnp.int32)
        for b in range(2):
            if not done[b]:
                greedy[b].append(int(prev[b]))
                done[b] = int(prev[b]) == 2
    for b in range(2):
        n, tokens = int(result.lengths[b, 0]), list(np.asarray(result.tokens[b, 0]))
        if bool(result.truncated[b, 0]):  # stopped at max_length: its </s> forced in the last position
            assert n == 8 and tokens[: n - 1] == greedy[b][: n - 1] and tokens[n - 1] == 2
        else:
            assert tokens[:n] == greedy[b][:n] and tokens[n - 1] == 2


def _run_config(tmp_path):
    config = own_model.run_config(steps=30)
    config.data.synthetic_spec.update(train_size=400, validation_size=40, test_per_bucket=3)
    config = apply_overrides(config, ["data.synthetic=custom", "eval_every=30", "log_every=10"])
    config.data.data_dir = str(tmp_path / "tfds")
    return config


def test_trained_decoded_and_evaluated_through_the_public_api(tmp_path):
    config = _run_config(tmp_path)
    assert config.model.arch == ARCH and config.model.hidden == own_model.TinyConfig.hidden
    workdir = tmp_path / "run"
    result = train_and_evaluate(config, workdir, tty=False)
    assert result.step == 30
    losses = [m["loss"] for m in read_metrics(workdir / "metrics.jsonl") if m.get("split") == "train"]
    assert losses[-1] < losses[0] - 0.5, losses  # it learns (from ln 898 ≈ 6.8 nats)
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["arch"] == ARCH

    loaded = load_model(workdir)  # rebuilt from config.json through model.arch
    assert isinstance(loaded.model, own_model.TinyTranslator)
    [hyps] = translate_sentences(loaded, ["the purple teapot threw the student ."], beam_size=3, nbest=2)
    assert len(hyps) == 2 and hyps[0].score >= hyps[1].score
    att = hyps[0].attention  # [m + 1, n + 1]: 7 source words + </s>, rows summing to 1
    assert att.shape == (len(hyps[0].tokens) + 1, 8) and np.allclose(att.sum(-1), 1.0, atol=1e-5)

    out = evaluate_workdir(workdir, split="test", decode=DecodeOptions(beam_size=2), max_examples=6)
    assert out["num_sentences"] == 6 and 0.0 <= out["bleu"] <= 100.0 and 0.0 <= out["aer"]["aer"] <= 1.0
    assert json.loads((workdir / "eval" / "test" / "evaluation.json").read_text())["bleu"] == out["bleu"]


def test_model_config_builds_the_class_with_the_runs_fields():
    config = apply_overrides(default_config(ARCH), ["model.hidden=12"])
    m = model_config(config, 20, 30)
    assert m == own_model.TinyConfig(src_vocab=20, tgt_vocab=30, embed=32, hidden=12)
    built = m.build(rngs=nnx.Rngs(0))
    module = build_module(m, nnx.to_pure_dict(nnx.state(built, nnx.Param)))  # how a checkpoint is loaded
    assert isinstance(module, own_model.TinyTranslator) and module.encoder.out_features == 12
    src, mask, tgt = jnp.full((2, 4), 5, jnp.int32), jnp.ones((2, 4), bool), jnp.full((2, 3), 6, jnp.int32)
    np.testing.assert_array_equal(
        module(src, mask, tgt)[0], built(src, mask, tgt)[0]
    )  # same program, same params


@pytest.mark.parametrize(
    "arch,message",
    [
        ("no_such_module_xyz:Config", "cannot import module 'no_such_module_xyz'"),
        ("own_model:Missing", "module 'own_model' has no 'Missing'"),
        ("own_model:TinyState", "TinyState is not a dataclass"),
        ("json:JSONDecoder", "JSONDecoder is not a dataclass"),
        ("rnnsarch", "model.arch must be one of rnnsearch, rnnenc, gnmt, transformer or 'module:Class'"),
    ],
)
def test_a_bad_model_arch_is_a_one_line_config_error(arch, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        default_config(arch)
    assert "\n" not in str(e.value)
