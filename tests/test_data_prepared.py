"""Prepared corpora (``data.prepared_dir``, ``attn-jax data --prepare``): the same training as in memory, step
for step; reuse and rebuild said on stderr; damaged files refused in one line naming them; each process's
batches are its own rows; a failed preparation leaves nothing that looks prepared."""

import json
import os
import pathlib
import re

import numpy as np
import pytest

from attn_jax import data
from attn_jax.cli import main
from attn_jax.train import apply_overrides, load_config, make_inputs, prepare_train_split, read_metrics

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_SMOKE = str(_ROOT / "configs" / "rnnsearch_cpu.py:smoke")

WORDS = "a b c d e f g h i j".split()
GOOD = [
    (
        " ".join(WORDS[(k * 3 + i) % 10] for i in range(2 + k % 7)),
        " ".join(WORDS[(k * 3 + i * 2) % 10].upper() for i in range(1 + k % 6)),
    )
    for k in range(60)
]
LONG = " ".join(["a"] * 15)  # over the smoke config's max_source_length = max_target_length = 14
# 60 good pairs, 2 sources and 1 target too long, 1 pair with both, 2 with an empty side.
TRAIN = [*GOOD, (LONG, "A"), (LONG, "B"), ("c", LONG.upper()), (LONG, LONG), ("", "A"), ("d", "")]


def _write(directory: pathlib.Path, split: str, pairs) -> None:
    (directory / f"{split}.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (directory / f"{split}.fr").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def _overrides(d: pathlib.Path, *extra: str) -> list[str]:
    return [
        "data.corpus=plain",
        f"data.source_path={d}/{{split}}.en",
        f"data.target_path={d}/{{split}}.fr",
        "data.eval_split=none",
        "data.batch_size=8",
        "data.eval_batch_size=8",
        *extra,
    ]


def _config(d: pathlib.Path, *extra: str):
    return apply_overrides(load_config(_SMOKE), _overrides(d, "data.prefetch=0", *extra))


@pytest.fixture()
def corpus(tmp_path) -> pathlib.Path:
    d = tmp_path / "corpus"
    d.mkdir()
    _write(d, "train", TRAIN)
    return d


def _train(workdir, d, capsys, steps: int, *extra: str, resume: bool = False):
    args = ["train", "--config", _SMOKE, "--workdir", str(workdir), "--progress", "lines"]
    overrides = [f"--config.{o}" for o in _overrides(d, f"num_train_steps={steps}", *extra)]
    common = ["--config.log_every=1", "--config.checkpoint_every=2", "--config.tensorboard=false"]
    status = main(
        [*args, *(["--resume"] if resume else []), *overrides, *common, "--config.async_checkpoints=false"]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    return out + err


def _losses(workdir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(workdir / "metrics.jsonl") if "loss" in r]


@pytest.mark.slow
def test_prepared_training_equals_in_memory_step_for_step_and_resumes_exactly(tmp_path, corpus, capsys):
    # The same compiled program on the same batches: the losses agree bit for bit, also across a resume.
    _train(tmp_path / "memory", corpus, capsys, 4)
    prepared = tmp_path / "disk"
    first = _train(prepared, corpus, capsys, 2, "data.prepared_dir=auto")
    assert f"data: preparing the train split in {prepared}/prepared (none is there yet)" in first
    second = _train(prepared, corpus, capsys, 4, "data.prepared_dir=auto", resume=True)
    assert f"data: reusing prepared train split in {prepared}/prepared (64 pairs;" in second
    memory, disk = _losses(tmp_path / "memory"), _losses(prepared)
    assert [s for s, _ in memory] == [1, 2, 3, 4]
    assert disk == memory
    report = json.loads((prepared / "data.json").read_text())["train"]
    assert report == json.loads((tmp_path / "memory" / "data.json").read_text())["train"]
    assert (
        report["kept"],
        report["source_too_long"],
        report["target_too_long"],
        report["both_too_long"],
    ) == (
        60,
        2,
        1,
        1,
    )
    assert report["empty"] == 2


def _arrays_by_hand(pairs, src_vocab, tgt_vocab):
    """The flat token arrays of the non-empty pairs, written out with plain Python lists."""
    out = {"src_tokens": [], "src_offsets": [0], "tgt_tokens": [], "tgt_offsets": [0]}
    for s, t in pairs:
        if not s or not t:
            continue
        for side, text, vocab in (("src", s, src_vocab), ("tgt", t, tgt_vocab)):
            ids = [vocab.tokens.index(w) if w in vocab.tokens else data.UNK_ID for w in text.split()]
            out[f"{side}_tokens"] += ids
            out[f"{side}_offsets"].append(out[f"{side}_offsets"][-1] + len(ids))
    return out


def test_prepared_files_are_plain_npy_arrays_and_batches_match_memory(tmp_path, corpus):
    config = _config(corpus, "data.src_vocab_size=6")
    prepared = prepare_train_split(config, str(tmp_path / "p"))
    split = prepared.manifest["split"]
    want = _arrays_by_hand(TRAIN, prepared.source_vocab, prepared.target_vocab)
    for name, values in want.items():
        got = np.load(tmp_path / "p" / f"{split}.{name}.npy")  # any .npy reader, no memory map
        np.testing.assert_array_equal(got, np.asarray(values, got.dtype))
        assert isinstance(getattr(prepared.encoded, name), np.memmap)
    assert prepared.manifest["lengths"]["source"]["max"] == 15
    assert prepared.manifest["counts"] == {
        "kept": 60,
        "source_too_long": 2,
        "target_too_long": 1,
        "both_too_long": 1,
        "empty": 2,
        "beyond_max_examples": 0,
    }
    # The vocabulary: the 6 most frequent source words of the pairs within the length limits.
    counts = {}
    for s, _ in TRAIN[:60]:
        for w in s.split():
            counts[w] = counts.get(w, 0) + 1
    top = sorted(counts, key=lambda w: (-counts[w], w))[:6]
    assert prepared.source_vocab.tokens[4:] == tuple(top)


@pytest.mark.parametrize(
    "vocab, joint", [("word", False), ("sentencepiece", False), ("word", True), ("sentencepiece", True)]
)
def test_each_process_reads_its_own_rows_as_in_memory(tmp_path, corpus, vocab, joint):
    size = 30 if joint else 12  # a joint model needs pieces for both sides' characters
    extra = [
        f"data.vocab={vocab}",
        f"data.src_vocab_size={size}",
        f"data.tgt_vocab_size={size}",
        f"data.joint_vocab={joint}",
    ]
    config = _config(corpus, *extra)
    memory = make_inputs(config, str(tmp_path / "v0"), reuse_vocab=False)
    assert memory.train.plan.shapes[0][0] == 8
    for p in range(2):
        disk = make_inputs(
            config,
            str(tmp_path / f"v{p + 1}"),
            reuse_vocab=False,
            process_index=p,
            process_count=2,
            prepared_dir=str(tmp_path / "p"),
        )
        assert (disk.src_vocab, disk.tgt_vocab, disk.vocab_line) == (
            memory.src_vocab,
            memory.tgt_vocab,
            memory.vocab_line,
        )
        assert disk.train_report == memory.train_report and disk.schedule == memory.schedule
        assert isinstance(disk.train.plan, data.BatchPlan)
        memory.train.set_state({"next_index": 0, "fingerprint": memory.train.get_state()["fingerprint"]})
        for _ in range(9):  # more than an epoch
            whole, mine = next(memory.train), next(disk.train)
            rows = slice(4 * p, 4 * p + 4)
            for a, b in zip(whole, mine, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_array_equal(a[rows], b)


def test_reuse_and_rebuild_are_said_with_the_reason(tmp_path, corpus):
    lines = []
    where = str(tmp_path / "p")
    prepare_train_split(_config(corpus), where, log=lines.append)
    prepare_train_split(_config(corpus), where, log=lines.append)
    assert lines[0] == f"data: preparing the train split in {where} (none is there yet)"
    assert lines[1].startswith("data: prepared 64 pairs in ")
    assert (
        lines[2]
        == f"data: reusing prepared train split in {where} (64 pairs; its input files and settings are unchanged)"
    )
    _write(corpus, "train", TRAIN[:-3])
    os.utime(corpus / "train.en", ns=(1, 1))  # a different modification time even on a coarse clock
    lines.clear()
    prepared = prepare_train_split(_config(corpus), where, log=lines.append)
    assert (
        lines[0]
        == f"data: rebuilding the prepared train split in {where} because {corpus}/train.en changed (size or modification time)"
    )
    assert prepared.manifest["pairs"] == 63 and not prepared.reused
    lines.clear()
    prepare_train_split(_config(corpus, "data.max_source_length=10"), where, log=lines.append)
    assert lines[0].endswith("because data.max_source_length changed (14 -> 10)")
    assert sorted(os.listdir(tmp_path)) == ["corpus", "p"]  # no temporary directory left behind


def _prepare_cli(capsys, corpus, out):
    status = main(
        [
            "data",
            "--prepare",
            "--config",
            _SMOKE,
            "--out",
            str(out),
            *[f"--config.{o}" for o in _overrides(corpus)],
        ]
    )
    _, err = capsys.readouterr()
    return status, [line for line in err.splitlines() if line.startswith("attn-jax data: error: ")]


def _truncate(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes()[:-4])


def _bad_header(path: pathlib.Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[:6] = b"NOTNPY"
    path.write_bytes(bytes(raw))


def _decreasing(path: pathlib.Path) -> None:
    offsets = np.load(path)
    offsets[3], offsets[4] = offsets[4], offsets[3]
    np.save(path, offsets)


@pytest.mark.parametrize(
    "file, damage, said",
    [
        ("train.src_tokens.npy", _truncate, "bytes, expected"),
        ("train.tgt_offsets.npy", _bad_header, "bad .npy header"),
        ("train.src_offsets.npy", _decreasing, "offsets decrease at entry 4"),
        ("manifest.json", lambda p: p.write_text('{"format_version": 1, "spl'), "damaged prepared manifest"),
    ],
)
def test_a_damaged_prepared_file_is_one_line_naming_it(tmp_path, corpus, capsys, file, damage, said):
    out = tmp_path / "p"
    assert _prepare_cli(capsys, corpus, out) == (0, [])
    damage(out / file)
    status, errors = _prepare_cli(capsys, corpus, out)
    assert status == 1 and len(errors) == 1
    assert errors[0].startswith(f"attn-jax data: error: {out / file}: ") and said in errors[0]


def test_a_failed_preparation_leaves_no_prepared_directory(tmp_path, corpus):
    def pairs():
        yield from data.iter_plain_pairs(corpus / "train.en", corpus / "train.fr")
        raise KeyboardInterrupt  # a kill in the middle of the encoding pass

    with pytest.raises(KeyboardInterrupt):
        data.prepare_corpus(
            tmp_path / "p",
            name="x",
            pairs=pairs,
            inputs=[str(corpus / "train.en")],
            settings={},
            make_vocabularies=lambda kept: (data.WordVocabulary(data.SPECIAL_TOKENS),) * 2 + ("",),
        )
    assert sorted(os.listdir(tmp_path)) == ["corpus"]


@pytest.mark.parametrize(
    "extra, said",
    [
        (
            ["data.corpus=synthetic"],
            "data.prepared_dir='auto' needs a plain or tsv corpus, not data.corpus='synthetic'",
        ),
        (["data.alignment_path=x.{split}.align"], "to train with data.alignment_path"),
    ],
)
def test_prepared_dir_refuses_what_it_cannot_hold(corpus, extra, said):
    from attn_jax.train import ConfigError, check_config

    with pytest.raises(ConfigError, match=re.escape(said)):
        check_config(_config(corpus, "data.prepared_dir=auto", *extra))


def test_prepare_flags_go_together(tmp_path, corpus, capsys):
    assert main(["data", "--prepare", "--config", _SMOKE]) == 2
    assert "--prepare needs --out DIR or --workdir DIR" in capsys.readouterr().err
    assert (
        main(["data", "--src", str(corpus / "train.en"), "--tgt", str(corpus / "train.fr"), "--out", "x"])
        == 2
    )
    assert "--workdir and --out go with --prepare" in capsys.readouterr().err
    status = main(
        [
            "data",
            "--prepare",
            "--config",
            _SMOKE,
            "--workdir",
            str(tmp_path / "run"),
            *[f"--config.{o}" for o in _overrides(corpus)],
        ]
    )
    out = capsys.readouterr().out
    assert status == 0 and f"prepared: {tmp_path}/run/prepared" in out.splitlines()
    assert (
        "pairs: 64 encoded (2 with an empty side and 0 beyond data.max_train_examples not read); 60 of 64"
        in out
    )
