"""Translate sentences with a loaded run: length-sorted batches at a few padded widths, beam search, n-best."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from attn_jax.pipeline._load import LoadedModel, TranslateError
from attn_jax.pipeline._options import DecodeOptions

__all__ = ["Translation", "length_batches", "pad_rows", "padded_width", "translate_sentences"]


class Translation(NamedTuple):
    """One hypothesis for one source sentence.

    Attributes:
      text: the translation (``<unk>`` replaced when asked).
      tokens: its target tokens (words for word-level vocabularies), without ``</s>``.
      ids: the target token ids, without ``</s>``.
      score: normalised beam score ``log P / lp + cp``.
      log_prob: ``log P(Y | X)`` including ``</s>``.
      attention: ``[m + 1, n + 1]`` float32 weights (rows: ``m`` target tokens then ``</s>``; columns: ``n``
        source tokens then ``</s>``), or None for a model without attention.
      source_tokens: the ``n`` source tokens.
      truncated: True when the hypothesis stopped at its length limit, its ``</s>`` forced where the model's
        most probable next token was another word (``attn_jax.decoding.BeamResult.truncated``).
      limit: the most tokens (without ``</s>``) this sentence could have: :func:`length_limit`'s rule, cut to
        what the model can produce (:func:`model_length_cap`); None for a blank line (nothing decoded).
      source_unk: positions (0-based, in ``source_tokens``) of the source tokens the source vocabulary maps to
        ``<unk>``: the model never saw those words.
      unmet_constraints: how many of the sentence's lexical constraints this hypothesis lacks (the length
        limit left no room for them); 0 without constraints.
    """

    text: str
    tokens: list[str]
    ids: list[int]
    score: float
    log_prob: float
    attention: np.ndarray | None
    source_tokens: list[str]
    truncated: bool = False
    limit: int | None = None
    source_unk: tuple[int, ...] = ()
    unmet_constraints: int = 0

    def alignment(self) -> str:
        """Pharaoh ``i-j`` links: each target token ``j`` to its most-attended source token ``i`` (no ``</s>``)."""
        if self.attention is None or not self.tokens or not self.source_tokens:
            return ""
        w = self.attention[: len(self.tokens), : len(self.source_tokens)]
        return " ".join(f"{int(np.argmax(w[j]))}-{j}" for j in range(w.shape[0]) if w[j].max() > 0)


def padded_width(tokens: int) -> int:
    """The padded length for ``tokens`` positions (``attn_jax.decoding.padded_width``: few compiled shapes)."""
    from attn_jax.decoding import padded_width as width

    return width(tokens)


def length_batches(
    lengths: Sequence[int], batch_size: int, *, one_shape: bool = False
) -> list[tuple[list[int], int, int]]:
    """Sentence indices grouped by padded width, ``(indices, width, rows)``
    (``attn_jax.decoding.length_batches``)."""
    from attn_jax.decoding import length_batches as batches

    return batches(lengths, batch_size, one_shape=one_shape)


def pad_rows(rows: list[list[int]], width: int, num_rows: int, eos_id: int, pad_id: int):
    """``(ids [R, width] int32, mask [R, width] bool)``, each row ending in ``</s>``
    (``attn_jax.decoding.pad_rows``)."""
    from attn_jax.decoding import pad_rows as pad

    return pad(rows, width, num_rows, eos_id, pad_id)


def _token_strings(vocab, ids: Sequence[int]) -> list[str]:
    """One display string per target id (the word itself for word-level vocabularies)."""
    if getattr(vocab, "word_level", False):
        return [vocab.tokens[i] for i in ids]
    return [vocab.decode([i]) or "?" for i in ids]


def _target_ids(vocab, text: str, where: str) -> list[int]:
    """``text`` in the target vocabulary, or a TranslateError naming a word it lacks (forced as ``<unk>``, it
    would put ``<unk>`` where the user's word was)."""
    ids = vocab.encode(text)
    if vocab.unk_id in ids:
        unknown = [w for w in text.split() if vocab.unk_id in vocab.encode(w)] or [text]
        raise TranslateError(f"{where}: {unknown[0]!r} is not in the target vocabulary")
    return ids


def _forced_ids(loaded: LoadedModel, sentences, prefixes, constraints):
    """The prefixes and constraints as target ids (None stays None), checked against the sentences (line
    ``i + 1`` is sentence ``i``) and the model's length cap; a TranslateError names the line otherwise."""
    from attn_jax.decoding import model_length_cap

    forced = wanted = None
    vocab, cap = loaded.tgt_vocab, model_length_cap(loaded.model)
    if prefixes is not None:
        if len(prefixes) != len(sentences):
            raise TranslateError(f"got {len(prefixes)} prefixes for {len(sentences)} sentences")
        forced = [_target_ids(vocab, p, f"prefix of line {i + 1}") for i, p in enumerate(prefixes)]
        for i, ids in enumerate(forced):
            if cap and len(ids) + 1 > cap:
                raise TranslateError(
                    f"prefix of line {i + 1}: {len(ids)} tokens, but the model produces at most {cap - 1}"
                )
    if constraints is not None:
        if len(constraints) != len(sentences):
            raise TranslateError(f"got {len(constraints)} constraint lists for {len(sentences)} sentences")
        wanted = []
        for i, phrases in enumerate(constraints):
            where = f"constraint of line {i + 1}"
            if any(not p.split() for p in phrases):
                raise TranslateError(f"{where}: a constraint is empty")
            wanted.append([_target_ids(vocab, p, where) for p in phrases])
    return forced, wanted


def translate_sentences(
    loaded: LoadedModel,
    sentences: Sequence[str],
    options: DecodeOptions | None = None,
    *,
    batch_size: int = 32,
    limit=None,
    progress: Callable[[int, int, float], None] | None = None,
    sampling=None,
    first_index: int = 0,
    prefixes: Sequence[str] | None = None,
    constraints: Sequence[Sequence[str]] | None = None,
    one_shape: bool = False,
    **fields: Any,
) -> list[list[Translation]]:
    """Beam-search translations of ``sentences``: for each, its ``nbest`` best hypotheses, best first.

    Sentences are sorted by length and batched at a few padded widths (:func:`length_batches`), each source
    ending in ``</s>`` as in training. A sentence of ``n`` tokens may produce ``limit.tokens(n)`` tokens (then
    ``</s>``), no more than the model can (:func:`model_length_cap`); each :class:`Translation` says its limit
    and whether it stopped there (:func:`length_limit_report` counts them). A blank sentence gets ``nbest``
    empty hypotheses (score 0) without decoding, so that an n-best list has ``nbest`` lines for it too.

    Args:
      loaded: the model and vocabularies (:func:`load_model`).
      sentences: source sentences, whitespace-tokenised like the training corpus.
      options: the beam search, n-best size, length limit and ``<unk>`` replacement (:class:`DecodeOptions`;
        None: its defaults).
      batch_size: sentences per decoding batch.
      limit: an ``attn_jax.decoding.LengthLimit`` that replaces the length fields of ``options``; None: the
        rule :meth:`DecodeOptions.length_limit` gives.
      progress: called after each batch with the sentences decoded so far, their total and the fraction of
        the work done (source tokens, the longer sentences come last).
      sampling: an ``attn_jax.decoding.Sampling``: draw ``nbest`` translations per sentence
        (``attn_jax.decoding.sample_decode``) instead of beam search; ``beam_size``, ``alpha`` and ``beta``
        then do not apply, and each score is the sample's ``log_prob``. None: beam search.
      first_index: the position of ``sentences[0]`` in the whole input. Sampling draws sentence ``i``'s words
        by ``first_index + i``, so an input translated in pieces gets the samples it gets at once.
      prefixes: per sentence, a target prefix every hypothesis starts with ("": none), tokenised like the
        targets; decoding continues after it (``attn_jax.decoding.beam_search``'s ``prefix``).
      constraints: per sentence, phrases that must appear in the translation (lexically constrained decoding,
        ``attn_jax.decoding.beam_search``'s ``constraints``); each :class:`Translation` counts those it lacks.
      one_shape: decode every batch at one padded shape (:func:`length_batches`): one compilation, more
        padding.
      **fields: :class:`DecodeOptions` fields that replace those of ``options`` (``beam_size=4``).

    Returns:
      ``len(sentences)`` lists of :class:`Translation`.
    """
    from attn_jax.decoding import search_batches

    opts = dataclasses.replace(options or DecodeOptions(), **fields)
    if sampling is not None:  # sampling draws nbest translations; there is no beam to bound them
        opts = dataclasses.replace(opts, beam_size=max(opts.beam_size, opts.nbest))
    opts.check()
    rule = opts.length_limit(loaded.config) if limit is None else limit
    try:
        rule.check()
    except ValueError as e:
        raise TranslateError(str(e)) from None
    nbest, replace_unk = opts.nbest, opts.replace_unk
    if batch_size < 1:
        raise TranslateError(f"batch size must be >= 1, got {batch_size}")
    src_vocab, tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
    word_level = getattr(src_vocab, "word_level", False) and getattr(tgt_vocab, "word_level", False)
    encoded = [src_vocab.encode(s) for s in sentences]
    if word_level:
        source_tokens = [s.split() for s in sentences]
    else:
        source_tokens = [_token_strings(src_vocab, ids) for ids in encoded]
    # A copy model (RNNsearch model.copy) reads the source in the extended target vocabulary and may emit ids
    # V + r: the sentence's r-th out-of-vocabulary source word, written out as that word.
    copies = bool(getattr(getattr(loaded.model, "config", None), "copy", False))
    if copies:
        from attn_jax.data import extend_with_source

        extended = [extend_with_source(s, "", tgt_vocab) for s in sentences]
    forced, wanted = _forced_ids(loaded, sentences, prefixes, constraints)
    results: list[list[Translation]] = [[] for _ in sentences]
    todo = [i for i, ids in enumerate(encoded) if ids]
    for i in range(len(sentences)):
        if not encoded[i]:
            results[i] = [Translation("", [], [], 0.0, 0.0, None, [])] * nbest
    lengths = [len(encoded[i]) + 1 for i in todo]
    work_total, work_done, done = max(sum(lengths), 1), 0, 0
    batches = search_batches(
        loaded.model,
        [encoded[i] for i in todo],
        limit=rule,
        beam_size=opts.beam_size,
        num_return=nbest,
        alpha=opts.alpha,
        beta=opts.beta,
        batch_size=batch_size,
        src_eos_id=src_vocab.eos_id,
        src_pad_id=src_vocab.pad_id,
        bos_id=tgt_vocab.bos_id,
        eos_id=tgt_vocab.eos_id,
        pad_id=tgt_vocab.pad_id,
        sources_ext=[extended[i][0] for i in todo] if copies else None,
        no_repeat_ngram=opts.no_repeat_ngram,
        min_length=opts.min_length,
        sampling=sampling,
        ids=[first_index + i for i in todo],
        prefixes=None if forced is None else [forced[i] for i in todo],
        constraints=None if wanted is None else [wanted[i] for i in todo],
        one_shape=one_shape,
    )
    while True:
        try:
            chunk, limits, out = next(batches)
        except StopIteration:
            break
        except ValueError as e:
            raise TranslateError(str(e).splitlines()[0]) from None
        members = [todo[c] for c in chunk]
        tokens, lens = np.asarray(out.tokens), np.asarray(out.lengths)
        scores, log_probs = np.asarray(out.scores), np.asarray(out.log_probs)
        truncated = np.asarray(out.truncated)
        lacking = None if out.unmet_constraints is None else np.asarray(out.unmet_constraints)
        attention = None if out.attention is None else np.asarray(out.attention)
        for r, i in enumerate(members):
            n = len(encoded[i])
            hyps = []
            for k in range(nbest):
                length = int(lens[r, k])
                if length == 0:  # an empty n-best slot (too few hypotheses fit the length limit)
                    continue
                ids = [int(t) for t in tokens[r, k, : length - 1]]
                if copies:
                    oov, size = extended[i][2], tgt_vocab.size
                    words = [oov[t - size] if t >= size else tgt_vocab.tokens[t] for t in ids]
                else:
                    words = _token_strings(tgt_vocab, ids)
                attn = None if attention is None else attention[r, k, :length, : n + 1]
                if replace_unk and word_level and attn is not None:
                    words = [
                        source_tokens[i][int(np.argmax(attn[j, :n]))] if t == tgt_vocab.unk_id else w
                        for j, (t, w) in enumerate(zip(ids, words, strict=True))
                    ]
                text = " ".join(words) if word_level or copies else tgt_vocab.decode(ids)
                hyps.append(
                    Translation(
                        text,
                        words,
                        ids,
                        float(scores[r, k]),
                        float(log_probs[r, k]),
                        attn,
                        source_tokens[i],
                        bool(truncated[r, k]),
                        limits[r] - 1,
                        tuple(j for j, t in enumerate(encoded[i]) if t == src_vocab.unk_id),
                        0 if lacking is None else int(lacking[r, k]),
                    )
                )
            results[i] = hyps
        done += len(members)
        work_done += sum(lengths[c] for c in chunk)
        if progress is not None:
            progress(done, len(todo), work_done / work_total)
    return results
