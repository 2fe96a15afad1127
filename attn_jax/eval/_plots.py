"""PNG pictures for the report: attention heatmaps (the paper's Figure 3) and BLEU by sentence length (Figure 2).

Drawn on a bare ``matplotlib.figure.Figure`` with an explicit Agg canvas: pyplot is never imported, so no global
backend is selected, no figure registry fills up, and a caller's own matplotlib set-up is left alone.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from jaxtyping import ArrayLike, Float

from attn_jax._extras import needed_by
from attn_jax.eval._alignment import Alignment, Link, _as_gold, _check_weights
from attn_jax.eval._bleu import BleuByLength

# Inches per source/target word and for the tick labels and title around the matrix.
_INCH_PER_WORD = 0.25
_MARGIN_INCH = 2.0


def attention_figsize(source_length: int, target_length: int) -> tuple[float, float]:
    """Default heatmap size in inches: ``(2 + 0.25·S, 2 + 0.25·T)``; at ``dpi`` the PNG is that times dpi pixels.

    >>> attention_figsize(8, 4)
    (4.0, 3.0)
    """
    return (
        _MARGIN_INCH + _INCH_PER_WORD * source_length,
        _MARGIN_INCH + _INCH_PER_WORD * target_length,
    )


def plot_attention(
    weights: Float[ArrayLike, "T S"],
    source_words: Sequence[str],
    target_words: Sequence[str],
    path: str | os.PathLike,
    *,
    gold: Alignment | Iterable[Link] | str | None = None,
    title: str | None = None,
    figsize: tuple[float, float] | None = None,
    dpi: int = 100,
) -> str:
    """Write a heatmap of one sentence's attention weights as a PNG (Bahdanau et al., 2015, Figure 3).

    Source words run along the x axis (labels on top), target words down the y axis; cell ``(j, i)`` shows
    ``α_ji``, the weight of source word ``i`` when producing target word ``j``, in grayscale with black = 0 and
    white = 1 (fixed range, so pictures are comparable), with a colour bar and the axes titled "source words" /
    "target words". Gold links ``(i, j)`` are drawn as hollow red squares.

    Args:
      weights: attention weights ``[T, S]`` in [0, 1] (pass the sub-matrix of the words you label, e.g. with
        ``</s>`` rows/columns when ``"</s>"`` is among the words).
      source_words: S labels for the columns.
      target_words: T labels for the rows.
      path: where to write the PNG (parent directories are created).
      gold: optional gold alignment (links ``(i, j)``, :class:`Alignment` or Pharaoh text) to overlay.
      title: optional figure title.
      figsize: inches ``(width, height)``; default :func:`attention_figsize` of ``(S, T)``.
      dpi: pixels per inch; the PNG is ``round(width·dpi) × round(height·dpi)`` pixels.

    Returns:
      ``path`` as a string.
    """
    w = _check_weights(weights)
    t, s = w.shape
    if (t, s) != (len(target_words), len(source_words)):
        raise ValueError(
            f"attention weights have shape [T, S] = {[t, s]} but there are {len(target_words)} target "
            f"and {len(source_words)} source words"
        )
    links = sorted(_as_gold(gold, "gold", s, t).possible) if gold is not None else []
    fig, ax = _figure(figsize or attention_figsize(s, t), dpi)
    image = ax.imshow(w, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
    ax.set_xticks(range(s), list(source_words), rotation=90, fontsize=8)
    ax.set_yticks(range(t), list(target_words), fontsize=8)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("source words", fontsize=8)
    ax.set_ylabel("target words", fontsize=8)
    ax.tick_params(length=0)
    bar = ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label("attention weight α", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    if links:
        xs, ys = zip(*links, strict=True)
        ax.scatter(xs, ys, s=40, marker="s", facecolors="none", edgecolors="tab:red", linewidths=1.0)
    if title:
        ax.set_title(title, fontsize=9)  # matplotlib lifts it above the top tick labels
    return _save(fig, path, dpi)


def plot_bleu_by_length(
    results: Mapping[str, BleuByLength],
    path: str | os.PathLike,
    *,
    title: str | None = None,
    figsize: tuple[float, float] = (6.0, 4.0),
    dpi: int = 100,
) -> str:
    """Write BLEU against source-sentence length bucket for several systems as a PNG (the paper's Figure 2).

    One line per system (x = bucket, labelled with its sentence count; y = BLEU). Empty buckets leave a gap.

    Args:
      results: system name -> :class:`BleuByLength`; every system must use the same buckets.
      path: where to write the PNG (parent directories are created).
      title: optional title.
      figsize: inches ``(width, height)``.
      dpi: pixels per inch.

    Returns:
      ``path`` as a string.
    """
    labels, counts = _common_buckets(results)
    fig, ax = _figure(figsize, dpi)
    x = np.arange(len(labels))
    markers = "osD^v<>ph"
    for k, (name, r) in enumerate(results.items()):
        y = [b.bleu.score for b in r.buckets]
        ax.plot(x, y, marker=markers[k % len(markers)], label=f"{name} (all: {_fmt(r.overall.score)})")
    ax.set_xticks(x, [f"{lab}\n(n={'/'.join(map(str, c))})" for lab, c in zip(labels, counts, strict=True)])
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("source sentence length (words)")
    ax.set_ylabel("BLEU")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path, dpi)


# --------------------------------------------------------------------------------------------------------------


def _figure(figsize: tuple[float, float], dpi: int):
    """A pyplot-free figure on an Agg canvas, laid out by matplotlib's constrained layout."""
    with needed_by("drawing figures"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

    if min(figsize) <= 0 or dpi <= 0:
        raise ValueError(f"figsize and dpi must be positive, got figsize={figsize}, dpi={dpi}")
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig, path: str | os.PathLike, dpi: int) -> str:
    """PNG at exactly figsize·dpi pixels (no tight bounding box, which would change the size)."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    return path


def _common_buckets(results: Mapping[str, BleuByLength]) -> tuple[list[str], list[list[int]]]:
    """Bucket labels shared by every system and, per bucket, each system's sentence count."""
    if not results:
        raise ValueError("no systems to compare")
    items = list(results.items())
    labels = [b.label for b in items[0][1].buckets]
    for name, r in items[1:]:
        if [b.label for b in r.buckets] != labels:
            raise ValueError(
                f"systems use different length buckets: {items[0][0]} has {labels}, "
                f"{name} has {[b.label for b in r.buckets]}"
            )
    counts = [sorted({r.buckets[k].num_sentences for _, r in items}) for k in range(len(labels))]
    return labels, counts


def _fmt(x: float, digits: int = 2) -> str:
    """A score, or an em dash for NaN."""
    return "—" if math.isnan(x) else f"{x:.{digits}f}"
