"""``attn-jax evaluate`` on a split with pairs whose source or reference is empty: the reader skips them, and
the count reaches stderr (one warning line), ``summary.json``, ``evaluation.json`` and the Markdown reports."""

import json

from attn_jax.cli import main
from tests.test_cli_translate import make_run

GOOD = [("the dog slept .", "le chien dormait ."), ("every monk stood .", "chaque moine ."), (".", ".")]
# Line 2 has no source, line 4 no reference: both are skipped by the corpus reader.
TEST = [GOOD[0], ("", "le chien ."), GOOD[1], ("the dog .", ""), GOOD[2]]


def _write(directory, split, pairs):
    (directory / f"{split}.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (directory / f"{split}.fr").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def _evaluate(run, split, out, capsys):
    flags = ["--split", split, "--beam", "1", "--heatmaps", "0", "--out", str(out)]
    status = main(["evaluate", "--workdir", run, *flags])
    _, err = capsys.readouterr()
    return status, [line for line in err.splitlines() if "empty" in line]


def test_skipped_empty_pairs_are_counted_on_stderr_and_in_summary(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write(corpus, "test", TEST)
    _write(corpus, "valid", GOOD)
    overrides = (
        "data.corpus=plain",
        f"data.source_path={corpus}/{{split}}.en",
        f"data.target_path={corpus}/{{split}}.fr",
    )
    run = make_run(tmp_path / "run", overrides=overrides)

    status, lines = _evaluate(run, "test", tmp_path / "test", capsys)
    assert status == 0
    assert lines == [
        f"warning: 2 pairs of {corpus}/test.en | {corpus}/test.fr with an empty source or reference skipped "
        "(not translated, not scored)"
    ]
    summary = json.loads((tmp_path / "test" / "summary.json").read_text())
    assert summary["RNNsearch"]["skipped_empty"] == 2
    assert summary["RNNsearch"]["bleu"]["sentences"] == 3
    full = json.loads((tmp_path / "test" / "evaluation.json").read_text())
    assert full["skipped_empty"] == 2 and full["num_sentences"] == 3
    assert (tmp_path / "test" / "sources.txt").read_text().splitlines() == [s for s, _ in GOOD]
    for name in ("summary.md", "evaluation.md"):
        assert "2 pairs of " in (tmp_path / "test" / name).read_text()

    # A split without empty sides: no warning, and 0 in the JSON (present, so a program need not guess).
    status, lines = _evaluate(run, "valid", tmp_path / "valid", capsys)
    assert status == 0 and lines == []
    assert json.loads((tmp_path / "valid" / "summary.json").read_text())["RNNsearch"]["skipped_empty"] == 0
    assert "empty" not in (tmp_path / "valid" / "summary.md").read_text()
