"""``attn-jax data``: statistics of the built-in corpus, plain-text and TFDS corpora; one-line errors."""

import argparse

import pytest

from attn_jax.cli import main
from attn_jax.cli._data import add_data_parser, run_data
from attn_jax.data import SyntheticSpec, generate_synthetic


def _run(argv, capsys):
    status = main(["data", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def _error_line(err: str) -> str:
    """The CLI's own error line (TensorFlow may log other lines to stderr)."""
    lines = [line for line in err.splitlines() if line.startswith("attn-jax data: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_builtin_corpus_statistics(tmp_path, capsys):
    status, out, _ = _run(["--config", "tiny", "--data-dir", str(tmp_path)], capsys)
    assert status == 0
    tiny = generate_synthetic(SyntheticSpec(train_size=200, validation_size=50, test_per_bucket=10))
    lines = out.splitlines()
    assert lines[0] == f"corpus: attn_jax_synthetic/tiny (data_dir: {tmp_path})"
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert rows["train"][1] == "200" and rows["validation"][1] == "50" and rows["test"][1] == "70"
    assert rows["train"][2] == f"{sum(len(p.source.split()) for p in tiny['train']):,}"
    # Histogram: the stratified test split has 10 pairs in every bucket.
    hist = {line.split()[0]: line.split()[1:] for line in lines if line[:1].isdigit()}
    assert list(hist) == ["0-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60+"]
    assert all(row[2] == "10" for row in hist.values())
    assert sum(int(row[0]) for row in hist.values()) == 200
    n_src = len({w for p in tiny["train"] for w in p.source.split()})
    assert f"source: {n_src:,} word types" in out
    example = tiny["test"][0]
    assert f"  source:    {example.source}" in lines
    assert f"  alignment: {example.alignment}" in lines
    assert "the->(none)" in out


def test_plain_corpus_statistics(tmp_path, capsys):
    (tmp_path / "a.en").write_text("the cat sat .\n\nhello world\n")
    (tmp_path / "a.fr").write_text("le chat .\nvide\nbonjour le monde\n")
    status, out, _ = _run(
        ["--src", str(tmp_path / "a.en"), "--tgt", str(tmp_path / "a.fr"), "--vocab-size", "2"], capsys
    )
    assert status == 0
    assert "all                  2           6           6" in out
    assert out.splitlines()[2].split()[-1] == "1"  # one pair skipped for its empty line
    # Shortlist K=2 of the source (cat sat . the hello world: 6 words, 1 each) covers 2/6 tokens.
    assert "source: 6 word types; shortlist K=2 (+4 specials) covers 33.33% of tokens" in out
    assert "  source:    the cat sat ." in out and "alignment" not in out


def test_tsv_statistics(tmp_path, capsys):
    (tmp_path / "p.tsv").write_text("a b\tx\nc\ty z\n")
    status, out, _ = _run(["--tsv", str(tmp_path / "p.tsv"), "--example", "1"], capsys)
    assert status == 0 and "  target:    y z" in out


@pytest.mark.parametrize(
    "src, tgt, message",
    [
        (b"a\nb\n", b"x\n", "{d}/s.txt:2: line has no partner: {d}/s.txt has 2 lines but {d}/t.txt has 1"),
        (b"a\n\xc3\x28\n", b"x\ny\n", "{d}/s.txt:2: invalid UTF-8 (byte 0xc3 at column 1)"),
        (None, b"x\n", "{d}/s.txt: no such file"),
        (b"\n\n", b"x\ny\n", "{d}/s.txt | {d}/t.txt: no sentence pairs (skipped 2 pairs with an empty side)"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path, capsys, src, tgt, message):
    if src is not None:
        (tmp_path / "s.txt").write_bytes(src)
    (tmp_path / "t.txt").write_bytes(tgt)
    status, out, err = _run(["--src", str(tmp_path / "s.txt"), "--tgt", str(tmp_path / "t.txt")], capsys)
    assert status == 1 and out == ""
    assert _error_line(err) == "attn-jax data: error: " + message.format(d=tmp_path)


def test_bad_arguments(tmp_path, capsys):
    status, _, err = _run(["--src", "x"], capsys)
    assert status == 2 and _error_line(err) == "attn-jax data: error: --src and --tgt go together"
    status, _, err = _run(["--src", "x", "--tgt", "y", "--tsv", "z"], capsys)
    assert status == 2 and "choose one corpus" in _error_line(err)
    status, _, err = _run(
        ["--tfds", "no_such_dataset_xyz", "--split", "train", "--data-dir", str(tmp_path)], capsys
    )
    assert status == 1 and _error_line(err).startswith(
        "attn-jax data: error: no_such_dataset_xyz: unknown TFDS dataset"
    )


def test_tfds_dataset_under_mock_data(tmp_path, capsys):
    import tensorflow_datasets as tfds

    argv = [
        "--tfds",
        "wmt14_translate/fr-en",
        "--source-key",
        "en",
        "--target-key",
        "fr",
        "--split",
        "train",
        "--split",
        "validation",
        "--data-dir",
        str(tmp_path),
    ]
    with tfds.testing.mock_data(num_examples=12):
        status, out, _ = _run(argv, capsys)
    assert status == 0
    assert out.splitlines()[0] == "corpus: wmt14_translate/fr-en"
    assert out.splitlines()[2].startswith("train") and out.splitlines()[3].startswith("validation")
    assert "example pair (train #0)" in out  # no test split: the first split


def test_tfds_not_prepared(tmp_path, capsys):
    status, _, err = _run(
        ["--tfds", "wmt14_translate/fr-en", "--split", "test", "--data-dir", str(tmp_path)], capsys
    )
    assert status == 1
    assert "wmt14_translate/fr-en: not prepared in" in _error_line(err)


def test_parser_wiring():
    parser = argparse.ArgumentParser()
    add_data_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "--config", "small", "--split", "test"])
    assert args.func is run_data and args.config == "small" and args.split == ["test"]
