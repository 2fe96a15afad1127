"""``attn-jax data`` says where the TFDS data go (``--data-dir``, the trainer's ``data.data_dir``) and how much it
wrote, and keeps TFDS's, absl's and TensorFlow's own output off its output unless ``--verbose``."""

import logging
import os
import re
import subprocess
import sys

import pytest

from attn_jax import data
from attn_jax.cli import main

_ANSI = re.compile(r"\x1b\[")
_LOG_LINE = re.compile(
    r"^[IW]\d{4} [\d:.]+ +\d+ \S+:\d+\] ", re.MULTILINE
)  # absl/glog: I1201 22:52:04.12 ...
_NAME = "attn_jax_synthetic/tiny"


def _files(root) -> dict[str, tuple[int, int]]:
    return {
        os.path.join(d, f): (os.stat(os.path.join(d, f)).st_size, os.stat(os.path.join(d, f)).st_mtime_ns)
        for d, _, fs in os.walk(root)
        for f in fs
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``attn-jax data --config tiny --data-dir D`` once, in a fresh interpreter (TensorFlow reads its logging
    settings when imported) with ``HOME`` elsewhere and stderr not a terminal: ``(D, HOME, process)``."""
    root = tmp_path_factory.mktemp("data_dir")
    data_dir, home = root / "tfds", root / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TFDS_DATA_DIR", "TF_CPP_MIN_LOG_LEVEL")}
    env["HOME"] = str(home)
    proc = subprocess.run(
        [sys.executable, "-m", "attn_jax.cli", "data", "--config", "tiny", "--data-dir", str(data_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a guard against a hang: TensorFlow's import alone took minutes on a loaded 2-core machine
    )
    return data_dir, home, proc


def test_writes_under_data_dir_says_where_and_how_much(built):
    data_dir, home, proc = built
    assert proc.returncode == 0, proc.stderr
    path = data_dir / _NAME / "1.0.0"
    assert (path / "dataset_info.json").is_file()
    # The corpus went to --data-dir: nothing of it under $HOME (TensorFlow may leave its own config there).
    assert not (home / "tensorflow_datasets").exists()
    assert not [f for f in _files(home) if "tfrecord" in f or "attn_jax_synthetic" in f]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("attn-jax data: ")]
    size = sum(n for n, _ in _files(path).values())
    assert ours == [
        f"attn-jax data: building {_NAME} in {path} (data dir {data_dir}, from --data-dir)",
        f"attn-jax data: wrote {size / 1e3:.1f} kB ({size:,} bytes) to {path}",
    ]
    assert proc.stdout.splitlines()[0] == f"corpus: {_NAME} (data_dir: {data_dir})"


def test_no_third_party_noise_without_verbose(built):
    _, _, proc = built
    for stream in (proc.stdout, proc.stderr):
        assert not _ANSI.search(stream) and "\r" not in stream  # no tqdm bars or colours
        assert not _LOG_LINE.search(stream)  # no absl/TensorFlow INFO or WARNING lines
        assert "absl::InitializeLog" not in stream and "oneDNN" not in stream
        assert "Downloading and preparing" not in stream and "Generating" not in stream  # TFDS's own prints
        assert "INFO:" not in stream
    # Every other stderr line is ours, or matplotlib's one-time notice under a fresh HOME (TensorFlow imports
    # Keras, which imports matplotlib): a warning, which stays.
    others = [
        line
        for line in proc.stderr.splitlines()
        if not line.startswith(("attn-jax data: ", "WARNING:matplotlib.font_manager:Matplotlib is building"))
    ]
    assert others == []


def test_reuse_writes_nothing_and_says_so(built, capsys, monkeypatch):
    data_dir, _, proc = built
    assert proc.returncode == 0, proc.stderr
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # run_data may set it; restored after the test
    before = _files(data_dir)
    assert main(["data", "--config", "tiny", "--data-dir", str(data_dir), "--split", "test"]) == 0
    out, err = capsys.readouterr()
    path = data_dir / _NAME / "1.0.0"
    size = sum(n for n, _ in _files(path).values())
    assert err.splitlines()[0] == (
        f"attn-jax data: reusing {_NAME} prepared in {path} ({size / 1e3:.1f} kB ({size:,} bytes); "
        f"data dir {data_dir}, from --data-dir); nothing written"
    )
    assert _files(data_dir) == before
    assert out.splitlines()[0] == f"corpus: {_NAME} (data_dir: {data_dir})"
    assert out.splitlines()[2].split()[:2] == ["test", "70"]


def test_cpp_log_lines_are_dropped_and_errors_kept(capfd):
    from attn_jax.cli._data import _filter_fd2

    with _filter_fd2():
        os.write(
            2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        )
        os.write(2, b"I0000 00:00:1796165616.263013    3409 port.cc:153] oneDNN custom operations are on.\n")
        os.write(2, b"W1201 22:52:04.123456   17 cpu_feature_guard.cc:227] This TensorFlow binary is\n")
        os.write(2, b"E1201 22:52:04.123456   17 cuda_dnn.cc:8] a real error\n")
        os.write(2, b"a line of our own\n")
    assert (
        capfd.readouterr().err
        == "E1201 22:52:04.123456   17 cuda_dnn.cc:8] a real error\na line of our own\n"
    )


@pytest.mark.parametrize("verbose", [False, True])
def test_verbose_lets_tfds_output_through(verbose, capsys, caplog, monkeypatch):
    from attn_jax.cli._data import _third_party_output

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    caplog.set_level(logging.NOTSET)
    absl = logging.getLogger("absl")
    level = absl.level
    with _third_party_output(verbose):
        print("Downloading and preparing dataset")  # what TFDS prints on stdout
        absl.info("Load dataset info from ...")
        absl.warning("a warning")
    out, err = capsys.readouterr()
    assert out == ""  # stdout is for the statistics either way
    assert ("Downloading and preparing dataset" in err) is verbose
    messages = [r.getMessage() for r in caplog.records if r.name == "absl"]
    assert messages == (["Load dataset info from ...", "a warning"] if verbose else ["a warning"])
    assert absl.level == level


def test_data_dir_config_key_reaches_the_loaders(tmp_path, monkeypatch):
    from attn_jax.train import default_config, load_corpus

    seen = []
    pairs = data.corpus_from_pairs([("a b", "x y")])
    monkeypatch.setattr(data, "load_synthetic_corpus", lambda *a, **k: seen.append(k["data_dir"]) or pairs)
    monkeypatch.setattr(data, "load_tfds_corpus", lambda *a, **k: seen.append(k["data_dir"]) or pairs)
    d = default_config().data
    d.use_tfds, d.synthetic, d.data_dir = True, "tiny", str(tmp_path)
    load_corpus(d, "test")
    d.corpus, d.tfds_name = "tfds", "wmt14_translate/fr-en"
    load_corpus(d, "test")
    d.data_dir = ""  # unset: TFDS's own default
    load_corpus(d, "test")
    assert seen == [str(tmp_path), str(tmp_path), None]


def test_train_says_where_a_tfds_corpus_is_read_or_built(tmp_path):
    """`attn-jax train` with a TFDS-read corpus names the directory before reading (issue 17: it built silently)."""
    from attn_jax.train import default_config
    from attn_jax.train._loop import _tfds_location

    d = default_config().data
    d.use_tfds, d.synthetic, d.data_dir = True, "tiny", str(tmp_path)
    first = _tfds_location(d)
    path = tmp_path / "attn_jax_synthetic" / "tiny"
    written = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert first.startswith(f"data: built attn_jax_synthetic/tiny in {path}/") and written > 100_000
    assert f"({written / 1e6:.1f} MB written; data.data_dir)" in first
    assert _tfds_location(d).startswith(f"data: reading attn_jax_synthetic/tiny from {path}/")  # reused
    d.corpus, d.tfds_name = "tfds", "wmt14_translate/fr-en"
    assert _tfds_location(d) == (
        f"data: wmt14_translate/fr-en is not prepared in {tmp_path}: TFDS downloads and builds it there now "
        "(needs internet; `tfds build` does it ahead; data.data_dir)"
    )
    d.corpus = "synthetic"
    d.use_tfds = False
    assert _tfds_location(d) is None  # generated in memory: nothing read from disk
