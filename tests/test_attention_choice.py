"""A multi-head model's choice of attention: ``--attention-layer`` / ``--attention-head`` on ``translate`` and
``evaluate``, the AER of every decoder layer and head (``aer_by_head``) against a NumPy reference, and the
one-line errors for a model or a value that cannot give the choice."""

import json
import os

import numpy as np
import pytest

from attn_jax.cli import main
from attn_jax.pipeline import (
    AttentionChoice,
    AttentionChoiceError,
    DecodeOptions,
    evaluate_workdir,
    hypothesis_cross_attention,
    load_model,
    load_split,
    reference_attention,
)
from tests.test_cli_translate import make_run
from tests.tolerance import assert_close_f32

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS, HEADS = 2, 3  # odd and distinct, so that a swapped axis cannot pass
SENTENCES = ["the dog slept .", "every monk stood , because the torch bit fragile lazy bananas ."]


def make_transformer_run(workdir) -> str:
    """A tiny Transformer run (2 decoder layers of 3 heads) with one untrained checkpoint, as ``make_run``."""
    import jax

    from attn_jax import data
    from attn_jax.train import (
        CheckpointManager,
        StepConfig,
        init_train_state,
        load_config,
        model_config,
        optimizer_config,
    )

    config = load_config(os.path.join(_ROOT, "configs", "transformer_cpu.py:smoke"))
    config.model.update(
        d_model=12, heads=HEADS, d_ff=20, encoder_layers=1, decoder_layers=LAYERS, max_length=128
    )
    config.model.share_embeddings = "none"  # a tied untrained decoder repeats its first word
    s = config.data.synthetic_spec
    spec = data.SyntheticSpec(
        train_size=s.train_size, validation_size=s.validation_size, test_per_bucket=0, seed=s.seed,
        min_length=s.min_length, max_length=s.max_length,
    )  # fmt: skip
    train = data.generate_synthetic(spec)["train"]
    src_vocab = data.WordVocabulary.build([p.source for p in train])
    tgt_vocab = data.WordVocabulary.build([p.target for p in train])
    data.save_vocabularies(os.path.join(workdir, "vocab"), src_vocab, tgt_vocab)
    step_cfg = StepConfig(
        model=model_config(config, src_vocab.size, tgt_vocab.size),
        optimizer=optimizer_config(config),
        label_smoothing=0.0,
    )
    abstract = jax.eval_shape(lambda: init_train_state(step_cfg, 0))
    rng = np.random.default_rng(0)
    zeros = lambda s: np.zeros(s.shape, s.dtype)  # noqa: E731
    # N(0, 0.5²) parameters: peaked attention, so argmax links compare without near-ties.
    state = abstract.replace(
        step=zeros(abstract.step),
        params=jax.tree.map(lambda s: rng.normal(0.0, 0.5, s.shape).astype(s.dtype), abstract.params),
        opt_state=jax.tree.map(zeros, abstract.opt_state),
        rng=zeros(abstract.rng),
    )
    manager = CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False)
    manager.save(1, state, {}, json.loads(config.to_json()), {"nll_per_token": 1.0})
    manager.close()
    return str(workdir)


@pytest.fixture(scope="module")
def tf_run(tmp_path_factory):
    return make_transformer_run(tmp_path_factory.mktemp("tf_run"))


@pytest.fixture(scope="module")
def rnn_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("rnn_run"))


@pytest.fixture(scope="module")
def evaluated(tf_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    result = evaluate_workdir(
        tf_run,
        split="test",
        decode=DecodeOptions(beam_size=1, max_length=4),  # AER reads the references: short hypotheses do
        max_examples=9,
        out_dir=out,
        num_heatmaps=0,
    )
    return str(out), result


def _entry(by_head, layer, head):
    (e,) = [e for e in by_head["entries"] if (e["layer"], e["head"]) == (layer, head)]
    return e


def _teacher_forced_heads(loaded, sources, references):
    """``[L_dec, H, m, n]`` per sentence, without ``</s>``: all sentences in one batch, padded to the longest
    (one compiled program; the source mask and the causal decoder keep the padding out)."""
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    src_ids = [[*sv.encode(s), sv.eos_id] for s in sources]
    tgt_ids = [[tv.bos_id, *tv.encode(r)] for r in references]
    width = max(len(x) for x in src_ids + tgt_ids)
    src = np.full((len(sources), width), sv.pad_id, np.int32)
    tgt_in = np.full((len(sources), width), tv.pad_id, np.int32)
    mask = np.zeros((len(sources), width), bool)
    for k, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        src[k, : len(s)], tgt_in[k, : len(t)], mask[k, : len(s)] = s, t, True
    w = np.asarray(loaded.model.cross_attention_weights(src, mask, tgt_in))  # [B, L_dec, H, T, S]
    return [
        w[k, :, :, : len(r.split()), : len(s.split())]
        for k, (s, r) in enumerate(zip(sources, references, strict=True))
    ]


def _numpy_aer(heads, gold, layer, head):
    """Och & Ney's AER of one layer and head (or ``"mean"``): argmax links against the all-sure gold."""
    a = s = p = a_s = a_p = 0
    for w, g in zip(heads, gold, strict=True):
        w = w[layer].mean(axis=0) if head == "mean" else w[layer, head]
        links = {(int(np.argmax(w[j])), j) for j in range(w.shape[0])}
        sure = {tuple(map(int, x.split("-"))) for x in g.split()}  # the built-in gold: every link sure
        a, s, p = a + len(links), s + len(sure), p + len(sure)
        a_s, a_p = a_s + len(links & sure), a_p + len(links & sure)
    return 1.0 - (a_s + a_p) / (a + s)


def test_one_heads_aer_matches_a_numpy_reference(tf_run, evaluated):
    out, r = evaluated
    by_head = r["aer_by_head"]
    assert (by_head["layers"], by_head["heads"]) == (LAYERS, HEADS)
    assert len(by_head["entries"]) == LAYERS * (HEADS + 1)
    loaded = load_model(tf_run)
    corpus = load_split(loaded.config, "test")
    gold_of = dict(zip(corpus.sources, corpus.alignments, strict=True))
    with open(os.path.join(out, "sources.txt"), encoding="utf-8") as f:
        sources = f.read().splitlines()
    with open(os.path.join(out, "references.txt"), encoding="utf-8") as f:
        references = f.read().splitlines()
    gold = [gold_of[s] for s in sources]
    heads = _teacher_forced_heads(loaded, sources, references)
    for layer, head in ((0, 1), (1, 2), (0, "mean")):
        want = _numpy_aer(heads, gold, layer, head)
        assert _entry(by_head, layer, head)["aer"] == pytest.approx(want, abs=1e-12), (layer, head)
    # The heads differ: one table entry is not a copy of another.
    assert len({e["aer"] for e in by_head["entries"]}) > 2


def test_the_last_layers_mean_is_the_default_aer(evaluated):
    out, r = evaluated
    mean = _entry(r["aer_by_head"], LAYERS - 1, "mean")
    assert {k: mean[k] for k in r["aer"]} == r["aer"]  # every count, not only the rate
    best = r["aer_by_head"]["best"]
    assert best["aer"] == min(e["aer"] for e in r["aer_by_head"]["entries"] if e["head"] != "mean")
    with open(os.path.join(out, "aer_by_head.json"), encoding="utf-8") as f:
        assert json.load(f) == r["aer_by_head"]
    with open(os.path.join(out, "evaluation.json"), encoding="utf-8") as f:
        assert json.load(f)["aer_by_head"] == r["aer_by_head"]
    with open(os.path.join(out, "aer_by_head.md"), encoding="utf-8") as f:
        table = f.read()
    assert table.count("\n| ") == LAYERS and f"Best: layer {best['layer']}, head {best['head']}" in table
    with open(os.path.join(out, "evaluation.md"), encoding="utf-8") as f:
        assert "## AER by decoder layer and head" in f.read()


def test_evaluate_with_a_chosen_head_scores_that_head(tf_run, evaluated, tmp_path, capsys):
    _, r = evaluated
    argv = ["evaluate", "--workdir", tf_run, "--out", str(tmp_path), "--beam", "1", "--max-length", "4"]
    status = main(
        [*argv, "--max-examples", "9", "--heatmaps", "0", "--attention-layer", "0", "--attention-head", "1"]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    with open(tmp_path / "evaluation.json", encoding="utf-8") as f:
        chosen = json.load(f)
    assert chosen["aer"]["aer"] == _entry(r["aer_by_head"], 0, 1)["aer"]
    assert (chosen["options"]["attention_layer"], chosen["options"]["attention_head"]) == (0, 1)
    with open(tmp_path / "summary.json", encoding="utf-8") as f:
        assert json.load(f)[chosen["system"]]["aer_attention"] == {"layer": 0, "head": 1}
    assert "(decoder layer 0, head 1)" in out
    best = r["aer_by_head"]["best"]
    (line,) = [x for x in err.splitlines() if x.startswith("AER by head:")]
    assert f"best layer {best['layer']}, head {best['head']}" in line


def test_reference_attention_of_a_choice(tf_run):
    loaded = load_model(tf_run)
    refs = ["the dog slept .", "the museum buried those waiters ."]
    srcs = ["le chien dormait .", "le musée enterra ces serveurs ."]
    default = reference_attention(loaded, srcs, refs)
    same = reference_attention(loaded, srcs, refs, choice=AttentionChoice())
    chosen = reference_attention(loaded, srcs, refs, choice=AttentionChoice(layer=-2, head=2))
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    for k in range(2):
        np.testing.assert_array_equal(same[k], default[k])
        src = np.asarray([[*sv.encode(srcs[k]), sv.eos_id]], np.int32)
        tgt_in = np.asarray([[tv.bos_id, *tv.encode(refs[k])]], np.int32)
        w = np.asarray(loaded.model.cross_attention_weights(src, np.ones_like(src, bool), tgt_in))[0, 0, 2]
        assert chosen[k].shape == w.shape
        # Padded batch vs one unpadded sentence: float32 rounding over a softmax of n + 1 logits of width K.
        assert_close_f32(chosen[k], w, reduction=4 + 2 * w.shape[1] + 12 * 3)


def _translate(argv, capsys, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    status = main(["translate", "--input", str(src), "--beam", "2", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_translate_alignments_of_one_head(tf_run, capsys, tmp_path):
    loaded = load_model(tf_run)
    status, out, err = _translate(
        ["--workdir", tf_run, "--alignment", "json", "--attention-head", "1"], capsys, tmp_path
    )
    assert status == 0, err
    status, plain, err = _translate(
        ["--workdir", tf_run, "--alignment", "json", "--attention-head", "mean", "--attention-layer", "-1"],
        capsys,
        tmp_path,
    )
    assert status == 0, err
    for line, default_line, source in zip(out.splitlines(), plain.splitlines(), SENTENCES, strict=True):
        hyp, default = json.loads(line)["hypotheses"][0], json.loads(default_line)["hypotheses"][0]
        assert hyp["translation"] == default["translation"]  # the choice changes alignments, not decoding
        got = np.asarray(hyp["attention"])
        want = hypothesis_cross_attention(loaded, source, _as_translation(loaded, source, default))[1]
        np.testing.assert_allclose(got, want, atol=2e-6)  # the JSON rounds to 6 decimals
        links = [f"{int(np.argmax(got[j, :-1]))}-{j}" for j in range(got.shape[0] - 1)]
        assert hyp["alignment"] == " ".join(links)


def _as_translation(loaded, source, hyp):
    """A ``Translation`` of the JSON hypothesis ``hyp``: what ``hypothesis_cross_attention`` reads."""
    from attn_jax.pipeline import Translation

    ids = loaded.tgt_vocab.encode(hyp["translation"])
    return Translation(hyp["translation"], hyp["tokens"], ids, 0.0, 0.0, None, source.split())


@pytest.mark.parametrize(
    ("command", "flags", "words"),
    [
        ("translate", ["--alignment", "pharaoh", "--attention-head", "0"], ["--attention-head", "RNNsearch"]),
        ("evaluate", ["--attention-layer", "1"], ["--attention-layer", "RNNsearch"]),
    ],
)
def test_a_model_with_one_attention_refuses_a_choice(rnn_run, command, flags, words, capsys, tmp_path):
    argv = ["--workdir", rnn_run, *flags]
    if command == "evaluate":
        status = main(["evaluate", *argv, "--out", str(tmp_path), "--max-examples", "2"])
        _, err = capsys.readouterr()
    else:
        status, _, err = _translate(argv, capsys, tmp_path)
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and all(w in err for w in words), err


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--attention-layer", "2"], ["--attention-layer", "between -2 and 1", "got 2"]),
        (["--attention-layer", "-3"], ["--attention-layer", "between -2 and 1", "got -3"]),
        (["--attention-head", "3"], ["--attention-head", "between 0 and 2", "got 3"]),
    ],
)
def test_a_layer_or_head_out_of_range_is_one_line(tf_run, flags, words, capsys, tmp_path):
    for command in ("translate", "evaluate"):
        if command == "evaluate":
            status = main(["evaluate", "--workdir", tf_run, *flags, "--out", str(tmp_path)])
            _, err = capsys.readouterr()
        else:
            status, _, err = _translate(
                ["--workdir", tf_run, "--alignment", "json", *flags], capsys, tmp_path
            )
        assert status == 2, err
        assert len(err.strip().splitlines()) == 1 and all(w in err for w in words), err


def test_translate_refuses_a_choice_without_alignments(tf_run, capsys, tmp_path):
    status, _, err = _translate(["--workdir", tf_run, "--attention-head", "0"], capsys, tmp_path)
    assert status == 2 and "--alignment" in err and len(err.strip().splitlines()) == 1


def test_an_ensemble_takes_only_the_default(tf_run):
    from attn_jax.pipeline import load_ensemble

    loaded = load_ensemble([tf_run, tf_run], "best", "raw")
    assert AttentionChoice().check(loaded) == (-1, None)
    with pytest.raises(AttentionChoiceError, match="attention_head needs one run"):
        AttentionChoice(head=0).check(loaded)
