"""Where training metrics go: JSON lines, TensorBoard event files, and the terminal.

* ``<workdir>/metrics.jsonl``: one JSON object per line, ``{"step": int, "split": "train" | "validation", ...}``
  (non-finite numbers and undefined values are ``null``).
* ``<workdir>/tensorboard/{train,validation}/events.out.tfevents.*``: the same numbers as TensorBoard scalars
  (two runs with the same tag names, so TensorBoard overlays train and validation curves).
* The terminal: on a TTY a single progress line (step, loss, tokens/s, ETA) rewritten in place, with
  validation results and checkpoint notes printed above it; otherwise plain log lines every ``log_every`` steps.

:class:`ProgressLine` is that terminal display on its own (bar or plain lines), for any long loop: the trainer's
:class:`MetricsLogger` and ``attn-jax evaluate``'s decoding both draw with it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import IO

from attn_jax.train._tensorboard import EventWriter

__all__ = ["MetricsLogger", "ProgressLine", "format_duration", "read_metrics"]


def format_duration(seconds: float) -> str:
    """``3725.2 -> '1h02m05s'``, ``65 -> '1m05s'``, ``4.2 -> '4s'``.

    >>> format_duration(3725.2), format_duration(65), format_duration(4.2)
    ('1h02m05s', '1m05s', '4s')
    """
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a ``metrics.jsonl`` file (an incomplete last line, from a killed run, is skipped)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


class ProgressLine:
    """Progress of a loop on ``stream``: a bar redrawn in place on a terminal, or plain lines elsewhere.

    ``update(done, total, text)`` shows ``{label} {done}/{total} [####----] {text}``. On a TTY (``tty`` True, or
    ``stream.isatty()`` when None) that one line is rewritten in place, at most 10 times a second unless
    ``force``; :meth:`log` prints a permanent line above it. Otherwise (``--progress lines``, a pipe, a log file)
    ``update`` prints ``{label} {done}/{total}: {text}`` as a line of its own: the first, then at most one
    every ``every_s`` seconds, and the last (``done == total``); ``every_s=None`` prints none (a caller that
    writes its own lines, as the trainer does).

    >>> import io
    >>> out = io.StringIO()
    >>> p = ProgressLine(out, tty=False, label="decoding", every_s=0.0)
    >>> p.update(3, 9, "ETA 4s"); p.update(9, 9, "done"); print(out.getvalue(), end="")
    decoding 3/9: ETA 4s
    decoding 9/9: done
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        tty: bool | None = None,
        label: str = "step",
        every_s: float | None = 10.0,
    ):
        self.stream = stream if stream is not None else sys.stdout
        self.tty = bool(tty if tty is not None else getattr(self.stream, "isatty", lambda: False)())
        self.label = label
        self.every_s = every_s
        self._bar_shown = False
        self._last_bar = 0.0
        self._last_line: float | None = None

    def log(self, line: str) -> None:
        """Print a permanent line (above the bar on a TTY)."""
        if self._bar_shown:
            self.stream.write("\r\033[K")
            self._bar_shown = False
        self.stream.write(line + "\n")
        self.stream.flush()

    def update(self, done: int, total: int, text: str, *, force: bool = False) -> None:
        """Show that ``done`` of ``total`` are done, with ``text`` (rates, ETA) after the count."""
        now = time.monotonic()
        if not self.tty:
            due = self._last_line is None or done >= total
            if self.every_s is None or not (force or due or now - self._last_line >= self.every_s):
                return
            self._last_line = now
            self.log(f"{self.label} {done}/{total}: {text}")
            return
        if not force and now - self._last_bar < 0.1:
            return
        self._last_bar = now
        width = 24
        filled = int(width * done / max(total, 1))
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r\033[K{self.label} {done}/{total} [{bar}] {text}")
        self.stream.flush()
        self._bar_shown = True

    def close(self) -> None:
        """End the bar's line (the next output starts on a line of its own)."""
        if self._bar_shown:
            self.stream.write("\n")
            self.stream.flush()
            self._bar_shown = False


class MetricsLogger:
    """Writes metrics to ``workdir`` (JSON lines, TensorBoard) and reports progress on ``stream``.

    Args:
      workdir: the run directory.
      total_steps: the run's last step (for the progress bar and the ETA).
      tensorboard: also write TensorBoard event files.
      stream: where progress and log lines go (default stdout).
      tty: force progress-bar (True) or plain-line (False) output; default: ``stream.isatty()``.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        total_steps: int,
        *,
        tensorboard: bool = True,
        stream: IO[str] | None = None,
        tty: bool | None = None,
    ):
        self.path = os.path.join(os.fspath(workdir), "metrics.jsonl")
        self.total_steps = total_steps
        # The trainer writes its own plain lines every log_every steps (with the loss), hence every_s=None.
        self._line = ProgressLine(stream, tty=tty, label="step", every_s=None)
        self.stream, self.tty = self._line.stream, self._line.tty
        self._tb_dir = os.path.join(os.fspath(workdir), "tensorboard") if tensorboard else None
        self._writers: dict[str, EventWriter] = {}

    def truncate_after(self, step: int) -> None:
        """Drop records after ``step`` (a resumed run rewrites the steps its killed predecessor got past)."""
        if not os.path.exists(self.path):
            return
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for r in kept:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, self.path)

    def write(self, split: str, step: int, values: dict) -> None:
        """Append a record ``{"step", "split", **values}`` to the JSON lines and TensorBoard."""
        record = {"step": int(step), "split": split, **{k: _clean(v) for k, v in values.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
        if self._tb_dir is not None:
            if split not in self._writers:
                self._writers[split] = EventWriter(os.path.join(self._tb_dir, split))
            self._writers[split].scalars(
                step, {k: v for k, v in record.items() if k not in ("step", "split")}
            )

    def log(self, line: str) -> None:
        """Print a permanent line (above the progress bar on a TTY)."""
        self._line.log(line)

    def progress(
        self, step: int, loss: float, tokens_per_s: float, eta_s: float, *, force: bool = False
    ) -> None:
        """Redraw the progress line (TTY only; at most 10 times a second unless ``force``)."""
        text = f"loss {loss:.4f} | {tokens_per_s:,.0f} tok/s | ETA {format_duration(eta_s)}"
        self._line.update(step, self.total_steps, text, force=force)

    def close(self) -> None:
        self._line.close()
        for w in self._writers.values():
            w.close()
        self._writers.clear()
