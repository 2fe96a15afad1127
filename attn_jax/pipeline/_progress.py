"""Decoding progress with a rate and an ETA, drawn on an ``attn_jax.train.ProgressLine``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["decode_progress"]


def decode_progress(
    line, *, clock: Callable[[], float] = time.monotonic
) -> Callable[[int, int, float], None]:
    """A ``progress`` callback for :func:`evaluate_workdir` or :func:`translate_sentences` that draws on ``line``
    (an ``attn_jax.train.ProgressLine``, as ``attn-jax train`` does) the sentences done, their rate and an ETA.

    The clock starts at the call with 0 sentences done; the ETA extrapolates the elapsed time over the
    fraction of the work left (source tokens: batches run from the shortest sentences to the longest, so a
    count of sentences would promise too early an end).
    """
    from attn_jax.train import format_duration

    start = [clock()]

    def update(done: int, total: int, fraction: float) -> None:
        now = clock()
        if done == 0:
            start[0] = now
            return
        elapsed = now - start[0]
        eta = elapsed * (1.0 - fraction) / fraction if fraction > 0 else math.inf
        rate = done / elapsed if elapsed > 0 else math.inf
        line.update(
            done,
            total,
            f"{rate:.1f} sentences/s | elapsed {format_duration(elapsed)} | "
            f"ETA {format_duration(eta) if math.isfinite(eta) else '?'}",
        )

    return update
