"""Evaluate a trained run on one split: decode it, score BLEU (overall, by source length, No UNK), chrF, TER
and AER (a multi-head model's also per decoder layer and head), draw attention heatmaps and write the tables,
the sentences and ``evaluation.{json,md}``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from attn_jax.eval import BleuSettings
from attn_jax.pipeline._attention import (
    HeatmapPick,
    figure3_examples,
    hypothesis_cross_attention,
    reference_attention,
    reference_cross_attention,
    sharpest_head,
)
from attn_jax.pipeline._bleu import _without_sacrebleu_tokenized_warning, bleu_options
from attn_jax.pipeline._length import LengthLimitReport, length_limit_report
from attn_jax.pipeline._load import LoadedModel, TranslateError, load_ensemble
from attn_jax.pipeline._options import AttentionChoice, DecodeOptions
from attn_jax.pipeline._split import load_split, select_examples
from attn_jax.pipeline._translate import Translation, translate_sentences

__all__ = ["evaluate_workdir"]

_SYSTEM_NAMES = {"rnnsearch": "RNNsearch", "rnnenc": "RNNenc", "gnmt": "GNMT", "transformer": "Transformer"}
_PICK_NOTES = {
    "correct": "translated exactly",
    "within": "within training lengths, not exact",
    "beyond": "beyond the training lengths (> {} words)",
    "chosen": "chosen",
}


def evaluate_workdir(
    workdir: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    split: str = "test",
    decode: DecodeOptions | None = None,
    bleu: BleuSettings | None = None,
    max_examples: int | None = None,
    out_dir: str | os.PathLike | None = None,
    checkpoint: str | int = "best",
    weights: str = "raw",
    batch_size: int = 32,
    num_heatmaps: int = 3,
    heatmap_max_length: int = 40,
    heatmap_sentences: Sequence[int] | None = None,
    test_per_bucket: int | None = None,
    name: str | None = None,
    log=None,
    progress: Callable[[int, int, float], None] | None = None,
    one_shape: bool = False,
    attention: AttentionChoice | None = None,
    save_attention: bool = False,
) -> dict[str, Any]:
    """Evaluate a training run on one split: decode, BLEU overall / by length / No UNK, AER, heatmaps, tables.

    Args:
      workdir: the run directory (``checkpoints/``, ``vocab/``), or several: an ensemble
        (:func:`load_ensemble`) whose log-probabilities are averaged. The first run's config gives the corpus
        and the length limit; the result, ``summary.json`` and ``evaluation.md`` list the members.
      split: the corpus split (``test``, ``validation``, ``train``, or TFDS slicing such as ``test[:500]``).
      decode: the beam search, length limit, repetition control and ``<unk>`` replacement
        (:class:`DecodeOptions`; None: its defaults). Its ``nbest`` is not used: the best hypothesis is scored.
      bleu: how BLEU, chrF and TER are scored (``attn_jax.eval.BleuSettings``: sacreBLEU's tokeniser and an
        optional detokeniser; None: its defaults). ``tokenize`` None is ``13a``, not chosen, so a corpus whose
        references look tokenised gets a warning (:func:`bleu_options`).
      max_examples: evaluate at most this many pairs, spread evenly over the length buckets
        (:func:`select_examples`); None: all.
      out_dir: where to write (default ``workdir/eval/<split>``; an ensemble's: the first run's
        ``eval/<split>-ensemble``).
      checkpoint: ``best`` (by the run's ``checkpoint.best_metric``, lowest validation loss by default; the
        latest when no kept checkpoint was evaluated, which is logged and kept in ``checkpoint_note``), ``last``
        or a step.
      weights: ``raw`` (the trained parameters) or ``ema`` (their moving average; :func:`load_model`).
      batch_size: sentences per decoding / teacher-forcing batch.
      num_heatmaps: heatmaps of the longest sentences within the training lengths that the model translates
        exactly, plus one sentence beyond the training lengths (:func:`figure3_examples`); at most
        ``heatmap_max_length`` source words each.
      heatmap_sentences: draw these sentences instead (0-based indices in the split, as ``evaluation.json``'s
        ``heatmaps`` and the sentence files number them; each must be among the pairs evaluated, so with
        ``max_examples`` among the ones selected), in the order given, whatever their length.
      test_per_bucket: test pairs per length bucket of a generated built-in corpus (see :func:`load_split`).
      name: the system's name in the tables (default ``RNNsearch`` / ``RNNenc`` from the config).
      log: a ``print``-like callable for what happens (default: silent); the length limit's line included.
      progress: called with ``(sentences done, total, fraction of the work)``: once with 0 before decoding,
        then after each batch (:func:`decode_progress` draws it with an ETA).
      one_shape: decode and teacher-force every batch at one padded shape (``attn_jax.decoding.length_batches``):
        one compiled program each instead of one per width and partial batch. Faster where compiling costs
        more than computing (small models on a CPU); a sentence padded wider may round differently in its
        last bits. Kept in ``options``.
      attention: the decoder layer and head whose teacher-forced attention gives ``alignments.txt``, the AER
        and the reference heatmaps (:class:`AttentionChoice`; None: the last layer's mean of heads). Kept in
        ``options`` as ``attention_layer`` and ``attention_head``. A multi-head model with gold alignments
        also gets the AER of every layer and head: ``aer_by_head.{md,json}`` and the result's ``aer_by_head``.
      save_attention: also write ``attention.npz``, every sentence's attention on its translation and on its
        reference, every decoder layer and head (``attn_jax.pipeline._attention_file``): what ``attn-jax
        report`` draws. Costs two teacher-forced passes. Kept in ``options``.

    Returns:
      A dict: ``system``, ``workdir``, ``step``, ``checkpoint_note`` (None, or why another checkpoint than
      the one asked for was used), ``split``, ``num_sentences``, ``bleu`` (overall score),
      ``signature``, ``bleu_by_length`` (:meth:`BleuByLength.to_dict`), ``chrf`` and ``ter`` (overall scores,
      sacreBLEU's, detokenised as BLEU is), ``chrf_by_length`` and ``ter_by_length``
      (:meth:`attn_jax.eval.ScoreByLength.to_dict`), ``no_unk`` and ``aer`` (dicts or None),
      ``aer_by_head`` (None, or ``layers``, ``heads``, ``num_sentences``, ``entries``: per decoder layer and
      head, ``"mean"`` for the layer's mean of heads, the AER dict; ``best``: the head of lowest AER),
      ``skipped_empty`` (pairs of the split with an empty side, which the reader skipped: also logged as a
      warning and kept in ``summary.json`` under ``<system>.skipped_empty``),
      ``length_limit`` (``LengthLimitReport.to_dict``: ``stopped_at_limit`` of ``translations``, the rule; and
      ``stopped_indices``, the split's indices of the translations cut),
      ``bleu_options`` (:func:`bleu_options`: tokeniser, detokeniser and language, whether the references look
      tokenised, and the warning given, if any), ``options``, ``timings``, ``files`` (name -> path),
      ``tensorboard`` (``logdir``, ``step``, ``tags`` of the PNGs added as TensorBoard images, ``scalars``:
      the tags of overall BLEU, chrF and TER; None when the
      run has ``tensorboard`` off or its directory is read-only, which is logged),
      ``ensemble`` (only for an ensemble: per run its ``workdir``, ``step`` and ``checkpoint_note``; then
      ``workdir`` and ``step`` are the first run's, and TensorBoard is not written) and two objects for
      composing multi-system tables: ``bleu_by_length_result`` (:class:`attn_jax.eval.BleuByLength`) and
      ``system_scores`` (:class:`attn_jax.eval.SystemScores`). ``evaluation.json`` holds the same minus those two objects.

    Raises:
      AttentionChoiceError: an ``attention`` choice the model cannot give.
      TranslateError: a missing run or checkpoint, or bad options. ``attn_jax.data.CorpusError``: the split
        cannot be read.
    """
    log = log or (lambda *a, **k: None)
    decode = dataclasses.replace(decode or DecodeOptions(), nbest=1).check()
    attention = attention or AttentionChoice()
    bleu = bleu or BleuSettings()
    try:
        bleu.check()
    except ValueError as e:
        raise TranslateError(str(e)) from None
    options = {  # evaluation.json's "options"
        "beam_size": decode.beam_size,
        "alpha": decode.alpha,
        "beta": decode.beta,
        "max_length": decode.max_length,
        "max_length_ratio": decode.max_length_ratio,
        "max_length_offset": decode.max_length_offset,
        "checkpoint": checkpoint,
        "weights": weights,
        "max_examples": max_examples,
        "replace_unk": decode.replace_unk,
        "batch_size": batch_size,
        "bleu_tokenize": bleu.tokenize,
        "detokenize": bleu.detokenize,
        "detokenize_lang": bleu.detokenize_lang,
        "no_repeat_ngram": decode.no_repeat_ngram,
        "min_length": decode.min_length,
        "heatmap_sentences": None if heatmap_sentences is None else [int(i) for i in heatmap_sentences],
        "one_shape": one_shape,
        "attention_layer": attention.layer,
        "attention_head": attention.to_dict()["head"],
        "save_attention": save_attention,
    }
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    runs = [os.fspath(workdir)] if isinstance(workdir, str | os.PathLike) else [os.fspath(w) for w in workdir]
    loaded = load_ensemble(runs, checkpoint, weights)
    attention.check(loaded)  # before decoding: a choice the model cannot give fails at once
    if loaded.note:  # never silent: the CLI logs to stderr, and the JSON and the report keep it
        log(f"warning: {loaded.note}")
    workdir = runs[0]
    system = name or _system_name(loaded)
    default_out = os.path.join(workdir, "eval", f"{split}-ensemble" if loaded.members else split)
    out_dir = os.fspath(out_dir) if out_dir is not None else default_out
    os.makedirs(out_dir, exist_ok=True)
    pairs = _read_pairs(
        loaded.config, split, max_examples=max_examples, test_per_bucket=test_per_bucket, log=log
    )
    chosen = _chosen_positions(pairs, heatmap_sentences, split)
    rule = decode.length_limit(loaded.config)
    timings["load_s"] = time.perf_counter() - t0
    log(
        f"{system} ({_steps(loaded)}{', EMA weights' if weights == 'ema' else ''}): decoding {len(pairs.sources)} {split} sentences with beam {decode.beam_size}, "
        f"length limit {rule.describe()}"
    )

    t0 = time.perf_counter()
    translations = _decode(
        loaded, pairs.sources, progress, decode, batch_size=batch_size, limit=rule, one_shape=one_shape
    )
    hypotheses = [t[0].text if t else "" for t in translations]
    timings["decode_s"] = time.perf_counter() - t0
    limit_report = _count_length_limit(loaded, pairs.sources, translations, rule, log)

    t0 = time.perf_counter()
    scored = _score_bleu(loaded, pairs, hypotheses, bleu, log)
    chrf_ter = _score_chrf_ter(pairs, hypotheses, bleu)
    alignment = _score_alignment(loaded, pairs, batch_size, one_shape, attention)
    by_head = _aer_by_head(loaded, pairs, batch_size, one_shape, log)
    timings["score_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    files = _Files(out_dir)
    _write_sentences(files, pairs, hypotheses, alignment.links, bleu)
    if save_attention:
        from attn_jax.pipeline._attention_file import write_attention_file

        write_attention_file(
            files.path("attention.npz"),
            loaded,
            pairs.sources,
            pairs.references,
            translations,
            gold=pairs.gold,
            batch_size=batch_size,
            one_shape=one_shape,
        )
    members = _members(loaded) if loaded.members else None
    scores = _write_tables(
        files,
        system,
        pairs.corpus,
        scored,
        alignment.aer,
        limit_report,
        chrf_ter,
        ensemble=members,
        attention=attention,
    )
    if by_head is not None:
        _write_aer_by_head(files, by_head)
    picked, heatmaps = _draw_heatmaps(
        files,
        loaded,
        (system, split),
        pairs,
        translations,
        hypotheses,
        alignment.reference,
        count=num_heatmaps,
        max_length=heatmap_max_length,
        chosen=chosen,
        attention=attention,
    )
    tensorboard = _tensorboard_images(workdir, loaded, split, files.paths, log, scored, chrf_ter)
    timings["write_s"] = time.perf_counter() - t0

    result = _record(
        system,
        workdir,
        loaded,
        split,
        pairs,
        scored,
        alignment,
        limit_report,
        translations,
        chrf_ter=chrf_ter,
        picked=picked,
        options=options,
        timings=timings,
        files=files.paths,
        tensorboard=tensorboard,
        by_head=by_head,
    )
    md = _evaluation_markdown(result, limit_report, scored, scores, heatmaps, chrf_ter)
    _write_evaluation(files, result, md)
    result["bleu_by_length_result"] = scored.by_length
    result["system_scores"] = scores
    return result


# ------------------------------------------------------------------------------------------ the steps


class _Pairs(NamedTuple):
    """The pairs evaluated: the corpus read, their indices in the split, their sides and gold alignments."""

    corpus: Any  # attn_jax.data.ParallelCorpus
    keep: list[int]
    sources: list[str]
    references: list[str]
    gold: list[Any] | None


class _Bleu(NamedTuple):
    """BLEU overall and by source length, on the sentences without ``<unk>``, and how it was scored."""

    by_length: Any  # attn_jax.eval.BleuByLength
    no_unk: Any  # attn_jax.eval.BleuResult
    options: dict[str, Any]  # bleu_options(...)


class _Alignment(NamedTuple):
    """Teacher-forced attention on the references, its argmax links and their AER (None where not measured)."""

    reference: list[np.ndarray] | None
    links: list[Any] | None
    aer: Any
    aer_within: Any  # on the sentences within the training lengths


class _Files:
    """The output directory and the files written there, by name (``evaluation.json``'s ``files``)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.paths: dict[str, str] = {}

    def path(self, fname: str) -> str:
        """The path of ``fname`` in the output directory, recorded as written."""
        self.paths[fname] = os.path.join(self.out_dir, fname)
        return self.paths[fname]


def _read_pairs(config, split: str, *, max_examples, test_per_bucket, log) -> _Pairs:
    """The split's pairs to evaluate (:func:`select_examples`); pairs skipped for an empty side are logged."""
    corpus = load_split(config, split, test_per_bucket=test_per_bucket)
    if corpus.skipped_empty:  # never silent: stderr, summary.json/md and evaluation.json/md all say it
        log(f"warning: {_skipped_text(corpus.skipped_empty, corpus.name)}")
    keep = select_examples(corpus.sources, max_examples)
    if not keep:
        raise TranslateError(f"{split}: no sentence pairs to evaluate")
    gold = None if corpus.alignments is None else [corpus.alignments[i] for i in keep]
    return _Pairs(corpus, keep, [corpus.sources[i] for i in keep], [corpus.targets[i] for i in keep], gold)


def _decode(
    loaded: LoadedModel, sources: Sequence[str], progress, decode: DecodeOptions, **kw
) -> list[list[Translation]]:
    """Beam-search translations of ``sources``, with ``progress`` told 0 first (its clock starts there)."""
    if progress is not None:
        progress(0, len(sources), 0.0)
    return translate_sentences(loaded, sources, decode, progress=progress, **kw)


def _count_length_limit(loaded, sources, translations, rule, log) -> LengthLimitReport:
    """The translations that stopped at the length limit, logged (a warning when any did)."""
    report = length_limit_report(loaded, sources, translations, rule)
    if report.stopped:  # never silent: stderr, summary.json/md and evaluation.json/md all say it
        log(f"warning: {report.message()}")
    else:
        log(f"length limit: {report.describe_limit()}; no translation stopped at it")
    return report


def _score_bleu(
    loaded: LoadedModel,
    pairs: _Pairs,
    hypotheses: Sequence[str],
    settings: BleuSettings,
    log,
) -> _Bleu:
    """BLEU overall, by source length and on the sentences without ``<unk>`` (Table 1's "No UNK")."""
    from attn_jax import eval as ev

    opts = bleu_options(
        pairs.references,
        bleu_tokenize=settings.tokenize,
        detokenize=settings.detokenize,
        detokenize_lang=settings.detokenize_lang,
        built_in=str(loaded.config.data.corpus) == "synthetic",
    )
    if opts["warning"]:  # never silent: stderr, summary.json/md and evaluation.json/md all say it
        log(f"warning: {opts['warning']}")
    kw: dict[str, Any] = {
        "tokenize": settings.tokenize or "13a",
        "detokenize": settings.detokenize,
        "detokenize_lang": settings.detokenize_lang,
    }
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    sources, references = pairs.sources, pairs.references
    with _without_sacrebleu_tokenized_warning():  # bleu_options has said it once, with the flags to use
        by_length = ev.bleu_by_length(hypotheses, references, sources, **kw)
        no_unk = ev.bleu_no_unk(
            hypotheses,
            references,
            source_has_unk=[ev.has_unk(sv.encode(s), unk_id=sv.unk_id) for s in sources],
            reference_has_unk=[ev.has_unk(tv.encode(r), unk_id=tv.unk_id) for r in references],
            **kw,
        )
    return _Bleu(by_length, no_unk, opts)


def _score_chrf_ter(pairs: _Pairs, hypotheses: Sequence[str], settings: BleuSettings):
    """chrF and TER overall and by source length (``attn_jax.eval.ScoreByLength``), detokenised as BLEU is."""
    from attn_jax import eval as ev

    kw: dict[str, Any] = {"detokenize": settings.detokenize, "detokenize_lang": settings.detokenize_lang}
    return {
        m: ev.score_by_length(m, hypotheses, pairs.references, pairs.sources, **kw) for m in ("chrf", "ter")
    }


def _score_alignment(
    loaded: LoadedModel, pairs: _Pairs, batch_size: int, one_shape: bool, choice: AttentionChoice
) -> _Alignment:
    """AER of the teacher-forced attention (``choice``'s layer and head) on the references against the gold
    alignments, overall and within the training lengths (links only for word-level vocabularies; AER only
    where the corpus has gold)."""
    from attn_jax import eval as ev

    sources, references, gold = pairs.sources, pairs.references, pairs.gold
    attention = reference_attention(
        loaded, sources, references, batch_size=batch_size, one_shape=one_shape, choice=choice
    )
    if attention is None or not _word_level(loaded):
        return _Alignment(attention, None, None, None)
    links = [
        ev.argmax_alignment(w[: len(r.split()), : len(s.split())])
        for w, s, r in zip(attention, sources, references, strict=True)
    ]
    if gold is None:
        return _Alignment(attention, links, None, None)

    def aer_of(indices: Sequence[int]):
        return ev.alignment_error_rate(
            [links[k] for k in indices],
            [gold[k] for k in indices],
            source_lengths=[len(sources[k].split()) for k in indices],
            target_lengths=[len(references[k].split()) for k in indices],
        )

    limit = _training_source_length(loaded.config)
    inside = [k for k, s in enumerate(sources) if limit is None or len(s.split()) <= limit]
    return _Alignment(attention, links, aer_of(range(len(sources))), aer_of(inside) if inside else None)


def _aer_by_head(loaded: LoadedModel, pairs: _Pairs, batch_size: int, one_shape: bool, log):
    """AER of every decoder layer's cross-attention heads and of each layer's mean of heads, teacher-forced
    on the references in one pass per batch; None without gold, word-level vocabularies or heads."""
    from attn_jax import eval as ev

    models = loaded.model if isinstance(loaded.model, tuple) else (loaded.model,)
    if pairs.gold is None or not _word_level(loaded):
        return None
    if not any(hasattr(m, "cross_attention_weights") for m in models):
        return None
    if loaded.members:  # never silent: say why a multi-head ensemble has no table
        log("AER by head: not measured for an ensemble (the heads of its runs do not correspond)")
        return None
    src_len = [len(s.split()) for s in pairs.sources]
    tgt_len = [len(r.split()) for r in pairs.references]
    links: np.ndarray | None = None  # [L, H + 1, N] link sets; index H: the layer's mean of heads
    for i, heads, means in reference_cross_attention(
        loaded, pairs.sources, pairs.references, batch_size=batch_size, one_shape=one_shape
    ):
        if links is None:
            links = np.empty((heads.shape[0], heads.shape[1] + 1, len(pairs.sources)), object)
        m, n = tgt_len[i], src_len[i]
        for layer in range(heads.shape[0]):
            for h in range(heads.shape[1]):
                links[layer, h, i] = ev.argmax_alignment(heads[layer, h, :m, :n])
            links[layer, -1, i] = ev.argmax_alignment(means[layer, :m, :n])
    if links is None:
        return None
    num_layers, num_heads = links.shape[0], links.shape[1] - 1
    entries = []
    for layer in range(num_layers):
        for h in range(num_heads + 1):
            aer = ev.alignment_error_rate(
                list(links[layer, h]), pairs.gold, source_lengths=src_len, target_lengths=tgt_len
            )
            entries.append({"layer": layer, "head": "mean" if h == num_heads else h, **aer.to_dict()})
    heads_only = [e for e in entries if e["head"] != "mean" and e["aer"] is not None]
    best = min(heads_only, key=lambda e: e["aer"], default=None)  # ties: the first layer and head
    last_mean = entries[-1]
    if best is not None:
        log(
            f"AER by head: best layer {best['layer']}, head {best['head']}: {100 * best['aer']:.2f} % "
            f"(last layer, mean of heads: {_percent(last_mean['aer'])}); table in aer_by_head.md"
        )
    return {
        "layers": num_layers,
        "heads": num_heads,
        "num_sentences": len(pairs.sources),
        "entries": entries,
        "best": None if best is None else {"layer": best["layer"], "head": best["head"], "aer": best["aer"]},
    }


def _percent(fraction: float | None) -> str:
    """``12.34 %``, or an em dash for no value."""
    return "—" if fraction is None or math.isnan(fraction) else f"{100 * fraction:.2f} %"


def _aer_by_head_markdown(by_head: dict[str, Any]) -> str:
    """A Markdown table of AER (%) per decoder layer (rows) and head (columns), the best head in bold."""
    num_heads, best = by_head["heads"], by_head["best"]
    lines = [
        "| decoder layer | " + " | ".join(f"head {h}" for h in range(num_heads)) + " | mean of heads |",
        "|---|" + "---:|" * (num_heads + 1),
    ]
    for layer in range(by_head["layers"]):
        cells = []
        for e in by_head["entries"][layer * (num_heads + 1) : (layer + 1) * (num_heads + 1)]:
            cell = _percent(e["aer"]).removesuffix(" %")
            is_best = best is not None and (e["layer"], e["head"]) == (best["layer"], best["head"])
            cells.append(f"**{cell}**" if is_best else cell)
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + (
        f"\n\nAER (%) of each decoder layer's cross-attention, teacher-forced on the references "
        f"({by_head['num_sentences']} sentences; layers and heads 0-based)."
    )
    if best is not None:
        text += f" Best: layer {best['layer']}, head {best['head']} (bold)."
    return text + "\n"


def _write_aer_by_head(files: _Files, by_head: dict[str, Any]) -> None:
    """``aer_by_head.md`` and ``aer_by_head.json`` (NaN as null)."""
    with open(files.path("aer_by_head.md"), "w", encoding="utf-8") as f:
        f.write(_aer_by_head_markdown(by_head))
    with open(files.path("aer_by_head.json"), "w", encoding="utf-8") as f:
        json.dump(_json_ready(by_head), f, indent=2, allow_nan=False)


def _write_sentences(
    files: _Files,
    pairs: _Pairs,
    hypotheses: Sequence[str],
    links,
    settings: BleuSettings,
) -> None:
    """``sources``/``references``/``hypotheses.txt`` (and their ``.detok`` forms), ``alignments.txt``."""
    from attn_jax import eval as ev

    _write_lines(files.path("sources.txt"), pairs.sources)
    _write_lines(files.path("references.txt"), pairs.references)
    _write_lines(files.path("hypotheses.txt"), hypotheses)
    # With a detokeniser, the exact strings BLEU scored, so that sacrebleu reproduces the score from files.
    if settings.detokenize != "none":
        how = (settings.detokenize, settings.detokenize_lang)
        _write_lines(files.path("references.detok.txt"), ev.detokenize(pairs.references, *how))
        _write_lines(files.path("hypotheses.detok.txt"), ev.detokenize(hypotheses, *how))
    if links is not None:
        _write_lines(files.path("alignments.txt"), [ev.format_pharaoh(a) for a in links])


def _write_tables(
    files: _Files,
    system: str,
    corpus,
    bleu: _Bleu,
    aer,
    limit_report: LengthLimitReport,
    chrf_ter,
    ensemble: list[dict[str, Any]] | None = None,
    attention: AttentionChoice | None = None,
):
    """``bleu_by_length.{md,json,png}`` and ``summary.{md,json}`` (with chrF and TER overall and by source
    length under ``<system>.chrf`` / ``.ter``, an ensemble's runs under ``<system>.ensemble``, the attention
    of the AER under ``<system>.aer_attention``); returns the ``attn_jax.eval.SystemScores``."""
    from attn_jax import eval as ev

    scores = ev.SystemScores(bleu.by_length.overall, bleu.no_unk, aer)
    with open(files.path("bleu_by_length.md"), "w", encoding="utf-8") as f:
        f.write(ev.bleu_by_length_markdown({system: bleu.by_length}))
    with open(files.path("summary.md"), "w", encoding="utf-8") as f:
        f.write(
            _summary_markdown(system, scores, limit_report, corpus.skipped_empty, corpus.name, bleu.options)
        )
        if attention is not None and not attention.is_default:
            f.write(f"\nAER: {attention.describe()} (teacher-forced on the references).\n")
        f.write("\n" + _chrf_ter_markdown(chrf_ter))
    with open(files.path("bleu_by_length.json"), "w", encoding="utf-8") as f:
        json.dump(ev.bleu_by_length_json({system: bleu.by_length}), f, indent=2, allow_nan=False)
    summary = ev.summary_json({system: scores})
    summary[system]["length_limit"] = limit_report.to_dict()
    summary[system]["skipped_empty"] = corpus.skipped_empty
    summary[system]["bleu_options"] = bleu.options
    summary[system]["aer_attention"] = (attention or AttentionChoice()).to_dict()
    for m, r in chrf_ter.items():
        summary[system][m] = r.to_dict()
    if ensemble:
        summary[system]["ensemble"] = ensemble
    with open(files.path("summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, allow_nan=False)
    ev.plot_bleu_by_length(
        {system: bleu.by_length}, files.path("bleu_by_length.png"), title=f"{system}: BLEU by length"
    )
    return scores


def _summary_markdown(
    system: str, scores, limit_report: LengthLimitReport, skipped: int, corpus_name: str, options
) -> str:
    """``summary.md``: the summary table, the length limit, skipped pairs and the BLEU warning, if any."""
    from attn_jax import eval as ev

    text = ev.summary_markdown({system: scores}) + f"\n{_limit_markdown(limit_report)}\n"
    if skipped:
        text += f"\n{_skipped_text(skipped, corpus_name)}.\n"
    if options["warning"]:
        text += f"\n**Warning:** {options['warning']}.\n"
    return text


def _chrf_ter_markdown(chrf_ter) -> str:
    """A Markdown table of chrF and TER by source length (``—`` for an empty bucket), then their signatures."""
    chrf, ter = chrf_ter["chrf"], chrf_ter["ter"]

    def cell(x: float) -> str:
        return "—" if math.isnan(x) else f"{x:.2f}"

    lines = ["| source length | sentences | chrF | TER |", "|---|---:|---:|---:|"]
    for (b, n, c), (_, _, t) in zip(chrf.buckets, ter.buckets, strict=True):
        lines.append(f"| {b.label} | {n} | {cell(c)} | {cell(t)} |")
    lines.append(f"| all | {chrf.num_sentences} | {cell(chrf.overall)} | {cell(ter.overall)} |")
    return "\n".join(lines) + f"\n\nchrF: {chrf.signature}\nTER: {ter.signature}\n"


def _chosen_positions(pairs: _Pairs, indices: Sequence[int] | None, split: str) -> list[int] | None:
    """Positions in ``pairs`` of the split indices ``heatmap_sentences`` names (None: the Figure 3 rule)."""
    if indices is None:
        return None
    where = {k: pos for pos, k in enumerate(pairs.keep)}
    missing = [i for i in indices if i not in where]
    if missing:
        raise TranslateError(
            f"heatmap sentence(s) {', '.join(map(str, missing))} are not among the {len(pairs.keep)} {split} pairs "
            f"evaluated (split indices {', '.join(map(str, pairs.keep[:10]))}{' ...' if len(pairs.keep) > 10 else ''})"
        )
    return [where[i] for i in indices]


def _draw_heatmaps(
    files: _Files,
    loaded: LoadedModel,
    names: tuple[str, str],
    pairs: _Pairs,
    translations: Sequence[list[Translation]],
    hypotheses: Sequence[str],
    ref_attention: list[np.ndarray] | None,
    *,
    count: int,
    max_length: int,
    chosen: list[int] | None = None,
    attention: AttentionChoice | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Heatmaps of the sentences :func:`figure3_examples` picks: ``(picked, PNG paths)``, ``picked`` being
    ``evaluation.json``'s ``heatmaps`` (file, index in the split, words, kind); ``names``: system and split."""
    system, split = names
    train_length = _training_source_length(loaded.config)
    picks = (
        [HeatmapPick(i, "chosen") for i in chosen]
        if chosen is not None
        else figure3_examples(
            pairs.sources,
            hypotheses,
            pairs.references,
            count=count,
            within_length=train_length,
            max_length=max_length,
        )
    )
    picked, heatmaps = [], []
    for k, (i, kind) in enumerate(picks):
        source = pairs.sources[i]
        picked.append(
            {"file": f"attention_{k}.png", "index": pairs.keep[i], "words": len(source.split()), "kind": kind}
        )
        title = f"{system}, {split} #{pairs.keep[i]} ({_PICK_NOTES[kind].format(train_length)})"
        hyp = translations[i][0] if translations[i] else None
        if hyp is not None and hyp.attention is not None:
            heatmaps += _draw_own_translation(files, loaded, k, title, source, hyp)
        if ref_attention is not None and _word_level(loaded):
            gold = pairs.gold[i] if pairs.gold is not None else None
            which = "" if attention is None or attention.is_default else f", {attention.describe()}"
            heatmaps.append(
                _draw_reference(files, k, title + which, source, pairs.references[i], ref_attention[i], gold)
            )
    return picked, heatmaps


def _draw_own_translation(
    files: _Files, loaded: LoadedModel, k: int, title: str, source: str, hyp: Translation
) -> list[str]:
    """``attention_<k>.png`` (the attention while decoding; a multi-head model's mean of heads) and, for a
    multi-head model, ``attention_<k>_head.png`` (its sharpest head, :func:`sharpest_head`)."""
    from attn_jax import eval as ev

    multi_head = hasattr(loaded.model, "cross_attention_weights")
    if loaded.members:  # the search's attention is the mean of the members'
        title += f", mean of {len(loaded.members)} runs"
    source_labels, target_labels = [*hyp.source_tokens, "</s>"], [*hyp.tokens, "</s>"]
    drawn = [
        ev.plot_attention(
            hyp.attention,
            source_labels,
            target_labels,
            files.path(f"attention_{k}.png"),
            title=f"{title}: own translation" + (", last layer, mean of heads" if multi_head else ""),
        )
    ]
    heads = hypothesis_cross_attention(loaded, source, hyp)
    if heads is not None:
        h = sharpest_head(heads)
        drawn.append(
            ev.plot_attention(
                heads[h],
                source_labels,
                target_labels,
                files.path(f"attention_{k}_head.png"),
                title=f"{title}: own translation, last layer, head {h} (sharpest)",
            )
        )
    return drawn


def _draw_reference(
    files: _Files, k: int, title: str, source: str, reference: str, attention: np.ndarray, gold
) -> str:
    """``attention_<k>_reference.png``: the teacher-forced attention on the reference, gold links in red."""
    from attn_jax import eval as ev

    return ev.plot_attention(
        attention,
        [*source.split(), "</s>"],
        [*reference.split(), "</s>"],
        files.path(f"attention_{k}_reference.png"),
        gold=gold,
        title=f"{title}: reference (red: gold)",
    )


def _tensorboard_images(
    workdir, loaded, split: str, files: dict[str, str], log, bleu: _Bleu, chrf_ter
) -> dict[str, Any] | None:
    """Add the evaluation's PNGs to the run's TensorBoard log (``<workdir>/tensorboard/eval``) as images tagged
    ``eval/<split>/<file stem>``, and its overall BLEU, chrF and TER as scalars ``eval/<split>/{bleu,chrf,ter}``,
    at the checkpoint's step; None when the run has TensorBoard off."""
    if not getattr(loaded.config, "tensorboard", True):
        return None
    if loaded.members:  # never silent: the pictures of an ensemble belong to no one run's log
        log("TensorBoard: an ensemble's evaluation is not added to a run's TensorBoard log")
        return None
    from attn_jax.train import EventWriter

    tag_split = re.sub(r"[^-\w.]", "_", split)  # TensorBoard's tag alphabet: test[:500] -> test__500_
    pngs = {f"eval/{tag_split}/{os.path.splitext(f)[0]}": p for f, p in files.items() if f.endswith(".png")}
    overall = {"bleu": bleu.by_length.overall.score, **{m: r.overall for m, r in chrf_ter.items()}}
    scalars = {f"eval/{tag_split}/{m}": x for m, x in overall.items() if math.isfinite(x)}
    logdir = os.path.join(os.fspath(workdir), "tensorboard", "eval")
    try:
        with EventWriter(logdir) as w:
            w.images(loaded.step, pngs)
            w.scalars(loaded.step, scalars)
    except OSError as e:  # a read-only run directory: the PNGs and tables are written, so say it and go on
        log(f"warning: TensorBoard images not written to {logdir}: {e}")
        return None
    return {"logdir": logdir, "step": loaded.step, "tags": sorted(pngs), "scalars": sorted(scalars)}


def _record(
    system: str,
    workdir,
    loaded: LoadedModel,
    split: str,
    pairs: _Pairs,
    bleu: _Bleu,
    alignment: _Alignment,
    limit_report: LengthLimitReport,
    translations: Sequence[list[Translation]],
    *,
    chrf_ter: dict[str, Any],
    picked: list[dict[str, Any]],
    options: dict[str, Any],
    timings: dict[str, float],
    files: dict[str, str],
    tensorboard: dict[str, Any] | None,
    by_head: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result of :func:`evaluate_workdir` as ``evaluation.json`` holds it."""
    aer, aer_within = alignment.aer, alignment.aer_within
    ensemble = {"ensemble": _members(loaded)} if loaded.members else {}
    return {
        "system": system,
        "workdir": os.fspath(workdir),
        "step": loaded.step,
        "checkpoint_note": loaded.note or None,
        "split": split,
        "corpus": pairs.corpus.name,
        "num_sentences": len(pairs.sources),
        "skipped_empty": pairs.corpus.skipped_empty,
        "bleu": bleu.by_length.overall.score,
        "signature": bleu.by_length.signature,
        "bleu_options": bleu.options,
        "bleu_by_length": bleu.by_length.to_dict(),
        "chrf": chrf_ter["chrf"].overall,
        "ter": chrf_ter["ter"].overall,
        "chrf_by_length": chrf_ter["chrf"].to_dict(),
        "ter_by_length": chrf_ter["ter"].to_dict(),
        "no_unk": bleu.no_unk.to_dict(),
        "aer": None if aer is None else aer.to_dict(),
        "aer_within_training_lengths": None if aer_within is None else aer_within.to_dict(),
        "aer_by_head": by_head,
        "training_max_source_length": _training_source_length(loaded.config),
        "length_limit": {
            **limit_report.to_dict(),
            "stopped_indices": [pairs.keep[i] for i, t in enumerate(translations) if t and t[0].truncated],
        },
        "heatmaps": picked,
        "options": options,
        "timings": timings,
        "files": files,
        "tensorboard": tensorboard,
        **ensemble,
    }


def _evaluation_markdown(
    result: dict[str, Any],
    limit_report: LengthLimitReport,
    bleu: _Bleu,
    scores,
    heatmaps: Sequence[str],
    chrf_ter,
) -> list[str]:
    """The lines of ``evaluation.md``: the run, its warnings, the tables and the heatmaps."""
    from attn_jax import eval as ev

    system, options = result["system"], result["options"]
    corpus, skipped, note = result["corpus"], result["skipped_empty"], result["checkpoint_note"]
    warning = bleu.options["warning"]
    md = [
        f"# {system} on {corpus} ({result['split']}), checkpoint step {result['step']}\n",
        *([f"**Warning:** {note}.\n"] if note else []),
        *([f"{_ensemble_markdown(result['ensemble'])}\n"] if "ensemble" in result else []),
        f"Beam {options['beam_size']}, α = {options['alpha']}, β = {options['beta']}; "
        f"{result['num_sentences']} sentences.\n",
        f"{'**Warning:** ' if limit_report.stopped else ''}{_limit_markdown(limit_report)}\n",
        *([f"**Warning:** {_skipped_text(skipped, corpus)}.\n"] if skipped else []),
        *([f"**Warning:** {warning}.\n"] if warning else []),
        "## BLEU by source length\n",
        ev.bleu_by_length_markdown({system: bleu.by_length}),
        "## chrF and TER by source length\n",
        _chrf_ter_markdown(chrf_ter),
        "## Summary\n",
        _summary_markdown(system, scores, limit_report, skipped, corpus, bleu.options),
    ]
    if options["attention_layer"] != -1 or options["attention_head"] != "mean":
        head = options["attention_head"]
        choice = AttentionChoice(options["attention_layer"], None if head == "mean" else head)
        md.append(
            f"AER and `alignments.txt` use the {choice.describe()} (teacher-forced on the references).\n"
        )
    if result["aer_by_head"] is not None:
        md += ["## AER by decoder layer and head\n", _aer_by_head_markdown(result["aer_by_head"])]
    if heatmaps:
        md.append("## Attention\n")
        md.append(
            "Sentences chosen as in the paper's Figure 3: the longest within the training lengths "
            f"({result['training_max_source_length']} source words) translated exactly, then one beyond them "
            "(the failure case).\n"
        )
        md += [
            f"- `attention_{k}`: #{p['index']}, {p['words']} words, {p['kind']}"
            for k, p in enumerate(result["heatmaps"])
        ]
        md.append("")
        md += [f"![{os.path.basename(h)}]({os.path.basename(h)})\n" for h in heatmaps]
    return md


def _write_evaluation(files: _Files, result: dict[str, Any], md: Sequence[str]) -> None:
    """``evaluation.md`` and ``evaluation.json`` (the result with NaN as null); both listed in ``files``."""
    md_path, json_path = files.path("evaluation.md"), files.path("evaluation.json")
    with open(md_path, "w", encoding="utf-8") as f:
        f.write("\n".join(md))
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(_json_ready(result), f, indent=2, allow_nan=False)


# --------------------------------------------------------------------------------------------- helpers


def _system_name(loaded: LoadedModel) -> str:
    """``RNNsearch`` from the run's ``model.arch``; an ensemble: ``RNNsearch ensemble of 2``."""
    archs = [str(m.config.model.arch) for m in loaded.members or (loaded,)]
    names = "+".join(dict.fromkeys(_SYSTEM_NAMES.get(a, a) for a in archs))
    return f"{names} ensemble of {len(archs)}" if loaded.members else names


def _steps(loaded: LoadedModel) -> str:
    """``step 4``, or an ensemble's ``steps 4, 6``."""
    if not loaded.members:
        return f"step {loaded.step}"
    return f"steps {', '.join(str(m.step) for m in loaded.members)}"


def _members(loaded: LoadedModel) -> list[dict[str, Any]]:
    """An ensemble's runs for ``evaluation.json`` and ``summary.json``: directory, step and checkpoint note."""
    return [{"workdir": m.workdir, "step": m.step, "checkpoint_note": m.note or None} for m in loaded.members]


def _ensemble_markdown(members: Sequence[dict[str, Any]]) -> str:
    """One Markdown sentence naming an ensemble's runs."""
    runs = ", ".join(f"`{m['workdir']}` (step {m['step']})" for m in members)
    return f"Ensemble of {len(members)} runs, their log-probabilities averaged: {runs}."


def _word_level(loaded: LoadedModel) -> bool:
    """Whether both vocabularies are word-level (attention columns and rows are words)."""
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    return bool(getattr(sv, "word_level", False) and getattr(tv, "word_level", False))


def _write_lines(path: str, lines: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def _training_source_length(config) -> int | None:
    """The longest source (in tokens) the run trained on, or None when its config sets no limit."""
    limit = config.data.get("max_source_length") if hasattr(config, "data") else None
    return int(limit) if limit else None


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


def _json_ready(x):
    """NaN -> None, recursively."""
    if isinstance(x, dict):
        return {k: _json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_ready(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
