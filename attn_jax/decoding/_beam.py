"""Batched beam search and greedy decoding over the step interface of ``attn_jax.models.interface``.

One compiled program per (models, beam size, n-best size, output length, token ids, input shapes): a
``lax.while_loop`` over target positions with static shapes, keeping two fixed-size sets per sentence as in
Flax's ``examples/wmt/decode.py`` and tensor2tensor's ``beam_search.py``:

* **alive** — the ``K`` best unfinished hypotheses, ranked by raw ``log P(y_<t | x)``; and
* **finished** — the ``K`` best hypotheses that ended in ``</s>``, ranked by GNMT's normalised score
  ``s(Y, X) = log P(Y|X) / lp(Y) + cp(X; Y)`` (Wu et al. 2016, eq. 14; see ``_penalties``).

At each position every alive hypothesis is extended by every word. A ``</s>`` extension that ranks among the
``K`` most probable extensions of the sentence is scored and offered to the finished set (fairseq's rule; it
makes ``K = 1`` exactly greedy decoding), the best ``K`` other extensions become the new alive set, and the
decoder states,
the tokens, the per-step attention rows and the coverage ``Σ_j α_ij`` are reordered with the back-pointers —
so the attention matrix returned belongs to the returned words. A sentence stops when no alive hypothesis can
still beat its ``num_return``-th finished one (the bound ``log P(y_<t) / lp(limit)`` is exact for ``α ≥ 0``,
``β ≥ 0``: log-probabilities only fall, ``lp`` only grows and ``cp ≤ 0``), or at its length limit; the loop
ends when every sentence has stopped. The early stop never changes the result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_jax.decoding import _constrained
from attn_jax.decoding._penalties import length_penalty, normalized_score
from attn_jax.models.interface import check_source, for_decoding, gather_batch, initial_state, repeat_batch
from attn_jax.typing import Array, ArrayLike, Bool, Float, Int

__all__ = ["BeamResult", "beam_search", "greedy_decode", "output_length"]

_NEG_INF = float("-inf")
_TRACE_COUNT = [0]  # incremented each time the search is traced (compiled); tests assert no retracing


class BeamResult(NamedTuple):
    """The ``N = num_return`` best hypotheses of each sentence, best first.

    Attributes:
      tokens: ``[B, N, L]`` int32; ``tokens[b, n, :lengths[b, n]]`` is the hypothesis, its last token
        ``</s>``, then ``pad_id`` to the end.
      lengths: ``[B, N]`` int32 ``|Y|``, counting the ``</s>`` (the words are ``lengths - 1`` tokens).
      scores: ``[B, N]`` float32 normalised scores ``log P / lp + cp`` the list is sorted by (descending).
      log_probs: ``[B, N]`` float32 raw ``log P(Y | X)`` (an ensemble's averaged log-probabilities).
      attention: ``[B, N, L, S]`` float32, row ``i`` the attention over the source when token ``i`` was
        predicted (zeros after the hypothesis); ``None`` for models without attention.
      truncated: ``[B, N]`` bool, True where the hypothesis stopped at its sentence's length limit rather than
        at a ``</s>`` of the model's choosing: ``lengths == limits`` and, at that last position, the model's most
        probable next token was another word (its ``</s>`` was forced). Count these: a translation cut short
        by the limit is a wrong answer the limit made, not the model.
      limits: ``[B]`` int32, the length limit each sentence had (tokens including ``</s>``).
      unmet_constraints: ``[B, N]`` int32, the lexical constraints each hypothesis lacks (0: all there); None
        without constraints. A hypothesis lacks one only when the length limit left no room for it: it is
        ranked below every hypothesis that has them all, and it must be reported, never passed off.

    An entry that could not be filled (fewer than ``N`` distinct hypotheses fit the length limit, e.g. a
    limit of 1 allows only ``</s>``) has score ``-inf``, length 0, only padding and ``truncated`` False.
    """

    tokens: Int[Array, "B N L"]
    lengths: Int[Array, "B N"]
    scores: Float[Array, "B N"]
    log_probs: Float[Array, "B N"]
    attention: Float[Array, "B N L S"] | None
    truncated: Bool[Array, "B N"]
    limits: Int[Array, " B"]
    unmet_constraints: Int[Array, "B N"] | None = None


class _Alive(NamedTuple):
    """The ``K`` unfinished hypotheses of each sentence (sorted by ``log_probs``, ``-inf`` = empty slot)."""

    tokens: Int[Array, "B K L"]
    log_probs: Float[Array, "B K"]
    attention: Float[Array, "B K L S"] | None
    coverage: Float[Array, "B K S"] | None
    states: tuple[Any, ...]  # one decoder state per model, rows b·K + k
    progress: Int[Array, "B K C"] | None = None  # tokens matched of each lexical constraint


class _Finished(NamedTuple):
    """The ``K`` best hypotheses ended by ``</s>`` (sorted by ``scores``, ``-inf`` = empty slot)."""

    tokens: Int[Array, "B K L"]
    lengths: Int[Array, "B K"]
    scores: Float[Array, "B K"]
    log_probs: Float[Array, "B K"]
    attention: Float[Array, "B K L S"] | None
    truncated: Bool[Array, "B K"]  # ended at the length limit with a forced </s>
    unmet: Int[Array, "B K"] | None = None  # lexical constraints the hypothesis lacks


def output_length(
    src_width: int, max_length: int | None, max_length_ratio: float | None, max_length_offset: int
) -> int:
    """The static output width ``L``: ``max_length``, else ``⌊ratio · S⌋ + offset`` for sources ``S`` wide.

    >>> output_length(7, None, 2.0, 10), output_length(7, 5, 2.0, 10)
    (24, 5)
    """
    if max_length is not None:
        return max_length
    return max(1, math.floor(max_length_ratio * src_width + 1e-4) + max_length_offset)


def greedy_decode(
    model: nnx.Module | Sequence[nnx.Module],
    src: Int[Array, "B S"],
    src_mask: Bool[Array, "B S"],
    *,
    max_length: int | None = None,
    max_length_ratio: float | None = 2.0,
    max_length_offset: int = 10,
    limits: Int[ArrayLike, " B"] | None = None,
    bos_id: int = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    src_ext: Int[ArrayLike, "B S"] | None = None,
    no_repeat_ngram: int = 0,
    min_length: int = 0,
    prefix: Int[ArrayLike, "B P"] | None = None,
    prefix_lengths: Int[ArrayLike, " B"] | None = None,
    constraints: Sequence[Sequence[Sequence[int]]] | None = None,
) -> BeamResult:
    """Greedy decoding (``y_t = argmax_y P(y | y_<t, x)`` until ``</s>``): beam search, ``K = 1``, ``α = β = 0``.

    With one hypothesis, ``</s>`` finishes it only when ``</s>`` is the argmax, and with raw log-probabilities
    nothing longer can then beat it, so this is the argmax loop (``pad_id``/``bos_id`` are never produced,
    ``</s>`` is forced at the length limit). See :func:`beam_search` for the arguments and an example
    (``greedy_decode(model, src, src_mask)`` returns the same fields with ``N = 1``).
    """
    return beam_search(
        model,
        src,
        src_mask,
        beam_size=1,
        num_return=1,
        max_length=max_length,
        max_length_ratio=max_length_ratio,
        max_length_offset=max_length_offset,
        limits=limits,
        length_penalty_alpha=0.0,
        coverage_penalty_beta=0.0,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
        src_ext=src_ext,
        no_repeat_ngram=no_repeat_ngram,
        min_length=min_length,
        prefix=prefix,
        prefix_lengths=prefix_lengths,
        constraints=constraints,
    )


def beam_search(
    model: nnx.Module | Sequence[nnx.Module],
    src: Int[Array, "B S"],
    src_mask: Bool[Array, "B S"],
    *,
    beam_size: int = 12,
    num_return: int = 1,
    max_length: int | None = None,
    max_length_ratio: float | None = 2.0,
    max_length_offset: int = 10,
    limits: Int[ArrayLike, " B"] | None = None,
    length_penalty_alpha: float = 0.6,
    coverage_penalty_beta: float = 0.0,
    bos_id: int = 1,
    eos_id: int = 2,
    pad_id: int = 0,
    src_ext: Int[ArrayLike, "B S"] | None = None,
    no_repeat_ngram: int = 0,
    min_length: int = 0,
    prefix: Int[ArrayLike, "B P"] | None = None,
    prefix_lengths: Int[ArrayLike, " B"] | None = None,
    constraints: Sequence[Sequence[Sequence[int]]] | None = None,
) -> BeamResult:
    """Batched, jit-compiled beam search returning the n-best hypotheses, their scores and attention.

    Hypotheses are ranked by GNMT's score (Wu et al. 2016, eq. 14)::

        s(Y, X) = log P(Y | X) / lp(Y) + cp(X; Y)
        lp(Y)   = ((5 + |Y|) / 6)^α                           |Y| counts the </s>
        cp(X;Y) = β · Σ_i log(min(Σ_j α_ij, 1))                i over real source words, j over target tokens

    Alive hypotheses compete on raw ``log P`` (as in GNMT and tensor2tensor); only finished ones are
    normalised. A ``</s>`` extension is finished only if it is among the ``K`` most probable extensions of
    its sentence at that position (fairseq, OpenNMT), which makes ``K = 1`` greedy decoding.

    Length limit: sentence ``b`` may produce at most ``limit_b = min(L, ⌊ratio · |x_b|⌋ + offset)`` tokens
    including ``</s>`` (``|x_b|`` its real source length; ``L = max_length``, or ``⌊ratio · S⌋ + offset`` for
    the padded width ``S`` when ``max_length`` is None; ``limit_b ≥ 1``), or ``min(L, limits[b])`` when
    ``limits`` is given (``L = max_length``, default ``max(limits)``). Token ``limit_b`` must be ``</s>``,
    scored with its true probability (as fairseq forces it), so every hypothesis is ``</s>``-terminated; a
    hypothesis whose ``</s>`` was forced there is flagged in :attr:`BeamResult.truncated`, never silently.
    ``pad_id`` and ``bos_id`` are never generated (their probability is not redistributed: scores stay the
    model's log-probabilities). The encoder runs once per sentence, before its outputs (with the precomputed
    attention keys) are tiled over the beam.

    Ensembles: pass several models with the same target vocabulary; each step uses the mean of their
    log-softmax outputs (the log of the geometric mean of their probabilities, not renormalised — the
    log-linear average of Nematus and Marian), so ``log_probs`` is the members' mean sequence log-probability.
    The attention returned (and used for ``cp``) is the mean of the members' attention weights (members
    without attention are skipped).

    The compiled search is cached on the models' graph definitions, ``beam_size``, ``num_return``, ``L``,
    the token ids and the input shapes: a new batch of the same shape reuses it, and ``α``, ``β``, the ratio
    and the offset are runtime values (changing them never recompiles).

    References: Wu et al. (2016), "Google's Neural Machine Translation System", §7; Flax
    ``examples/wmt/decode.py``; tensor2tensor ``utils/beam_search.py``.

    Args:
      model: an NNX module implementing ``encode`` / ``init_decoder_state`` / ``decode_step``, or a
        sequence of them (an ensemble).
      src: ``[B, S]`` integer source token ids.
      src_mask: ``[B, S]`` boolean, True at real tokens (right padding).
      beam_size: ``K ≥ 1`` hypotheses kept per sentence (``K = 1`` with ``α = β = 0`` is greedy decoding).
      num_return: ``N``, ``1 ≤ N ≤ K`` hypotheses returned per sentence (the n-best list).
      max_length: the static output width ``L`` (tokens including ``</s>``); None to derive it from
        ``max_length_ratio``.
      max_length_ratio: per-sentence limit ``⌊ratio · |x_b|⌋ + max_length_offset``; None for the fixed
        ``max_length``.
      max_length_offset: the constant added to the ratio limit (lets short sentences grow).
      limits: ``[B]`` per-sentence limits (tokens including ``</s>``, ``>= 1``), replacing the ratio rule
        (``attn_jax.decoding.LengthLimit`` computes them); runtime values, changing them never recompiles.
      length_penalty_alpha: ``α ≥ 0`` (GNMT: 0.6–0.7; 0 ranks by raw log-probability).
      coverage_penalty_beta: ``β ≥ 0`` (GNMT: 0.2; 0 switches the coverage penalty off). Needs attention.
      bos_id: the token fed before the first target word. eos_id: ``</s>``. pad_id: fills after ``</s>``.
      src_ext: ``[B, S]`` the source in the extended target vocabulary, for a model that copies source words
        (RNNsearch ``copy=True``, passed to its ``encode``); its hypotheses then hold ids ``>= V`` for copied
        out-of-vocabulary words (``V + r``: the sentence's ``r``-th, :func:`attn_jax.data.extend_with_source`).
      no_repeat_ngram: ``N > 0`` forbids a word that would complete an ``N``-gram already in the hypothesis
        (its log-probability becomes ``-inf``; ``</s>`` is never blocked); 0: off. Static: each value compiles
        its own search, and 0 adds no operation.
      min_length: ``</s>`` is forbidden before the hypothesis has this many tokens (``</s>`` not counted),
        except at the sentence's length limit, which wins; 0: off. Static, like ``no_repeat_ngram``.
        Neither option renormalises: the scores stay the model's log-probabilities of the words chosen.
      prefix: ``[B, P]`` forced target prefixes: while ``t < prefix_lengths[b]``, every hypothesis of
        sentence ``b`` takes ``prefix[b, t]``, and decoding continues after it. The prefix's log-probability
        counts in the scores (as fairseq's ``prefix_tokens``); repetition control never blocks it. Its
        tokens must be words (not ``</s>``, ``<s>`` or padding), and a prefix must leave room for ``</s>``
        (``prefix_lengths[b] < limit_b``). None (the default) adds no operation to the search.
      prefix_lengths: ``[B]`` the prefix length of each sentence (0: none); needed with ``prefix``.
      constraints: per sentence, a list of constraints, each a non-empty list of token ids that must appear
        in the output as a contiguous sequence (lexically constrained decoding by dynamic beam allocation,
        :mod:`attn_jax.decoding._constrained`). The result then has ``unmet_constraints``.

    Returns:
      A :class:`BeamResult` with ``[B, N, ...]`` fields, best first.

    >>> from attn_jax.models import RNNConfig, RNNsearch
    >>> cfg = RNNConfig(src_vocab=11, tgt_vocab=13, embed=4, hidden=6, maxout=3, align=5)
    >>> out = beam_search(RNNsearch(cfg, rngs=nnx.Rngs(0)), jnp.ones((2, 3), jnp.int32),
    ...                   jnp.ones((2, 3), bool), beam_size=4, num_return=2, max_length=5)
    >>> out.tokens.shape, out.scores.shape, out.attention.shape, bool(out.scores[0, 0] >= out.scores[0, 1])
    ((2, 2, 5), (2, 2), (2, 2, 5, 3), True)
    """
    models = _check_models(model)
    check_source(src, src_mask)
    limits = _check_limits(limits, src.shape[0])
    _check_options(
        beam_size,
        num_return,
        max_length,
        max_length_ratio if limits is None else 1.0,  # explicit limits replace the ratio rule
        max_length_offset,
        length_penalty_alpha,
        coverage_penalty_beta,
        bos_id,
        eos_id,
        pad_id,
    )
    for name, value in (("no_repeat_ngram", no_repeat_ngram), ("min_length", min_length)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name} must be a non-negative int (0: off), got {value!r}")
    src, src_mask = jnp.asarray(src, jnp.int32), jnp.asarray(src_mask, jnp.bool_)
    if limits is not None:
        length = max_length if max_length is not None else int(limits.max())
        limit = jnp.clip(jnp.asarray(limits, jnp.int32), 1, length)
    else:
        length = output_length(src.shape[1], max_length, max_length_ratio, max_length_offset)
        if max_length_ratio is None:
            limit = jnp.full((src.shape[0],), length, jnp.int32)
        else:
            real = jnp.sum(src_mask, axis=-1).astype(jnp.float32)  # [B]
            limit = jnp.floor(jnp.float32(max_length_ratio) * real + 1e-4).astype(jnp.int32)
            limit = jnp.clip(limit + max_length_offset, 1, length)
    forcing = None
    if prefix is not None or prefix_lengths is not None:
        forcing = _check_prefix(prefix, prefix_lengths, np.asarray(limit), length, bos_id, eos_id, pad_id)
    packed = None
    if constraints is not None:
        packed = _constrained.pack_constraints(constraints, src.shape[0], bos_id, eos_id, pad_id)
    graphdefs, states = zip(*(nnx.split(m) for m in models), strict=True)
    result = _search_jit(
        tuple(graphdefs),
        tuple(states),
        src,
        src_mask,
        limit,
        jnp.float32(length_penalty_alpha),
        jnp.float32(coverage_penalty_beta),
        None if src_ext is None else jnp.asarray(src_ext, jnp.int32),
        forcing,
        packed,
        beam_size=beam_size,
        num_return=num_return,
        length=length,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
        no_repeat_ngram=no_repeat_ngram,
        min_length=min_length,
    )
    if result.attention is None and coverage_penalty_beta > 0:
        raise ValueError("coverage_penalty_beta > 0 needs attention weights, but the model returns none")
    return result


# ----------------------------------------------------------------------------------------------- checks


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_models(model) -> list[nnx.Module]:
    """The models as a non-empty list of NNX modules with the step interface, or a ValueError."""
    models = list(model) if isinstance(model, Sequence) else [model]
    if not models:
        raise ValueError("beam_search needs at least one model, got an empty sequence")
    for i, m in enumerate(models):
        if not isinstance(m, nnx.Module):
            raise ValueError(f"model {i} must be a flax.nnx.Module, got {type(m).__name__}")
        missing = [a for a in ("encode", "init_decoder_state", "decode_step") if not hasattr(m, a)]
        if missing:
            raise ValueError(f"model {i} ({type(m).__name__}) lacks the step interface: {', '.join(missing)}")
    return models


def _check_limits(limits, batch: int):
    """``limits`` as an int32 NumPy ``[B]`` array of values ``>= 1`` (None stays None), or a ValueError."""
    if limits is None:
        return None
    arr = np.asarray(limits)
    if arr.shape != (batch,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"limits must be {batch} ints (one per sentence), got {arr.dtype} {list(arr.shape)}")
    if batch and arr.min() < 1:
        raise ValueError(f"limits must be >= 1 (tokens including </s>), got {int(arr.min())}")
    return arr.astype(np.int32)


def _check_prefix(prefix, lengths, limit: np.ndarray, width: int, bos_id, eos_id, pad_id):
    """``(prefix [B, L], lengths [B])`` as int32 arrays padded or cut to the output width, or a ValueError."""
    if prefix is None or lengths is None:
        raise ValueError("give prefix and prefix_lengths together")
    arr, n = np.asarray(prefix), np.asarray(lengths)
    batch = limit.shape[0]
    if arr.ndim != 2 or arr.shape[0] != batch or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"prefix must be [B={batch}, P] ints, got {arr.dtype} {list(arr.shape)}")
    if n.shape != (batch,) or not np.issubdtype(n.dtype, np.integer):
        raise ValueError(f"prefix_lengths must be {batch} ints, got {n.dtype} {list(n.shape)}")
    for b in range(batch):
        if not 0 <= n[b] <= arr.shape[1]:
            raise ValueError(
                f"prefix_lengths[{b}] = {n[b]} is outside [0, {arr.shape[1]}] (the prefix width)"
            )
        if n[b] >= limit[b]:
            raise ValueError(
                f"the prefix of sentence {b} has {n[b]} tokens, but its length limit is {limit[b]} tokens "
                "including </s>: no room for </s>"
            )
        bad = [int(x) for x in arr[b, : n[b]] if x < 0 or x in (bos_id, eos_id, pad_id)]
        if bad:
            raise ValueError(
                f"the prefix of sentence {b} holds {bad[0]}, not a word id (</s>, <s>, pad, < 0)"
            )
    out = np.full((batch, width), pad_id, np.int32)
    cut = min(width, arr.shape[1])
    out[:, :cut] = arr[:, :cut]
    return jnp.asarray(out), jnp.asarray(n, jnp.int32)


def _check_options(
    beam_size, num_return, max_length, ratio, offset, alpha, beta, bos_id, eos_id, pad_id
) -> None:
    """Raise a one-line ValueError for any search option out of range."""
    if not _is_int(beam_size) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
    if not _is_int(num_return) or not 1 <= num_return <= beam_size:
        raise ValueError(f"num_return must be an int in [1, beam_size={beam_size}], got {num_return!r}")
    if max_length is not None and (not _is_int(max_length) or max_length < 1):
        raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
    if ratio is not None and not (isinstance(ratio, int | float) and math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"max_length_ratio must be a positive finite number or None, got {ratio!r}")
    if max_length is None and ratio is None:
        raise ValueError("give max_length or max_length_ratio (both are None)")
    if not _is_int(offset) or offset < 0:
        raise ValueError(f"max_length_offset must be a non-negative int, got {offset!r}")
    for name, value in (("length_penalty_alpha", alpha), ("coverage_penalty_beta", beta)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if eos_id in (bos_id, pad_id):
        raise ValueError(
            f"eos_id must differ from bos_id and pad_id, got eos={eos_id} bos={bos_id} pad={pad_id}"
        )


# ------------------------------------------------------------------------------------------------ search


def _take_beams(x: Array, beams: Int[Array, "B K"]) -> Array:
    """``x[b, beams[b, k]]`` for ``x`` of shape ``[B, K', ...]``."""
    return jnp.take_along_axis(x, beams.reshape(beams.shape + (1,) * (x.ndim - 2)), axis=1)


def _block_repeats(
    logp: Float[Array, "B K V"],
    tokens: Int[Array, "B K L"],
    t,
    at_limit: Bool[Array, "B 1 1"],
    no_repeat_ngram: int,
    min_length: int,
    eos_id: int,
) -> Float[Array, "B K V"]:
    """``logp`` with ``-inf`` for the words that position ``t`` may not take: ``</s>`` before ``min_length``
    tokens (not at the limit), and each word completing an ``n``-gram that ``tokens[..., :t]`` already holds."""
    batch, k, vocab = logp.shape
    ids = jnp.arange(vocab)
    if min_length:
        early = (t < min_length) & ~at_limit  # [B, 1, 1]
        logp = jnp.where(early & (ids == eos_id), _NEG_INF, logp)
    n = no_repeat_ngram
    width = tokens.shape[-1]
    if n and width >= n:
        # n-gram j covers positions j .. j+n-1; it is complete in the prefix when j + n - 1 <= t - 1.
        starts = width - n + 1
        context = jax.lax.dynamic_slice_in_dim(
            tokens, jnp.maximum(t - n + 1, 0), n - 1, axis=2
        )  # [B, K, n-1]
        match = jnp.arange(starts) <= t - n  # [J]
        for i in range(n - 1):
            match = match & (tokens[..., i : i + starts] == context[..., i : i + 1])  # [B, K, J]
        match = jnp.broadcast_to(match, (batch, k, starts))
        words = tokens[..., n - 1 :]  # [B, K, J]: the word that completes n-gram j
        rows = jnp.arange(batch * k)[:, None]
        banned = jnp.zeros((batch * k, vocab), jnp.bool_)
        banned = banned.at[rows, words.reshape(batch * k, starts)].max(match.reshape(batch * k, starts))
        logp = jnp.where(banned.reshape(batch, k, vocab) & (ids != eos_id), _NEG_INF, logp)
    return logp


def _row_width(k: int) -> int:
    """Candidates per hypothesis in the logits path: the ``2K`` the flat ranking may need, two slots that
    ``<s>`` and padding may take, and one that holds ``</s>`` when it ranks lower."""
    return 2 * k + 3


_CHUNK = 256  # words per block of the two-stage top-k


def _max_and_top_k(
    x: Float[Array, "... V"], k: int
) -> tuple[Float[Array, "... 1"], Float[Array, "... k"], Int[Array, "... k"]]:
    """``(max, *jax.lax.top_k(x, k))`` over the last axis, ties to the lower index, in two stages for a wide axis.

    XLA's CPU top-k kernel reads a ``[128, 58101]`` row block in ~3× the time of one reduction. Here the axis
    is cut into blocks of ``_CHUNK`` words; the ``k`` blocks with the largest maxima (the lower block first on
    a tie) hold every one of the ``k`` best words, because a block ranked above a winner's block holds a word
    ranked above the winner. One ``top_k`` picks those blocks, a second one the words among them. The row's
    maximum is the best block's, so the log-softmax needs no pass of its own. Exact for every input without
    NaN (NaN rows come out NaN-laden, in an unspecified order); a narrow axis goes straight to ``top_k``.
    """
    v = x.shape[-1]
    blocks = -(-v // _CHUNK)
    if blocks < 4 * k:
        vals, idx = jax.lax.top_k(x, k)
        return jnp.max(x, axis=-1, keepdims=True), vals, idx
    lead = x.shape[:-1]
    rows = x.reshape(-1, v)
    full = (v // _CHUNK) * _CHUNK
    block_max = jnp.max(rows[:, :full].reshape(rows.shape[0], -1, _CHUNK), axis=-1)
    if full < v:
        block_max = jnp.concatenate([block_max, jnp.max(rows[:, full:], axis=-1, keepdims=True)], axis=-1)
    _, best = jax.lax.top_k(block_max, k)  # [R, k]
    best = jnp.sort(best, axis=-1)  # candidates in word-id order, so top_k's ties still go to the lower id
    ids = (best[:, :, None] * _CHUNK + jnp.arange(_CHUNK)).reshape(rows.shape[0], k * _CHUNK)
    outside = ids >= v  # the last block's slots past the vocabulary: -inf, and last among any ties
    cand = jnp.where(outside, -jnp.inf, jnp.take_along_axis(rows, jnp.minimum(ids, v - 1), axis=1))
    vals, pos = jax.lax.top_k(cand, k)
    idx = jnp.take_along_axis(ids, pos, axis=1)
    x_max = jnp.max(block_max, axis=-1, keepdims=True)
    return x_max.reshape(*lead, 1), vals.reshape(*lead, k), idx.reshape(*lead, k)


def _row_candidates(
    logits: Float[Array, "B K V"], k: int, bos_id: int, eos_id: int, pad_id: int
) -> tuple[Int[Array, "B K W"], Float[Array, "B K W"], Float[Array, "B K"], Float[Array, "B K"]]:
    """The best ``W = 2K + 3`` words of each row with their log-probabilities, without writing the row's
    log-softmax: two reductions and one ``top_k`` read the logits, nothing ``[B, K, V]`` is written.

    Returns ``(word, logp, eos_logp, best_word)``: ``word`` and ``logp`` ``[B, K, W]`` in (log-prob desc, id
    asc) order, ``<s>`` and padding at ``-inf``, ``</s>`` always present (in the last slot when it ranks
    lower); ``eos_logp`` ``[B, K]`` the log-probability of ``</s>``; ``best_word`` ``[B, K]`` that of the best
    other word. The log-probabilities are ``jax.nn.log_softmax``'s, computed with the same operations.
    """
    width = _row_width(k)
    x_max, vals, word = _max_and_top_k(logits, width)
    lse = jnp.log(jnp.sum(jnp.exp(logits - x_max), axis=-1, keepdims=True))
    # Masked, not sliced: a slice of top_k's output stops XLA's rewrite of the sort into its TopK kernel.
    slot = jnp.arange(width)
    has_eos = jnp.any((word == eos_id) & (slot < width - 1), axis=-1, keepdims=True)
    put_eos = (slot == width - 1) & ~has_eos
    eos_x = logits[..., eos_id : eos_id + 1]
    vals = jnp.where(put_eos, eos_x, vals)
    word = jnp.where(put_eos, eos_id, word).astype(jnp.int32)
    free = (word != pad_id) & (word != bos_id)
    logp = jnp.where(free, (vals - x_max) - lse, _NEG_INF)
    eos_logp = ((eos_x - x_max) - lse)[..., 0]
    best_word = jnp.max(jnp.where(word != eos_id, logp, _NEG_INF), axis=-1)
    return word, logp, eos_logp, best_word


def _search(
    graphdefs,
    states,
    src,
    src_mask,
    limit,
    alpha,
    beta,
    src_ext=None,
    prefix=None,
    cons=None,
    *,
    beam_size,
    num_return,
    length,
    bos_id,
    eos_id,
    pad_id,
    no_repeat_ngram=0,
    min_length=0,
):
    """The traced search; ``_search_jit`` caches one compilation per static configuration."""
    _TRACE_COUNT[0] += 1
    models = [for_decoding(nnx.merge(g, s)) for g, s in zip(graphdefs, states, strict=True)]
    batch, src_len = src.shape
    k = beam_size

    # The encoder, s_0 and the first step run once per sentence, then are tiled to the beam: rows
    # b·K .. b·K + K - 1. The K hypotheses of a sentence are one until the first word is chosen.
    encs1, dec0 = [], []
    for m in models:
        enc = m.encode(src, src_mask) if src_ext is None else m.encode(src, src_mask, src_ext)
        dec0.append(initial_state(m, enc, length))
        encs1.append(enc)
    encs = [repeat_batch(enc, k) for enc in encs1]

    max_lp = length_penalty(limit, alpha)  # [B] the largest lp any finished hypothesis can reach
    # One model and no rule that rewrites the distribution: the search ranks a few candidates per row read off
    # the logits and never writes the [B, K, V] log-probabilities (see _row_candidates).
    from_logits = len(models) == 1 and not (no_repeat_ngram or min_length) and prefix is None and cons is None

    def decode(dec_states, prev):
        """One position for every model: averaged log-probs (or, when ``from_logits``, the one model's logits)
        ``[B, K, V]``, new states, attention ``[B, K, S]``."""
        return ensemble_step(
            models, encs, dec_states, prev, (batch, k, src_len), (bos_id, eos_id, pad_id), raw=from_logits
        )

    def advance(t, alive: _Alive, fin: _Finished, logp, new_states, attn):
        """Extend every alive hypothesis by one token: offer the ``</s>`` ones, keep the best ``K`` others."""
        vocab = logp.shape[-1]
        if from_logits and _row_width(k) <= vocab:
            return advance_raw(t, alive, fin, logp, new_states, attn)
        if from_logits:
            logp = jax.nn.log_softmax(logp, axis=-1)
        ids = jnp.arange(vocab)
        at_limit = (t + 1 >= limit)[:, None, None]  # [B, 1, 1]: the last token a sentence may have
        raw = logp
        if no_repeat_ngram or min_length:  # static: with both off the search has no extra operation
            logp = _block_repeats(logp, alive.tokens, t, at_limit, no_repeat_ngram, min_length, eos_id)
        if cons is not None:  # </s> waits until every constraint is met (or the limit forces it)
            logp = _constrained.block_eos(logp, alive.progress, cons, at_limit, eos_id)
        free = (ids != pad_id) & (ids != bos_id)
        allowed = free & (~at_limit | (ids == eos_id))
        if prefix is not None:  # inside its prefix a sentence takes the prefix token, never blocked
            want = jax.lax.dynamic_index_in_dim(prefix[0], t, axis=1, keepdims=False)  # [B]
            inside = (t < prefix[1])[:, None, None]  # [B, 1, 1]
            allowed = jnp.where(inside, ids == want[:, None, None], allowed)
            logp = jnp.where(inside, raw, logp)
        cand = alive.log_probs[..., None] + jnp.where(allowed, logp, _NEG_INF)  # [B, K, V]
        # At the limit </s> is forced; it was the model's own choice only if no other word was more probable.
        best_word = jnp.max(jnp.where(free & (ids != eos_id), logp, _NEG_INF), axis=-1)  # [B, K]
        forced = at_limit[:, :, 0] & (logp[..., eos_id] < best_word)  # [B, K]

        history, coverage = record_attention(t, alive, attn)
        if cons is None:
            # The 2K best extensions hold at least K that do not end the sentence (one </s> per hypothesis).
            top_lp, top = jax.lax.top_k(cand.reshape(batch, k * vocab), 2 * k)  # [B, 2K], best first
            in_top_k, log_probs, flat = split_top(top_lp, top, vocab)
            progress = None
        else:  # dynamic beam allocation picks the candidates instead, in the same two roles
            in_top_k, log_probs, flat, progress = _constrained.allocate(cand, alive.progress, cons, k, eos_id)
        eos_lp = jnp.where(in_top_k, cand[..., eos_id], _NEG_INF)  # [B, K]
        fin = offer_finished(t, alive, fin, eos_lp, history, coverage, forced)
        return finish_step(t, alive, fin, log_probs, flat, vocab, history, coverage, new_states, progress)

    def advance_raw(t, alive: _Alive, fin: _Finished, logits, new_states, attn):
        """``advance`` for one model without rules, from its logits: the same ranking, ties and scores."""
        vocab = logits.shape[-1]
        at_limit = (t + 1 >= limit)[:, None, None]  # [B, 1, 1]
        word, logp_c, eos_logp, best_word = _row_candidates(logits, k, bos_id, eos_id, pad_id)
        ok = ~at_limit | (word == eos_id)
        cand = alive.log_probs[..., None] + jnp.where(ok, logp_c, _NEG_INF)  # [B, K, W]
        forced = at_limit[:, :, 0] & (eos_logp < best_word)  # [B, K]

        history, coverage = record_attention(t, alive, attn)
        width = cand.shape[-1]
        # Row by row the candidates lie in (log-prob, word id) order, so flat positions rank as flat ids do.
        flat_c = (jnp.arange(k)[None, :, None] * vocab + word).reshape(batch, k * width)
        top_lp, pos = jax.lax.top_k(cand.reshape(batch, k * width), 2 * k)  # [B, 2K], best first
        top = jnp.take_along_axis(flat_c, pos, axis=1)
        in_top_k, log_probs, flat = split_top(top_lp, top, vocab)
        eos_lp = jnp.where(in_top_k, alive.log_probs + eos_logp, _NEG_INF)  # [B, K]
        fin = offer_finished(t, alive, fin, eos_lp, history, coverage, forced)
        return finish_step(t, alive, fin, log_probs, flat, vocab, history, coverage, new_states, None)

    def record_attention(t, alive: _Alive, attn):
        """The attention history with step ``t`` written in, and the coverage with it added."""
        history, coverage = alive.attention, alive.coverage
        if attn is not None:
            history = jax.lax.dynamic_update_index_in_dim(history, attn, t, axis=2)
            coverage = coverage + attn
        return history, coverage

    def split_top(top_lp, top, vocab):
        """From the ``2K`` best flat extensions ``[B, 2K]``: whether each hypothesis' ``</s>`` ranks among
        the ``K`` best (fairseq's rule, so ``K = 1`` is greedy decoding), and the ``K`` best others."""
        top_eos = (top % vocab) == eos_id
        eos_flat = jnp.arange(k) * vocab + eos_id  # [K]: where each hypothesis' </s> lies in the flat axis
        # Masked, not sliced (top[:, :k]): a second slice of top_k's output stops XLA from rewriting the
        # sort behind top_k into its TopK kernel, and a full sort of the K·V axis every step was ~90 % of
        # the search.
        first_k = (jnp.arange(2 * k) < k)[None, None, :]
        in_top_k = jnp.any((top[:, None, :] == eos_flat[None, :, None]) & first_k, axis=-1)  # [B, K]
        log_probs, keep = jax.lax.top_k(jnp.where(top_eos, _NEG_INF, top_lp), k)  # the K best others
        return in_top_k, log_probs, jnp.take_along_axis(top, keep, axis=1)

    def offer_finished(t, alive, fin, eos_lp, history, coverage, forced):
        """Offer each hypothesis ended by ``</s>`` (log-prob ``eos_lp`` ``[B, K]``, ``-inf`` when not offered)
        to the finished set and keep its ``K`` best."""
        done_tokens = jax.lax.dynamic_update_index_in_dim(
            alive.tokens, jnp.full((batch, k), eos_id, jnp.int32), t, axis=2
        )
        eos_scores = normalized_score(eos_lp, t + 1, coverage, src_mask[:, None, :], alpha, beta)
        unmet = None if cons is None else _constrained.unmet(alive.progress, cons)
        offered = _Finished(
            done_tokens, jnp.full((batch, k), t + 1, jnp.int32), eos_scores, eos_lp, history, forced, unmet
        )
        both = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), fin, offered)
        if cons is None:
            # Stable: on ties an earlier finished hypothesis stays first.
            _, best = jax.lax.top_k(both.scores, k)
        else:
            best = _constrained.rank_finished(both.scores, both.unmet, k)
        return jax.tree.map(lambda x: _take_beams(x, best), both)

    def finish_step(t, alive, fin, log_probs, flat, vocab, history, coverage, new_states, progress):
        """Reorder the alive set to the chosen extensions ``flat`` ``[B, K]`` and stop finished sentences."""
        beams, words = flat // vocab, (flat % vocab).astype(jnp.int32)
        tokens = jax.lax.dynamic_update_index_in_dim(_take_beams(alive.tokens, beams), words, t, axis=2)
        if history is not None:
            history, coverage = _take_beams(history, beams), _take_beams(coverage, beams)
        rows = (jnp.arange(batch)[:, None] * k + beams).reshape(-1)  # back-pointers into the B·K rows
        states = tuple(gather_batch(s, rows) for s in new_states)

        # Stop a sentence at its limit, or once no continuation can beat its num_return-th finished score.
        bound = jnp.max(log_probs, axis=1) / max_lp
        done = (t + 1 >= limit) | (bound <= fin.scores[:, num_return - 1])
        log_probs = jnp.where(done[:, None], _NEG_INF, log_probs)
        return _Alive(tokens, log_probs, history, coverage, states, progress), fin

    logp, new_states, attn = ensemble_step(
        models,
        encs1,
        tuple(dec0),
        jnp.full((batch,), bos_id, jnp.int32),
        (batch, 1, src_len),
        (bos_id, eos_id, pad_id),
        raw=from_logits,
    )
    logp = jnp.broadcast_to(logp, (batch, k, logp.shape[-1]))
    attn = None if attn is None else jnp.broadcast_to(attn, (batch, k, src_len))
    new_states = repeat_batch(new_states, k)
    history = None if attn is None else jnp.zeros((batch, k, length, src_len), jnp.float32)
    coverage = None if attn is None else jnp.zeros((batch, k, src_len), jnp.float32)
    tokens = jnp.full((batch, k, length), pad_id, jnp.int32)
    # Only the first slot is live at the start, so the K beams do not all grow the same prefix.
    first = jnp.where(jnp.arange(k) == 0, 0.0, _NEG_INF)
    progress = None if cons is None else jnp.zeros((batch, k, cons.lengths.shape[1]), jnp.int32)
    alive = _Alive(tokens, jnp.broadcast_to(first, (batch, k)), history, coverage, new_states, progress)
    fin = _Finished(
        tokens,
        jnp.zeros((batch, k), jnp.int32),
        jnp.full((batch, k), _NEG_INF),
        jnp.full((batch, k), _NEG_INF),
        history,
        jnp.zeros((batch, k), jnp.bool_),
        None if cons is None else jnp.zeros((batch, k), jnp.int32),
    )
    alive, fin = advance(0, alive, fin, logp, new_states, attn)

    def cond(carry):
        t, alive, _ = carry
        return (t < length) & jnp.any(alive.log_probs > _NEG_INF)

    def body(carry):
        t, alive, fin = carry
        prev = jax.lax.dynamic_index_in_dim(alive.tokens, t - 1, axis=2, keepdims=False).reshape(-1)
        logp, new_states, attn = decode(alive.states, prev)
        alive, fin = advance(t, alive, fin, logp, new_states, attn)
        return t + 1, alive, fin

    _, _, fin = jax.lax.while_loop(cond, body, (jnp.int32(1), alive, fin))

    top = jax.tree.map(lambda x: x[:, :num_return], fin)
    valid = top.scores > _NEG_INF
    attention = top.attention
    if attention is not None:
        attention = jnp.where(valid[..., None, None], attention, 0.0)
    return BeamResult(
        tokens=jnp.where(valid[..., None], top.tokens, pad_id),
        lengths=jnp.where(valid, top.lengths, 0),
        scores=top.scores,
        log_probs=top.log_probs,
        attention=attention,
        truncated=valid & top.truncated,
        limits=limit,
        unmet_constraints=None if cons is None else jnp.where(valid, top.unmet, 0),
    )


_search_jit = jax.jit(
    _search,
    static_argnames=(
        "graphdefs",
        "beam_size",
        "num_return",
        "length",
        "bos_id",
        "eos_id",
        "pad_id",
        "no_repeat_ngram",
        "min_length",
    ),
)


def ensemble_step(
    models, encs, dec_states, prev, shape: tuple[int, int, int], special: tuple[int, int, int], *, raw=False
):
    """One decoding position for every ensemble member: the members' log-softmax averaged ``[B, K, V]``, their
    new states, and their attention averaged ``[B, K, S]`` (None when no member returns one). With ``raw`` and
    one member, the member's float32 logits instead of their log-softmax.

    ``shape`` is ``(B, K, S)``, the rows being ``B·K`` hypotheses; ``special`` is ``(bos, eos, pad)``, each
    checked against the vocabulary. Beam search and sampling share it, so both check members alike.
    """
    batch, k, src_len = shape
    logps, new_states, attns = [], [], []
    for i, (m, enc, dec) in enumerate(zip(models, encs, dec_states, strict=True)):
        logits, dec, attn = m.decode_step(enc, dec, prev)
        if logits.ndim != 2 or logits.shape[0] != batch * k:
            raise ValueError(f"model {i}: decode_step logits must be [B*K, V], got {list(logits.shape)}")
        if logps and logits.shape[-1] != logps[0].shape[-1]:
            raise ValueError(
                f"ensemble members disagree on the target vocabulary: model 0 has "
                f"{logps[0].shape[-1]} words, model {i} has {logits.shape[-1]}"
            )
        if attn is not None and tuple(attn.shape) != (batch * k, src_len):
            raise ValueError(
                f"model {i}: decode_step attention must be [B*K, S] = {[batch * k, src_len]}, "
                f"got {list(attn.shape)}"
            )
        logits = logits.astype(jnp.float32)
        logps.append(logits if raw and len(models) == 1 else jax.nn.log_softmax(logits, axis=-1))
        new_states.append(dec)
        if attn is not None:
            attns.append(attn.astype(jnp.float32))
    vocab = logps[0].shape[-1]
    if max(special) >= vocab:
        bos_id, eos_id, pad_id = special
        raise ValueError(
            f"token ids bos={bos_id} eos={eos_id} pad={pad_id} must be < the vocabulary size {vocab}"
        )
    logp = (sum(logps) / len(logps)).reshape(batch, k, vocab)
    attn = None if not attns else (sum(attns) / len(attns)).reshape(batch, k, src_len)
    return logp, tuple(new_states), attn
