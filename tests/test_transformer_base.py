"""configs/transformer_base.py: the full preset carries the paper's numbers (Vaswani et al. 2017, Table 3 "base",
§5.3's learning-rate formula), and its ``:smoke`` variant trains through the normal trainer."""

import dataclasses
import io
import json
import math
import os
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from attn_jax.data import load_vocabularies
from attn_jax.models.transformer import Transformer, TransformerConfig
from attn_jax.pipeline import load_model, translate_sentences
from attn_jax.train import (
    apply_overrides,
    average_checkpoints,
    check_config,
    last_steps,
    load_checkpoint,
    load_config,
    make_schedule,
    model_config,
    optimizer_config,
    read_metrics,
    train_and_evaluate,
    write_averaged_run,
)

PRESET = pathlib.Path(__file__).resolve().parents[1] / "configs" / "transformer_base.py"


def _parameter_count_by_hand(d, d_ff, n_enc, n_dec, src_vocab, tgt_vocab):
    """The base model's parameters written out from §3: attention = 4 projections d×d with biases, FFN = two
    dense layers, LayerNorm = scale and bias per sub-layer; embeddings per vocabulary (src_vocab=0: one shared
    matrix), the softmax's bias."""
    attention = 4 * (d * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder = n_enc * (attention + ffn + 2 * norm)
    decoder = n_dec * (2 * attention + ffn + 3 * norm)
    return encoder + decoder + (src_vocab + tgt_vocab) * d + tgt_vocab  # tied softmax: its bias only


def test_full_preset_has_the_papers_settings():
    c = load_config(str(PRESET))
    check_config(c)
    vocab = c.data.src_vocab_size + 4
    m = model_config(c, src_vocab=vocab, tgt_vocab=c.data.tgt_vocab_size + 4)
    assert isinstance(m, TransformerConfig)
    # Table 3, base: N = 6, d_model = 512, d_ff = 2048, h = 8, d_k = d_v = 64, P_drop = 0.1, ε_ls = 0.1
    assert (m.encoder_layers, m.decoder_layers, m.d_model, m.d_ff, m.heads, m.head_dim) == (
        6,
        6,
        512,
        2048,
        8,
        64,
    )
    assert (m.dropout, c.label_smoothing, m.norm, m.positions) == (0.1, 0.1, "post", "sinusoidal")
    assert (m.share_embeddings, m.normalizer, m.num_kv_heads) == ("all", "softmax", 0)
    # §5.1: one shared byte-pair vocabulary of about 37,000 tokens; batches of about 25,000 tokens a side
    assert c.data.joint_vocab and vocab == c.data.tgt_vocab_size + 4 == 37_000 and vocab % 8 == 0
    assert c.data.batch_tokens == 25_000
    # WMT'14 English→German through TFDS, byte-pair pieces
    d = c.data
    assert (d.corpus, d.tfds_name, d.source_key, d.target_key) == (
        "tfds",
        "wmt14_translate/de-en",
        "en",
        "de",
    )
    assert (d.vocab, d.sentencepiece_type) == ("sentencepiece", "bpe")
    # §5.3: Adam β1 = 0.9, β2 = 0.98, ε = 1e-9; lr = d^-0.5 · min(step^-0.5, step · 4000^-1.5), 100k updates
    opt = optimizer_config(c)
    assert (opt.name, opt.b1, opt.b2, opt.eps, opt.warmup_steps) == ("adam", 0.9, 0.98, 1e-9, 4000)
    assert c.num_train_steps == 100_000 and c.keep_checkpoints >= 5  # the last 5 are averaged (§6.1)
    schedule = make_schedule(opt)
    for step in (1, 10, 1000, 3999, 4000, 4001, 10_000, 100_000):
        paper = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        ours = float(schedule(step))
        # float32 (optax): the linear warm-up computes peak − peak·(1 − step/4000), which cancels at small steps
        # (step 1: 1.2e-11 absolute, 7e-5 relative); elsewhere float32 rounding, ~1e-7 relative
        assert math.isclose(ours, paper, rel_tol=1e-6, abs_tol=1e-10), (step, ours, paper)
    # the model's size, abstractly (no memory): the count written out from the paper's layer shapes
    abstract = nnx.eval_shape(lambda: Transformer(m, rngs=nnx.Rngs(0)))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert count == _parameter_count_by_hand(512, 2048, 6, 6, 0, vocab)
    assert 60e6 < count < 66e6  # ~63M; the paper: 65M
    untied = dataclasses.replace(m, share_embeddings="decoder")  # a source embedding of its own
    untied_count = sum(
        x.size
        for x in jax.tree.leaves(
            nnx.state(nnx.eval_shape(lambda: Transformer(untied, rngs=nnx.Rngs(0))), nnx.Param)
        )
    )
    assert untied_count == _parameter_count_by_hand(512, 2048, 6, 6, vocab, vocab)


def _expected_stop(bleus: list[tuple[int, float]], patience: int, total: int) -> int:
    """Where Keras-style early stopping (min_delta 0, higher is better) ends a run, worked out from the log."""
    best, bad = None, 0
    for step, bleu in bleus:
        if best is None or bleu > best:
            best, bad = bleu, 0
        else:
            bad += 1
        if bad >= patience:
            return step
    return total


def test_smoke_variant_keeps_the_papers_settings_shrunk():
    """The smoke variant changes sizes only: the architecture, optimiser and validation rule are the paper's."""
    config = load_config(f"{PRESET}:smoke")
    full = load_config(str(PRESET))
    for key in ("arch", "heads", "norm", "positions", "share_embeddings", "dropout"):
        assert config.model[key] == full.model[key], key
    assert config.optimizer.to_dict() == {**full.optimizer.to_dict(), "warmup_steps": 0, "accumulate": 2}
    assert config.data.corpus == "synthetic" and config.data.vocab == "word" and config.data.joint_vocab
    assert config.data.batch_tokens == 16 * 16  # token batches, shrunk to the sentence smoke's one shape
    assert config.validation.bleu and config.checkpoint.best_metric == "bleu" == full.checkpoint.best_metric
    assert config.early_stopping.patience == 2


@pytest.mark.heavy  # every feature it combines has its own cheaper test; this one runs them together
def test_smoke_variant_trains_through_the_trainer(tmp_path):
    """The paper's settings shrunk: joint vocabulary, token batches, accumulation, BLEU validation, early
    stopping, then the last checkpoints averaged and translated."""
    config = load_config(f"{PRESET}:smoke")
    # validation and a checkpoint every 2 updates, so early stopping has validations to count
    total = 10
    config = apply_overrides(
        config,
        [
            f"num_train_steps={total}",
            "log_every=2",
            "eval_every=2",
            "checkpoint_every=2",
            "tensorboard=False",
        ],
    )
    out = io.StringIO()
    result = train_and_evaluate(config, str(tmp_path), stream=out, tty=False)
    records = list(read_metrics(os.path.join(tmp_path, "metrics.jsonl")))
    train = [r for r in records if r["split"] == "train"]
    assert all(np.isfinite(r["loss"]) for r in train)
    assert (
        train[-1]["loss"] < train[0]["loss"]
    )  # Adam at the paper's peak rate moves the loss within a few updates
    validation = [r for r in records if r["split"] == "validation"]
    assert all(np.isfinite(r["loss"]) and 0 <= r["bleu"] <= 100 and 0 <= r["chrf"] <= 100 for r in validation)
    stop = _expected_stop([(r["step"], r["bleu"]) for r in validation], patience=2, total=total)
    assert result.step == stop and result.stopped_early == (stop < total)
    assert [r["step"] for r in validation] == list(range(2, stop + 1, 2))
    assert "each update accumulates 2 batches" in out.getvalue()
    assert load_checkpoint(tmp_path, step=stop).data["next_index"] == 2 * stop  # 2 micro-batches an update
    # One vocabulary for both sides, and no batch over the token budget.
    src_vocab, tgt_vocab = load_vocabularies(tmp_path / "vocab")
    assert src_vocab == tgt_vocab
    with open(tmp_path / "data.json", encoding="utf-8") as f:
        buckets = json.load(f)["train_batches"]
    assert buckets and all(b["rows"] * b["length"] <= 16 * 16 for b in buckets)
    # The last two checkpoints averaged: the mean of their parameters, computed here in float64.
    steps = last_steps(tmp_path, 2)
    averaged = average_checkpoints(tmp_path, steps)
    a, b = (load_checkpoint(tmp_path, step=s).state["params"] for s in steps)
    mean = jax.tree.map(lambda x, y: (np.asarray(x, np.float64) + np.asarray(y, np.float64)) / 2, a, b)
    jax.tree.map(lambda m, p: np.testing.assert_allclose(p, m, rtol=1e-6, atol=1e-7), mean, averaged.params)
    run = write_averaged_run(tmp_path, tmp_path / "averaged", averaged)
    loaded = load_model(run, "last")
    [[hyp]] = translate_sentences(loaded, ["a b c"], beam_size=4)
    assert isinstance(hyp.text, str)
