"""Search many sentences: length-sorted batches at a few padded widths, each with its per-sentence length limit.

``attn-jax translate``, ``evaluate`` and the trainer's validation by translation decode through
:func:`search_batches`, so they batch, pad and limit the same way and compile the same few shapes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from attn_jax.decoding._beam import beam_search
from attn_jax.decoding._limits import LengthLimit
from attn_jax.decoding._sampling import Sampling, sample_decode

__all__ = ["SearchBatch", "length_batches", "model_length_cap", "pad_rows", "padded_width", "search_batches"]

_MIN_WIDTH = 16  # padded source widths are powers of two from here: few compiled shapes


def padded_width(tokens: int) -> int:
    """The padded length for ``tokens`` positions: a power of two, at least 16 (few compiled shapes)."""
    return max(_MIN_WIDTH, 1 << max(0, tokens - 1).bit_length())


def length_batches(
    lengths: Sequence[int], batch_size: int, *, one_shape: bool = False
) -> list[tuple[list[int], int, int]]:
    """Group sentence indices by padded width: ``(indices, width, rows)`` with ``rows`` the padded batch size.

    ``rows`` is ``batch_size`` for full batches and the next power of two for a last partial one, so a width
    compiles at most ``log2(batch_size) + 1`` shapes. ``one_shape``: every batch has the widest sentence's
    width and the same rows, so one program serves them all: fewer compilations for more padding, a trade
    that pays where compiling costs more than decoding (small models on a CPU).
    """
    if one_shape:
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        rows = min(batch_size, 1 << (len(order) - 1).bit_length()) if order else batch_size
        width = padded_width(max(lengths, default=1))
        return [(order[k : k + rows], width, rows) for k in range(0, len(order), rows)]
    by_width: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        by_width.setdefault(padded_width(lengths[i]), []).append(i)
    out = []
    for width, idx in sorted(by_width.items()):
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            out.append((chunk, width, min(batch_size, 1 << (len(chunk) - 1).bit_length())))
    return out


def pad_rows(rows: list[list[int]], width: int, num_rows: int, eos_id: int, pad_id: int):
    """``(ids [R, width] int32, mask [R, width] bool)``: each row's tokens then ``</s>``; missing rows repeat
    the first (their results are dropped)."""
    ids = np.full((num_rows, width), pad_id, np.int32)
    mask = np.zeros((num_rows, width), bool)
    for r in range(num_rows):
        toks = rows[r] if r < len(rows) else rows[0]
        ids[r, : len(toks)] = toks
        ids[r, len(toks)] = eos_id
        mask[r, : len(toks) + 1] = True
    return ids, mask


def _prefix_rows(prefixes, members: list[int], rows: int, pad_id: int, cap: int | None) -> dict[str, Any]:
    """``beam_search``'s ``prefix`` and ``prefix_lengths`` for a batch, padding rows repeating the first."""
    chosen = [list(prefixes[i]) for i in members]
    chosen += [chosen[0]] * (rows - len(members))
    for i, p in zip(members, chosen, strict=False):
        if cap and len(p) + 1 > cap:
            raise ValueError(
                f"the prefix of sentence {i} has {len(p)} tokens, but the model produces at most {cap - 1} "
                "tokens before </s>"
            )
    ids = np.full((rows, max(1, max(len(p) for p in chosen))), pad_id, np.int32)
    for r, p in enumerate(chosen):
        ids[r, : len(p)] = p
    return {"prefix": ids, "prefix_lengths": np.asarray([len(p) for p in chosen], np.int32)}


def model_length_cap(model) -> int | None:
    """The most target tokens (with ``</s>``) a model can produce: a Transformer's decoder cache holds
    ``model.config.max_length`` positions; None for a model without such a bound (the RNNs). An ensemble (a
    sequence of models) can produce what its most bounded member can."""
    if isinstance(model, Sequence):
        return min((c for c in map(model_length_cap, model) if c is not None), default=None)
    cap = getattr(getattr(model, "config", None), "max_length", None)
    return int(cap) if cap else None


class SearchBatch(NamedTuple):
    """One decoded batch of :func:`search_batches`.

    Attributes:
      members: indices (into the ``sources`` given) of the sentences of this batch, in row order.
      limits: per row (padding rows included), the most tokens it could have, ``</s>`` included.
      result: the ``attn_jax.decoding.BeamResult`` with NumPy fields; rows past ``len(members)`` are padding.
    """

    members: list[int]
    limits: list[int]
    result: Any


def search_batches(
    model,
    sources: Sequence[Sequence[int]],
    *,
    limit: LengthLimit,
    beam_size: int,
    num_return: int = 1,
    alpha: float = 0.0,
    beta: float = 0.0,
    batch_size: int = 32,
    src_eos_id: int = 2,
    src_pad_id: int = 0,
    bos_id: int = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    sources_ext: Sequence[Sequence[int]] | None = None,
    no_repeat_ngram: int = 0,
    min_length: int = 0,
    sampling: Sampling | None = None,
    ids: Sequence[int] | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    constraints: Sequence[Sequence[Sequence[int]]] | None = None,
    one_shape: bool = False,
) -> Iterator[SearchBatch]:
    """Beam-search (or sample) ``sources`` (token ids without ``</s>``, none empty) in length-sorted, padded batches.

    Sentences are grouped by :func:`length_batches` and padded by :func:`pad_rows`, each source ending in
    ``</s>`` as in training. A sentence of ``n`` tokens may produce ``limit.tokens(n)`` tokens and then
    ``</s>``, and no more than the model can (:func:`model_length_cap`). The static output width of a batch
    comes from its padded width, so a new call with sentences of the same widths reuses the compiled search.

    Args:
      model: a model with the step interface (or an ensemble: a sequence of them).
      sources: the encoded source sentences.
      limit: the length limit (:class:`LengthLimit`).
      beam_size, num_return, alpha, beta: as :func:`beam_search`'s ``beam_size``, ``num_return``,
        ``length_penalty_alpha`` and ``coverage_penalty_beta``.
      batch_size: sentences per batch.
      src_eos_id, src_pad_id: the source vocabulary's ``</s>`` and padding ids.
      bos_id, eos_id, pad_id: the target vocabulary's.
      sources_ext: for a model that copies source words, each source in the extended target vocabulary.
      no_repeat_ngram, min_length: repetition control, as :func:`beam_search`'s (0: off).
      sampling: draw ``num_return`` translations per sentence with :func:`sample_decode` instead of beam
        search (``beam_size``, ``alpha`` and ``beta`` then do not apply); None: beam search.
      ids: with ``sampling``, the number each sentence draws its words by (default: its index in
        ``sources``), so a sentence draws the same words whatever batch it lands in.
      prefixes: per sentence, target token ids every hypothesis must start with (empty: none); see
        :func:`beam_search`'s ``prefix``. A prefix longer than its sentence's limit raises that limit to the
        prefix length, so the translation may still end after it.
      constraints: per sentence, token-id sequences that must appear (:func:`beam_search`'s
        ``constraints``); the results then count what each hypothesis lacks (``unmet_constraints``).
      one_shape: batch at a single padded shape (:func:`length_batches`): one compiled search instead of
        one per width and partial batch.

    Yields:
      One :class:`SearchBatch` per batch, in the order decoded (shortest sentences first).

    Raises:
      ValueError: from :func:`beam_search` (e.g. ``beta > 0`` for a model without attention), or for a
        prefix longer than the model can produce.
    """
    if sampling is not None and (prefixes is not None or constraints is not None):
        raise ValueError("sampling takes no prefixes or constraints: forced output is a beam-search option")
    cap = model_length_cap(model)
    lengths = [len(s) + 1 for s in sources]
    for members, width, rows in length_batches(lengths, batch_size, one_shape=one_shape):
        src, mask = pad_rows([list(sources[i]) for i in members], width, rows, src_eos_id, src_pad_id)
        # Tokens with </s>: per sentence, and the static width from the padded width (few compiled shapes).
        width_limit = limit.tokens(width - 1) + 1
        limits = [limit.tokens(len(sources[i])) + 1 for i in members]
        limits += [limits[0]] * (rows - len(members))  # the padding rows repeat the first sentence
        extra = {}
        if sources_ext is not None:
            ext = [list(sources_ext[i]) for i in members]
            extra["src_ext"] = pad_rows(ext, width, rows, eos_id, pad_id)[0]
        if prefixes is not None:
            extra.update(_prefix_rows(prefixes, members, rows, pad_id, cap))
            limits = [max(n, int(p) + 1) for n, p in zip(limits, extra["prefix_lengths"], strict=True)]
            if max(limits) > width_limit:
                width_limit = padded_width(max(limits))
        if constraints is not None:
            extra["constraints"] = [constraints[i] for i in members]
            extra["constraints"] += [extra["constraints"][0]] * (rows - len(members))
        if cap:
            width_limit, limits = min(width_limit, cap), [min(n, cap) for n in limits]
        search = beam_search if sampling is None else _sampler(sampling, members, rows, ids)
        out = search(
            model,
            src,
            mask,
            beam_size=beam_size,
            num_return=num_return,
            max_length=width_limit,
            limits=np.asarray(limits, np.int32),
            length_penalty_alpha=alpha,
            coverage_penalty_beta=beta,
            bos_id=bos_id,
            eos_id=eos_id,
            pad_id=pad_id,
            no_repeat_ngram=no_repeat_ngram,
            min_length=min_length,
            **extra,
        )
        result = type(out)(*(None if x is None else np.asarray(x) for x in out))
        yield SearchBatch(members, limits, result)


def _sampler(sampling: Sampling, members: list[int], rows: int, ids: Sequence[int] | None):
    """:func:`sample_decode` for one batch, called like :func:`beam_search`: ``num_return`` samples per
    sentence, each row drawing by its sentence's id (padding rows repeat the first)."""
    import jax

    sampling.check()
    row_ids = [members[r] if ids is None else ids[members[r]] for r in range(len(members))]
    row_ids += [row_ids[0]] * (rows - len(members))

    def search(model, src, mask, *, beam_size, num_return, length_penalty_alpha, coverage_penalty_beta, **kw):
        return sample_decode(
            model,
            src,
            mask,
            jax.random.key(sampling.seed),
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            num_samples=num_return,
            ids=np.asarray(row_ids, np.int64),
            **kw,
        )

    return search
