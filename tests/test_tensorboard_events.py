"""TensorBoard event files (``attn_jax.train.EventWriter`` over tensorboardX), read back with TensorBoard's own
reader, and the TensorBoard section of docs/cli.md checked against the packaging and the files written.

The trainer's and ``evaluate``'s files are checked on their real runs in tests/test_train_loop.py
(``test_tensorboard_scalars_read_by_tensorboard``) and tests/test_cli_evaluate.py
(``test_pngs_are_images_in_the_runs_tensorboard_log``); here the writer alone, in milliseconds.
"""

import io
import pathlib
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from attn_jax.train import EventWriter, MetricsLogger, read_metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _accumulator(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def test_metrics_logger_scalars_match_metrics_jsonl(tmp_path):
    """Each split is a TensorBoard run of its own; values, steps and tags are metrics.jsonl's; None, NaN, strings
    and booleans are not scalars."""
    logger = MetricsLogger(tmp_path, 20, stream=io.StringIO(), tty=False)
    logger.write(
        "train", 5, {"loss": 2.75, "tokens": 1234, "grad_norm": 0.1 + 0.2, "note": "x", "flag": True}
    )
    logger.write("train", 10, {"loss": 1.5, "tokens": 1300, "grad_norm": float("nan")})
    logger.write("validation", 10, {"loss": 1.625, "attn_diag_corr": None, "attn_entropy": 0.7})
    logger.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    for split, tags in (("train", {"loss", "tokens", "grad_norm"}), ("validation", {"loss", "attn_entropy"})):
        logdir = tmp_path / "tensorboard" / split
        assert len(list(logdir.glob("events.out.tfevents.*"))) == 1
        acc = _accumulator(logdir)
        assert set(acc.Tags()["scalars"]) == tags
        for tag in tags:
            want = [(r["step"], r[tag]) for r in records if r["split"] == split and r.get(tag) is not None]
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            assert [s for s, _ in got] == [s for s, _ in want]
            assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-7)  # float32 on disk


def test_images_keep_size_and_pixels(tmp_path):
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (13, 21, 4), dtype=np.uint8)  # odd, distinct sizes: a swapped H/W cannot pass
    rgb = rng.integers(0, 256, (7, 5, 3), dtype=np.uint8)
    Image.fromarray(rgba).save(tmp_path / "a.png")
    Image.fromarray(rgb).save(tmp_path / "b.png")
    with EventWriter(tmp_path / "tb") as w:
        w.images(42, {"eval/test/a": tmp_path / "a.png", "eval/test/b": tmp_path / "b.png"})
    acc = _accumulator(tmp_path / "tb")
    assert sorted(acc.Tags()["images"]) == ["eval/test/a", "eval/test/b"]
    for tag, want in (("eval/test/a", rgba), ("eval/test/b", rgb)):
        (event,) = acc.Images(tag)
        assert (event.step, event.height, event.width) == (42, *want.shape[:2])
        with Image.open(io.BytesIO(event.encoded_image_string)) as got:
            assert np.array_equal(np.asarray(got), want)


@pytest.mark.slow  # a fresh interpreter importing JAX: seconds, half a minute on a loaded machine
def test_import_attn_jax_train_does_not_import_the_writer():
    code = (
        "import sys, attn_jax, attn_jax.train; print('tensorboardX' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.slow  # a fresh interpreter importing JAX: seconds, half a minute on a loaded machine
def test_writer_leaves_torch_unimported(tmp_path):
    """tensorboardX imports an installed torch for a type alias; the writer hides it (seconds, and a second
    set of CUDA libraries beside JAX's), and torch stays importable afterwards."""
    code = (
        "import sys; from attn_jax.train import EventWriter\n"
        f"EventWriter({str(tmp_path)!r}).scalars(1, {{'x': 1.0}})\n"
        "print('torch' in sys.modules, sys.modules.get('torch', 0) is None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    assert out.stdout.split() == ["False", "False"]


def _readme_section(title: str) -> str:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    m = re.search(rf"^## {title}\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert m, f"docs/cli.md has no '## {title}' section"
    return m.group(1)


def test_readme_tensorboard_section_matches_packaging_and_files():
    """The TensorBoard section of docs/cli.md: the command, an extra that exists and holds the viewer, an install
    that `make install` does, and the run directories and tags that the writer really uses."""
    section = _readme_section("TensorBoard")
    assert "tensorboard --logdir runs/X/tensorboard" in section
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (viewer_extra,) = re.findall(r"pip install 'attn-jax\[(\w+)\]'", section)
    assert any(d.startswith("tensorboard>") for d in extras[viewer_extra])
    assert any(d.startswith("tensorboardX") for d in extras["train"]) and "attn-jax[train]" in section
    # `make install` (and so `make test`) installs EXTRAS, all,dev by default; `all` must pull the viewer in.
    (default_extras,) = re.findall(r"^EXTRAS \?= (\S+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert "all" in default_extras.split(",")
    (everything,) = extras["all"]
    assert viewer_extra in re.fullmatch(r"attn-jax\[([\w,]+)\]", everything).group(1).split(",")
    # The run directories and tags named (tests/test_cli_evaluate.py checks that evaluate writes these tags).
    for name in (
        "`train/`",
        "`validation/`",
        "`eval/`",
        "eval/<split>/bleu_by_length",
        "eval/<split>/attention_<k>",
    ):
        assert name in section, name
    assert "--config.tensorboard=false" in section
