"""Score given translations: the log-probability a trained model gives each target sentence of its source,
by teacher forcing through the same forward pass as the trainer's loss."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from attn_jax.pipeline._length import model_length_cap
from attn_jax.pipeline._load import LoadedModel, TranslateError
from attn_jax.pipeline._translate import length_batches, pad_rows

__all__ = ["ScoredPair", "score_pairs"]


class ScoredPair(NamedTuple):
    """The model's score of one (source, target) pair.

    Attributes:
      total: ``log P(Y | X)``, summed over the target tokens and the final ``</s>``.
      per_token: ``total / tokens``.
      tokens: target tokens scored, ``</s>`` included.
      target_unk: target tokens the target vocabulary maps to ``<unk>`` (scored as ``<unk>``).
    """

    total: float
    per_token: float
    tokens: int
    target_unk: int


@functools.cache
def _log_likelihoods():
    """The jitted ``(graphdef, state, src, src_mask, tgt_in, tgt_out, tgt_mask) -> [B]`` summed target
    log-probabilities; built on first use so that ``attn-jax --help`` does not import JAX."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def score(graphdef, state, src, src_mask, tgt_in, tgt_out, tgt_mask):
        logits, _ = nnx.merge(graphdef, state)(src, src_mask, tgt_in)  # [B, T, V]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(logp, tgt_out[..., None], axis=-1)[..., 0]  # [B, T]
        return jnp.sum(jnp.where(tgt_mask, picked, 0.0), axis=-1)

    return jax.jit(score, static_argnums=0)


def score_pairs(
    loaded: LoadedModel, sources: Sequence[str], targets: Sequence[str], *, batch_size: int = 32
) -> list[ScoredPair]:
    """The log-probability the model gives each target sentence of its source (teacher forcing).

    ``log P(Y | X) = Σ_{t=1..m+1} log p(y_t | y_<t, X)`` with ``y_{m+1} = </s>``: the negative of the trainer's
    cross-entropy sum without label smoothing. Sources end in ``</s>`` as in training. Pairs are batched by
    length as :func:`translate_sentences` batches sentences; padding changes no score. An ensemble
    (:func:`load_ensemble`) gives the mean of its members' ``log P(Y | X)``, as its beam search averages them.

    Args:
      loaded: the model and vocabularies (:func:`load_model` or :func:`load_ensemble`).
      sources: source sentences, whitespace-tokenised like the training corpus.
      targets: one target sentence per source.
      batch_size: pairs per batch.

    Returns:
      One :class:`ScoredPair` per pair, in input order.

    Raises:
      TranslateError: different counts, a copy model, or a pair longer than the model can read (the
        Transformer's ``max_length`` positions, ``</s>`` included): such pairs are refused, never truncated.
    """
    from flax import nnx

    if len(sources) != len(targets):
        raise TranslateError(f"{len(sources)} sources but {len(targets)} targets")
    if batch_size < 1:
        raise TranslateError(f"batch size must be >= 1, got {batch_size}")
    if getattr(getattr(loaded.model, "config", None), "copy", False):
        raise TranslateError("scoring is not available for copy models (model.copy)")
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    src_ids = [sv.encode(s) for s in sources]
    tgt_ids = [tv.encode(t) for t in targets]
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids, strict=True)]
    cap = model_length_cap(loaded.model)
    if cap is not None:
        over = [i for i, n in enumerate(lengths) if n > cap]
        if over:
            i = over[0]
            raise TranslateError(
                f"{len(over)} pair(s) longer than the model's {cap} positions (</s> included), first line "
                f"{i + 1}: {len(src_ids[i])} source and {len(tgt_ids[i])} target tokens; not truncated"
            )
    models = loaded.model if isinstance(loaded.model, tuple) else (loaded.model,)
    splits = [nnx.split(m) for m in models]
    out: list[ScoredPair | None] = [None] * len(sources)
    for chunk, width, rows in length_batches(lengths, batch_size):
        if cap is not None:  # a learned position table has only cap rows; every pair fits in them (above)
            width = min(width, cap)
        src, mask = pad_rows([src_ids[i] for i in chunk], width, rows, sv.eos_id, sv.pad_id)
        tgt_in = np.full((rows, width), tv.pad_id, np.int32)
        tgt_out = np.full((rows, width), tv.pad_id, np.int32)
        tgt_len = np.zeros(rows, np.int32)
        for r, i in enumerate(chunk):
            t = tgt_ids[i]
            tgt_in[r, 0] = tv.bos_id
            tgt_in[r, 1 : len(t) + 1] = t
            tgt_out[r, : len(t)] = t
            tgt_out[r, len(t)] = tv.eos_id
            tgt_len[r] = len(t) + 1
        tgt_mask = np.arange(width) < tgt_len[:, None]
        batch = (src, mask, tgt_in, tgt_out, tgt_mask)
        totals = np.mean(
            [np.asarray(_log_likelihoods()(g, s, *batch), np.float64) for g, s in splits], axis=0
        )
        for r, i in enumerate(chunk):
            total, n = float(totals[r]), int(tgt_len[r])
            unk = sum(1 for x in tgt_ids[i] if x == tv.unk_id)
            out[i] = ScoredPair(total, total / n, n, unk)
    return out  # type: ignore[return-value]
