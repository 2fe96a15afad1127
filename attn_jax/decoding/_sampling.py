"""Batched sampling (ancestral, with temperature, top-k and top-p) over the step interface of
``attn_jax.models.interface``.

One compiled program per (models, samples per sentence, output length, ``k``, whether a nucleus is cut, token
ids, input shapes): a ``lax.while_loop`` over target positions with static shapes, as in beam search. Every
sentence keeps ``N`` independent samples; each draws its next word from the model's distribution reshaped by
the temperature, then cut to the ``k`` most probable words, then to the nucleus of probability ``p`` (the order
of Hugging Face's logits warpers and fairseq's sampling). A sample ends at its own ``</s>`` or at its sentence's
length limit, where ``</s>`` is forced and the cut is flagged, as beam search does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_jax.decoding._beam import (
    BeamResult,
    _block_repeats,
    _check_limits,
    _check_models,
    _is_int,
    ensemble_step,
    output_length,
)
from attn_jax.models.interface import check_source, for_decoding, initial_state, repeat_batch
from attn_jax.typing import Array, ArrayLike, Bool, Float, Int

__all__ = ["Sampling", "sample_decode"]

_NEG_INF = float("-inf")
_TRACE_COUNT = [0]  # incremented each time the sampler is traced (compiled); tests assert no retracing


class Sampling(NamedTuple):
    """How to draw translations instead of searching for the best one (:func:`sample_decode`).

    Attributes:
      temperature: ``T > 0``; the next word is drawn from ``softmax(log P / T)``. Below 1 it sharpens the
        model's distribution, above 1 it flattens it; 1 samples the model itself.
      top_k: draw only among the ``k`` most probable words (after the temperature); 0: no cut.
      top_p: draw only from the nucleus, the fewest most probable words whose probability (after the
        temperature and the top-k cut, renormalised) sums to at least ``p``, and any word tied with the last
        of them; 1: no cut.
      seed: the seed of the draws; the same seed gives the same translations.

    >>> Sampling(temperature=0.7, top_p=0.9).check().top_p
    0.9
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def check(self) -> Sampling:
        """``self``, or a one-line ValueError naming the field out of range."""
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not (isinstance(t, int | float) and math.isfinite(t) and t > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {t!r}")
        if not _is_int(k) or k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0: no cut), got {k!r}")
        if isinstance(p, bool) or not (isinstance(p, int | float) and 0 < p <= 1):
            raise ValueError(f"top_p must be a number in (0, 1] (1: no cut), got {p!r}")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        return self


def sample_decode(
    model: nnx.Module | Sequence[nnx.Module],
    src: Int[Array, "B S"],
    src_mask: Bool[Array, "B S"],
    key: int | jax.Array,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    num_samples: int = 1,
    ids: Int[ArrayLike, " B"] | None = None,
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
) -> BeamResult:
    """Batched, jit-compiled sampling of ``num_samples`` translations per sentence.

    At each position a sample draws its next word ``y_t`` from the model's distribution, reshaped::

        q(y) ∝ exp(log P(y | y_<t, x) / T)        T: temperature
        then q is cut to the top_k most probable words, renormalised,
        then to the nucleus: the fewest most probable words whose q sums to >= top_p (with any word tied
        with the last of them), renormalised

    (temperature, then top-k, then top-p, as Hugging Face's logits warpers; Holtzman et al. 2020 for the
    nucleus). ``top_k = 1``, or a temperature near 0, is greedy decoding. ``pad_id`` and ``bos_id`` are never
    drawn. The scores reported are the model's own: ``log_probs`` sums ``log P(y_t | y_<t, x)`` of the words
    drawn, not the reshaped ``q``, so they compare with beam search's.

    Randomness: sentence ``b`` draws from ``fold_in(key, ids[b])`` (``ids`` defaults to ``0 .. B-1``), and
    position ``t`` from ``fold_in`` of that with ``t``. So the same key gives the same samples, different
    sentences (even equal ones) draw independently, and a sentence draws the same words in any batch that
    gives it the same id. Its ``N`` samples are independent draws.

    Length limit: as :func:`beam_search`'s (``max_length``, ``max_length_ratio``, ``max_length_offset`` or
    ``limits``). At a sentence's last position the sample still draws, but its token is ``</s>``, scored with
    its true probability. When the draw was another word, the sample was cut by the limit and
    :attr:`BeamResult.truncated` says so. ``no_repeat_ngram`` and ``min_length`` forbid words as in
    :func:`beam_search`; a sample left with no allowed word ends empty (length 0, ``log_probs`` ``-inf``).

    Ensembles: several models with the same target vocabulary; each step uses the mean of their
    log-softmax outputs, and the mean of their attention, as :func:`beam_search` does.

    The compiled sampler is cached on the models' graph definitions, ``num_samples``, the output width, ``k``,
    whether ``top_p < 1``, the token ids and the input shapes. The key, ids, temperature, ``top_p`` and the
    limits are runtime values: changing them never recompiles.

    Args:
      model: an NNX module with the step interface, or a sequence of them (an ensemble).
      src: ``[B, S]`` integer source token ids.
      src_mask: ``[B, S]`` boolean, True at real tokens (right padding).
      key: a ``jax.random`` key, or an int seed for ``jax.random.key``.
      temperature: ``T > 0``.
      top_k: ``k >= 0``; 0: no cut (a ``k`` above the vocabulary size is no cut either).
      top_p: ``p`` in ``(0, 1]``; 1: no cut.
      num_samples: ``N >= 1`` samples per sentence.
      ids: ``[B]`` ints, the number each sentence draws its words by (default ``0 .. B-1``).
      max_length, max_length_ratio, max_length_offset, limits: the length limit, as :func:`beam_search`'s.
      bos_id, eos_id, pad_id: the target vocabulary's ``<s>``, ``</s>`` and padding ids.
      src_ext: ``[B, S]`` the source in the extended target vocabulary, for a model that copies source words.
      no_repeat_ngram, min_length: repetition control, as :func:`beam_search`'s (0: off; static).

    Returns:
      A :class:`BeamResult` with ``[B, N, ...]`` fields: the samples sorted by ``log_probs``, most probable
      first; ``scores`` equal ``log_probs`` (no length normalisation).

    >>> from attn_jax.models import RNNConfig, RNNsearch
    >>> cfg = RNNConfig(src_vocab=11, tgt_vocab=13, embed=4, hidden=6, maxout=3, align=5)
    >>> m = RNNsearch(cfg, rngs=nnx.Rngs(0))
    >>> src, mask = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), bool)
    >>> out = sample_decode(m, src, mask, 0, top_p=0.9, num_samples=3, max_length=5)
    >>> out.tokens.shape, bool((out.tokens == sample_decode(m, src, mask, 0, top_p=0.9, num_samples=3,
    ...                                                      max_length=5).tokens).all())
    ((2, 3, 5), True)
    """
    models = _check_models(model)
    check_source(src, src_mask)
    Sampling(temperature, top_k, top_p).check()
    if not _is_int(num_samples) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    batch = src.shape[0]
    limits = _check_limits(limits, batch)
    if ids is None:
        ids = np.arange(batch, dtype=np.int32)
    else:
        ids = np.asarray(ids)
        if ids.shape != (batch,) or not np.issubdtype(ids.dtype, np.integer) or (batch and ids.min() < 0):
            raise ValueError(
                f"ids must be {batch} ints >= 0 (one per sentence), got {ids.dtype} {list(ids.shape)}"
            )
    _check_lengths_and_ids(max_length, max_length_ratio, limits, max_length_offset, bos_id, eos_id, pad_id)
    for name, value in (("no_repeat_ngram", no_repeat_ngram), ("min_length", min_length)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name} must be a non-negative int (0: off), got {value!r}")
    if _is_int(key):
        key = jax.random.key(key)
    src, src_mask = jnp.asarray(src, jnp.int32), jnp.asarray(src_mask, jnp.bool_)
    if limits is not None:
        length = max_length if max_length is not None else int(limits.max())
        limit = jnp.clip(jnp.asarray(limits, jnp.int32), 1, length)
    else:
        length = output_length(src.shape[1], max_length, max_length_ratio, max_length_offset)
        if max_length_ratio is None:
            limit = jnp.full((batch,), length, jnp.int32)
        else:
            real = jnp.sum(src_mask, axis=-1).astype(jnp.float32)  # [B]
            limit = jnp.floor(jnp.float32(max_length_ratio) * real + 1e-4).astype(jnp.int32)
            limit = jnp.clip(limit + max_length_offset, 1, length)
    graphdefs, states = zip(*(nnx.split(m) for m in models), strict=True)
    return _sample_jit(
        tuple(graphdefs),
        tuple(states),
        src,
        src_mask,
        limit,
        key,
        jnp.asarray(ids, jnp.uint32),
        jnp.float32(temperature),
        jnp.float32(top_p),
        None if src_ext is None else jnp.asarray(src_ext, jnp.int32),
        num_samples=num_samples,
        length=length,
        top_k=top_k,
        nucleus=top_p < 1,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
        no_repeat_ngram=no_repeat_ngram,
        min_length=min_length,
    )


def _check_lengths_and_ids(max_length, ratio, limits, offset, bos_id, eos_id, pad_id) -> None:
    """Raise a one-line ValueError for a length option or token id out of range (as beam search's)."""
    if max_length is not None and (not _is_int(max_length) or max_length < 1):
        raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
    if limits is None:
        if ratio is not None and not (isinstance(ratio, int | float) and math.isfinite(ratio) and ratio > 0):
            raise ValueError(f"max_length_ratio must be a positive finite number or None, got {ratio!r}")
        if max_length is None and ratio is None:
            raise ValueError("give max_length or max_length_ratio (both are None)")
    if not _is_int(offset) or offset < 0:
        raise ValueError(f"max_length_offset must be a non-negative int, got {offset!r}")
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if eos_id in (bos_id, pad_id):
        raise ValueError(
            f"eos_id must differ from bos_id and pad_id, got eos={eos_id} bos={bos_id} pad={pad_id}"
        )


# ----------------------------------------------------------------------------------------------- sampler


class _Samples(NamedTuple):
    """The ``N`` samples of each sentence while they grow (``lengths`` 0 until a sample ends)."""

    tokens: Int[Array, "B N L"]
    lengths: Int[Array, "B N"]
    log_probs: Float[Array, "B N"]
    attention: Float[Array, "B N L S"] | None
    truncated: Bool[Array, "B N"]  # ended at the length limit where the draw was another word
    dead: Bool[Array, "B N"]  # left with no allowed word (repetition control): returned empty
    states: tuple[Any, ...]  # one decoder state per model, rows b·N + n


def _nucleus(logits: Float[Array, "... C"], top_p: Float[Array, ""]) -> Bool[Array, "... C"]:
    """The nucleus of ``softmax(logits)``: the words whose probability is at least the largest threshold ``τ``
    with ``Σ_{q ≥ τ} q ≥ top_p``, i.e. the fewest most probable words reaching ``top_p`` (all of a tie).

    ``τ`` is found by bisection over the bit patterns of float32 (ordered like the non-negative floats they
    encode): 31 masked sums find it exactly, where sorting the vocabulary every step costs several times more.
    """
    finite = jnp.isfinite(jnp.max(logits, axis=-1, keepdims=True))
    probs = jax.nn.softmax(jnp.where(finite, logits, 0.0), axis=-1)  # a row with no word left stays NaN-free
    bits = jax.lax.bitcast_convert_type(probs, jnp.int32)
    lo = jnp.zeros(bits.shape[:-1], jnp.int32)  # Σ_{q ≥ lo} q ≥ top_p (all words)
    hi = jnp.max(bits, axis=-1) + 1  # Σ_{q ≥ hi} q = 0 < top_p

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = jnp.sum(jnp.where(bits >= mid[..., None], probs, 0.0), axis=-1) >= top_p
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, hi))
    return bits >= lo[..., None]  # the most probable word always stays: lo < hi <= its bits + 1


def _draw(
    keys: Array,
    logp: Float[Array, "B N V"],
    temperature: Float[Array, ""],
    top_p: Float[Array, ""],
    top_k: int,
    nucleus: bool,
) -> Int[Array, "B N"]:
    """One word per sample from ``logp`` reshaped by the temperature, the top-k cut and the nucleus cut."""
    logits = logp / temperature
    words = None
    if 0 < top_k < logp.shape[-1]:
        logits, words = jax.lax.top_k(logits, top_k)  # [B, N, k]: the draw picks among these candidates
    if nucleus:
        logits = jnp.where(_nucleus(logits, top_p), logits, _NEG_INF)
    draw = jax.vmap(jax.random.categorical)(keys, logits)  # [B, N]: one key per sentence
    if words is not None:
        draw = jnp.take_along_axis(words, draw[..., None], axis=-1)[..., 0]
    return draw.astype(jnp.int32)


def _sample(
    graphdefs,
    states,
    src,
    src_mask,
    limit,
    key,
    ids,
    temperature,
    top_p,
    src_ext=None,
    *,
    num_samples,
    length,
    top_k,
    nucleus,
    bos_id,
    eos_id,
    pad_id,
    no_repeat_ngram=0,
    min_length=0,
):
    """The traced sampler; ``_sample_jit`` caches one compilation per static configuration."""
    _TRACE_COUNT[0] += 1
    models = [for_decoding(nnx.merge(g, s)) for g, s in zip(graphdefs, states, strict=True)]
    batch, src_len = src.shape
    n = num_samples
    rows = batch * n

    # The encoder runs once per sentence; its output is tiled to the samples: rows b·N .. b·N + N - 1.
    encs, dec0 = [], []
    for m in models:
        enc = m.encode(src, src_mask) if src_ext is None else m.encode(src, src_mask, src_ext)
        dec0.append(repeat_batch(initial_state(m, enc, length), n))
        encs.append(repeat_batch(enc, n))
    sentence_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)  # [B]

    def decode(dec_states, prev):
        """One position for every model: averaged log-probs ``[B, N, V]``, new states, attention ``[B, N, S]``."""
        return ensemble_step(models, encs, dec_states, prev, (batch, n, src_len), (bos_id, eos_id, pad_id))

    def advance(t, smp: _Samples, logp, new_states, attn) -> _Samples:
        """Draw position ``t`` of every live sample; end it at its ``</s>`` or its limit."""
        vocab = logp.shape[-1]
        word_ids = jnp.arange(vocab)
        at_limit = (t + 1 >= limit)[:, None, None]  # [B, 1, 1]: the last token a sentence may have
        if no_repeat_ngram or min_length:  # static: with both off the sampler has no extra operation
            logp = _block_repeats(logp, smp.tokens, t, at_limit, no_repeat_ngram, min_length, eos_id)
        logp = jnp.where((word_ids == pad_id) | (word_ids == bos_id), _NEG_INF, logp)
        live = (smp.lengths == 0) & ~smp.dead  # [B, N]
        empty = jnp.max(logp, axis=-1) == _NEG_INF  # [B, N]: no word allowed, the sample dies
        step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(sentence_keys, t)  # [B]
        drawn = _draw(step_keys, logp, temperature, top_p, top_k, nucleus)  # [B, N]
        # At the limit the draw only tells whether the model chose </s> itself; the token is </s> either way.
        word = jnp.where(at_limit[..., 0], eos_id, drawn)
        word_lp = jnp.take_along_axis(logp, word[..., None], axis=-1)[..., 0]
        active = live & ~empty
        tokens = jax.lax.dynamic_update_index_in_dim(smp.tokens, jnp.where(active, word, pad_id), t, axis=2)
        history = smp.attention
        if attn is not None:
            row = jnp.where(active[..., None], attn, 0.0)
            history = jax.lax.dynamic_update_index_in_dim(history, row, t, axis=2)
        ends = active & (word == eos_id)
        return _Samples(
            tokens=tokens,
            lengths=jnp.where(ends, t + 1, smp.lengths),
            log_probs=smp.log_probs + jnp.where(active, word_lp, 0.0),
            attention=history,
            truncated=smp.truncated | (active & at_limit[..., 0] & (drawn != eos_id)),
            dead=smp.dead | (live & empty),
            states=new_states,
        )

    dec0 = tuple(dec0)
    logp, new_states, attn = decode(dec0, jnp.full((rows,), bos_id, jnp.int32))
    smp = _Samples(
        tokens=jnp.full((batch, n, length), pad_id, jnp.int32),
        lengths=jnp.zeros((batch, n), jnp.int32),
        log_probs=jnp.zeros((batch, n), jnp.float32),
        attention=None if attn is None else jnp.zeros((batch, n, length, src_len), jnp.float32),
        truncated=jnp.zeros((batch, n), jnp.bool_),
        dead=jnp.zeros((batch, n), jnp.bool_),
        states=dec0,
    )
    smp = advance(0, smp, logp, new_states, attn)

    def cond(carry):
        t, smp = carry
        return (t < length) & jnp.any((smp.lengths == 0) & ~smp.dead)

    def body(carry):
        t, smp = carry
        prev = jax.lax.dynamic_index_in_dim(smp.tokens, t - 1, axis=2, keepdims=False).reshape(-1)
        logp, new_states, attn = decode(smp.states, prev)
        return t + 1, advance(t, smp, logp, new_states, attn)

    _, smp = jax.lax.while_loop(cond, body, (jnp.int32(1), smp))

    valid = ~smp.dead
    log_probs = jnp.where(valid, smp.log_probs, _NEG_INF)
    _, order = jax.lax.top_k(log_probs, n)  # most probable first; stable on ties
    take = lambda x: jnp.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1)  # noqa: E731
    valid = take(valid)
    attention = smp.attention
    if attention is not None:
        attention = jnp.where(valid[..., None, None], take(attention), 0.0)
    log_probs = take(log_probs)
    return BeamResult(
        tokens=jnp.where(valid[..., None], take(smp.tokens), pad_id),
        lengths=jnp.where(valid, take(smp.lengths), 0),
        scores=log_probs,
        log_probs=log_probs,
        attention=attention,
        truncated=valid & take(smp.truncated),
        limits=limit,
    )


_sample_jit = jax.jit(
    _sample,
    static_argnames=(
        "graphdefs",
        "num_samples",
        "length",
        "top_k",
        "nucleus",
        "bos_id",
        "eos_id",
        "pad_id",
        "no_repeat_ngram",
        "min_length",
    ),
)
