"""TensorBoard event files through ``tensorboardX`` (no TensorFlow): scalars per step, and PNG files as images.

``tensorboardX`` (the ``train`` extra) writes the TFRecord/protobuf format and its checksums; it is imported on
the first :class:`EventWriter`, so ``import attn_jax`` never pays for it. The viewer, ``tensorboard``, is the
``viz`` extra: ``tensorboard --logdir <workdir>/tensorboard``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import numpy as np

__all__ = ["EventWriter"]


def _summary_writer_class():
    # tensorboardX's writer module imports torch when it is installed (only for a type alias): measured 0.7 s
    # without torch against 13 s with it on a loaded 2-core machine, plus torch's own CUDA libraries beside
    # JAX's on a GPU. Hide an installed-but-unimported torch for this one import; tensorboardX and the standard
    # library are all it loads then.
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
    try:
        from tensorboardX import SummaryWriter
    except ImportError as e:
        raise ImportError(
            f"TensorBoard event files need tensorboardX ({e}): pip install 'attn-jax[train]', "
            "or turn them off with --config.tensorboard=false"
        ) from e
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter


def _read_png(path: str | os.PathLike) -> np.ndarray:
    """A PNG file's pixels, ``[H, W, C]`` uint8 with C = 3 or 4, exactly as stored (no float round trip)."""
    from PIL import Image  # pillow: a dependency of matplotlib, which drew the picture

    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA" if "A" in im.getbands() else "RGB"))


class EventWriter:
    """Append summaries to a new event file in ``logdir`` (one file per writer, as TensorBoard expects).

    Every call is flushed at once, so a TensorBoard watching a live run sees each step as it is written.

    >>> import tempfile
    >>> with EventWriter(tempfile.mkdtemp()) as w:
    ...     w.scalars(10, {"loss": 2.5})
    """

    def __init__(self, logdir: str | os.PathLike):
        self.logdir = os.fspath(logdir)
        os.makedirs(self.logdir, exist_ok=True)
        self._writer = _summary_writer_class()(logdir=self.logdir)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Write a scalar per ``tag: value`` at ``step`` (non-numbers, booleans included, are skipped)."""
        for tag, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self._writer.add_scalar(tag, float(v), int(step))
        self._writer.flush()

    def images(self, step: int, pngs: Mapping[str, str | os.PathLike]) -> None:
        """Write the PNG file at each ``tag: path`` as an image at ``step`` (pixels unchanged)."""
        for tag, path in pngs.items():
            self._writer.add_image(tag, _read_png(path), int(step), dataformats="HWC")
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
