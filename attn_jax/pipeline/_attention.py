"""A run's attention outside beam search: teacher-forced on references, every layer and head on references and on
its own translations, and the sentences whose attention is drawn (the paper's Figure 3)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from attn_jax.pipeline._load import LoadedModel
from attn_jax.pipeline._options import AttentionChoice
from attn_jax.pipeline._translate import Translation, length_batches, pad_rows, padded_width

__all__ = [
    "HeatmapPick",
    "choose_attention",
    "figure3_examples",
    "hypothesis_cross_attention",
    "reference_attention",
    "reference_cross_attention",
    "sharpest_head",
]


@functools.cache
def _teacher_forced():
    """The jitted ``(graphdef, state, src, src_mask, tgt_in) -> attention [B, T, S]`` (None without attention);
    built on first use so that ``attn-jax --help`` does not import JAX."""
    import jax
    from flax import nnx

    def attention(graphdef, state, src, src_mask, tgt_in, src_ext=None):
        model = nnx.merge(graphdef, state)
        if src_ext is not None:  # a copy model (RNNsearch model.copy) reads the extended source too
            return model(src, src_mask, tgt_in, src_ext)[1]
        _, weights = model(src, src_mask, tgt_in)
        return weights

    return jax.jit(attention, static_argnums=0)


def _reference_batches(loaded: LoadedModel, sources, references, batch_size: int, one_shape: bool):
    """``(chunk, src, src_mask, tgt_in, src_ext)`` per batch: the references teacher-forced after ``<s>``."""
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    src_ids = [sv.encode(s) for s in sources]
    tgt_ids = [tv.encode(r) for r in references]
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids, strict=True)]
    for chunk, width, rows in length_batches(lengths, batch_size, one_shape=one_shape):
        src, mask = pad_rows([src_ids[i] for i in chunk], width, rows, sv.eos_id, sv.pad_id)
        tgt_in = np.full((rows, width), tv.pad_id, np.int32)
        for r in range(rows):
            t = tgt_ids[chunk[r]] if r < len(chunk) else tgt_ids[chunk[0]]
            tgt_in[r, 0] = tv.bos_id
            tgt_in[r, 1 : len(t) + 1] = t
        src_ext = None
        if getattr(getattr(loaded.model, "config", None), "copy", False):
            from attn_jax.data import extend_with_source

            ext = [extend_with_source(sources[i], "", tv)[0] for i in chunk]
            src_ext = pad_rows(ext, width, rows, tv.eos_id, tv.pad_id)[0]
        yield chunk, src, mask, tgt_in, src_ext


def reference_attention(
    loaded: LoadedModel,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    batch_size: int = 32,
    one_shape: bool = False,
    choice: AttentionChoice | None = None,
) -> list[np.ndarray] | None:
    """Teacher-forced attention on each reference: ``[m + 1, n + 1]`` per sentence (rows: the ``m`` reference
    tokens then ``</s>``; columns: the ``n`` source tokens then ``</s>``); None for a model without attention.
    An ensemble gives the mean of its members' attention (members without attention left out), as its beam
    search does. ``one_shape``: every batch at one padded shape (:func:`length_batches`), one compilation.
    ``choice``: a multi-head model's decoder layer and head (:class:`AttentionChoice`, checked against the
    model; None or the default: the last layer's mean of heads, the model's own output)."""
    from flax import nnx

    if choice is not None and not choice.is_default:
        layer, head = choice.check(loaded)
        chosen: list[np.ndarray | None] = [None] * len(sources)
        for i, heads, means in reference_cross_attention(
            loaded, sources, references, batch_size=batch_size, one_shape=one_shape
        ):
            chosen[i] = means[layer] if head is None else heads[layer, head]
        return chosen  # type: ignore[return-value]
    models = loaded.model if isinstance(loaded.model, tuple) else (loaded.model,)
    splits = [nnx.split(m) for m in models]
    out: list[np.ndarray | None] = [None] * len(sources)
    n_src = [len(loaded.src_vocab.encode(s)) for s in sources]
    n_tgt = [len(loaded.tgt_vocab.encode(r)) for r in references]
    for chunk, src, mask, tgt_in, src_ext in _reference_batches(
        loaded, sources, references, batch_size, one_shape
    ):
        found = [_teacher_forced()(g, s, src, mask, tgt_in, src_ext) for g, s in splits]
        found = [np.asarray(w) for w in found if w is not None]
        if not found:
            return None
        weights = np.mean(found, axis=0)
        for r, i in enumerate(chunk):
            out[i] = weights[r, : n_tgt[i] + 1, : n_src[i] + 1]
    return out  # type: ignore[return-value]


@functools.cache
def _cross_attention_layers():
    """The jitted ``(graphdef, state, src, src_mask, tgt_in) -> (heads [B, L_dec, H, T, S], means
    [B, L_dec, T, S])``: every decoder layer's heads and their mean, from one teacher-forced pass."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def layers(graphdef, state, src, src_mask, tgt_in):
        heads = nnx.merge(graphdef, state).cross_attention_weights(src, src_mask, tgt_in)
        return heads, jnp.mean(heads, axis=2)  # the mean the decoder takes of its heads

    return jax.jit(layers, static_argnums=0)


def reference_cross_attention(
    loaded: LoadedModel,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    batch_size: int = 32,
    one_shape: bool = False,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Every decoder layer's cross-attention heads, teacher-forced on each reference, one pass per batch.

    Yields ``(i, heads, means)`` for every sentence ``i`` (in batch order, not corpus order): ``heads`` is
    float32 ``[L_dec, H, m + 1, n + 1]`` and ``means`` ``[L_dec, m + 1, n + 1]`` the mean over heads, rows
    and columns laid out as :func:`reference_attention`'s. The batches are :func:`reference_attention`'s.
    A model without ``cross_attention_weights`` (the RNNs) or an ensemble yields nothing.
    """
    from flax import nnx

    if isinstance(loaded.model, tuple) or not hasattr(loaded.model, "cross_attention_weights"):
        return
    graphdef, state = nnx.split(loaded.model)
    n_src = [len(loaded.src_vocab.encode(s)) for s in sources]
    n_tgt = [len(loaded.tgt_vocab.encode(r)) for r in references]
    for chunk, src, mask, tgt_in, _ in _reference_batches(loaded, sources, references, batch_size, one_shape):
        heads, means = (np.asarray(x) for x in _cross_attention_layers()(graphdef, state, src, mask, tgt_in))
        for r, i in enumerate(chunk):
            m, n = n_tgt[i] + 1, n_src[i] + 1
            yield i, heads[r, :, :, :m, :n], means[r, :, :m, :n]


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

    from attn_jax.decoding import model_length_cap

    if not hasattr(loaded.model, "cross_attention_weights"):
        return None
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    src_ids = sv.encode(source)
    n, m = len(src_ids), len(hypothesis.ids)
    # Padded to one of a few widths (few compiled programs), within the model's positions; the causal
    # decoder's rows ignore the padded tail.
    need, cap = max(n, m) + 1, model_length_cap(loaded.model)
    width = max(need, min(padded_width(need), cap)) if cap else padded_width(need)
    src, mask = pad_rows([src_ids], width, 1, sv.eos_id, sv.pad_id)
    tgt_in = np.full((1, width), tv.pad_id, np.int32)
    tgt_in[0, : m + 1] = [tv.bos_id, *hypothesis.ids]
    graphdef, state = nnx.split(loaded.model)
    weights = np.asarray(_cross_attention_heads()(graphdef, state, src, mask, tgt_in))  # [1, L_dec, H, T, S]
    return weights[0, -1, :, : m + 1, : n + 1]


def choose_attention(
    loaded: LoadedModel,
    sources: Sequence[str],
    translations: Sequence[list[Translation]],
    choice: AttentionChoice,
    *,
    batch_size: int = 32,
) -> list[list[Translation]]:
    """``translations`` with each hypothesis' ``attention`` replaced by one decoder layer or head's.

    Each hypothesis is teacher-forced (``<s>`` then its ids) through ``cross_attention_weights``, one pass
    per batch; a causal decoder run on its own output reproduces the attention it had while decoding. The
    default choice returns ``translations`` as they are (the decoder's last-layer mean of heads). A choice
    the model cannot give raises :class:`AttentionChoiceError` (:meth:`AttentionChoice.check`).
    """
    from flax import nnx

    from attn_jax.decoding import model_length_cap

    layer, head = choice.check(loaded)
    if choice.is_default:
        return list(translations)
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    # Blank lines have no attention to replace.
    items = [
        (i, k) for i, hyps in enumerate(translations) for k, h in enumerate(hyps) if h.attention is not None
    ]
    src_ids = {i: sv.encode(sources[i]) for i, _ in items}
    lengths = [max(len(src_ids[i]), len(translations[i][k].ids)) + 1 for i, k in items]
    cap = model_length_cap(loaded.model)
    graphdef, state = nnx.split(loaded.model)
    out = [list(hyps) for hyps in translations]
    for chunk, width, rows in length_batches(lengths, batch_size):
        # Within the model's positions; the causal decoder's rows ignore the padded tail.
        width = max(max(lengths[c] for c in chunk), min(width, cap)) if cap else width
        pairs = [items[c] for c in chunk]
        src, mask = pad_rows([src_ids[i] for i, _ in pairs], width, rows, sv.eos_id, sv.pad_id)
        tgt_in = np.full((rows, width), tv.pad_id, np.int32)
        for r in range(rows):  # missing rows repeat the first, as pad_rows' sources do
            i, k = pairs[r] if r < len(pairs) else pairs[0]
            tgt_in[r, : len(translations[i][k].ids) + 1] = [tv.bos_id, *translations[i][k].ids]
        heads, means = (np.asarray(x) for x in _cross_attention_layers()(graphdef, state, src, mask, tgt_in))
        for r, (i, k) in enumerate(pairs):
            h = translations[i][k]
            m, n = len(h.ids) + 1, len(src_ids[i]) + 1
            chosen = means[r, layer] if head is None else heads[r, layer, head]
            out[i][k] = h._replace(attention=chosen[:m, :n])
    return out


def sharpest_head(weights: np.ndarray) -> int:
    """The head whose attention rows have the lowest mean entropy (the most alignment-like): ``weights`` is
    ``[H, T, S]`` with rows summing to 1; ties go to the lowest index.

    >>> sharpest_head(np.array([[[0.5, 0.5]], [[0.9, 0.1]], [[0.1, 0.9]]]))
    1
    """
    w = np.asarray(weights, np.float64)
    entropy = -np.sum(w * np.log(np.where(w > 0, w, 1.0)), axis=-1).mean(axis=-1)  # [H]
    return int(np.argmin(entropy))


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
