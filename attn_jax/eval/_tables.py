"""Result tables as Markdown and JSON: BLEU by sentence length across systems, and a per-system summary."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from attn_jax.eval._alignment import AerResult
from attn_jax.eval._bleu import BleuByLength, BleuResult
from attn_jax.eval._plots import _common_buckets


@dataclasses.dataclass(frozen=True)
class SystemScores:
    """What the summary table shows for one system: overall BLEU, BLEU without ``<unk>``, AER (each optional
    but the first)."""

    bleu: BleuResult
    no_unk: BleuResult | None = None
    aer: AerResult | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict ``{"bleu": {...}, "no_unk": {...} | None, "aer": {...} | None}``."""
        return {
            "bleu": self.bleu.to_dict(),
            "no_unk": None if self.no_unk is None else self.no_unk.to_dict(),
            "aer": None if self.aer is None else self.aer.to_dict(),
        }


def bleu_by_length_markdown(results: Mapping[str, BleuByLength], *, digits: int = 2) -> str:
    """Markdown table of BLEU by source length: one row per bucket plus ``all``, one column per system.

    The ``sentences`` column gives each bucket's sentence count; if systems were scored on different sentences,
    each cell carries its own count instead. The sacreBLEU signature follows the table. NaN (empty bucket) is
    written ``—``.

    Args:
      results: system name -> :class:`BleuByLength`, all with the same buckets; column order = mapping order.
      digits: decimals of BLEU.

    Returns:
      The Markdown text, ending in a newline.

    >>> from attn_jax.eval import bleu_by_length, length_buckets
    >>> r = bleu_by_length(["a b c d"], ["a b c d"], ["x y"], buckets=length_buckets((5,)))
    >>> print(bleu_by_length_markdown({"sys": r}, digits=1))  # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    | source length | sentences | sys |
    |---|---:|---:|
    | 0-4 | 1 | 100.0 |
    | 5+ | 0 | — |
    | all | 1 | 100.0 |
    <BLANKLINE>
    sacreBLEU: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:...
    <BLANKLINE>
    """
    labels, counts = _common_buckets(results)
    names = list(results)
    shared = (
        all(len(c) == 1 for c in counts) and len({r.overall.num_sentences for r in results.values()}) == 1
    )
    header = ["source length", *(["sentences"] if shared else []), *map(_escape, names)]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    rows = [(lab, [r.buckets[k].bleu for r in results.values()]) for k, lab in enumerate(labels)]
    rows.append(("all", [r.overall for r in results.values()]))
    for label, scores in rows:
        cells = [label]
        if shared:
            cells.append(str(scores[0].num_sentences))
            cells += [_fmt(b.score, digits) for b in scores]
        else:
            cells += [f"{_fmt(b.score, digits)} (n={b.num_sentences})" for b in scores]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + _signatures(b.overall for b in results.values()) + "\n"


def bleu_by_length_json(results: Mapping[str, BleuByLength]) -> dict[str, Any]:
    """JSON-ready BLEU by source length for several systems.

    Returns:
      ``{"buckets": [labels], "rows": [{"bucket", "sentences": {system: n}, "bleu": {system: score}}, ...,
      {"bucket": "all", ...}], "systems": {system: BleuByLength.to_dict()}}``; NaN becomes ``None``.
    """
    labels, _ = _common_buckets(results)
    rows = []
    for k, label in enumerate([*labels, "all"]):
        scores = {n: (r.buckets[k].bleu if k < len(labels) else r.overall) for n, r in results.items()}
        rows.append(
            {
                "bucket": label,
                "sentences": {n: b.num_sentences for n, b in scores.items()},
                "bleu": {n: _none_if_nan(b.score) for n, b in scores.items()},
            }
        )
    return {"buckets": labels, "rows": rows, "systems": {n: r.to_dict() for n, r in results.items()}}


def summary_markdown(systems: Mapping[str, SystemScores], *, digits: int = 2) -> str:
    """Markdown table, one row per system: BLEU on all sentences, BLEU on those without ``<unk>`` (the paper's
    Table 1 columns "All" and "No UNK", with sentence counts), and AER in percent with precision and recall.

    Args:
      systems: system name -> :class:`SystemScores`; row order = mapping order.
      digits: decimals.

    Returns:
      The Markdown text (sacreBLEU signature after the table), ending in a newline.

    >>> from attn_jax.eval import alignment_error_rate, corpus_bleu
    >>> s = SystemScores(corpus_bleu(["a b c d"], ["a b c d"]), aer=alignment_error_rate(["0-0"], ["0-0 1-1"]))
    >>> print(summary_markdown({"sys": s}).splitlines()[2])
    | sys | 100.00 | 1 | — | — | 33.33 | 100.00 | 50.00 |
    """
    if not systems:
        raise ValueError("no systems to tabulate")
    header = ["system", "BLEU (all)", "sentences", "BLEU (No UNK)", "sentences", "AER (%)", "P (%)", "R (%)"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for name, s in systems.items():
        nan = math.nan
        no_unk = (s.no_unk.score, str(s.no_unk.num_sentences)) if s.no_unk is not None else (nan, "—")
        aer = (s.aer.aer, s.aer.precision, s.aer.recall) if s.aer is not None else (nan, nan, nan)
        cells = [
            _escape(name),
            _fmt(s.bleu.score, digits),
            str(s.bleu.num_sentences),
            _fmt(no_unk[0], digits),
            no_unk[1],
            *(_fmt(100.0 * x, digits) for x in aer),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + _signatures(s.bleu for s in systems.values()) + "\n"


def summary_json(systems: Mapping[str, SystemScores]) -> dict[str, Any]:
    """JSON-ready per-system summary ``{system: SystemScores.to_dict()}`` (AER as a fraction, NaN -> ``None``)."""
    if not systems:
        raise ValueError("no systems to tabulate")
    return {name: s.to_dict() for name, s in systems.items()}


# --------------------------------------------------------------------------------------------------------------


def _signatures(results) -> str:
    """One ``sacreBLEU: <signature>`` line per distinct signature."""
    sigs = list(dict.fromkeys(r.signature for r in results))
    return "\n".join(f"sacreBLEU: {s}" for s in sigs)


def _fmt(x: float, digits: int) -> str:
    """A number with ``digits`` decimals, or an em dash for NaN."""
    return "—" if math.isnan(x) else f"{x:.{digits}f}"


def _none_if_nan(x: float) -> float | None:
    """JSON has no NaN."""
    return None if math.isnan(x) else x


def _escape(name: str) -> str:
    """A system name safe inside a Markdown table cell."""
    return str(name).replace("|", r"\|")
