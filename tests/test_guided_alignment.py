"""Guided alignment (Chen et al. 2016; Garg et al. 2019): the loss against a float64 loop reference (value and
gradients), padding and unlinked rows left out (a hand-computed case), the train step with and without it, a
short run in which the loss falls and the gold hit rises, Pharaoh files beside a plain/tsv corpus, config errors.
"""

import dataclasses
import io
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_jax.data import CorpusError, read_plain_corpus, read_tsv_corpus
from attn_jax.train import (
    ConfigError,
    StepConfig,
    alignment_loss,
    alignment_loss_sums,
    apply_overrides,
    check_config,
    default_config,
    init_train_state,
    load_config,
    make_inputs,
    model_config,
    optimizer_config,
    read_metrics,
    train_and_evaluate,
    train_step,
)
from tests.tolerance import assert_close_f32

B, T, S = 3, 5, 7
CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
SMOKE = f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke"


def _reference(weights, gold, src_mask, tgt_mask):
    """float64, loop by loop: (mean loss over supervised rows, d loss / d weights)."""
    w = np.asarray(weights, np.float64)
    total, rows = 0.0, 0
    grad = np.zeros_like(w)
    for b in range(w.shape[0]):
        for j in range(w.shape[1]):
            if not tgt_mask[b, j]:
                continue
            links = [i for i in range(w.shape[2]) if gold[b, j, i] and src_mask[b, i]]
            if not links:
                continue
            rows += 1
            for i in links:
                total -= math.log(w[b, j, i]) / len(links)
                grad[b, j, i] -= 1.0 / (len(links) * w[b, j, i])
    return total / max(rows, 1), grad / max(rows, 1), rows


def _random_case(seed):
    rng = np.random.default_rng(seed)
    src_len, tgt_len = np.array([7, 4, 1]), np.array([5, 3, 2])
    src_mask = np.arange(S) < src_len[:, None]
    tgt_mask = np.arange(T) < tgt_len[:, None]
    scores = rng.normal(size=(B, T, S)) * 2.0
    gold = rng.random((B, T, S)) < 0.3  # links into padding too: they must be ignored
    return scores.astype(np.float32), gold, src_mask, tgt_mask


def test_loss_and_gradient_match_float64_reference():
    scores, gold, src_mask, tgt_mask = _random_case(0)
    weights = jax.nn.softmax(jnp.asarray(scores), axis=-1)
    value, grad = jax.value_and_grad(alignment_loss)(weights, gold, src_mask, tgt_mask)
    ref, ref_grad, rows = _reference(np.asarray(weights), gold, src_mask, tgt_mask)
    assert rows >= 4  # the draw supervises several rows of several sentences
    assert abs(float(value) - ref) <= 1e-5 * abs(ref)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, rtol=1e-5, atol=1e-6)
    sums = alignment_loss_sums(weights, gold, src_mask, tgt_mask)
    assert float(sums.rows) == rows


def test_gradient_through_softmax_is_weights_minus_gold_distribution():
    """d/dz of -Σ p log softmax(z) is softmax(z) - p per supervised row (p sums to 1): an independent check."""
    scores, gold, src_mask, tgt_mask = _random_case(1)
    grad = jax.grad(lambda z: alignment_loss(jax.nn.softmax(z, axis=-1), gold, src_mask, tgt_mask))(scores)
    z = np.asarray(scores, np.float64)
    alpha = np.exp(z - z.max(-1, keepdims=True))
    alpha /= alpha.sum(-1, keepdims=True)
    g = gold & src_mask[:, None, :] & tgt_mask[:, :, None]
    n = g.sum(-1, keepdims=True)
    supervised = n > 0
    p = np.where(supervised, g / np.maximum(n, 1), 0.0)
    ref = np.where(supervised, alpha - p, 0.0) / supervised.sum()
    np.testing.assert_allclose(np.asarray(grad), ref, rtol=1e-4, atol=1e-6)


def test_hand_computed_case_excludes_padding_and_unlinked_rows():
    nan = float("nan")
    # Sentence 0: 3 real source words + 1 pad, 3 real target rows + 1 pad.
    w = np.array(
        [
            [
                [0.5, 0.25, 0.25, nan],  # links 0 and 1: -(log .5 + log .25) / 2
                [0.2, 0.2, 0.6, 0.0],  # no links: unsupervised
                [0.1, 0.1, 0.8, nan],  # link 2 and a link into the pad column: -log .8
                [nan, nan, nan, nan],  # padding row with a link: ignored
            ]
        ],
        np.float32,
    )
    gold = np.zeros((1, 4, 4), bool)
    gold[0, 0, [0, 1]] = True
    gold[0, 2, [2, 3]] = True
    gold[0, 3, 0] = True
    src_mask, tgt_mask = np.array([[1, 1, 1, 0]], bool), np.array([[1, 1, 1, 0]], bool)
    value, grad = jax.value_and_grad(alignment_loss)(jnp.asarray(w), gold, src_mask, tgt_mask)
    expected = (-(math.log(0.5) + math.log(0.25)) / 2 - math.log(0.8)) / 2
    assert abs(float(value) - expected) <= 1e-6 * expected
    want = np.zeros((1, 4, 4))
    want[0, 0, 0], want[0, 0, 1] = -0.5 / 0.5 / 2, -0.5 / 0.25 / 2
    want[0, 2, 2] = -1 / 0.8 / 2
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6)  # exact zeros (not NaN) on every pad cell
    s = alignment_loss_sums(jnp.asarray(w), gold, src_mask, tgt_mask)
    assert float(s.rows) == 2.0


def test_zero_weight_on_a_gold_link_is_finite_and_nothing_supervised_is_zero():
    w = jnp.array([[[1.0, 0.0]]])
    gold = jnp.array([[[False, True]]])
    m = jnp.ones((1, 2), bool), jnp.ones((1, 1), bool)
    value, grad = jax.value_and_grad(alignment_loss)(w, gold, *m)
    assert abs(float(value) + math.log(np.finfo(np.float32).tiny)) < 1e-3
    assert np.all(np.isfinite(np.asarray(grad)))
    assert float(alignment_loss(w, jnp.zeros_like(gold), *m)) == 0.0


def test_shape_errors_name_the_shapes():
    w = jnp.ones((2, 3, 4))
    with pytest.raises(ValueError, match=r"gold \[B, T, S\] \[2, 4, 3\]"):
        alignment_loss(w, jnp.ones((2, 4, 3), bool), jnp.ones((2, 4), bool), jnp.ones((2, 3), bool))
    with pytest.raises(ValueError, match=r"src_mask \[B, S\] \[2, 3\]"):
        alignment_loss(w, jnp.ones((2, 3, 4), bool), jnp.ones((2, 3), bool), jnp.ones((2, 3), bool))


# ------------------------------------------------------------------------------------------------ train step


@pytest.fixture(scope="module")
def smoke_inputs(tmp_path_factory):
    config = apply_overrides(load_config(SMOKE), ["lambda_align=1.0"])
    inputs = make_inputs(config, str(tmp_path_factory.mktemp("vocab")), reuse_vocab=False)
    # fan-in initialisation: the paper's (v_a = 0, W_a, U_a ~ N(0, 0.001²)) makes the attention's first gradient
    # too small to tell the two objectives apart by their gradient norms.
    model = dataclasses.replace(
        model_config(config, inputs.src_vocab.size, inputs.tgt_vocab.size), attention_init="fan_in"
    )
    return config, inputs, model


def test_train_step_with_and_without_the_term(smoke_inputs):
    config, inputs, model = smoke_inputs
    batch = next(iter(inputs.validation))
    assert batch.gold is not None
    plain = StepConfig(model=model, optimizer=optimizer_config(config))
    guided = StepConfig(model=model, optimizer=optimizer_config(config), lambda_align=0.7)

    def run(cfg, b):
        state = init_train_state(cfg, jnp.int32(3))
        return train_step(state, b, cfg)

    s0, m0 = run(plain, batch)
    s0_nogold, _ = run(plain, batch._replace(gold=None))
    assert m0.align is None
    for x, y in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s0_nogold.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # at 0 the gold is never read

    s1, m1 = run(guided, batch)
    assert float(m1.align.rows) > 0
    # The update is that of loss/tokens + λ·align_loss: the grad norm equals that of the sum computed by hand.
    from attn_jax.train import build_module, loss_sums

    params = init_train_state(guided, jnp.int32(3)).params
    src_mask, tgt_mask = batch.src_mask, batch.tgt_mask

    def objective(p):
        logits, w = build_module(model, p)(batch.src, src_mask, batch.tgt_in)
        sums = loss_sums(logits, batch.tgt_out, tgt_mask)
        return sums.loss / sums.tokens + 0.7 * alignment_loss(w, batch.gold, src_mask, tgt_mask)

    grads = jax.jit(jax.grad(objective))(params)  # one compiled program, not op-by-op dispatch
    norm = float(jnp.sqrt(sum(jnp.sum(g.astype(jnp.float32) ** 2) for g in jax.tree.leaves(grads))))
    assert_close_f32(float(m1.grad_norm), norm, reduction=64)
    assert abs(float(m1.grad_norm) - float(m0.grad_norm)) > 1e-3 * float(m0.grad_norm)


@pytest.mark.heavy  # two trainer runs (~70 s of CPU): make test-all; the train-step test checks the objective
def test_short_run_loss_falls_and_gold_hit_rises(tmp_path):
    """60 smoke updates: with λ = 2 the alignment loss falls and validation's gold hit beats λ = 0's."""
    hits, logs = {}, {}
    for lam in (0.0, 2.0):
        config = apply_overrides(
            load_config(SMOKE),
            [f"lambda_align={lam}", "num_train_steps=60", "eval_every=60", "checkpoint_every=60"],
        )
        workdir = tmp_path / f"lam{lam}"
        out = io.StringIO()
        train_and_evaluate(config, workdir, stream=out, tty=False)
        records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
        val = [r for r in records if r["split"] == "validation"][-1]
        hits[lam], logs[lam] = val["attn_gold_hit"], out.getvalue()
        train = [r for r in records if r["split"] == "train"]
        if lam == 0.0:
            assert all("align_loss" not in r for r in records)
            continue
        first, last = train[0]["align_loss"], train[-1]["align_loss"]
        assert last < 0.95 * first, (first, last)
        print(f"align_loss {first:.3f} -> {last:.3f}")
        assert "align_loss" in val and " | align " in logs[lam]
    print(f"gold hit {hits}")
    assert hits[2.0] > hits[0.0] + 0.1, hits


# -------------------------------------------------------------------------------------- Pharaoh files


def _write(path, lines):
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    return str(path)


def test_plain_corpus_reads_alignments_beside_the_text(tmp_path):
    src = _write(tmp_path / "a.src", ["a b c", "", "d e"])
    tgt = _write(tmp_path / "a.tgt", ["x y", "z", "u v w"])
    links = _write(tmp_path / "a.align", ["0-0 2-1", "0-0", "1?2 0-0"])
    c = read_plain_corpus(src, tgt, links)
    assert c.alignments == ("0-0 2-1", "1?2 0-0") and c.skipped_empty == 1  # the empty pair's line goes too


def test_tsv_corpus_reads_alignments(tmp_path):
    tsv = _write(tmp_path / "a.tsv", ["a b\tx", "", "c\ty z"])
    links = _write(tmp_path / "a.align", ["1-0", "", ""])
    c = read_tsv_corpus(tsv, alignment_path=links)
    assert c.alignments == ("1-0", "")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0-0 1x1", r"a\.align:2: malformed alignment link '1x1'"),
        ("0-0 -1", r"a\.align:2: malformed alignment link '-1'"),
        ("0-0 2-0", r"a\.align:2: alignment link '2-0' out of range: the pair has 2 source and 1 target"),
        ("0-1", r"a\.align:2: alignment link '0-1' out of range"),
    ],
)
def test_bad_alignment_line_names_file_and_line(tmp_path, line, message):
    src = _write(tmp_path / "a.src", ["a b", "c d"])
    tgt = _write(tmp_path / "a.tgt", ["x", "y"])
    links = _write(tmp_path / "a.align", ["0-0", line])
    with pytest.raises(CorpusError, match=message):
        read_plain_corpus(src, tgt, links)


def test_alignment_file_of_another_length_is_refused(tmp_path):
    src = _write(tmp_path / "a.src", ["a", "b"])
    tgt = _write(tmp_path / "a.tgt", ["x", "y"])
    links = _write(tmp_path / "a.align", ["0-0"])
    with pytest.raises(CorpusError, match=r"a\.align:2: alignment file has 1 lines but .*a\.src has 2"):
        read_plain_corpus(src, tgt, links)


def test_plain_corpus_with_alignment_path_trains_on_gold(tmp_path):
    pairs = [("a b c", "x y z", "0-0 1-1 2-2"), ("b a", "y x", "0-0 1-1"), ("c", "z", "")] * 4
    for split in ("train", "validation"):
        _write(tmp_path / f"{split}.src", [p[0] for p in pairs])
        _write(tmp_path / f"{split}.tgt", [p[1] for p in pairs])
        _write(tmp_path / f"{split}.align", [p[2] for p in pairs])
    config = default_config()
    config.data.update(
        corpus="plain",
        source_path=str(tmp_path / "{split}.src"),
        target_path=str(tmp_path / "{split}.tgt"),
        alignment_path=str(tmp_path / "{split}.align"),
        batch_size=4,
        eval_batch_size=4,
    )
    config.lambda_align = 0.5
    check_config(config)
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False)
    batch = next(inputs.train)
    assert batch.gold is not None
    for b, i in enumerate(batch.example_id):
        if i < 0:
            continue
        src, tgt, links = pairs[i]
        want = np.zeros(batch.gold.shape[1:], bool)
        for link in links.split():
            s, t = map(int, link.split("-"))
            want[t, s] = True
        np.testing.assert_array_equal(batch.gold[b], want)
    assert inputs.validation[0].gold is not None  # validation gets gold-hit diagnostics


# ------------------------------------------------------------------------------------------ config errors


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["lambda_align=-0.5"], r"lambda_align must be a finite number >= 0, got -0\.5"),
        (["lambda_align=nan"], r"lambda_align must be a finite number >= 0"),
        (
            ["data.alignment_path=x.{split}.align"],
            r"data\.alignment_path is for a plain or tsv corpus.*own gold",
        ),
        (
            [
                "data.corpus=plain",
                "data.source_path=s.{split}",
                "data.target_path=t.{split}",
                "lambda_align=1",
            ],
            r"lambda_align=1\.0 needs gold alignments: set data\.alignment_path",
        ),
        (
            [
                "data.corpus=plain",
                "data.source_path=s.{split}",
                "data.target_path=t.{split}",
                "data.alignment_path=a",
            ],
            r"data\.alignment_path='a' needs \{split\} like the corpus paths",
        ),
        (["lambda_align=1", "data.vocab=sentencepiece"], r"needs data\.vocab='word'"),
        (["lambda_align=1", "model.arch=rnnenc"], r"model\.arch='rnnenc' has no attention to guide"),
    ],
)
def test_config_errors(overrides, message):
    config = default_config()
    with pytest.raises(ConfigError, match=message):
        check_config(apply_overrides(config, overrides))


def test_default_is_off_and_a_weight_passes():
    config = default_config()
    assert config.lambda_align == 0.0 and config.data.alignment_path == ""
    check_config(apply_overrides(config, ["lambda_align=0.3"]))
