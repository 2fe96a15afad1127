"""A user's own plain-text corpus: the validation split under its common names (``validation``, ``valid``,
``dev``), training without one, ``attn-jax data`` over ``{split}`` paths, and every dropped pair counted per split
with its reason in the trainer's start-up output and ``data.json``."""

import json
import pathlib

import pytest

from attn_jax.cli import main
from attn_jax.train import (
    apply_overrides,
    default_config,
    describe_split,
    has_eval_split,
    load_checkpoint,
    load_config,
    make_inputs,
    read_metrics,
)
from attn_jax.train._loop import _data_lines

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_SMOKE = str(_ROOT / "configs" / "rnnsearch_cpu.py:smoke")

WORDS = "a b c d e f g h i j".split()
# 20 pairs of 3-6 words over 10 source and 10 target types: every split has the same vocabulary, so every run
# here has the same model shapes and the train step compiles once for the module.
GOOD = [
    (
        " ".join(WORDS[(k + i) % 10] for i in range(3 + k % 4)),
        " ".join(WORDS[(k + i) % 10].upper() for i in range(3 + k % 4)),
    )
    for k in range(20)
]
LONG = " ".join(["a"] * 15)  # over the smoke config's max_source_length = max_target_length = 14
# Training: 3 sources too long, 2 targets too long, 1 pair with both, 1 empty source line, 1 empty target line.
TRAIN = [*GOOD, (LONG, "A"), (LONG, "B"), (LONG, "C"), ("a", LONG.upper()), ("b", LONG.upper()), (LONG, LONG)]
TRAIN += [("", "A"), ("c", "")]
# Validation: 1 source too long, 1 empty target.
VALID = [*GOOD[:7], (LONG, "A"), ("d", "")]

TRAIN_LINE = (
    "data: training split train ({d}/train.en | {d}/train.fr): 20 of 28 pairs kept; 8 dropped: 3 with the source "
    "over data.max_source_length=14 words, 2 with the target over data.max_target_length=14 words, 1 with both "
    "over, 2 with an empty side"
)


def _write(directory: pathlib.Path, split: str, pairs) -> None:
    (directory / f"{split}.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (directory / f"{split}.fr").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def _overrides(d: pathlib.Path, *extra: str) -> list[str]:
    return [
        "--config.data.corpus=plain",
        f"--config.data.source_path={d}/{{split}}.en",
        f"--config.data.target_path={d}/{{split}}.fr",
        "--config.num_train_steps=2",
        "--config.log_every=1",
        "--config.eval_every=2",
        "--config.checkpoint_every=2",
        "--config.tensorboard=false",
        "--config.async_checkpoints=false",
        *extra,
    ]


def _config(d: pathlib.Path, *extra: str):
    """The smoke config on the plain-text corpus in ``d`` (max lengths 14, batches of 16), for make_inputs."""
    overrides = [o.removeprefix("--config.") for o in _overrides(d, "--config.data.prefetch=0", *extra)]
    return apply_overrides(load_config(_SMOKE), overrides)


def _train(tmp_path, capsys, *extra: str):
    workdir = tmp_path / "run"
    status = main(
        [
            "train",
            "--config",
            _SMOKE,
            "--workdir",
            str(workdir),
            "--progress",
            "lines",
            *_overrides(tmp_path, *extra),
        ]
    )
    out, err = capsys.readouterr()
    return status, out, err, workdir


def _error_line(err: str, command: str = "train") -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"attn-jax {command}: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("name", ["valid", "dev"])
def test_a_validation_split_named_valid_or_dev_trains_and_says_which_file(tmp_path, capsys, name):
    _write(tmp_path, "train", TRAIN)
    _write(tmp_path, name, VALID)
    status, out, err, workdir = _train(tmp_path, capsys)
    assert status == 0, err
    lines = out.splitlines()
    d = tmp_path
    assert TRAIN_LINE.format(d=d) in lines
    assert (
        f"data: validation split {name} ({d}/{name}.en | {d}/{name}.fr; no 'validation' files, so "
        f"data.eval_split=validation reads {name!r}): 7 of 9 pairs kept; 2 dropped: 1 with the source over "
        "data.max_source_length=14 words, 0 with the target over data.max_target_length=14 words, 0 with both "
        "over, 1 with an empty side"
    ) in lines
    assert any(line.startswith("validation @ step 2: ") for line in lines)
    report = json.loads((workdir / "data.json").read_text())
    assert report["train"] == {
        "split": "train",
        "asked": "train",
        "name": f"{d}/train.en | {d}/train.fr",
        "kept": 20,
        "source_too_long": 3,
        "target_too_long": 2,
        "both_too_long": 1,
        "empty": 2,
        "beyond_max_examples": 0,
        "read": 28,
        "dropped": 8,
    }
    assert report["validation"]["split"] == name and report["validation"]["asked"] == "validation"
    assert (report["validation"]["kept"], report["validation"]["dropped"]) == (7, 2)


def test_the_validation_name_wins_over_valid_and_dev(tmp_path):
    for split in ("train", "validation", "valid", "dev"):
        _write(
            tmp_path,
            split,
            TRAIN if split == "train" else VALID[: {"validation": 3, "valid": 4, "dev": 5}[split]],
        )
    inputs = make_inputs(_config(tmp_path), str(tmp_path / "vocab"), reuse_vocab=False)
    assert inputs.validation_report.split == "validation" and inputs.validation_pairs == 3


def test_evaluate_split_validation_reads_the_same_files_as_training(tmp_path):
    from attn_jax.pipeline import load_split

    _write(tmp_path, "train", TRAIN)
    _write(tmp_path, "dev", VALID)
    corpus = load_split(_config(tmp_path), "validation")  # attn-jax evaluate --split validation
    assert corpus.name == f"{tmp_path}/dev.en | {tmp_path}/dev.fr"  # evaluate prints and records the name
    assert (len(corpus), corpus.skipped_empty) == (8, 1)


@pytest.mark.parametrize("value", ["none", ""])
def test_no_validation_split_is_a_documented_setting(value):
    assert not has_eval_split(apply_overrides(default_config(), [f"data.eval_split={value}"]).data)
    assert has_eval_split(default_config().data)


def test_training_without_a_validation_split(tmp_path, capsys, caplog):
    _write(tmp_path, "train", TRAIN)
    status, out, err, workdir = _train(tmp_path, capsys, "--config.data.eval_split=none")
    assert status == 0, err
    lines = out.splitlines()
    assert TRAIN_LINE.format(d=tmp_path) in lines
    assert (
        "data: no validation split (data.eval_split='none'): no validation runs, and the best checkpoint is the "
        "latest one"
    ) in lines
    assert not any(line.startswith("validation @") or line.startswith("final validation") for line in lines)
    assert any(
        line.startswith("done: step 2 in ") and "(best: the latest, no validation)" in line for line in lines
    )
    # orbax is not asked to rank checkpoints by a metric that never comes (it would warn at every save).
    assert not [r for r in caplog.records if "tracked_metric" in r.getMessage()]
    assert [r["split"] for r in read_metrics(workdir / "metrics.jsonl")] == ["train", "train"]
    assert json.loads((workdir / "data.json").read_text())["validation"] is None
    # --checkpoint best (the default of translate and evaluate) falls back to the latest with the usual note.
    restored = load_checkpoint(workdir, best=True)
    assert restored.step == 2 and "no kept checkpoint has validation metrics" in restored.note
    (tmp_path / "in.txt").write_text("a b c\n", encoding="utf-8")
    status = main(
        ["translate", "--workdir", str(workdir), "--input", str(tmp_path / "in.txt"), "--beam", "1"]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    assert len(out.splitlines()) == 1
    assert "attn-jax translate: warning: no kept checkpoint has validation metrics" in err


def test_ambiguous_or_missing_validation_split_is_one_line(tmp_path, capsys):
    _write(tmp_path, "train", TRAIN)
    _write(tmp_path, "valid", VALID)
    _write(tmp_path, "dev", VALID)
    status, out, err, workdir = _train(tmp_path, capsys)
    d = tmp_path
    assert status == 1
    assert _error_line(err) == (
        f"attn-jax train: error: {d}/{{split}}.en: no validation split ({d}/validation.en), and several "
        f"candidates: valid ({d}/valid.en) and dev ({d}/dev.en); set data.eval_split to the one to use, e.g. "
        "data.eval_split=valid"
    )
    assert not list((workdir / "checkpoints").glob("[0-9]*"))  # nothing trained
    for split in ("valid", "dev"):
        for side in ("en", "fr"):
            (tmp_path / f"{split}.{side}").unlink()
    status, out, err, workdir = _train(tmp_path, capsys)
    assert status == 1
    assert _error_line(err) == (
        f"attn-jax train: error: {d}/{{split}}.en: no validation split: none of {d}/validation.en, {d}/valid.en, "
        f"{d}/dev.en exists; set data.eval_split to its name, or data.eval_split=none to do without one"
    )


def test_every_drop_is_counted_with_its_reason(tmp_path):
    _write(tmp_path, "train", TRAIN)
    _write(tmp_path, "validation", VALID)
    config = _config(tmp_path)
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False)
    t = inputs.train_report
    assert (t.kept, t.source_too_long, t.target_too_long, t.both_too_long, t.empty) == (20, 3, 2, 1, 2)
    assert (inputs.train_pairs, inputs.train_dropped) == (20, 6)  # the length filter's own count
    assert describe_split(t, "training", config.data) == TRAIN_LINE.format(d=tmp_path)
    # A cap on the pairs read is a drop too, with its config key.
    capped = apply_overrides(config, ["data.max_train_examples=22", "data.max_eval_examples=2"])
    inputs = make_inputs(capped, str(tmp_path / "vocab2"), reuse_vocab=False)
    t, v = inputs.train_report, inputs.validation_report
    assert (t.kept, t.source_too_long, t.beyond_max_examples, t.read) == (20, 2, 4, 28)
    assert describe_split(t, "training", capped.data).endswith(", 4 beyond data.max_train_examples=22")
    assert (v.kept, v.beyond_max_examples, v.empty, v.read) == (2, 6, 1, 9)
    assert describe_split(v, "validation", capped.data).endswith(", 6 beyond data.max_eval_examples=2")


def test_paths_without_split_validate_on_the_training_files_and_say_so(tmp_path):
    _write(tmp_path, "all", TRAIN)
    config = _config(
        tmp_path,
        f"--config.data.source_path={tmp_path}/all.en",
        f"--config.data.target_path={tmp_path}/all.fr",
    )
    inputs = make_inputs(config, str(tmp_path / "vocab"), reuse_vocab=False)
    lines = _data_lines(config, inputs)
    assert lines[-1] == (
        "warning: the validation split reads the same files as the training split (the corpus paths have no "
        "{split}); validation measures training pairs; data.eval_split=none trains without validation"
    )


def test_data_cli_reads_the_split_pattern(tmp_path, capsys):
    _write(tmp_path, "train", TRAIN)
    _write(tmp_path, "dev", VALID)
    _write(tmp_path, "test", GOOD[:5])
    src, tgt = f"{tmp_path}/{{split}}.en", f"{tmp_path}/{{split}}.fr"
    status = main(["data", "--src", src, "--tgt", tgt])
    out, err = capsys.readouterr()
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == f"corpus: {src} | {tgt}"
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert list(rows) == ["train", "dev", "test"]
    assert (rows["train"][1], rows["train"][-1]) == ("26", "2")  # pairs, skipped empty
    assert (rows["dev"][1], rows["dev"][-1]) == ("8", "1") and rows["test"][1] == "5"
    # --split validation reads dev, as training does, and says so on stderr.
    status = main(["data", "--src", src, "--tgt", tgt, "--split", "validation"])
    out, err = capsys.readouterr()
    assert status == 0 and out.splitlines()[2].split()[:2] == ["dev", "8"]
    assert "attn-jax data: no 'validation' files, so --split validation reads 'dev'" in err.splitlines()
    # The same pattern with TSV files.
    (tmp_path / "train.tsv").write_text("a b\tA B\n", encoding="utf-8")
    status = main(["data", "--tsv", f"{tmp_path}/{{split}}.tsv"])
    out, _ = capsys.readouterr()
    assert status == 0 and out.splitlines()[2].split()[:2] == ["train", "1"]


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (
            ["--src", "{d}/{{split}}.en", "--tgt", "{d}/train.fr"],
            2,
            "--src and --tgt must both contain {{split}} or neither, got {d}/{{split}}.en and {d}/train.fr",
        ),
        (
            ["--src", "{d}/train.en", "--tgt", "{d}/train.fr", "--split", "dev"],
            2,
            "--split needs {{split}} in --src/--tgt to stand for the split name (e.g. 'data/{{split}}.en'), got {d}/train.en",
        ),
        (
            ["--src", "{d}/{{split}}.de", "--tgt", "{d}/{{split}}.fr"],
            1,
            "{d}/{{split}}.de: no file matches ({{split}} stands for any split name)",
        ),
        (
            ["--src", "{d}/{{split}}.en", "--tgt", "{d}/{{split}}.fr", "--split", "validation"],
            1,
            "{d}/{{split}}.en: no validation split ({d}/validation.en), and several candidates: valid ({d}/valid.en) and dev ({d}/dev.en); set --split to the one to use, e.g. --split=valid",
        ),
    ],
    ids=["split-in-one-path-only", "split-flag-without-pattern", "no-file-matches", "valid-and-dev"],
)
def test_data_cli_split_errors_are_one_line(tmp_path, capsys, argv, status, message):
    for split in ("train", "valid", "dev"):
        _write(tmp_path, split, GOOD)
    got = main(["data", *(a.format(d=tmp_path) for a in argv)])
    out, err = capsys.readouterr()
    assert got == status and out == ""
    assert _error_line(err, "data") == "attn-jax data: error: " + message.format(d=tmp_path)
