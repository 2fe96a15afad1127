"""Corpus BLEU with sacreBLEU: overall, by source-sentence length bucket, and on the sentences without ``<unk>``;
optionally on Moses-detokenised text."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from attn_jax._extras import needed_by
from attn_jax.eval._detok import check_detokenize
from attn_jax.eval._detok import detokenize as _detokenize

# The special-id layout of attn_jax.data (<pad> 0, <s> 1, </s> 2, <unk> 3), repeated here because eval/ imports
# nothing of ours; tests/test_eval.py checks that the two agree.
UNK_ID = 3
UNK_TOKEN = "<unk>"


@dataclasses.dataclass(frozen=True)
class BleuResult:
    """Corpus BLEU of one set of sentences, with the sacreBLEU signature that makes it reproducible.

    Attributes:
      score: BLEU in [0, 100]; NaN for an empty set of sentences.
      signature: sacreBLEU's signature, e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``,
        followed by ``|detok:moses-fr`` when the sentences were detokenised (Moses, French) before scoring.
      num_sentences: number of hypothesis/reference pairs scored.
      precisions: modified n-gram precisions (percent), n = 1..4.
      brevity_penalty: BP in [0, 1].
      hyp_len: hypothesis length in tokens (after sacreBLEU's tokenisation).
      ref_len: reference length in tokens.
    """

    score: float
    signature: str
    num_sentences: int
    precisions: tuple[float, ...]
    brevity_penalty: float
    hyp_len: int
    ref_len: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes ``None``)."""
        return {
            "bleu": _finite_or_none(self.score),
            "signature": self.signature,
            "sentences": self.num_sentences,
            "precisions": [_finite_or_none(p) for p in self.precisions],
            "brevity_penalty": _finite_or_none(self.brevity_penalty),
            "hyp_len": self.hyp_len,
            "ref_len": self.ref_len,
        }

    def __str__(self) -> str:
        return f"BLEU = {self.score:.2f} ({self.num_sentences} sentences; {self.signature})"


@dataclasses.dataclass(frozen=True)
class LengthBucket:
    """Source lengths ``low <= n < high`` (``high=None``: no upper bound), with a label such as ``"10-19"``."""

    low: int
    high: int | None
    label: str

    def __contains__(self, length: object) -> bool:
        try:
            n = operator.index(length)  # ints and NumPy integers, not floats
        except TypeError:
            return False
        return self.low <= n and (self.high is None or n < self.high)


def length_buckets(edges: Sequence[int] = (10, 20, 30, 40, 50, 60)) -> tuple[LengthBucket, ...]:
    """Buckets ``[0, e1), [e1, e2), ..., [ek, inf)`` of source-sentence length, labelled ``"0-9" ... "60+"``.

    The default edges give the 10-word buckets of Bahdanau et al. (2015), Figure 2, and match the stratified test
    split of the built-in corpus (``attn_jax.data.TEST_BUCKETS``).

    Args:
      edges: strictly increasing positive lengths where a new bucket starts.

    Returns:
      ``len(edges) + 1`` contiguous buckets covering every length >= 0.

    >>> [b.label for b in length_buckets((10, 20))]
    ['0-9', '10-19', '20+']
    """
    edges = [int(e) for e in edges]
    if any(e <= 0 for e in edges) or any(a >= b for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"bucket edges must be strictly increasing positive lengths, got {edges}")
    lows = [0, *edges]
    highs: list[int | None] = [*edges, None]
    return tuple(LengthBucket(lo, hi, _bucket_label(lo, hi)) for lo, hi in zip(lows, highs, strict=True))


def _bucket_label(low: int, high: int | None) -> str:
    """``"10-19"``, ``"60+"``, or ``"7"`` for a one-length bucket."""
    if high is None:
        return f"{low}+"
    return f"{low}" if high == low + 1 else f"{low}-{high - 1}"


#: The paper's Figure 2 buckets: 0-9, 10-19, ..., 50-59, 60+ source words.
PAPER_BUCKETS = length_buckets()


def bucket_index(length: int, buckets: Sequence[LengthBucket] = PAPER_BUCKETS) -> int:
    """Index of the bucket that holds a sentence of ``length`` source words.

    >>> [bucket_index(n) for n in (0, 9, 10, 59, 60, 61)]
    [0, 0, 1, 5, 6, 6]
    """
    length = operator.index(length)
    if length < 0:
        raise ValueError(f"sentence length must be >= 0, got {length}")
    for k, b in enumerate(buckets):
        if length in b:
            return k
    raise ValueError(f"no bucket holds length {length}: buckets are {[b.label for b in buckets]}")


@dataclasses.dataclass(frozen=True)
class BucketBleu:
    """BLEU of the sentences of one length bucket; ``bleu.num_sentences`` is the bucket's count."""

    bucket: LengthBucket
    bleu: BleuResult

    @property
    def label(self) -> str:
        return self.bucket.label

    @property
    def num_sentences(self) -> int:
        return self.bleu.num_sentences


@dataclasses.dataclass(frozen=True)
class BleuByLength:
    """Overall corpus BLEU and the BLEU of each source-length bucket (the paper's Figure 2)."""

    overall: BleuResult
    buckets: tuple[BucketBleu, ...]

    @property
    def signature(self) -> str:
        return self.overall.signature

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``{"overall": {...}, "buckets": [{"bucket", "low", "high", ...BleuResult}]}``."""
        return {
            "overall": self.overall.to_dict(),
            "buckets": [
                {"bucket": b.label, "low": b.bucket.low, "high": b.bucket.high, **b.bleu.to_dict()}
                for b in self.buckets
            ],
        }


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
    detokenize: str = "none",
    detokenize_lang: str = "en",
) -> BleuResult:
    """Corpus BLEU of detokenised hypotheses against one reference each, computed by sacreBLEU.

    ``BLEU = BP · exp(Σ_{n=1..4} ¼ log p_n)``, ``BP = min(1, exp(1 - r/c))`` with ``p_n`` the modified n-gram
    precisions summed over the corpus, ``c`` the hypothesis and ``r`` the reference length (Papineni et al., 2002),
    computed by sacreBLEU (Post, 2018) with its defaults (``13a`` tokenisation, exponential smoothing), so the
    number is comparable across papers through :attr:`BleuResult.signature`. The built-in corpus is already
    whitespace-tokenised; ``13a`` leaves it as it is (pass ``tokenize="none"`` to score tokens exactly as given).
    Moses-tokenised text of a real corpus (``"l' ordinateur , dit-il ."``) is not what sacreBLEU's standard
    score expects: ``detokenize="moses"`` joins hypotheses and references back into running text first
    (sacremoses, :func:`attn_jax.eval.detokenize`), so the score equals sacreBLEU's on the raw text, and the
    signature ends in ``|detok:moses-<lang>``.

    Args:
      hypotheses: N system outputs, one string per sentence.
      references: N references, one per hypothesis.
      tokenize: sacreBLEU tokeniser name (``"13a"``, ``"none"``, ``"intl"``, ``"char"``, ...).
      lowercase: case-insensitive BLEU.
      detokenize: ``"none"`` (score the strings as given) or ``"moses"`` (detokenise both sides first).
      detokenize_lang: the Moses language of hypotheses and references (``en``, ``fr``, ``de``, ...).

    Returns:
      A :class:`BleuResult` (score, signature, sentence count, precisions, BP, lengths).

    >>> r = corpus_bleu(["the cat sat on the mat ."], ["the cat sat on the mat ."])
    >>> round(r.score, 6), r.num_sentences, r.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    (100.0, 1, True)
    """
    _check_pairs(hypotheses, references)
    if not hypotheses:
        raise ValueError("corpus_bleu: no sentences to score")
    scorer = _Scorer(tokenize, lowercase, detokenize, detokenize_lang)
    return scorer.score(*scorer.prepare(hypotheses, references))


@dataclasses.dataclass(frozen=True)
class CorpusScore:
    """A corpus chrF or TER of one set of sentences, with the sacreBLEU signature that makes it reproducible.

    Attributes:
      score: chrF in [0, 100], or TER in percent (edits per reference word; lower is better, may exceed 100).
      signature: sacreBLEU's signature, e.g. ``nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0``,
        followed by ``|detok:moses-fr`` when the sentences were detokenised before scoring.
      num_sentences: number of hypothesis/reference pairs scored.
    """

    score: float
    signature: str
    num_sentences: int


ChrfResult = CorpusScore  # what corpus_chrf returns
TerResult = CorpusScore  # what corpus_ter returns


def corpus_chrf(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    detokenize: str = "none",
    detokenize_lang: str = "en",
) -> ChrfResult:
    """Corpus chrF (Popović, 2015) of hypotheses against one reference each, computed by sacreBLEU's ``CHRF``.

    ``chrF_β = (1 + β²) · chrP · chrR / (β² · chrP + chrR)`` with ``β = 2`` and the character n-gram precision
    and recall averaged over n = 1..6, pooled over the corpus; whitespace is not counted. ``detokenize`` and
    ``detokenize_lang`` are as in :func:`corpus_bleu` (both sides detokenised first, and the signature says so).

    >>> r = corpus_chrf(["the cat sat on the mat ."], ["the cat sat on the mat ."])
    >>> round(r.score, 6), r.num_sentences
    (100.0, 1)
    """
    return ChrfResult(*_sacrebleu_corpus("CHRF", "chrF", hypotheses, references, detokenize, detokenize_lang))


def corpus_ter(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    detokenize: str = "none",
    detokenize_lang: str = "en",
) -> TerResult:
    """Corpus TER (Snover et al., 2006) of hypotheses against one reference each, computed by sacreBLEU's ``TER``.

    ``TER = 100 · Σ edits / Σ reference words``, the edits being insertions, deletions, substitutions and shifts
    of word sequences, with sacreBLEU's defaults (case-insensitive, no punctuation normalisation). ``detokenize`` and
    ``detokenize_lang`` are as in :func:`corpus_bleu` (both sides detokenised first, and the signature says so).

    >>> r = corpus_ter(["the cat sat on the mat ."], ["the cat sat on a mat ."])
    >>> round(r.score, 4), r.num_sentences
    (14.2857, 1)
    """
    return TerResult(*_sacrebleu_corpus("TER", "TER", hypotheses, references, detokenize, detokenize_lang))


def _sacrebleu_corpus(
    metric_name: str, label: str, hypotheses, references, detokenize: str, detokenize_lang: str
) -> tuple[float, str, int]:
    """``(score, signature, sentences)`` of sacreBLEU's ``metric_name`` at its defaults, both sides detokenised
    as asked; the signature ends in ``|detok:...`` when they were."""
    metric, stats, signature = _sacrebleu_statistics(
        metric_name, label, hypotheses, references, detokenize, detokenize_lang
    )
    return float(metric._aggregate_and_compute(stats).score), signature, len(stats)


def _sacrebleu_statistics(
    metric_name: str, label: str, hypotheses, references, detokenize: str, detokenize_lang: str
) -> tuple[Any, list, str]:
    """sacreBLEU's ``metric_name`` at its defaults, its per-sentence statistics and its signature (ending in
    ``|detok:...`` when both sides were detokenised). ``metric._aggregate_and_compute`` of any subset of the
    statistics is ``corpus_score`` of those sentences: that is how sacreBLEU's own ``corpus_score`` works."""
    _check_pairs(hypotheses, references)
    if not hypotheses:
        raise ValueError(f"corpus_{label.lower()}: no sentences to score")
    check_detokenize(detokenize, detokenize_lang)
    with needed_by(label):
        from sacrebleu import metrics

    metric = getattr(metrics, metric_name)()
    hyps = _detokenize(hypotheses, detokenize, detokenize_lang)
    refs = [list(_detokenize(references, detokenize, detokenize_lang))]
    metric._check_corpus_score_args(list(hyps), refs)
    stats = metric._extract_corpus_statistics(list(hyps), refs)
    suffix = "" if detokenize == "none" else f"|detok:{detokenize}-{detokenize_lang}"
    return metric, stats, str(metric.get_signature()) + suffix


@dataclasses.dataclass(frozen=True)
class ScoreByLength:
    """One corpus metric (chrF or TER) overall and within each source-length bucket.

    Attributes:
      metric: ``"chrF"`` or ``"TER"``.
      signature: sacreBLEU's signature of the overall score.
      overall: the score of all sentences.
      num_sentences: the number of sentences scored.
      buckets: ``(bucket, sentences, score)`` per bucket, in bucket order; NaN for an empty bucket.
    """

    metric: str
    signature: str
    overall: float
    num_sentences: int
    buckets: tuple[tuple[LengthBucket, int, float], ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``{"metric", "signature", "score", "sentences", "buckets": [{"bucket", "low",
        "high", "sentences", "score"}]}`` (NaN becomes ``None``)."""
        return {
            "metric": self.metric,
            "signature": self.signature,
            "score": _finite_or_none(self.overall),
            "sentences": self.num_sentences,
            "buckets": [
                {"bucket": b.label, "low": b.low, "high": b.high, "sentences": n, "score": _finite_or_none(x)}
                for b, n, x in self.buckets
            ],
        }


# score_by_length's metrics: sacreBLEU's class name and the name reports use.
_BY_LENGTH = {"chrf": ("CHRF", "chrF"), "ter": ("TER", "TER")}


def score_by_length(
    metric: str,
    hypotheses: Sequence[str],
    references: Sequence[str],
    sources: Sequence[str] | None = None,
    *,
    lengths: Sequence[int] | None = None,
    buckets: Sequence[LengthBucket] = PAPER_BUCKETS,
    detokenize: str = "none",
    detokenize_lang: str = "en",
) -> ScoreByLength:
    """chrF (:func:`corpus_chrf`) or TER (:func:`corpus_ter`) overall and within each source-length bucket.

    Lengths and buckets are as in :func:`bleu_by_length`; each bucket's score is the corpus score of that
    bucket's sentences alone.

    Args:
      metric: ``"chrf"`` or ``"ter"``.
      hypotheses, references, sources, lengths, buckets: as in :func:`bleu_by_length`.
      detokenize, detokenize_lang: as in :func:`corpus_bleu`.

    >>> r = score_by_length("chrf", ["a b", "c d"], ["a b", "c e"], ["x", " ".join(["w"] * 12)])
    >>> [(b.label, n) for b, n, _ in r.buckets][:3]
    [('0-9', 1), ('10-19', 1), ('20-29', 0)]
    """
    if metric not in _BY_LENGTH:
        raise ValueError(f"score_by_length: metric must be 'chrf' or 'ter', got {metric!r}")
    _check_pairs(hypotheses, references)
    if not hypotheses:
        raise ValueError("score_by_length: no sentences to score")
    if lengths is None:
        if sources is None:
            raise ValueError("score_by_length: pass the source sentences or their lengths")
        _check_count("sources", sources, len(hypotheses))
        lengths = [len(s.split()) for s in sources]
    else:
        _check_count("lengths", lengths, len(hypotheses))
    _check_buckets(buckets)
    metric_name, name = _BY_LENGTH[metric]
    # Each sentence is scored once and its statistics summed per bucket: TER's edit search is slow, and the
    # sums are the ones corpus_score of each subset would make, in the same order.
    scorer, stats, signature = _sacrebleu_statistics(
        metric_name, name, hypotheses, references, detokenize, detokenize_lang
    )
    members: list[list[int]] = [[] for _ in buckets]
    for n, length in enumerate(lengths):
        members[bucket_index(int(length), buckets)].append(n)
    per_bucket = []
    for b, rows in zip(buckets, members, strict=True):
        x = float(scorer._aggregate_and_compute([stats[n] for n in rows]).score) if rows else math.nan
        per_bucket.append((b, len(rows), x))
    overall = float(scorer._aggregate_and_compute(stats).score)
    return ScoreByLength(name, signature, overall, len(hypotheses), tuple(per_bucket))


def bleu_by_length(
    hypotheses: Sequence[str],
    references: Sequence[str],
    sources: Sequence[str] | None = None,
    *,
    lengths: Sequence[int] | None = None,
    buckets: Sequence[LengthBucket] = PAPER_BUCKETS,
    tokenize: str = "13a",
    lowercase: bool = False,
    detokenize: str = "none",
    detokenize_lang: str = "en",
) -> BleuByLength:
    """Corpus BLEU overall and within each source-length bucket (Bahdanau et al., 2015, Figure 2).

    A sentence's length is its number of whitespace-separated source words (``len(source.split())``, punctuation
    included, as in the built-in corpus), or ``lengths[n]`` when given (e.g. subword counts). Each bucket's score
    is sacreBLEU's corpus BLEU of that bucket's sentences alone, so it equals ``corpus_bleu`` on the subset. An
    empty bucket scores NaN with ``num_sentences == 0``.

    Args:
      hypotheses: N system outputs.
      references: N references.
      sources: N source sentences (to measure lengths); may be omitted when ``lengths`` is given.
      lengths: N source lengths, overriding the word counts of ``sources``.
      buckets: contiguous buckets starting at 0 with an open last one, e.g. ``length_buckets((10, 20, 30))``;
        default :data:`PAPER_BUCKETS` (0-9, 10-19, ..., 50-59, 60+).
      tokenize, lowercase, detokenize, detokenize_lang: as in :func:`corpus_bleu` (detokenising changes the
        scored sentences, not the source lengths).

    Returns:
      :class:`BleuByLength` with the overall score and one :class:`BucketBleu` per bucket, in bucket order.

    >>> r = bleu_by_length(["a b c d e"] * 2, ["a b c d e"] * 2, ["one two", " ".join(["w"] * 12)])
    >>> [(b.label, b.num_sentences) for b in r.buckets][:3]
    [('0-9', 1), ('10-19', 1), ('20-29', 0)]
    """
    _check_pairs(hypotheses, references)
    if not hypotheses:
        raise ValueError("bleu_by_length: no sentences to score")
    if lengths is None:
        if sources is None:
            raise ValueError("bleu_by_length: pass the source sentences or their lengths")
        _check_count("sources", sources, len(hypotheses))
        lengths = [len(s.split()) for s in sources]
    else:
        _check_count("lengths", lengths, len(hypotheses))
    _check_buckets(buckets)
    scorer = _Scorer(tokenize, lowercase, detokenize, detokenize_lang)
    hypotheses, references = scorer.prepare(hypotheses, references)
    members: list[list[int]] = [[] for _ in buckets]
    for n, length in enumerate(lengths):
        members[bucket_index(int(length), buckets)].append(n)
    per_bucket = tuple(
        BucketBleu(
            b,
            scorer.score([hypotheses[n] for n in rows], [references[n] for n in rows]),
        )
        for b, rows in zip(buckets, members, strict=True)
    )
    return BleuByLength(scorer.score(hypotheses, references), per_bucket)


def bleu_subset(
    hypotheses: Sequence[str],
    references: Sequence[str],
    keep: Sequence[bool] | Callable[[int], bool],
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
    detokenize: str = "none",
    detokenize_lang: str = "en",
) -> BleuResult:
    """Corpus BLEU of the sentences selected by ``keep`` (flags, or a predicate on the sentence index).

    Args:
      hypotheses: N system outputs.
      references: N references.
      keep: N booleans, or ``keep(n) -> bool`` for sentence index n.
      tokenize, lowercase, detokenize, detokenize_lang: as in :func:`corpus_bleu`.

    Returns:
      :class:`BleuResult` of the kept sentences (NaN score when none is kept).

    >>> round(bleu_subset(["a b c d", "x"], ["a b c d", "y"], [True, False]).score, 6)
    100.0
    """
    _check_pairs(hypotheses, references)
    if callable(keep):
        flags = [bool(keep(n)) for n in range(len(hypotheses))]
    else:
        _check_count("keep flags", keep, len(hypotheses))
        flags = [bool(k) for k in keep]
    rows = [n for n, k in enumerate(flags) if k]
    scorer = _Scorer(tokenize, lowercase, detokenize, detokenize_lang)
    return scorer.score(*scorer.prepare([hypotheses[n] for n in rows], [references[n] for n in rows]))


def has_unk(sentence: str | Sequence[int], *, unk_id: int = UNK_ID, unk_token: str = UNK_TOKEN) -> bool:
    """Whether a sentence contains an unknown word: token id ``unk_id`` in a list of ids, or ``unk_token`` as a
    whitespace token of a string (e.g. a sentence decoded after vocabulary mapping).

    >>> has_unk([5, 3, 7]), has_unk("le <unk> chat"), has_unk("le chat")
    (True, True, False)
    """
    if isinstance(sentence, str):
        return unk_token in sentence.split()
    return any(int(t) == unk_id for t in sentence)


def bleu_no_unk(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    source_has_unk: Sequence[bool],
    reference_has_unk: Sequence[bool],
    tokenize: str = "13a",
    lowercase: bool = False,
    detokenize: str = "none",
    detokenize_lang: str = "en",
) -> BleuResult:
    """Corpus BLEU on the sentences without unknown words (Bahdanau et al., 2015, Table 1, "No UNK").

    A sentence counts when neither its source nor its reference contains ``<unk>`` after mapping through the
    model's vocabularies (the hypothesis may contain ``<unk>``: that is the model's output, as in the paper).
    eval/ knows no vocabulary, so the caller passes the flags, e.g. with the model's vocabularies::

        source_has_unk = [has_unk(src_vocab.encode(s)) for s in sources]
        reference_has_unk = [has_unk(tgt_vocab.encode(r)) for r in references]

    Args:
      hypotheses: N system outputs.
      references: N references.
      source_has_unk: N flags, True where the source sentence has an unknown word.
      reference_has_unk: N flags, True where the reference has an unknown word.
      tokenize, lowercase, detokenize, detokenize_lang: as in :func:`corpus_bleu`.

    Returns:
      :class:`BleuResult` of the sentences with both flags False; ``num_sentences`` says how many.

    >>> bleu_no_unk(["a b c d", "x"], ["a b c d", "y"], source_has_unk=[False, True],
    ...             reference_has_unk=[False, False]).num_sentences
    1
    """
    _check_count("source_has_unk flags", source_has_unk, len(hypotheses))
    _check_count("reference_has_unk flags", reference_has_unk, len(hypotheses))
    keep = [not (s or r) for s, r in zip(source_has_unk, reference_has_unk, strict=True)]
    return bleu_subset(
        hypotheses,
        references,
        keep,
        tokenize=tokenize,
        lowercase=lowercase,
        detokenize=detokenize,
        detokenize_lang=detokenize_lang,
    )


# --------------------------------------------------------------------------------------------------------------


class _Scorer:
    """One BLEU setting: the detokeniser applied by :meth:`prepare`, the sacreBLEU metric used by :meth:`score`."""

    def __init__(self, tokenize: str, lowercase: bool, detokenize: str, detokenize_lang: str):
        check_detokenize(detokenize, detokenize_lang)
        self.detokenize, self.lang = detokenize, detokenize_lang
        # Never part of sacreBLEU's own signature: appended so that a detokenised score is never taken for one on
        # the text as given.
        self.suffix = "" if detokenize == "none" else f"|detok:{detokenize}-{detokenize_lang}"
        self.metric = _metric(tokenize, lowercase)

    def prepare(self, hypotheses: Sequence[str], references: Sequence[str]) -> tuple[list[str], list[str]]:
        """Both sides detokenised (or as given)."""
        return (
            _detokenize(hypotheses, self.detokenize, self.lang),
            _detokenize(references, self.detokenize, self.lang),
        )

    def score(self, hypotheses: Sequence[str], references: Sequence[str]) -> BleuResult:
        return _score(self.metric, hypotheses, references, self.suffix)


def _metric(tokenize: str, lowercase: bool):
    """A sacreBLEU BLEU metric (imported lazily: sacrebleu is part of the optional ``eval`` extra)."""
    with needed_by("BLEU"):
        from sacrebleu.metrics import BLEU

    return BLEU(tokenize=tokenize, lowercase=lowercase)


def _score(metric, hypotheses: Sequence[str], references: Sequence[str], suffix: str = "") -> BleuResult:
    """sacreBLEU's corpus score as a :class:`BleuResult`; NaN for no sentences (sacreBLEU fails on those)."""
    if not hypotheses:
        # sacreBLEU knows its signature (nrefs) only once it has scored something; score a dummy pair.
        metric.corpus_score(["."], [["."]])
        nan = math.nan
        sig = str(metric.get_signature()) + suffix
        return BleuResult(nan, sig, 0, (nan,) * metric.max_ngram_order, nan, 0, 0)
    s = metric.corpus_score(list(hypotheses), [list(references)])
    return BleuResult(
        float(s.score),
        str(metric.get_signature()) + suffix,
        len(hypotheses),
        tuple(float(p) for p in s.precisions),
        float(s.bp),
        int(s.sys_len),
        int(s.ref_len),
    )


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    """Same number of hypotheses and references, all strings."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be sequences of strings, not one string")
    if len(hypotheses) != len(references):
        raise ValueError(f"mismatched counts: {len(hypotheses)} hypotheses but {len(references)} references")
    for name, seq in (("hypothesis", hypotheses), ("reference", references)):
        for n, s in enumerate(seq):
            if not isinstance(s, str):
                raise TypeError(f"{name} {n} is a {type(s).__name__}, expected str")


def _check_count(name: str, seq: Sequence[Any], expected: int) -> None:
    """``len(seq) == expected`` or a ValueError naming both counts."""
    if len(seq) != expected:
        raise ValueError(f"mismatched counts: {expected} hypotheses but {len(seq)} {name}")


def _check_buckets(buckets: Sequence[LengthBucket]) -> None:
    """Buckets must tile [0, inf): start at 0, each ``high`` the next ``low``, the last one open."""
    if not buckets:
        raise ValueError("no length buckets given")
    ok = buckets[0].low == 0 and buckets[-1].high is None
    ok = ok and all(
        a.high is not None and a.high == b.low for a, b in zip(buckets, buckets[1:], strict=False)
    )
    ok = ok and all(b.high is None or b.low < b.high for b in buckets)
    if not ok:
        spans = [(b.low, b.high) for b in buckets]
        raise ValueError(
            f"length buckets must tile [0, inf) in order (use length_buckets(edges)), got {spans}"
        )


def _finite_or_none(x: float) -> float | None:
    """JSON has no NaN."""
    return None if math.isnan(x) else float(x)
