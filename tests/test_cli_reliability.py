"""``attn-jax translate`` / ``evaluate`` never give a quietly wrong answer: output line k belongs to input line k
whatever bytes the input holds, and ``--checkpoint best`` on a run with no evaluated checkpoint falls back to the
latest one and says so on stderr."""

import io
import json
import os
import shutil

import pytest

from attn_jax.cli import main
from attn_jax.cli._translate import split_lines
from attn_jax.pipeline import load_model, translate_sentences
from tests.test_cli_translate import make_run

# Three sentences; the first two hold characters str.splitlines() (not the corpus reader) breaks lines at.
RAW = b"the cat\x0csat .\nthe dog \xe2\x80\xa8ran .\nthe red house .\n"
AS_TRAINED = ["the cat sat .", "the dog ran .", "the red house ."]  # the same tokens, space-separated


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"))


def _translate(argv, capsys, monkeypatch=None, stdin: bytes | None = None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    status = main(["translate", *argv])
    out, err = capsys.readouterr()
    return status, out, _without_length_warning(err)


def _without_length_warning(err: str) -> str:
    """stderr without the length-limit line: make_run's untrained model never chooses </s>, so every translation
    stops at the limit and says so (tests/test_decode_limits.py checks that line); these tests check the rest."""
    return "".join(line for line in err.splitlines(True) if "stopped at the length limit" not in line)


def test_split_lines_splits_on_newline_only():
    # hand-written cases: every separator but \n stays inside its line; \r\n and a final \n end lines
    assert split_lines("a\x0cb\nc\u2028d\r\ne\x85f\u2029g\x1ch\vi\rj\n") == [
        "a\x0cb",
        "c\u2028d",
        "e\x85f\u2029g\x1ch\vi\rj",
    ]
    assert split_lines("a\n\nb") == ["a", "", "b"]  # a blank line is a line
    assert split_lines("a\n\n") == ["a", ""]
    assert split_lines("") == [] and split_lines("\n") == [""]
    assert "a\x0cb\n".splitlines() == ["a", "b"]  # the behaviour this replaces


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_output_line_k_translates_input_line_k_whatever_the_separators(
    run_dir, tmp_path, capsys, monkeypatch, source
):
    if source == "file":
        path = tmp_path / "in.txt"
        path.write_bytes(RAW)
        status, out, err = _translate(["--workdir", run_dir, "--input", str(path), "--beam", "2"], capsys)
    else:
        status, out, err = _translate(["--workdir", run_dir, "--beam", "2"], capsys, monkeypatch, stdin=RAW)
    assert status == 0 and err == ""
    assert out.count("\n") == 3  # `wc -l`: 5 before
    # Each line is the translation of its input line, read as whitespace-separated tokens (as in training).
    want = [h[0].text for h in translate_sentences(load_model(run_dir), AS_TRAINED, beam_size=2)]
    assert out.split("\n")[:3] == want


def test_crlf_and_lone_carriage_returns_keep_the_alignment(run_dir, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_bytes(b"the cat\rsat .\r\nthe dog ran .\r\n\r\nthe red house .")  # no final newline
    status, out, err = _translate(["--workdir", run_dir, "--input", str(path), "--beam", "2"], capsys)
    assert status == 0, err
    lines = out.split("\n")
    assert len(lines) == 5 and lines[-1] == "" and lines[2] == ""  # 4 lines, the blank one blank
    want = [h[0].text for h in translate_sentences(load_model(run_dir), AS_TRAINED, beam_size=2)]
    assert [lines[0], lines[1], lines[3]] == want


def test_json_output_stays_one_line_per_input(run_dir, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_bytes(RAW.replace(b"sat", b"\xc2\x85sat\xe2\x80\xa9"))  # also NEL and U+2029 inside line 1
    status, out, err = _translate(
        ["--workdir", run_dir, "--input", str(path), "--beam", "2", "--alignment", "json"], capsys
    )
    assert status == 0, err
    lines = out.splitlines()  # the strictest reader: it breaks at U+2028, U+2029 and NEL too
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert (
        records[0]["source"] == "the cat\x0c\x85sat\u2029 ." and records[1]["source"] == "the dog \u2028ran ."
    )
    assert records[0]["hypotheses"][0]["tokens"] is not None


# --- --checkpoint best on a run killed before any checkpoint was evaluated ---------------------------------


def _run_without_metrics(source_run, workdir, steps=(2, 4)) -> str:
    """A copy of ``source_run`` whose checkpoints (``steps``) carry no validation metrics, as a run killed with
    ``checkpoint_every < eval_every`` leaves them; step 4's parameters are step 2's plus one, so they differ."""
    import jax
    import numpy as np

    from attn_jax.train import CheckpointManager

    shutil.copytree(os.path.join(source_run, "vocab"), os.path.join(workdir, "vocab"))
    reader = CheckpointManager(os.path.join(source_run, "checkpoints"), async_save=False, read_only=True)
    restored = reader.restore(reader.latest_step())
    reader.close()
    manager = CheckpointManager(os.path.join(workdir, "checkpoints"), async_save=False)
    for k, step in enumerate(steps):
        state = dict(restored.state)
        state["params"] = jax.tree.map(lambda p, k=k: np.asarray(p) + k, restored.state["params"])
        manager.save(step, state, {}, restored.config, None)
    manager.close()
    return str(workdir)


@pytest.fixture(scope="module")
def unevaluated_run(run_dir, tmp_path_factory):
    return _run_without_metrics(run_dir, tmp_path_factory.mktemp("unevaluated"))


def test_best_falls_back_to_the_latest_and_says_so(unevaluated_run, tmp_path, capsys):
    from attn_jax.train import load_checkpoint

    restored = load_checkpoint(unevaluated_run, best=True)
    assert restored.step == 4 and "no kept checkpoint has validation metrics" in restored.note
    assert load_checkpoint(unevaluated_run).note == ""  # latest, as asked: nothing to say
    path = tmp_path / "in.txt"
    path.write_text("the dog slept .\n", encoding="utf-8")
    argv = ["--workdir", unevaluated_run, "--input", str(path), "--beam", "2"]
    status, out_best, err = _translate(argv, capsys)  # --checkpoint best is the default
    assert status == 0
    assert err.count("\n") == 1 and err.startswith("attn-jax translate: warning: no kept checkpoint")
    assert "step 4 (of [2, 4])" in err
    status, out_last, err_last = _translate([*argv, "--checkpoint", "last"], capsys)
    assert status == 0 and err_last == "" and out_best == out_last
    status, out_2, _ = _translate([*argv, "--checkpoint", "2"], capsys)
    assert status == 0 and out_2 != out_last  # the two steps differ, so the equality above means step 4


def test_best_with_an_evaluated_checkpoint_is_unchanged(run_dir, unevaluated_run, tmp_path):
    from attn_jax.train import CheckpointManager, load_checkpoint

    restored = load_checkpoint(run_dir, best=True)
    assert restored.step == 1 and restored.note == ""
    # one evaluated checkpoint among unevaluated later ones: best is the evaluated one, silently
    mixed = _run_without_metrics(run_dir, tmp_path / "mixed", steps=(5, 6))
    manager = CheckpointManager(os.path.join(mixed, "checkpoints"), async_save=False)
    manager.save(3, restored.state, {}, restored.config, {"nll_per_token": 2.0})
    manager.close()
    got = load_checkpoint(mixed, best=True)
    assert got.step == 3 and got.note == ""
    assert load_checkpoint(unevaluated_run, step=2).note == ""


def test_no_checkpoint_at_all_is_still_an_error(tmp_path, capsys):
    os.makedirs(tmp_path / "checkpoints")
    (tmp_path / "in.txt").write_text("the dog slept .\n", encoding="utf-8")
    status, out, err = _translate(["--workdir", str(tmp_path), "--input", str(tmp_path / "in.txt")], capsys)
    assert status == 1 and out == "" and err.count("\n") == 1 and "no checkpoint" in err


def test_evaluate_falls_back_too_and_records_it(unevaluated_run, tmp_path, capsys):
    out_dir = tmp_path / "eval"
    status = main(
        ["evaluate", "--workdir", unevaluated_run, "--beam", "1", "--max-examples", "2", "--heatmaps", "0"]
        + ["--out", str(out_dir)]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    warnings = [line for line in err.splitlines() if "no kept checkpoint has validation metrics" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ")
    assert "checkpoint step 4" in out
    record = json.loads((out_dir / "evaluation.json").read_text(encoding="utf-8"))
    assert record["step"] == 4 and "no kept checkpoint" in record["checkpoint_note"]
    assert "no kept checkpoint" in (out_dir / "evaluation.md").read_text(encoding="utf-8")
