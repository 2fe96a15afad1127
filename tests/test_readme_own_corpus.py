"""The "Four commands" of docs/own-corpus.md, run verbatim on the corpus shipped for them.

The block is the fenced code block after the ``<!-- own-corpus-commands -->`` marker in docs/own-corpus.md.
Each command (a ``\\``-continued line joined, comments dropped) runs with ``bash -c`` exactly as written, in a fresh temporary
directory that holds symbolic links to the repository's ``configs/`` and ``tests/data/own_corpus/``: the paths
the commands name resolve as they do from the repository root, while what they write (``runs/own``) lands in the
temporary directory. Nothing in the commands is substituted; ``attn-jax`` is the one installed beside the
Python running the tests (its directory is put first on ``PATH``). The environment is the test session's
(``tests/conftest.py``'s ``XLA_FLAGS``: 8 fake devices, which an unsharded run ignores, and XLA's faster
compilation).
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

_ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = _ROOT / "tests" / "data" / "own_corpus"
MARKER = "<!-- own-corpus-commands -->"


def readme_commands(text: str) -> list[str]:
    """The commands of the fenced block after ``MARKER``: continuation lines joined, comments and blanks dropped."""
    _, found, rest = text.partition(MARKER)
    assert found, f"docs/own-corpus.md has no {MARKER} marker"
    lines = rest.lstrip("\n").splitlines()
    assert lines[0].startswith("```"), (
        f"the line after {MARKER} must open a fenced code block, got {lines[0]!r}"
    )
    block = lines[1 : lines.index("```", 1)]
    commands, current = [], ""
    for line in block:
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        commands.append(" ".join((current + line).split()))
        current = ""
    assert not current, "the block ends inside a continued command"
    return commands


def _lines(path: pathlib.Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_the_readme_block_is_the_whole_sequence():
    commands = readme_commands((_ROOT / "docs" / "own-corpus.md").read_text(encoding="utf-8"))
    assert [c.split()[:2] for c in commands] == [
        ["attn-jax", "data"],
        ["attn-jax", "train"],
        ["attn-jax", "translate"],
        ["attn-jax", "evaluate"],
    ]
    train = commands[1]
    assert "--config.data.vocab=sentencepiece" in train and "--config.data.corpus=plain" in train
    assert "tests/data/own_corpus/{split}.en" in train and "--workdir runs/own" in train


def test_the_shipped_corpus_is_what_its_script_writes(tmp_path):
    sys.path.insert(0, str(CORPUS))
    try:
        import make_corpus
    finally:
        sys.path.remove(str(CORPUS))
    make_corpus.write(tmp_path)
    names = sorted(p.name for lang in ("en", "fr") for p in CORPUS.glob(f"*.{lang}"))
    assert names == [f"{s}.{lang}" for s in ("test", "train", "valid") for lang in ("en", "fr")]
    for name in names:
        assert (tmp_path / name).read_bytes() == (CORPUS / name).read_bytes(), name
    assert sum((CORPUS / n).stat().st_size for n in names) < 100_000
    assert [len(_lines(CORPUS / f"{s}.en")) for s in ("train", "valid", "test")] == [400, 40, 40]


@pytest.mark.slow
def test_readme_own_corpus_commands_run_verbatim(tmp_path):
    commands = readme_commands((_ROOT / "docs" / "own-corpus.md").read_text(encoding="utf-8"))
    (tmp_path / "configs").symlink_to(_ROOT / "configs", target_is_directory=True)
    (tmp_path / "tests" / "data").mkdir(parents=True)
    (tmp_path / "tests" / "data" / "own_corpus").symlink_to(CORPUS, target_is_directory=True)
    bindir = os.path.dirname(sys.executable)
    assert os.path.exists(os.path.join(bindir, "attn-jax")), f"attn-jax is not installed in {bindir}"
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    outputs, timings = [], []
    for command in commands:
        t0 = time.perf_counter()
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        timings.append(round(time.perf_counter() - t0, 1))
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
        outputs.append(done)
    print("wall seconds per command:", timings)
    data_out, train_out, _, evaluate_out = outputs

    # prepare: every split is listed, the empty sides counted.
    assert "corpus: tests/data/own_corpus/{split}.en | tests/data/own_corpus/{split}.fr" in data_out.stdout
    for split, pairs, empty in (("train", 399, 1), ("valid", 40, 0), ("test", 39, 1)):
        assert any(
            line.split()[:2] == [split, str(pairs)] and line.split()[-1] == str(empty)
            for line in data_out.stdout.splitlines()
        ), data_out.stdout

    # train: SentencePiece vocabularies, the trained checkpoint and the vocabularies beside it.
    run = tmp_path / "runs" / "own"
    log = train_out.stdout + train_out.stderr
    assert "data: SentencePiece unigram vocabularies trained on the 399 training pairs" in log
    assert "1 with an empty side" in log
    steps = [int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps, f"no checkpoint in {run / 'checkpoints'}"
    assert json.loads((run / "vocab" / "target" / "vocab.json").read_text())["kind"] == "sentencepiece"

    # translate: one line per input line.
    hyp = next(run.glob("test.hyp.*"))
    assert len(_lines(hyp)) == len(_lines(CORPUS / "test.en")) == 40

    # evaluate: summary.json with a BLEU over the 39 test pairs with both sides, the skipped one said.
    summary = json.loads((run / "eval" / "test" / "summary.json").read_text())
    (scores,) = summary.values()
    assert isinstance(scores["bleu"]["bleu"], float) and 0.0 <= scores["bleu"]["bleu"] <= 100.0
    assert scores["bleu"]["sentences"] == 39 and scores["skipped_empty"] == 1
    assert (
        "warning: 1 pair of tests/data/own_corpus/test.en | tests/data/own_corpus/test.fr with an empty"
        in (evaluate_out.stderr)
    )
