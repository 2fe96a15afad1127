"""Helpers the seed studies under experiments/ share: their sentence files, their ``results.jsonl`` and the
mean ± sd cells of their tables. Imported as ``experiments._results`` (the scripts put the repository on
``sys.path``)."""

from __future__ import annotations

import json
import os
import statistics


def read_lines(path: str) -> list[str]:
    """The lines of a sentence file written by ``evaluate_workdir`` (an empty file: no lines)."""
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1] if os.path.getsize(path) else []


def load_results(out: str) -> list[dict]:
    """The records of ``<out>/results.jsonl``, one per finished run (none yet: ``[]``)."""
    path = os.path.join(out, "results.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mean_sd_cell(xs: list[float]) -> str:
    """``mean ± sample sd`` to two decimals; one value as it is; none as ``n/a``.

    >>> mean_sd_cell([1.0, 2.0, 3.0]), mean_sd_cell([4.0]), mean_sd_cell([])
    ('2.00 ± 1.00', '4.00', 'n/a')
    """
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f}"
