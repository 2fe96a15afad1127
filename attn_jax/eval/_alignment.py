"""Word alignments: Pharaoh ``i-j`` text, hard alignments from soft attention, alignment error rate (AER).

Conventions (those of the built-in corpus, attn_jax/data/README.md): a link ``(i, j)`` joins 0-based source word
``i`` and 0-based target word ``j`` (whitespace tokens, punctuation included), written ``i-j`` (sure) or ``i?j``
(possible) in Pharaoh format. Attention weights are indexed ``[T, S]`` like the model's (row ``j`` = the decoder
step that predicts target word ``j``, column ``i`` = source word ``i``), as is the corpus' batched
``gold[b, j, i]``. Links are plain ``frozenset[tuple[int, int]]`` of ``(i, j)``. The gold aligns the source with
the reference, so AER is measured on teacher-forced attention over the reference.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, TypeAlias

import numpy as np
from jaxtyping import ArrayLike, Bool, Float

#: One link ``(source word i, target word j)``.
Link: TypeAlias = tuple[int, int]
#: A hard alignment: a set of links.
Links: TypeAlias = frozenset[Link]


class Alignment(NamedTuple):
    """A gold alignment with sure links ``S`` and possible links ``P ⊇ S`` (Och & Ney, 2003).

    A corpus with a single gold set (the built-in one) has ``sure == possible``.
    """

    sure: Links
    possible: Links


def parse_pharaoh(
    text: str, *, source_length: int | None = None, target_length: int | None = None
) -> Alignment:
    """Parse a Pharaoh alignment ``"i-j i?j ..."``: ``i-j`` a sure link, ``i?j`` a possible one.

    Args:
      text: whitespace-separated links, 0-based source index ``i`` first, target index ``j`` second.
      source_length: if given, every ``i`` must be below it.
      target_length: if given, every ``j`` must be below it.

    Returns:
      :class:`Alignment` with ``possible`` = sure ∪ possible links (so ``sure == possible`` without ``?`` links).

    >>> a = parse_pharaoh("0-0 2-1 1?2")
    >>> sorted(a.sure), sorted(a.possible)
    ([(0, 0), (2, 1)], [(0, 0), (1, 2), (2, 1)])
    """
    if not isinstance(text, str):
        raise TypeError(f"a Pharaoh alignment is a str, got {type(text).__name__}")
    sure, possible = set(), set()
    for token in text.split():
        sep = "-" if "-" in token else "?"
        i, found, j = token.partition(sep)
        if not (found and i.isdigit() and j.isdigit()):
            raise ValueError(
                f"bad Pharaoh link {token!r} in {text!r}: expected 'i-j' or 'i?j' with i, j >= 0"
            )
        link = (int(i), int(j))
        _check_link(link, source_length, target_length, f"link {token!r}")
        (sure if sep == "-" else possible).add(link)
    return Alignment(frozenset(sure), frozenset(sure | possible))


def format_pharaoh(alignment: Alignment | Iterable[Link]) -> str:
    """Write links as Pharaoh text, sorted by ``(i, j)``: sure links ``i-j``, possible-only links ``i?j``.

    Args:
      alignment: an :class:`Alignment`, or plain links (all written as sure).

    Returns:
      The Pharaoh string; ``format_pharaoh(parse_pharaoh(s)) == s`` for a sorted, duplicate-free ``s``.

    >>> format_pharaoh({(2, 1), (0, 0)}), format_pharaoh(Alignment(frozenset({(0, 0)}), frozenset({(0, 0), (1, 1)})))
    ('0-0 2-1', '0-0 1?1')
    """
    gold = _as_gold(alignment, "alignment")
    return " ".join(f"{i}{'-' if (i, j) in gold.sure else '?'}{j}" for i, j in sorted(gold.possible))


def argmax_alignment(weights: Float[ArrayLike, "T S"]) -> Links:
    """Hard alignment from attention: each target word to the source word it attends to most.

    ``A = {(argmax_i α_ji, j) : j = 0..T-1}`` — one link per target word, like the built-in corpus' gold (every
    target word aligned to exactly one source word). Ties go to the lowest ``i``; a row of zeros (a fully masked
    step) gets no link. Pass the valid sub-matrix ``weights[:m, :n]`` for ``m`` target and ``n`` source words:
    without the ``</s>`` rows and columns, and without padding.

    Args:
      weights: non-negative attention weights ``[T, S]`` (row j = target word j, column i = source word i).

    Returns:
      Links ``(i, j)``.

    >>> sorted(argmax_alignment([[0.1, 0.9, 0.0], [0.7, 0.2, 0.1]]))
    [(0, 1), (1, 0)]
    """
    w = _check_weights(weights)
    if w.size == 0:
        return frozenset()
    best = w.argmax(axis=1)  # [T]
    return frozenset((int(best[j]), j) for j in range(w.shape[0]) if w[j, best[j]] > 0)


def mutual_argmax_alignment(weights: Float[ArrayLike, "T S"]) -> Links:
    """Hard alignment kept in both directions: ``i`` is target word ``j``'s argmax and ``j`` is source word ``i``'s.

    ``A = {(i, j) : i = argmax_i' α_ji' and j = argmax_j' α_j'i}``, the intersection of the target→source and
    source→target argmax alignments (the usual symmetrisation by intersection; high precision, lower recall).
    Ties go to the lowest index; zero rows and columns give no link. Pass the valid sub-matrix, as for
    :func:`argmax_alignment`.

    Args:
      weights: non-negative attention weights ``[T, S]``.

    Returns:
      Links ``(i, j)``.

    >>> sorted(mutual_argmax_alignment([[0.6, 0.4], [0.9, 0.1]]))
    [(0, 1)]
    """
    w = _check_weights(weights)
    if w.size == 0:
        return frozenset()
    row_best = w.argmax(axis=1)  # [T]: source word of each target word
    col_best = w.argmax(axis=0)  # [S]: target word of each source word
    return frozenset((int(i), j) for j, i in enumerate(row_best) if col_best[i] == j and w[j, i] > 0)


def threshold_alignment(weights: Float[ArrayLike, "T S"], threshold: float) -> Links:
    """Hard alignment of every (source, target) pair whose attention weight reaches ``threshold``.

    ``A = {(i, j) : α_ji >= threshold}``: a target word may get several links (``threshold <= 0.5``) or none.

    Args:
      weights: non-negative attention weights ``[T, S]``.
      threshold: in (0, 1].

    Returns:
      Links ``(i, j)``.

    >>> sorted(threshold_alignment([[0.5, 0.5], [0.9, 0.1]], 0.5))
    [(0, 0), (0, 1), (1, 0)]
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    w = _check_weights(weights)
    js, is_ = np.nonzero(w >= threshold)
    return frozenset((int(i), int(j)) for j, i in zip(js, is_, strict=True))


def alignment_matrix(
    links: Alignment | Iterable[Link] | str, source_length: int, target_length: int
) -> Bool[np.ndarray, "T S"]:
    """Links as a boolean matrix ``m[j, i]`` (target row, source column), the layout of attention and of
    ``attn_jax.data.Batch.gold[b]``.

    Args:
      links: links ``(i, j)``, an :class:`Alignment` (its possible links) or Pharaoh text.
      source_length: S.
      target_length: T.

    Returns:
      bool ``[T, S]``.

    >>> alignment_matrix("0-1 1-0", 2, 3).astype(int).tolist()
    [[0, 1], [1, 0], [0, 0]]
    """
    m = np.zeros((target_length, source_length), bool)
    for i, j in _as_gold(links, "links", source_length, target_length).possible:
        m[j, i] = True
    return m


def links_from_matrix(matrix: Bool[ArrayLike, "T S"]) -> Links:
    """Links ``(i, j)`` of the True entries of a ``[T, S]`` matrix (e.g. ``attn_jax.data.Batch.gold[b]``).

    >>> sorted(links_from_matrix([[False, True], [True, False]]))
    [(0, 1), (1, 0)]
    """
    m = np.asarray(matrix)
    if m.ndim != 2:
        raise ValueError(f"an alignment matrix is [T, S], got shape {m.shape}")
    js, is_ = np.nonzero(m)
    return frozenset((int(i), int(j)) for j, i in zip(js, is_, strict=True))


@dataclasses.dataclass(frozen=True)
class AerResult:
    """Corpus-level alignment error rate with the counts it is made of (all summed over sentences).

    Attributes:
      aer: ``1 - (|A∩S| + |A∩P|) / (|A| + |S|)`` in [0, 1] (NaN when ``|A| + |S| = 0``).
      precision: ``|A∩P| / |A|`` (NaN when ``|A| = 0``).
      recall: ``|A∩S| / |S|`` (NaN when ``|S| = 0``).
      num_sentences: sentences scored.
      hyp_links, sure_links, possible_links: ``|A|``, ``|S|``, ``|P|``.
      sure_hits, possible_hits: ``|A∩S|``, ``|A∩P|``.
    """

    aer: float
    precision: float
    recall: float
    num_sentences: int
    hyp_links: int
    sure_links: int
    possible_links: int
    sure_hits: int
    possible_hits: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes ``None``)."""
        d = dataclasses.asdict(self)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}

    def __str__(self) -> str:
        """``AER = 76.68 % (P = 23.10 %, R = 23.56 %, 140 sentences)``: percent, as in the summary tables."""
        aer, p, r = (_percent(x) for x in (self.aer, self.precision, self.recall))
        return f"AER = {aer} (P = {p}, R = {r}, {self.num_sentences} sentences)"


def _percent(fraction: float) -> str:
    """A fraction as a percentage with two decimals (the tables' ``AER (%)`` columns), an em dash for NaN."""
    return "—" if math.isnan(fraction) else f"{100.0 * fraction:.2f} %"


def alignment_error_rate(
    hypotheses: Sequence[Iterable[Link] | str],
    gold: Sequence[Alignment | Iterable[Link] | str],
    *,
    source_lengths: Sequence[int] | None = None,
    target_lengths: Sequence[int] | None = None,
) -> AerResult:
    """Alignment error rate of hypothesis alignments against gold ones, summed over the corpus.

    ``AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|)`` (Och & Ney, 2003, "A Systematic Comparison of Various Statistical
    Alignment Models", Computational Linguistics 29(1)), with every count summed over all sentences before the
    ratio is taken (corpus level, not an average of per-sentence rates). A gold alignment given as plain links or
    as Pharaoh text without ``?`` links has ``S = P`` (the built-in corpus: all links sure), and then
    ``AER = 1 - 2|A∩S| / (|A| + |S|)``, one minus the F1 of the links.

    Args:
      hypotheses: N hard alignments (links ``(i, j)`` or Pharaoh text), e.g. from :func:`argmax_alignment`.
      gold: N gold alignments: :class:`Alignment`, links (all sure) or Pharaoh text (``i-j`` sure, ``i?j``
        possible).
      source_lengths: N source lengths; if given, every link's ``i`` must be below its sentence's.
      target_lengths: N target lengths; if given, every link's ``j`` must be below its sentence's.

    Returns:
      :class:`AerResult` (AER, precision, recall and the summed counts).

    >>> alignment_error_rate(["0-0 1-1"], ["0-0 1-2"]).aer
    0.5
    """
    if isinstance(hypotheses, str) or isinstance(gold, str):
        raise TypeError("hypotheses and gold are sequences of alignments (one per sentence), not one string")
    n = len(hypotheses)
    if len(gold) != n:
        raise ValueError(f"mismatched counts: {n} hypothesis alignments but {len(gold)} gold alignments")
    for name, lengths in (("source_lengths", source_lengths), ("target_lengths", target_lengths)):
        if lengths is not None and len(lengths) != n:
            raise ValueError(f"mismatched counts: {n} alignments but {len(lengths)} {name}")
    a = s = p = a_s = a_p = 0
    for k in range(n):
        src_len = None if source_lengths is None else source_lengths[k]
        tgt_len = None if target_lengths is None else target_lengths[k]
        hyp = _as_gold(hypotheses[k], f"hypothesis {k}", src_len, tgt_len).possible
        ref = _as_gold(gold[k], f"gold alignment {k}", src_len, tgt_len)
        a, s, p = a + len(hyp), s + len(ref.sure), p + len(ref.possible)
        a_s, a_p = a_s + len(hyp & ref.sure), a_p + len(hyp & ref.possible)
    return AerResult(
        aer=1.0 - (a_s + a_p) / (a + s) if a + s else math.nan,
        precision=a_p / a if a else math.nan,
        recall=a_s / s if s else math.nan,
        num_sentences=n,
        hyp_links=a,
        sure_links=s,
        possible_links=p,
        sure_hits=a_s,
        possible_hits=a_p,
    )


# --------------------------------------------------------------------------------------------------------------


def _as_gold(
    x: Alignment | Iterable[Link] | str,
    what: str,
    source_length: int | None = None,
    target_length: int | None = None,
) -> Alignment:
    """Any accepted alignment form as an :class:`Alignment` with ``possible ⊇ sure``, links range-checked."""
    if isinstance(x, str):
        return parse_pharaoh(x, source_length=source_length, target_length=target_length)
    if isinstance(x, Alignment):
        sure = _as_links(x.sure, what, source_length, target_length)
        return Alignment(sure, sure | _as_links(x.possible, what, source_length, target_length))
    links = _as_links(x, what, source_length, target_length)
    return Alignment(links, links)


def _as_links(x: Iterable[Any], what: str, source_length: int | None, target_length: int | None) -> Links:
    """A frozenset of ``(int, int)`` pairs, each checked."""
    out = set()
    for link in x:
        try:
            i, j = link
            link = (operator.index(i), operator.index(j))
        except (TypeError, ValueError):
            raise ValueError(f"{what}: a link is a pair of ints (source i, target j), got {link!r}") from None
        _check_link(link, source_length, target_length, f"{what}: link {link[0]}-{link[1]}")
        out.add(link)
    return frozenset(out)


def _check_link(link: Link, source_length: int | None, target_length: int | None, what: str) -> None:
    """Indices non-negative and inside the sentence lengths when known."""
    i, j = link
    if i < 0 or j < 0:
        raise ValueError(f"{what}: negative index")
    if source_length is not None and i >= source_length:
        raise ValueError(f"{what}: source index {i} out of range for {source_length} source words")
    if target_length is not None and j >= target_length:
        raise ValueError(f"{what}: target index {j} out of range for {target_length} target words")


def _check_weights(weights: Float[ArrayLike, "T S"]) -> np.ndarray:
    """float64 ``[T, S]``, finite and non-negative, or a ValueError naming what is wrong."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(
            f"attention weights must be [T, S] (one sentence; slice the valid sub-matrix), got shape {w.shape}"
        )
    if w.shape[0] and not w.shape[1]:
        raise ValueError(f"attention weights have {w.shape[0]} target rows but no source column")
    if not np.all(np.isfinite(w)):
        raise ValueError("attention weights contain NaN or infinity")
    if w.size and w.min() < 0:
        raise ValueError(f"attention weights must be non-negative, got minimum {w.min()}")
    return w
