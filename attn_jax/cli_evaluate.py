"""``attn-jax evaluate``: BLEU overall, by source length and without ``<unk>``, AER and attention heatmaps of a run.

    attn-jax evaluate --workdir runs/rnnsearch_cpu --split test
    attn-jax evaluate --workdir runs/rnnsearch_cpu --split test --beam 12 --max-examples 140 --out /tmp/eval

Decodes the split with beam search (the run's best checkpoint), scores it with sacreBLEU (overall, per source
length bucket 0-9 ... 60+ as in Bahdanau et al. 2015, Figure 2, and on the sentences without ``<unk>``,
Table 1's "No UNK"), measures the alignment error rate of the attention against the corpus' gold alignments
(built-in corpus; overall and on the sentences within the training lengths), draws attention heatmaps chosen
as the paper's Figure 3 is (the longest sentences within the training lengths that the model translates
exactly, plus one beyond them as the failure case: :func:`figure3_examples`), prints the tables and writes
them to ``--out`` (default ``workdir/eval/<split>``):

    sources.txt  references.txt  hypotheses.txt     the sentences, line-aligned (BLEU can be recomputed)
    references.detok.txt  hypotheses.detok.txt     with --detokenize moses: the detokenised text BLEU scored
    alignments.txt                                  Pharaoh links from teacher-forced attention (AER's input)
    bleu_by_length.{md,json}  summary.{md,json}     the tables (JSON: fractions, null for an empty bucket)
    evaluation.json  evaluation.md                  everything: scores, options, checkpoint, timings, pictures
    bleu_by_length.png  attention_<k>.png  attention_<k>_reference.png  attention_<k>_head.png

The PNGs also go to the run's TensorBoard log, ``workdir/tensorboard/eval``, as images tagged
``eval/<split>/<file name without .png>`` at the evaluated checkpoint's step (unless the run was trained with
``--config.tensorboard=false``).

Length limit: the same rule and flags as ``attn-jax translate`` (``--max-length``, ``--max-length-ratio``,
``--max-length-offset``; by default ``max(T, ⌊2·n⌋ + 10)`` tokens for a source of ``n`` tokens, ``T`` the run's
``data.max_target_length``). How many translations stopped at the limit instead of ending with ``</s>`` is
printed on stderr (a warning when any did) and kept in ``summary.json`` (``<system>.length_limit``),
``summary.md``, ``evaluation.json`` (``length_limit``) and ``evaluation.md``: a reference longer than the limit
cannot be matched, and the BLEU of such a run says so beside it.

Empty sides: pairs of the split whose source or reference is empty are skipped by the corpus reader; their
count is a warning on stderr (``warning: 1 pair of data/test.en | data/test.fr with an empty source or reference
skipped (not translated, not scored)``) and is kept in ``summary.json`` (``<system>.skipped_empty``, 0 when
none), ``evaluation.json`` (``skipped_empty``), ``summary.md`` and ``evaluation.md``.

BLEU on real text: sacreBLEU's standard score (``tok:13a``) is defined on raw, untokenised text. A corpus
that is Moses-tokenised (``l' ordinateur , dit-il .``) is scored either detokenised (``--detokenize moses
--detokenize-lang fr``: sacremoses joins hypotheses and references back into running text, so the BLEU equals
sacreBLEU's on the raw text; the signature ends in ``|detok:moses-fr``) or on its tokens exactly as given
(``--bleu-tokenize none``, ``tok:none``: the flag for pre-tokenised data sets, not comparable with scores of raw
text). When the references of a corpus other than the built-in one look tokenised and neither flag was given,
one warning line on stderr says so and names both flags; the choice is kept in ``summary.json``
(``<system>.bleu_options``), ``evaluation.json`` and the signature. The built-in corpus is defined on its tokens
and is scored as it always was (``tok:13a``, no detokenisation, no warning).

Progress: decoding shows the sentences done, their rate and an ETA on stderr, as ``attn-jax train`` does:
``--progress bar`` (one line redrawn in place; the default on a terminal) or ``lines`` (a line every 10 s; the
default otherwise).

AER uses attention from teacher forcing on the *reference* (the gold aligns source and reference words, so the
attention of a decoded hypothesis cannot be scored against it): each reference word is linked to its
most-attended source word (``argmax_alignment``). ``attention_<k>.png`` shows the attention while the model
produced its own translation (the paper's Figure 3); ``attention_<k>_reference.png`` the teacher-forced
attention on the reference with the gold links drawn as red squares. For a multi-head model (the Transformer)
both show the last decoder layer's cross-attention averaged over heads, and ``attention_<k>_head.png`` its
sharpest single head (lowest mean entropy) on the model's own translation.

Exit status: 0 done; 1 a missing workdir or checkpoint, an unreadable corpus or split; 2 a bad flag.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from attn_jax.cli_translate import (
    LoadedModel,
    TranslateError,
    Translation,
    add_length_limit_flags,
    length_batches,
    length_flags_problem,
    length_limit,
    length_limit_report,
    load_model,
    pad_rows,
    parse_checkpoint,
    quiet_checkpoint_logs,
    translate_sentences,
)

__all__ = [
    "add_evaluate_parser",
    "bleu_flags_problem",
    "bleu_options",
    "decode_progress",
    "evaluate_workdir",
    "hypothesis_cross_attention",
    "load_split",
    "run_evaluate",
    "sharpest_head",
]

_SYSTEM_NAMES = {"rnnsearch": "RNNsearch", "rnnenc": "RNNenc", "gnmt": "GNMT", "transformer": "Transformer"}


def load_split(config, split: str, *, test_per_bucket: int | None = None):
    """The ``split`` of the run's corpus as an ``attn_jax.data.ParallelCorpus``.

    The built-in corpus without TFDS (``data.use_tfds=False``) is generated in memory, the test split included
    (the trainer reads only train/validation that way): a named config (``small``, ...) uses its own
    ``test_per_bucket``; ``custom`` uses ``test_per_bucket`` or ``ceil(validation_size / 7)`` (at least 1) per
    length bucket. Other corpora are read by ``attn_jax.train.load_corpus``.
    """
    from attn_jax import data
    from attn_jax.train import load_corpus

    d = config.data
    if d.corpus == "synthetic" and not d.use_tfds and split.split("[")[0] == "test":
        named = {c.name: c.spec for c in data.AttnJaxSynthetic.BUILDER_CONFIGS}
        if d.synthetic in named:
            spec = named[d.synthetic]
            if test_per_bucket is not None:
                spec = dataclasses.replace(spec, test_per_bucket=test_per_bucket)
        else:
            s = d.synthetic_spec
            per_bucket = test_per_bucket or max(1, math.ceil(s.validation_size / 7))
            spec = data.SyntheticSpec(
                train_size=s.train_size,
                validation_size=s.validation_size,
                test_per_bucket=per_bucket,
                seed=s.seed,
                min_length=s.min_length,
                max_length=s.max_length,
            )
        pairs = data.generate_synthetic(spec)["test"]
        return data.corpus_from_pairs(
            [(p.source, p.target, p.alignment) for p in pairs], name=f"attn_jax_synthetic/{d.synthetic}[test]"
        )
    return load_corpus(d, split)


def select_examples(sources: Sequence[str], max_examples: int | None) -> list[int]:
    """Indices of at most ``max_examples`` pairs, spread evenly over the length buckets 0-9 ... 60+.

    Round robin over the buckets (corpus order inside each), so a small sample still fills every bucket of the
    BLEU-by-length table; all pairs when ``max_examples`` is None or not smaller than the corpus.
    """
    from attn_jax.eval import PAPER_BUCKETS, bucket_index

    n = len(sources)
    if max_examples is None or max_examples >= n:
        return list(range(n))
    groups: list[list[int]] = [[] for _ in PAPER_BUCKETS]
    for i, s in enumerate(sources):
        groups[bucket_index(len(s.split()))].append(i)
    picked: list[int] = []
    depth = 0
    while len(picked) < max_examples:
        for g in groups:
            if depth < len(g) and len(picked) < max_examples:
                picked.append(g[depth])
        depth += 1
    return sorted(picked)


@functools.cache
def _teacher_forced():
    """The jitted ``(graphdef, state, src, src_mask, tgt_in) -> attention [B, T, S]`` (None without attention);
    built on first use so that ``attn-jax --help`` does not import JAX."""
    import jax
    from flax import nnx

    def attention(graphdef, state, src, src_mask, tgt_in):
        _, weights = nnx.merge(graphdef, state)(src, src_mask, tgt_in)
        return weights

    return jax.jit(attention, static_argnums=0)


def reference_attention(
    loaded: LoadedModel, sources: Sequence[str], references: Sequence[str], *, batch_size: int = 32
) -> list[np.ndarray] | None:
    """Teacher-forced attention on each reference: ``[m + 1, n + 1]`` per sentence (rows: the ``m`` reference
    tokens then ``</s>``; columns: the ``n`` source tokens then ``</s>``); None for a model without attention."""
    from flax import nnx

    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    src_ids = [sv.encode(s) for s in sources]
    tgt_ids = [tv.encode(r) for r in references]
    graphdef, state = nnx.split(loaded.model)
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids, strict=True)]
    out: list[np.ndarray | None] = [None] * len(sources)
    for chunk, width, rows in length_batches(lengths, batch_size):
        src, mask = pad_rows([src_ids[i] for i in chunk], width, rows, sv.eos_id, sv.pad_id)
        tgt_in = np.full((rows, width), tv.pad_id, np.int32)
        for r in range(rows):
            t = tgt_ids[chunk[r]] if r < len(chunk) else tgt_ids[chunk[0]]
            tgt_in[r, 0] = tv.bos_id
            tgt_in[r, 1 : len(t) + 1] = t
        weights = _teacher_forced()(graphdef, state, src, mask, tgt_in)
        if weights is None:
            return None
        weights = np.asarray(weights)
        for r, i in enumerate(chunk):
            out[i] = weights[r, : len(tgt_ids[i]) + 1, : len(src_ids[i]) + 1]
    return out  # type: ignore[return-value]


@functools.cache
def _cross_attention_heads():
    """The jitted ``(graphdef, state, src, src_mask, tgt_in) -> [B, L_dec, H, T, S]`` of a multi-head model."""
    import jax
    from flax import nnx

    def heads(graphdef, state, src, src_mask, tgt_in):
        return nnx.merge(graphdef, state).cross_attention_weights(src, src_mask, tgt_in)

    return jax.jit(heads, static_argnums=0)


def hypothesis_cross_attention(
    loaded: LoadedModel, source: str, hypothesis: Translation
) -> np.ndarray | None:
    """Every head of the last decoder layer's cross-attention on the model's own translation.

    Teacher-forces ``hypothesis`` (``<s>`` then its ids) through a multi-head model's
    ``cross_attention_weights``: float32 ``[H, m + 1, n + 1]``, rows and columns laid out as
    :attr:`Translation.attention`. A causal decoder run on its own output reproduces the attention it had while
    decoding, so the mean over heads equals ``hypothesis.attention`` (the cached decoder's head average).
    None for a model without per-head cross-attention (the RNNs).
    """
    from flax import nnx

    if not hasattr(loaded.model, "cross_attention_weights"):
        return None
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    src_ids = sv.encode(source)
    n, m = len(src_ids), len(hypothesis.ids)
    src, mask = pad_rows([src_ids], n + 1, 1, sv.eos_id, sv.pad_id)
    tgt_in = np.asarray([[tv.bos_id, *hypothesis.ids]], np.int32)
    graphdef, state = nnx.split(loaded.model)
    weights = np.asarray(_cross_attention_heads()(graphdef, state, src, mask, tgt_in))  # [1, L_dec, H, T, S]
    return weights[0, -1, :, : m + 1, : n + 1]


def sharpest_head(weights: np.ndarray) -> int:
    """The head whose attention rows have the lowest mean entropy (the most alignment-like): ``weights`` is
    ``[H, T, S]`` with rows summing to 1; ties go to the lowest index.

    >>> sharpest_head(np.array([[[0.5, 0.5]], [[0.9, 0.1]], [[0.1, 0.9]]]))
    1
    """
    w = np.asarray(weights, np.float64)
    entropy = -np.sum(w * np.log(np.where(w > 0, w, 1.0)), axis=-1).mean(axis=-1)  # [H]
    return int(np.argmin(entropy))


def _write_lines(path: str, lines: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def _training_source_length(config) -> int | None:
    """The longest source (in tokens) the run trained on, or None when its config sets no limit."""
    limit = config.data.get("max_source_length") if hasattr(config, "data") else None
    return int(limit) if limit else None


class HeatmapPick(NamedTuple):
    """One sentence picked for a heatmap by :func:`figure3_examples`: its index and why it was picked."""

    index: int
    kind: str  # "correct": within the training lengths, translated exactly; "within": same, not exact
    #            (only when too few are exact); "beyond": longer than the training lengths (the failure case)


def figure3_examples(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    count: int,
    within_length: int | None,
    max_length: int,
) -> list[HeatmapPick]:
    """The sentences for the heatmaps, by the rule of the paper's Figure 3 (sentences the model gets right).

    Up to ``count`` sentences of at most ``within_length`` source words (the training lengths) whose translation
    equals the reference exactly (``"correct"``), longest first (ties: corpus order); if fewer are exact, the
    longest remaining ones within those lengths fill up (``"within"``, said in the picture's title). Then one
    sentence longer than ``within_length`` (``"beyond"``: the failure case), the longest with at most
    ``max_length`` words (so the picture stays legible). ``within_length=None``: no training limit is known,
    every sentence counts as within and there is no ``"beyond"`` picture.

    >>> src = ["a b", "a b c", "a b c d e", "a"]
    >>> hyp = ["x y", "x y z", "x", "q"]
    >>> ref = ["x y", "x y z", "x y z w v", "x"]
    >>> figure3_examples(src, hyp, ref, count=2, within_length=3, max_length=10)
    [HeatmapPick(index=1, kind='correct'), HeatmapPick(index=0, kind='correct'), HeatmapPick(index=2, kind='beyond')]
    """
    n = [len(s.split()) for s in sources]
    fits = [i for i in range(len(sources)) if n[i] <= max_length]
    within = [i for i in fits if within_length is None or n[i] <= within_length]
    by_length = sorted(within, key=lambda i: (-n[i], i))
    exact = [i for i in by_length if hypotheses[i].split() == references[i].split()]
    picks = [HeatmapPick(i, "correct") for i in exact[:count]]
    picks += [HeatmapPick(i, "within") for i in by_length if i not in exact][: count - len(picks)]
    beyond = [i for i in fits if within_length is not None and n[i] > within_length]
    if beyond and count > 0:
        picks.append(HeatmapPick(min(beyond, key=lambda i: (-n[i], i)), "beyond"))
    return picks


def evaluate_workdir(
    workdir: str | os.PathLike,
    *,
    split: str = "test",
    beam_size: int = 12,
    alpha: float = 0.6,
    beta: float = 0.0,
    max_examples: int | None = None,
    out_dir: str | os.PathLike | None = None,
    checkpoint: str | int = "best",
    batch_size: int = 32,
    num_heatmaps: int = 3,
    heatmap_max_length: int = 40,
    replace_unk: bool = False,
    test_per_bucket: int | None = None,
    name: str | None = None,
    log=None,
    max_length: int | None = None,
    max_length_ratio: float | None = None,
    max_length_offset: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    bleu_tokenize: str | None = None,
    detokenize: str = "none",
    detokenize_lang: str = "en",
) -> dict[str, Any]:
    """Evaluate a training run on one split: decode, BLEU overall / by length / No UNK, AER, heatmaps, tables.

    Args:
      workdir: the run directory (``checkpoints/``, ``vocab/``).
      split: the corpus split (``test``, ``validation``, ``train``, or TFDS slicing such as ``test[:500]``).
      beam_size, alpha, beta: beam search (GNMT length normalisation α, coverage penalty β).
      max_examples: evaluate at most this many pairs, spread evenly over the length buckets
        (:func:`select_examples`); None: all.
      out_dir: where to write (default ``workdir/eval/<split>``).
      checkpoint: ``best`` (lowest validation loss; the latest when no kept checkpoint was evaluated, which
        is logged and kept in ``checkpoint_note``), ``last`` or a step.
      batch_size: sentences per decoding / teacher-forcing batch.
      num_heatmaps: heatmaps of the longest sentences within the training lengths that the model translates
        exactly, plus one sentence beyond the training lengths (:func:`figure3_examples`); at most
        ``heatmap_max_length`` source words each.
      replace_unk: replace produced ``<unk>`` by the most-attended source word before scoring (off: the
        paper's setting).
      test_per_bucket: test pairs per length bucket of a generated built-in corpus (see :func:`load_split`).
      name: the system's name in the tables (default ``RNNsearch`` / ``RNNenc`` from the config).
      log: a ``print``-like callable for what happens (default: silent); the length limit's line included.
      max_length, max_length_ratio, max_length_offset: the length limit, as ``attn-jax translate``'s
        (``attn_jax.cli_translate.length_limit``; None: the run's default).
      progress: called with ``(sentences done, total, fraction of the work)``: once with 0 before decoding,
        then after each batch (:func:`decode_progress` draws it with an ETA).
      bleu_tokenize: sacreBLEU's tokeniser (``13a``, ``none``, ``intl``, ...); None: ``13a``, not chosen, so a
        corpus whose references look tokenised gets a warning (:func:`bleu_options`).
      detokenize, detokenize_lang: ``"moses"`` and a language detokenise hypotheses and references before BLEU
        (``attn_jax.eval.corpus_bleu``); ``"none"`` scores them as given.

    Returns:
      A dict: ``system``, ``workdir``, ``step``, ``checkpoint_note`` (None, or why another checkpoint than
      the one asked for was used), ``split``, ``num_sentences``, ``bleu`` (overall score),
      ``signature``, ``bleu_by_length`` (:meth:`BleuByLength.to_dict`), ``no_unk`` and ``aer`` (dicts or None),
      ``skipped_empty`` (pairs of the split with an empty side, which the reader skipped: also logged as a
      warning and kept in ``summary.json`` under ``<system>.skipped_empty``),
      ``length_limit`` (``LengthLimitReport.to_dict``: ``stopped_at_limit`` of ``translations``, the rule; and
      ``stopped_indices``, the split's indices of the translations cut),
      ``bleu_options`` (:func:`bleu_options`: tokeniser, detokeniser and language, whether the references look
      tokenised, and the warning given, if any), ``options``, ``timings``, ``files`` (name -> path),
      ``tensorboard`` (``logdir``, ``step``, ``tags`` of the PNGs added as TensorBoard images; None when the
      run has ``tensorboard`` off or its directory is read-only, which is logged) and two
      objects for composing multi-system tables:
      ``bleu_by_length_result`` (:class:`attn_jax.eval.BleuByLength`) and ``system_scores``
      (:class:`attn_jax.eval.SystemScores`). ``evaluation.json`` holds the same minus those two objects.

    Raises:
      TranslateError: a missing run or checkpoint, or bad options. ``attn_jax.data.CorpusError``: the split
        cannot be read.
    """
    from attn_jax import eval as ev

    log = log or (lambda *a, **k: None)
    problem = bleu_flags_problem(bleu_tokenize, detokenize, detokenize_lang)
    if problem:
        raise TranslateError(problem)
    tokenize = bleu_tokenize or "13a"
    bleu_kw: dict[str, Any] = {
        "tokenize": tokenize,
        "detokenize": detokenize,
        "detokenize_lang": detokenize_lang,
    }
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    loaded = load_model(workdir, checkpoint)
    if loaded.note:  # never silent: the CLI logs to stderr, and the JSON and the report keep it
        log(f"warning: {loaded.note}")
    system = name or _SYSTEM_NAMES.get(str(loaded.config.model.arch), str(loaded.config.model.arch))
    out_dir = os.fspath(out_dir) if out_dir is not None else os.path.join(os.fspath(workdir), "eval", split)
    os.makedirs(out_dir, exist_ok=True)

    corpus = load_split(loaded.config, split, test_per_bucket=test_per_bucket)
    skipped = corpus.skipped_empty
    if skipped:  # never silent: stderr, summary.json/md and evaluation.json/md all say it
        log(f"warning: {_skipped_text(skipped, corpus.name)}")
    keep = select_examples(corpus.sources, max_examples)
    if not keep:
        raise TranslateError(f"{split}: no sentence pairs to evaluate")
    sources = [corpus.sources[i] for i in keep]
    references = [corpus.targets[i] for i in keep]
    gold = None if corpus.alignments is None else [corpus.alignments[i] for i in keep]
    rule = length_limit(
        loaded.config,
        max_length=max_length,
        max_length_ratio=max_length_ratio,
        max_length_offset=max_length_offset,
    )
    timings["load_s"] = time.perf_counter() - t0
    log(
        f"{system} (step {loaded.step}): decoding {len(sources)} {split} sentences with beam {beam_size}, "
        f"length limit {rule.describe()}"
    )

    t0 = time.perf_counter()
    if progress is not None:
        progress(0, len(sources), 0.0)
    translations = translate_sentences(
        loaded,
        sources,
        beam_size=beam_size,
        alpha=alpha,
        beta=beta,
        batch_size=batch_size,
        limit=rule,
        replace_unk=replace_unk,
        progress=progress,
    )
    hypotheses = [t[0].text if t else "" for t in translations]
    timings["decode_s"] = time.perf_counter() - t0
    limit_report = length_limit_report(loaded, sources, translations, rule)
    if limit_report.stopped:  # never silent: stderr, summary.json/md and evaluation.json/md all say it
        log(f"warning: {limit_report.message()}")
    else:
        log(f"length limit: {limit_report.describe_limit()}; no translation stopped at it")

    t0 = time.perf_counter()
    bleu_opts = bleu_options(
        references,
        bleu_tokenize=bleu_tokenize,
        detokenize=detokenize,
        detokenize_lang=detokenize_lang,
        built_in=str(loaded.config.data.corpus) == "synthetic",
    )
    if bleu_opts["warning"]:  # never silent: stderr, summary.json/md and evaluation.json/md all say it
        log(f"warning: {bleu_opts['warning']}")
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    with _without_sacrebleu_tokenized_warning():  # bleu_options has said it once, with the flags to use
        by_length = ev.bleu_by_length(hypotheses, references, sources, **bleu_kw)
        no_unk = ev.bleu_no_unk(
            hypotheses,
            references,
            source_has_unk=[ev.has_unk(sv.encode(s), unk_id=sv.unk_id) for s in sources],
            reference_has_unk=[ev.has_unk(tv.encode(r), unk_id=tv.unk_id) for r in references],
            **bleu_kw,
        )
    word_level = getattr(sv, "word_level", False) and getattr(tv, "word_level", False)
    ref_attention = reference_attention(loaded, sources, references, batch_size=batch_size)
    aer = aer_within = links = None
    if ref_attention is not None and word_level:
        links = [
            ev.argmax_alignment(w[: len(r.split()), : len(s.split())])
            for w, s, r in zip(ref_attention, sources, references, strict=True)
        ]
        if gold is not None:
            aer = ev.alignment_error_rate(
                links,
                gold,
                source_lengths=[len(s.split()) for s in sources],
                target_lengths=[len(r.split()) for r in references],
            )
            limit = _training_source_length(loaded.config)
            inside = [k for k, s in enumerate(sources) if limit is None or len(s.split()) <= limit]
            if inside:
                aer_within = ev.alignment_error_rate(
                    [links[k] for k in inside],
                    [gold[k] for k in inside],
                    source_lengths=[len(sources[k].split()) for k in inside],
                    target_lengths=[len(references[k].split()) for k in inside],
                )
    timings["score_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    files: dict[str, str] = {}

    def path(fname: str) -> str:
        files[fname] = os.path.join(out_dir, fname)
        return files[fname]

    _write_lines(path("sources.txt"), sources)
    _write_lines(path("references.txt"), references)
    _write_lines(path("hypotheses.txt"), hypotheses)
    # With a detokeniser, the exact strings BLEU scored, so that sacrebleu reproduces the score from files.
    if detokenize != "none":
        _write_lines(path("references.detok.txt"), ev.detokenize(references, detokenize, detokenize_lang))
        _write_lines(path("hypotheses.detok.txt"), ev.detokenize(hypotheses, detokenize, detokenize_lang))
    if links is not None:
        _write_lines(path("alignments.txt"), [ev.format_pharaoh(a) for a in links])
    scores = ev.SystemScores(by_length.overall, no_unk, aer)
    by_length_md = ev.bleu_by_length_markdown({system: by_length})
    limit_line = _limit_markdown(limit_report)
    summary_md = ev.summary_markdown({system: scores}) + f"\n{limit_line}\n"
    if skipped:
        summary_md += f"\n{_skipped_text(skipped, corpus.name)}.\n"
    if bleu_opts["warning"]:
        summary_md += f"\n**Warning:** {bleu_opts['warning']}.\n"
    with open(path("bleu_by_length.md"), "w", encoding="utf-8") as f:
        f.write(by_length_md)
    with open(path("summary.md"), "w", encoding="utf-8") as f:
        f.write(summary_md)
    with open(path("bleu_by_length.json"), "w", encoding="utf-8") as f:
        json.dump(ev.bleu_by_length_json({system: by_length}), f, indent=2, allow_nan=False)
    summary = ev.summary_json({system: scores})
    summary[system]["length_limit"] = limit_report.to_dict()
    summary[system]["skipped_empty"] = skipped
    summary[system]["bleu_options"] = bleu_opts
    with open(path("summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, allow_nan=False)
    ev.plot_bleu_by_length({system: by_length}, path("bleu_by_length.png"), title=f"{system}: BLEU by length")

    heatmaps = []
    train_length = _training_source_length(loaded.config)
    picks = figure3_examples(
        sources,
        hypotheses,
        references,
        count=num_heatmaps,
        within_length=train_length,
        max_length=heatmap_max_length,
    )
    picked = []
    for k, (i, kind) in enumerate(picks):
        note = {
            "correct": "translated exactly",
            "within": "within training lengths, not exact",
            "beyond": f"beyond the training lengths (> {train_length} words)",
        }[kind]
        picked.append(
            {"file": f"attention_{k}.png", "index": keep[i], "words": len(sources[i].split()), "kind": kind}
        )
        hyp = translations[i][0] if translations[i] else None
        src_words = [*sources[i].split(), "</s>"] if word_level else None
        if hyp is not None and hyp.attention is not None:
            heatmaps.append(
                ev.plot_attention(
                    hyp.attention,
                    [*hyp.source_tokens, "</s>"],
                    [*hyp.tokens, "</s>"],
                    path(f"attention_{k}.png"),
                    title=f"{system}, {split} #{keep[i]} ({note}): own translation"
                    + (
                        ", last layer, mean of heads"
                        if hasattr(loaded.model, "cross_attention_weights")
                        else ""
                    ),
                )
            )
            heads = hypothesis_cross_attention(loaded, sources[i], hyp)
            if heads is not None:
                h = sharpest_head(heads)
                heatmaps.append(
                    ev.plot_attention(
                        heads[h],
                        [*hyp.source_tokens, "</s>"],
                        [*hyp.tokens, "</s>"],
                        path(f"attention_{k}_head.png"),
                        title=f"{system}, {split} #{keep[i]} ({note}): own translation, last layer, head {h} (sharpest)",
                    )
                )
        if ref_attention is not None and src_words is not None:
            heatmaps.append(
                ev.plot_attention(
                    ref_attention[i],
                    src_words,
                    [*references[i].split(), "</s>"],
                    path(f"attention_{k}_reference.png"),
                    gold=gold[i] if gold is not None else None,
                    title=f"{system}, {split} #{keep[i]} ({note}): reference (red: gold)",
                )
            )
    tensorboard = _tensorboard_images(workdir, loaded, split, files, log)
    timings["write_s"] = time.perf_counter() - t0

    result: dict[str, Any] = {
        "system": system,
        "workdir": os.fspath(workdir),
        "step": loaded.step,
        "checkpoint_note": loaded.note or None,
        "split": split,
        "corpus": corpus.name,
        "num_sentences": len(sources),
        "skipped_empty": skipped,
        "bleu": by_length.overall.score,
        "signature": by_length.signature,
        "bleu_options": bleu_opts,
        "bleu_by_length": by_length.to_dict(),
        "no_unk": no_unk.to_dict(),
        "aer": None if aer is None else aer.to_dict(),
        "aer_within_training_lengths": None if aer_within is None else aer_within.to_dict(),
        "training_max_source_length": _training_source_length(loaded.config),
        "length_limit": {
            **limit_report.to_dict(),
            "stopped_indices": [keep[i] for i, t in enumerate(translations) if t and t[0].truncated],
        },
        "heatmaps": picked,
        "options": {
            "beam_size": beam_size,
            "alpha": alpha,
            "beta": beta,
            "max_length": max_length,
            "max_length_ratio": max_length_ratio,
            "max_length_offset": max_length_offset,
            "checkpoint": checkpoint,
            "max_examples": max_examples,
            "replace_unk": replace_unk,
            "batch_size": batch_size,
            "bleu_tokenize": bleu_tokenize,
            "detokenize": detokenize,
            "detokenize_lang": detokenize_lang,
        },
        "timings": timings,
        "files": files,
        "tensorboard": tensorboard,
    }
    md = [
        f"# {system} on {corpus.name} ({split}), checkpoint step {loaded.step}\n",
        *([f"**Warning:** {loaded.note}.\n"] if loaded.note else []),
        f"Beam {beam_size}, α = {alpha}, β = {beta}; {len(sources)} sentences.\n",
        f"{'**Warning:** ' if limit_report.stopped else ''}{limit_line}\n",
        *([f"**Warning:** {_skipped_text(skipped, corpus.name)}.\n"] if skipped else []),
        *([f"**Warning:** {bleu_opts['warning']}.\n"] if bleu_opts["warning"] else []),
        "## BLEU by source length\n",
        by_length_md,
        "## Summary\n",
        summary_md,
    ]
    if heatmaps:
        md.append("## Attention\n")
        md.append(
            "Sentences chosen as in the paper's Figure 3: the longest within the training lengths "
            f"({train_length} source words) translated exactly, then one beyond them (the failure case).\n"
        )
        md += [
            f"- `attention_{k}`: #{p['index']}, {p['words']} words, {p['kind']}" for k, p in enumerate(picked)
        ]
        md.append("")
        md += [f"![{os.path.basename(h)}]({os.path.basename(h)})\n" for h in heatmaps]
    files["evaluation.md"] = os.path.join(out_dir, "evaluation.md")
    files["evaluation.json"] = os.path.join(out_dir, "evaluation.json")
    with open(files["evaluation.md"], "w", encoding="utf-8") as f:
        f.write("\n".join(md))
    with open(files["evaluation.json"], "w", encoding="utf-8") as f:
        json.dump(_json_ready(result), f, indent=2, allow_nan=False)
    result["bleu_by_length_result"] = by_length
    result["system_scores"] = scores
    return result


def _tensorboard_images(workdir, loaded, split: str, files: dict[str, str], log) -> dict[str, Any] | None:
    """Add the evaluation's PNGs to the run's TensorBoard log (``<workdir>/tensorboard/eval``) as images tagged
    ``eval/<split>/<file stem>`` at the checkpoint's step; None when the run has TensorBoard off."""
    if not getattr(loaded.config, "tensorboard", True):
        return None
    from attn_jax.train import EventWriter

    tag_split = re.sub(r"[^-\w.]", "_", split)  # TensorBoard's tag alphabet: test[:500] -> test__500_
    pngs = {f"eval/{tag_split}/{os.path.splitext(f)[0]}": p for f, p in files.items() if f.endswith(".png")}
    logdir = os.path.join(os.fspath(workdir), "tensorboard", "eval")
    try:
        with EventWriter(logdir) as w:
            w.images(loaded.step, pngs)
    except OSError as e:  # a read-only run directory: the PNGs and tables are written, so say it and go on
        log(f"warning: TensorBoard images not written to {logdir}: {e}")
        return None
    return {"logdir": logdir, "step": loaded.step, "tags": sorted(pngs)}


def bleu_flags_problem(bleu_tokenize: str | None, detokenize: str, detokenize_lang: str) -> str | None:
    """Why ``--bleu-tokenize``/``--detokenize``/``--detokenize-lang`` cannot be used, or None when they can."""
    from attn_jax.eval import DETOKENIZERS

    if detokenize not in DETOKENIZERS:
        return f"--detokenize must be one of {', '.join(DETOKENIZERS)}, got {detokenize!r}"
    lang = detokenize_lang
    if not (
        isinstance(lang, str) and lang.isascii() and lang.isalpha() and lang.islower() and 2 <= len(lang) <= 3
    ):
        return f"--detokenize-lang must be a Moses language code such as en, fr or de, got {lang!r}"
    if bleu_tokenize is not None:
        from sacrebleu.metrics import BLEU

        if bleu_tokenize not in BLEU.TOKENIZERS:
            names = ", ".join(BLEU.TOKENIZERS)
            return f"--bleu-tokenize must be a sacreBLEU tokeniser ({names}), got {bleu_tokenize!r}"
    return None


def bleu_options(
    references: Sequence[str],
    *,
    bleu_tokenize: str | None = None,
    detokenize: str = "none",
    detokenize_lang: str = "en",
    built_in: bool = False,
) -> dict[str, Any]:
    """How :func:`evaluate_workdir` scores BLEU, and the warning to give when nobody chose it for tokenised text.

    Returns ``{"tokenize", "detokenize", "detokenize_lang" (None without detokenising), "looks_tokenized"
    (``attn_jax.eval.looks_tokenized`` of the references), "warning" (one sentence, or None)}``. The warning is
    given when the references look tokenised and neither ``--detokenize`` nor ``--bleu-tokenize`` was chosen
    (``bleu_tokenize`` None, ``detokenize="none"``), except on the built-in corpus, whose BLEU is defined on its
    tokens (it has no raw form): sacreBLEU's ``13a`` on tokenised text is not the standard, comparable score.

    >>> bleu_options(["l' ordinateur , dit-il ."])["warning"].startswith("BLEU is scored with tok:13a on text")
    True
    >>> bleu_options(["l' ordinateur , dit-il ."], built_in=True)["warning"] is None  # the built-in corpus
    True
    >>> bleu_options(["l' ordinateur , dit-il ."], detokenize="moses", detokenize_lang="fr")["warning"] is None
    True
    """
    from attn_jax.eval import looks_tokenized

    tokenized = looks_tokenized(references)
    warning = None
    if tokenized and bleu_tokenize is None and detokenize == "none" and not built_in:
        warning = (
            "BLEU is scored with tok:13a on text that looks tokenised (the references have punctuation set off by "
            "spaces): not the standard sacreBLEU score of raw text. Pass --detokenize moses --detokenize-lang "
            "LANG to score detokenised text, or --bleu-tokenize none to score the tokens as given"
        )
    return {
        "tokenize": bleu_tokenize or "13a",
        "detokenize": detokenize,
        "detokenize_lang": detokenize_lang if detokenize != "none" else None,
        "looks_tokenized": tokenized,
        "warning": warning,
    }


class _DropTokenizedWarning(logging.Filter):
    """Drops sacreBLEU's three-line "forgot to detokenize" warning (it comes once per scored subset)."""

    _STARTS = (
        "That's 100 lines that end in a tokenized period",
        "It looks like you forgot to detokenize",
        "If you insist",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self._STARTS)


@contextlib.contextmanager
def _without_sacrebleu_tokenized_warning():
    """sacreBLEU's tokenised-text warning silenced while scoring: :func:`bleu_options` gives one line instead."""
    logger = logging.getLogger("sacrebleu")
    drop = _DropTokenizedWarning()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _skipped_text(skipped: int, name: str) -> str:
    """The sentence on the split's pairs left out for an empty side (the reader skips them)."""
    pairs = "pair" if skipped == 1 else "pairs"
    return f"{skipped:,} {pairs} of {name} with an empty source or reference skipped (not translated, not scored)"


def _limit_markdown(report) -> str:
    """One Markdown sentence: the length limit and how many translations stopped at it."""
    text = (
        f"Length limit: {report.describe_limit()}; {report.stopped} of {report.translations} translations "
        "stopped at it instead of ending with `</s>`"
    )
    if report.stopped:
        text += " (their references may be longer than any hypothesis could be: raise --max-length or "
        text += "--max-length-ratio)"
    return text + "."


def decode_progress(
    line, *, clock: Callable[[], float] = time.monotonic
) -> Callable[[int, int, float], None]:
    """A ``progress`` callback for :func:`evaluate_workdir` that draws on ``line`` (an
    ``attn_jax.train.ProgressLine``, as ``attn-jax train`` does) the sentences done, their rate and an ETA.

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


def _json_ready(x):
    """NaN -> None, recursively."""
    if isinstance(x, dict):
        return {k: _json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_ready(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# -------------------------------------------------------------------------------------------------- CLI


def add_evaluate_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``evaluate`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_evaluate`."""
    from attn_jax._help import summary

    p = subparsers.add_parser(
        "evaluate",
        help="BLEU (overall, by length, No UNK), AER and attention heatmaps of a trained run",
        description=summary(__doc__),
        epilog=(
            "Writes sources/references/hypotheses.txt, bleu_by_length.{md,json}, summary.{md,json}, "
            "evaluation.{md,json} and PNGs to --out (default WORKDIR/eval/SPLIT). Exit status: 0 done, "
            "1 missing run/checkpoint or unreadable corpus, 2 bad flag."
        ),
    )
    p.add_argument("--workdir", required=True, metavar="DIR", help="the training run's directory")
    p.add_argument("--split", default="test", help="corpus split (default: %(default)s)")
    p.add_argument(
        "--out", default=None, metavar="DIR", help="output directory (default: WORKDIR/eval/SPLIT)"
    )
    p.add_argument("--beam", type=int, default=12, metavar="K", help="beam size (default: %(default)s)")
    p.add_argument("--alpha", type=float, default=0.6, help="length-normalisation α (default: %(default)s)")
    p.add_argument("--beta", type=float, default=0.0, help="coverage-penalty β (default: %(default)s)")
    p.add_argument(
        "--max-examples",
        type=int,
        default=None,
        metavar="N",
        help="at most N pairs, spread over length buckets",
    )
    p.add_argument(
        "--checkpoint",
        type=parse_checkpoint,
        default="best",
        metavar="best|last|STEP",
        help="(default: best)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default: %(default)s)")
    p.add_argument(
        "--heatmaps", type=int, default=3, metavar="N", help="attention heatmaps (default: %(default)s)"
    )
    p.add_argument(
        "--replace-unk", action="store_true", help="replace produced <unk> by the most-attended source word"
    )
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "lines"),
        default="auto",
        help="decoding progress on stderr: a bar (redrawn in place) or a line every 10 s, with rate and ETA "
        "(default: %(default)s = bar on a terminal)",
    )
    p.add_argument(
        "--detokenize",
        choices=("none", "moses"),
        default="none",
        help="detokenise hypotheses and references before BLEU: 'moses' (sacremoses) for a Moses-tokenised corpus "
        "(\"l' ordinateur , dit-il .\"), so that the BLEU is sacreBLEU's standard score of the raw text; the "
        "signature then ends in |detok:moses-LANG (default: %(default)s)",
    )
    p.add_argument(
        "--detokenize-lang",
        default="en",
        metavar="LANG",
        help="the target language's Moses code for --detokenize moses: en, fr, de, ... (default: %(default)s)",
    )
    p.add_argument(
        "--bleu-tokenize",
        default=None,
        metavar="TOK",
        help="sacreBLEU's tokeniser: 13a, none, intl, char, ... (default: 13a); 'none' scores pre-tokenised "
        "text on its tokens exactly as given (tok:none; not comparable with scores of raw text). Without this "
        "flag or --detokenize, references that look tokenised get a one-line warning",
    )
    add_length_limit_flags(p)
    p.set_defaults(func=run_evaluate)
    return p


def _error(message: str, status: int = 1) -> int:
    print(f"attn-jax evaluate: error: {' '.join(str(message).split())}", file=sys.stderr)
    return status


def run_evaluate(args: argparse.Namespace) -> int:
    """Run ``attn-jax evaluate`` with parsed arguments; returns the exit status."""
    if args.beam < 1:
        return _error(f"--beam must be >= 1, got {args.beam}", 2)
    if args.max_examples is not None and args.max_examples < 1:
        return _error(f"--max-examples must be >= 1, got {args.max_examples}", 2)
    if args.batch_size < 1 or args.heatmaps < 0:
        return _error("--batch-size must be >= 1 and --heatmaps >= 0", 2)
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if not (math.isfinite(value) and value >= 0):
            return _error(f"{flag} must be a finite number >= 0, got {value}", 2)
    problem = length_flags_problem(args.max_length, args.max_length_ratio, args.max_length_offset)
    problem = problem or bleu_flags_problem(args.bleu_tokenize, args.detokenize, args.detokenize_lang)
    if problem:
        return _error(problem, 2)

    from attn_jax.data import CorpusError
    from attn_jax.train import ProgressLine

    quiet_checkpoint_logs()
    tty = {"auto": None, "bar": True, "lines": False}[args.progress]
    line = ProgressLine(sys.stderr, tty=tty, label="decoding", every_s=10.0)
    try:
        r = evaluate_workdir(
            args.workdir,
            split=args.split,
            beam_size=args.beam,
            alpha=args.alpha,
            beta=args.beta,
            max_examples=args.max_examples,
            out_dir=args.out,
            checkpoint=args.checkpoint,
            batch_size=args.batch_size,
            num_heatmaps=args.heatmaps,
            replace_unk=args.replace_unk,
            log=lambda *a: line.log(" ".join(str(x) for x in a)),
            max_length=args.max_length,
            max_length_ratio=args.max_length_ratio,
            max_length_offset=args.max_length_offset,
            progress=decode_progress(line),
            bleu_tokenize=args.bleu_tokenize,
            detokenize=args.detokenize,
            detokenize_lang=args.detokenize_lang,
        )
    except (TranslateError, CorpusError) as e:
        line.close()
        return _error(e)
    line.close()
    from attn_jax import eval as ev

    print(f"{r['system']} on {r['corpus']} ({r['split']}), checkpoint step {r['step']}, beam {args.beam}")
    print(
        f"\nBLEU by source length:\n\n{ev.bleu_by_length_markdown({r['system']: r['bleu_by_length_result']})}"
    )
    print(f"Summary:\n\n{ev.summary_markdown({r['system']: r['system_scores']})}")
    print(r["bleu_by_length_result"].overall)
    if r["system_scores"].aer is not None:
        print(r["system_scores"].aer)
    print(f"\nwritten to {os.path.dirname(r['files']['evaluation.json'])}/")
    if r["tensorboard"]:
        tb = r["tensorboard"]
        print(f"TensorBoard: {len(tb['tags'])} images at step {tb['step']} in {tb['logdir']}/")
    return 0
