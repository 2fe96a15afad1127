"""Lexically constrained beam search by dynamic beam allocation (Post & Vilar 2018, as fairseq's).

A constraint is a sequence of target tokens that must appear, contiguous, somewhere in the output. Each
hypothesis carries its progress on every constraint of its sentence: the number of tokens of the constraint it
has matched so far, which is the constraint's length once it is met (met stays met). Progress follows the
Knuth-Morris-Pratt automaton of the constraint, so a failed partial match falls back to the longest prefix of
the constraint that is still a suffix of the output: ``a a b`` meets ``a b``, and two constraints that
overlap or share a first token are tracked independently. A constraint given twice is met by one occurrence.

At each position, beam search's candidates are widened (Post & Vilar 2018, §3; fairseq's
``LexicallyConstrainedBeamSearch``):

* the ``2K`` best extensions of the sentence, as in plain beam search;
* the best extension of each hypothesis; and
* for each hypothesis and each constraint it lacks, the token that advances it and the token that starts it.

Duplicates are dropped. Each candidate's *bank* is its number of matched constraint tokens. Candidates are
ranked by score within their bank, then taken round-robin from the fullest bank down: the best of each bank,
then the second best of each, and so on. The first ``2K`` of that order play the roles of plain beam search's
``2K`` best: a ``</s>`` among the first ``K`` finishes its hypothesis, and the first ``K`` other words stay
alive. ``</s>`` is allowed only to a hypothesis that has met all its constraints, except at the length limit,
which forces it. So a finished hypothesis lacks a constraint only when the limit left no room; it ranks below
every hypothesis that has them all, and :attr:`BeamResult.unmet_constraints` counts what it lacks.

A sentence without constraints gets plain beam search's hypotheses: every candidate is in bank 0, so the
round-robin order is the order of scores.

Reference: Post and Vilar (2018), "Fast Lexically Constrained Decoding with Dynamic Beam Allocation for
Neural Machine Translation", NAACL; fairseq ``search.py`` and ``token_generation_constraints.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attn_jax.typing import Array, Bool, Float, Int

__all__ = ["Constraints", "pack_constraints"]

_NEG_INF = float("-inf")


class Constraints(NamedTuple):
    """The constraints of a batch, padded to ``C`` constraints of at most ``W`` tokens per sentence.

    Attributes:
      tokens: ``[B, C, W]`` int32 token ids, ``-1`` after each constraint and in missing ones.
      lengths: ``[B, C]`` int32, each constraint's length (0: no constraint in this slot).
      moves: ``[B, C, W + 1, W]`` int32, the automaton: progress after reading ``tokens[b, c, j]`` with
        progress ``p`` (any token not in the constraint sends it to 0).
    """

    tokens: Int[Array, "B C W"]
    lengths: Int[Array, "B C"]
    moves: Int[Array, "B C W1 W"]


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _automaton(seq: list[int], width: int) -> np.ndarray:
    """``moves[p, j]``: the longest prefix of ``seq`` that is a suffix of ``seq[:p] + [seq[j]]`` (KMP)."""
    n = len(seq)
    moves = np.zeros((width + 1, width), np.int32)
    for p in range(n + 1):
        for j in range(n):
            text = seq[:p] + [seq[j]]
            moves[p, j] = max(q for q in range(min(n, len(text)) + 1) if text[len(text) - q :] == seq[:q])
    return moves


def pack_constraints(
    constraints: Sequence[Sequence[Sequence[int]]], batch: int, bos_id: int, eos_id: int, pad_id: int
) -> Constraints:
    """Pad per-sentence constraints (lists of token-id lists) into :class:`Constraints`, or a ValueError.

    ``C`` and ``W`` are rounded up to powers of two, so that batches with a few more constraints reuse the
    compiled search.
    """
    if isinstance(constraints, str | bytes) or len(constraints) != batch:
        raise ValueError(f"constraints must be one list per sentence ({batch}), got {len(constraints)}")
    rows = []
    for b, row in enumerate(constraints):
        seqs = []
        for c, seq in enumerate(row):
            seq = [int(x) for x in np.asarray(seq).reshape(-1)]
            if not seq:
                raise ValueError(f"constraint {c} of sentence {b} is empty")
            bad = [x for x in seq if x < 0 or x in (bos_id, eos_id, pad_id)]
            if bad:
                raise ValueError(
                    f"constraint {c} of sentence {b} holds {bad[0]}, not a word id (</s>, <s>, pad, < 0)"
                )
            seqs.append(seq)
        rows.append(seqs)
    count = _pow2(max((len(r) for r in rows), default=1) or 1)
    width = _pow2(max((len(s) for r in rows for s in r), default=1))
    tokens = np.full((batch, count, width), -1, np.int32)
    lengths = np.zeros((batch, count), np.int32)
    moves = np.zeros((batch, count, width + 1, width), np.int32)
    for b, seqs in enumerate(rows):
        for c, seq in enumerate(seqs):
            tokens[b, c, : len(seq)] = seq
            lengths[b, c] = len(seq)
            moves[b, c] = _automaton(seq, width)
    return Constraints(jnp.asarray(tokens), jnp.asarray(lengths), jnp.asarray(moves))


def unmet(progress: Int[Array, "B K C"], cons: Constraints) -> Int[Array, "B K"]:
    """The number of constraints each hypothesis lacks."""
    return jnp.sum(progress < cons.lengths[:, None, :], axis=-1).astype(jnp.int32)


def block_eos(
    logp: Float[Array, "B K V"],
    progress: Int[Array, "B K C"],
    cons: Constraints,
    at_limit: Bool[Array, "B 1 1"],
    eos_id: int,
) -> Float[Array, "B K V"]:
    """``logp`` with ``-inf`` for ``</s>`` where the hypothesis lacks a constraint, except at the limit."""
    lacking = (unmet(progress, cons) > 0)[..., None] & ~at_limit  # [B, K, 1]
    return jnp.where(lacking & (jnp.arange(logp.shape[-1]) == eos_id), _NEG_INF, logp)


def advance(
    progress: Int[Array, "B N C"], words: Int[Array, "B N"], cons: Constraints
) -> Int[Array, "B N C"]:
    """The progress of each candidate after its word: one step of each constraint's automaton."""
    batch, n, count = progress.shape
    width = cons.tokens.shape[-1]
    p = jnp.minimum(progress, width)  # [B, N, C]
    # moves[b, c, p, :] for every candidate: a flat gather per sentence.
    index = (jnp.arange(count)[None, None, :] * (width + 1) + p)[..., None] * width + jnp.arange(width)
    rows = jnp.take_along_axis(cons.moves.reshape(batch, -1), index.reshape(batch, -1), axis=1)
    rows = rows.reshape(batch, n, count, width)
    match = cons.tokens[:, None, :, :] == words[:, :, None, None]  # [B, N, C, W]
    step = jnp.max(jnp.where(match, rows, 0), axis=-1)
    return jnp.where(progress >= cons.lengths[:, None, :], progress, step)


def allocate(
    cand: Float[Array, "B K V"], progress: Int[Array, "B K C"], cons: Constraints, k: int, eos_id: int
) -> tuple[Bool[Array, "B K"], Float[Array, "B K"], Int[Array, "B K"], Int[Array, "B K C"]]:
    """Dynamic beam allocation over one position's extensions ``cand`` (``-inf``: not allowed).

    Returns ``(eos_first, log_probs, flat, progress)``: which hypotheses' ``</s>`` extension is among the first
    ``K`` of the allocation order; and the ``K`` hypotheses kept alive, as their log-probabilities (``-inf``:
    an empty slot), their flat ``beam · V + word`` indices and their constraint progress.
    """
    batch, _, vocab = cand.shape
    count = cons.lengths.shape[1]
    width = cons.tokens.shape[-1]
    flat_cand = cand.reshape(batch, k * vocab)
    _, top = jax.lax.top_k(flat_cand, 2 * k)  # [B, 2K]
    each = jnp.arange(k)[None, :] * vocab + jnp.argmax(cand, axis=-1)  # [B, K]: each hypothesis' best
    open_ = progress < cons.lengths[:, None, :]  # [B, K, C]: constraints the hypothesis lacks
    toks = jnp.broadcast_to(cons.tokens[:, None], (batch, k, count, width))
    ahead = jnp.take_along_axis(toks, jnp.minimum(progress, width - 1)[..., None], axis=-1)[..., 0]
    words = jnp.concatenate([ahead, toks[..., 0]], axis=-1)  # [B, K, 2C]: advance or start each constraint
    cflat = (jnp.arange(k)[None, :, None] * vocab + jnp.maximum(words, 0)).reshape(batch, -1)
    flat = jnp.concatenate([top, each, cflat], axis=1)  # [B, Nc]
    lp = jnp.take_along_axis(flat_cand, flat, axis=1)
    usable = jnp.concatenate(
        [jnp.ones((batch, 3 * k), jnp.bool_), jnp.concatenate([open_, open_], -1).reshape(batch, -1)], axis=1
    )
    lp = jnp.where(usable, lp, _NEG_INF)
    n = flat.shape[1]
    earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]  # [i, j]: j comes before i
    seen = (flat[:, :, None] == flat[:, None, :]) & earlier & (lp > _NEG_INF)[:, None, :]
    lp = jnp.where(jnp.any(seen, axis=-1), _NEG_INF, lp)  # each (hypothesis, word) once
    valid = lp > _NEG_INF

    beams = flat // vocab
    new = advance(jnp.take_along_axis(progress, beams[..., None], axis=1), flat % vocab, cons)  # [B, Nc, C]
    bank = jnp.sum(new, axis=-1)  # [B, Nc]
    better = (lp[:, None, :] > lp[:, :, None]) | ((lp[:, None, :] == lp[:, :, None]) & earlier)
    rank = jnp.sum(valid[:, None, :] & (bank[:, None, :] == bank[:, :, None]) & better, axis=-1)
    most = count * width  # no bank is fuller
    stripe = rank * (most + 1) + (most - bank)  # round-robin: rank first, the fullest bank first within it
    _, order = jax.lax.top_k(jnp.where(valid, -stripe.astype(jnp.float32), _NEG_INF), 2 * k)  # [B, 2K]

    sel_flat = jnp.take_along_axis(flat, order, axis=1)
    sel_lp = jnp.take_along_axis(lp, order, axis=1)
    sel_eos = (sel_flat % vocab == eos_id) & (sel_lp > _NEG_INF)
    first_k = (jnp.arange(2 * k) < k)[None, None, :]
    mine = (sel_flat // vocab)[:, None, :] == jnp.arange(k)[None, :, None]  # [B, K, 2K]
    eos_first = jnp.any(sel_eos[:, None, :] & first_k & mine, axis=-1)  # [B, K]
    position = jnp.where(sel_eos, _NEG_INF, -jnp.arange(2 * k, dtype=jnp.float32))
    _, keep = jax.lax.top_k(position, k)  # the first K that do not end the sentence, in order
    log_probs = jnp.take_along_axis(jnp.where(sel_eos, _NEG_INF, sel_lp), keep, axis=1)
    picked = jnp.take_along_axis(order, keep, axis=1)  # [B, K] positions among the candidates
    flat_k = jnp.take_along_axis(flat, picked, axis=1)
    new_k = jnp.take_along_axis(new, picked[..., None], axis=1)
    return eos_first, log_probs, flat_k, new_k


def rank_finished(scores: Float[Array, "B F"], lacking: Int[Array, "B F"], k: int) -> Int[Array, "B K"]:
    """The ``K`` best finished hypotheses: those with every constraint first, each group by score (stable)."""
    group = jnp.where(scores > _NEG_INF, (lacking > 0).astype(jnp.int32), 2)  # 2: an empty slot
    return jnp.lexsort((-scores, group), axis=-1)[:, :k]
