"""The trainer's inputs: vocabularies come from the pairs the length filter keeps (a dropped pair takes no
shortlist place), the dropped pairs are counted, and a zero validation batch size is a one-line config error."""

import pathlib

import pytest

from attn_jax.cli import main
from attn_jax.train import (
    ConfigError,
    apply_overrides,
    check_config,
    default_config,
    load_config,
    make_inputs,
)

_ROOT = pathlib.Path(__file__).resolve().parent.parent

# 17 source word types, all sentences at most 7 words.
TRAIN = [
    ("the cat sat on the mat .", "le chat était sur le tapis ."),
    ("a dog ran .", "un chien courait ."),
    ("the red house", "la maison rouge"),
    ("my big cat slept .", "mon gros chat dormait ."),
    ("birds sing", "oiseaux chantent"),
    ("zzz", "zzz"),
]
SRC_TYPES = {"the", "cat", "sat", "on", "mat", ".", "a", "dog", "ran", "red", "house", "my", "big", "slept"}
SRC_TYPES |= {"birds", "sing", "zzz"}  # counted by hand, checked against len() below
LONG_SOURCE = " ".join(f"w{i}" for i in range(100_000))  # dropped by max_source_length
VALID = [("the cat sat .", "le chat était ."), (LONG_SOURCE, "trop long"), ("a dog .", "un chien .")]


def _write(tmp_path, split, pairs):
    (tmp_path / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def _config(tmp_path):
    c = default_config()
    c.data.update(
        corpus="plain",
        source_path=str(tmp_path / "{split}.src"),
        target_path=str(tmp_path / "{split}.tgt"),
        max_source_length=10,
        max_target_length=10,
        batch_size=2,
        eval_batch_size=2,
        prefetch=0,
    )
    check_config(c)
    return c


def test_vocabularies_come_from_the_pairs_the_length_filter_keeps(tmp_path):
    # The long line's pair is dropped by the filter; its target word "dropped" must not enter either.
    _write(tmp_path, "train", [*TRAIN, (LONG_SOURCE, "dropped .")])
    _write(tmp_path, "validation", VALID)
    inputs = make_inputs(_config(tmp_path), str(tmp_path / "vocab"), reuse_vocab=False)
    assert len(SRC_TYPES) == 17
    assert set(inputs.src_vocab.tokens[4:]) == SRC_TYPES  # 17 words, not 30,000 of the long line's
    assert inputs.src_vocab.size == 4 + 17
    tgt_types = {w for _, t in TRAIN for w in t.split()}
    assert set(inputs.tgt_vocab.tokens[4:]) == tgt_types and "dropped" not in inputs.tgt_vocab.tokens
    # The dropped pairs are counted (the trainer logs them next to the pairs it kept).
    assert (inputs.train_pairs, inputs.train_dropped) == (len(TRAIN), 1)
    assert (inputs.validation_pairs, inputs.validation_dropped) == (2, 1)
    # Same vocabularies as without the long pair at all: it has no influence left.
    _write(tmp_path, "train", TRAIN)
    clean = make_inputs(_config(tmp_path), str(tmp_path / "vocab2"), reuse_vocab=False)
    assert clean.src_vocab == inputs.src_vocab and clean.tgt_vocab == inputs.tgt_vocab
    assert clean.train_dropped == 0


def test_a_long_target_is_filtered_out_of_the_target_vocabulary_too(tmp_path):
    long_target = " ".join(f"m{i}" for i in range(11))  # 11 > max_target_length = 10
    _write(tmp_path, "train", [*TRAIN, ("birds sing loudly", long_target)])
    _write(tmp_path, "validation", VALID)
    inputs = make_inputs(_config(tmp_path), str(tmp_path / "vocab"), reuse_vocab=False)
    assert "loudly" not in inputs.src_vocab.tokens and "m0" not in inputs.tgt_vocab.tokens
    assert inputs.train_dropped == 1


@pytest.mark.parametrize("value", [0, -3])
def test_eval_batch_size_must_be_positive(value):
    config = apply_overrides(default_config(), [f"data.eval_batch_size={value}"])
    with pytest.raises(ConfigError) as e:
        check_config(config)
    assert str(e.value) == f"data.eval_batch_size must be a positive int, got {value}"


def test_cli_names_eval_batch_size_in_one_line(tmp_path, capsys):
    config = load_config(str(_ROOT / "configs" / "rnnsearch_cpu.py:smoke"))
    assert config.data.eval_batch_size > 0
    status = main(
        [
            "train",
            "--config",
            str(_ROOT / "configs" / "rnnsearch_cpu.py:smoke"),
            "--workdir",
            str(tmp_path / "run"),
            "--config.data.eval_batch_size=0",
        ]
    )
    out, err = capsys.readouterr()
    assert status == 2
    assert err == "attn-jax train: error: data.eval_batch_size must be a positive int, got 0\n"
    assert not (tmp_path / "run" / "checkpoints").exists()
