"""``data.joint_vocab``: one word list or one SentencePiece model over both sides of the training split, so that
``model.share_embeddings=all`` trains and decodes; the run's vocabularies read back equal; a run with token
batches resumes exactly."""

import io
import json
import pathlib

import jax
import numpy as np
import pytest

from attn_jax import data, pipeline
from attn_jax.train import (
    ConfigError,
    apply_overrides,
    check_config,
    default_config,
    load_checkpoint,
    load_config,
    make_inputs,
    read_metrics,
    train_and_evaluate,
)
from attn_jax.train._loop import _data_lines

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
SOURCES = ["a b c", "a b", "c d", "a a a a a a a a a a"]  # the last pair is over the length limit
TARGETS = ["x a", "y y", "x d", "z"]


def _plain(tmp_path, *extra):
    for split in ("train", "validation"):
        (tmp_path / f"{split}.src").write_text("\n".join(SOURCES) + "\n")
        (tmp_path / f"{split}.tgt").write_text("\n".join(TARGETS) + "\n")
    overrides = [
        "data.corpus=plain",
        f"data.source_path={tmp_path}/{{split}}.src",
        f"data.target_path={tmp_path}/{{split}}.tgt",
        "data.max_source_length=5",
        "data.batch_size=2",
        "data.eval_batch_size=2",
        "data.prefetch=0",
        "data.joint_vocab=true",
        *extra,
    ]
    return apply_overrides(default_config("transformer"), overrides)


def test_config_checks():
    config = apply_overrides(default_config("transformer"), ["model.share_embeddings=all"])
    with pytest.raises(
        ConfigError, match=r"share_embeddings=all .* needs one joint vocabulary: set data.joint_vocab=True"
    ) as e:
        check_config(config)
    assert "\n" not in str(e.value)
    check_config(apply_overrides(config, ["data.joint_vocab=true"]))
    sizes = ["data.joint_vocab=true", "data.src_vocab_size=100", "data.tgt_vocab_size=90"]
    with pytest.raises(
        ConfigError, match=r"data.src_vocab_size=100 entries, but data.tgt_vocab_size=90; set them equal"
    ):
        check_config(apply_overrides(default_config(), sizes))
    assert default_config().data.joint_vocab is False


def test_joint_word_vocabulary_counts_both_sides(tmp_path):
    config = _plain(tmp_path, "data.src_vocab_size=5", "data.tgt_vocab_size=5")
    check_config(config)
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False)
    # Counted by hand over the three kept pairs, both sides: a 3, b 2, c 2, d 2, x 2, y 2 (z only in the dropped
    # pair); the five most frequent, ties alphabetical, leave out y.
    assert inputs.src_vocab.tokens == data.SPECIAL_TOKENS + ("a", "b", "c", "d", "x")
    assert inputs.tgt_vocab == inputs.src_vocab
    assert inputs.tgt_vocab.encode("x a y") == [8, 4, data.UNK_ID]
    assert _data_lines(config, inputs)[0] == (
        "data: one joint word vocabulary (data.joint_vocab) over the sources and targets of the 3 kept training "
        "pairs: the 5 most frequent of 6 word types (data.src_vocab_size), plus the four specials"
    )
    src, tgt = data.load_vocabularies(tmp_path / "vocab")
    assert src == tgt == inputs.src_vocab


def test_joint_sentencepiece_model_covers_both_sides(tmp_path):
    config = _plain(tmp_path, "data.vocab=sentencepiece", "data.src_vocab_size=30", "data.tgt_vocab_size=30")
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False)
    vocab = inputs.src_vocab
    assert isinstance(vocab, data.SentencePieceVocabulary) and inputs.tgt_vocab == vocab
    # every character of the kept pairs, source-only (b, c) and target-only (x, y) alike, is a piece
    for text in ("a b c d", "x y"):
        assert data.UNK_ID not in vocab.encode(text) and vocab.decode(vocab.encode(text)) == text
    assert data.UNK_ID in vocab.encode("z")  # only in the pair over the length limit
    line = _data_lines(config, inputs)[0]
    assert line.startswith(
        "data: one joint SentencePiece unigram vocabulary (data.joint_vocab) trained on the sources and targets of "
        f"the 3 training pairs of at most 5 source and 50 target words: joint {vocab.size} pieces"
    )
    src, tgt = data.load_vocabularies(tmp_path / "vocab")
    assert src == tgt == vocab


def _tiny(*extra):
    config = load_config(f"{CONFIGS / 'transformer_cpu.py'}:smoke")
    overrides = [
        "data.joint_vocab=true",
        "data.src_vocab_size=200",
        "data.tgt_vocab_size=200",
        "model.share_embeddings=all",
        "model.d_model=16",
        "model.heads=2",
        "model.d_ff=32",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.dropout=0.0",
        "data.batch_tokens=128",
        "num_train_steps=4",
        "log_every=2",
        "eval_every=4",
        "checkpoint_every=2",
        "tensorboard=false",
        *extra,
    ]
    return apply_overrides(config, overrides)


@pytest.fixture(scope="module")
def joint_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("joint")
    config = _tiny()
    out = io.StringIO()
    result = train_and_evaluate(config, str(workdir), stream=out, tty=False)
    return config, workdir, result, out.getvalue()


@pytest.mark.slow
def test_shared_embeddings_train_and_decode(joint_run):
    config, workdir, result, log = joint_run
    assert result.step == 4
    assert "data: one joint word vocabulary (data.joint_vocab)" in log
    assert "data:   length 16: 8 rows a batch (128 padded tokens)" in log
    train = [r for r in read_metrics(workdir / "metrics.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4] and all(np.isfinite(r["loss"]) for r in train)
    params = load_checkpoint(str(workdir)).state["params"]
    # one matrix for source, target and softmax: no source embedding, the softmax keeps only its bias
    assert "src_embed" not in params and list(params["output"]) == ["bias"]
    loaded = pipeline.load_model(workdir, "last")
    inputs = make_inputs(config, str(workdir / "vocab"), reuse_vocab=True)
    built = inputs.src_vocab
    report = json.loads((workdir / "data.json").read_text())["train_batches"]
    assert report == [s._asdict() for s in inputs.batch_stats] and report[0]["rows"] == 8
    assert loaded.src_vocab == loaded.tgt_vocab == built
    assert params["tgt_embed"].shape[0] == built.size
    source = " ".join(built.tokens[4:9])  # five frequent words of the joint vocabulary
    [[hyp]] = pipeline.translate_sentences(loaded, [source], beam_size=2)
    assert hyp.source_tokens == source.split() and not hyp.source_unk
    assert all(0 <= i < built.size and i != data.EOS_ID for i in hyp.ids) and len(hyp.ids) <= hyp.limit
    assert hyp.text == built.decode(hyp.ids) and np.isfinite(hyp.log_prob)


@pytest.mark.slow
def test_token_batches_resume_exactly(joint_run, tmp_path):
    """Stop at step 2, resume to 4: the same losses and bit-identical parameters as the straight run."""
    config, ref_dir, ref, _ = joint_run
    first = train_and_evaluate(
        apply_overrides(config, ["num_train_steps=2"]), tmp_path, stream=io.StringIO(), tty=False
    )
    assert first.step == 2
    resumed = train_and_evaluate(config, tmp_path, resume=True, stream=io.StringIO(), tty=False)
    assert resumed.step == 4
    assert load_checkpoint(str(tmp_path)).data["next_index"] == 4
    for a, b in zip(jax.tree.leaves(ref.state.params), jax.tree.leaves(resumed.state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    losses = lambda d: [
        (r["step"], r["loss"]) for r in read_metrics(d / "metrics.jsonl") if r["split"] == "train"
    ]
    assert losses(tmp_path) == losses(ref_dir)
