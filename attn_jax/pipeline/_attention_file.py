"""``attention.npz``: every evaluated sentence's attention, on the model's own translation and teacher-forced on
the reference, every decoder layer and head of a multi-head model; what ``attn-jax report`` draws.

The file (``numpy.load`` reads it without pickle):

- ``meta``: a JSON string: ``format`` (1), ``layers`` and ``heads`` (1 and 1 for a single-attention RNN),
  ``views`` (the views present, a subset of ``["hypothesis", "reference"]``; empty for a model without
  attention), ``note`` (why a view or the heads are missing, or null), ``source_tokens``, ``target_tokens``
  (per view: the row labels of each sentence, without ``</s>``) and ``gold`` (the corpus' Pharaoh strings,
  source index then reference index, or null).
- ``<view>_shapes``: int32 ``[N, 4]``, per sentence ``(L, H, m + 1, n + 1)``; ``m + 1`` rows (target tokens then
  ``</s>``), ``n + 1`` columns (source tokens then ``</s>``). A sentence with nothing decoded has ``m + 1 = 0``.
- ``<view>_weights``: float16, the ``[L, H, m + 1, n + 1]`` arrays of all sentences, flattened and concatenated
  in corpus order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from attn_jax.pipeline._attention import _cross_attention_layers, reference_attention
from attn_jax.pipeline._load import LoadedModel
from attn_jax.pipeline._translate import Translation, _token_strings, length_batches, pad_rows

__all__ = ["save_attention_arrays", "write_attention_file"]

ATTENTION_FORMAT = 1


def write_attention_file(
    path: str | os.PathLike,
    loaded: LoadedModel,
    sources: Sequence[str],
    references: Sequence[str],
    translations: Sequence[list[Translation]],
    *,
    gold: Sequence[str] | None = None,
    batch_size: int = 32,
    one_shape: bool = False,
) -> dict:
    """Write ``attention.npz`` (the module docstring gives its layout); returns its ``meta``.

    A multi-head model (``cross_attention_weights``, not an ensemble) gets every decoder layer and head, from
    one teacher-forced pass on its own translations (which reproduces the attention it had while decoding)
    and one on the references. Other models get their single attention: the beam search's on the translation,
    the teacher-forced one on the reference (an ensemble: the mean of its members', as its search uses).
    """
    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    hyps = [t[0] if t else None for t in translations]
    src_ids = [sv.encode(s) for s in sources]
    ref_ids = [tv.encode(r) for r in references]
    hyp_ids = [list(h.ids) if h is not None else [] for h in hyps]
    multi_head = not isinstance(loaded.model, tuple) and hasattr(loaded.model, "cross_attention_weights")
    note = None
    views: dict[str, list[np.ndarray | None]] = {}
    if multi_head:
        views["hypothesis"] = _all_heads(loaded, src_ids, hyp_ids, batch_size, one_shape)
        views["reference"] = _all_heads(loaded, src_ids, ref_ids, batch_size, one_shape)
        for i, h in enumerate(hyps):
            if h is None:
                views["hypothesis"][i] = None
    else:
        if isinstance(loaded.model, tuple):
            note = "an ensemble: the mean of its members' attention, no single layer or head"
        own = [None if h is None or h.attention is None else h.attention[None, None] for h in hyps]
        if any(w is not None for w in own):
            views["hypothesis"] = own
        ref = reference_attention(loaded, sources, references, batch_size=batch_size, one_shape=one_shape)
        if ref is not None:
            views["reference"] = [w[None, None] for w in ref]
        if not views:
            note = "the model has no attention"
    return save_attention_arrays(
        path,
        views,
        source_tokens=[_labels(sv, s, ids) for s, ids in zip(sources, src_ids, strict=True)],
        target_tokens={
            "hypothesis": [
                _labels(tv, h.text if h else "", ids) for h, ids in zip(hyps, hyp_ids, strict=True)
            ],
            "reference": [_labels(tv, r, ids) for r, ids in zip(references, ref_ids, strict=True)],
        },
        gold=gold,
        note=note,
    )


def _labels(vocab, text: str, ids: Sequence[int]) -> list[str]:
    """A row or column label per token: the words of ``text`` for a word-level vocabulary (so that a word
    outside it shows as itself, not as ``<unk>``), else the vocabulary's token strings."""
    words = text.split()
    if getattr(vocab, "word_level", False) and len(words) == len(ids):
        return words
    return _token_strings(vocab, ids)


def save_attention_arrays(
    path: str | os.PathLike,
    views: dict[str, Sequence[np.ndarray | None]],
    *,
    source_tokens: Sequence[Sequence[str]],
    target_tokens: dict[str, Sequence[Sequence[str]]],
    gold: Sequence[str] | None = None,
    note: str | None = None,
) -> dict:
    """Write ``attention.npz`` from per-view lists of ``[L, H, m + 1, n + 1]`` arrays (None: nothing decoded);
    returns its ``meta``."""
    shapes = [w.shape[:2] for ws in views.values() for w in ws if w is not None]
    layers, heads = shapes[0] if shapes else (1, 1)
    meta = {
        "format": ATTENTION_FORMAT,
        "layers": int(layers),
        "heads": int(heads),
        "views": list(views),
        "note": note,
        "source_tokens": [list(t) for t in source_tokens],
        "target_tokens": {v: [list(t) for t in ts] for v, ts in target_tokens.items()},
        "gold": None if gold is None else list(gold),
    }
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta))}
    for v, ws in views.items():
        n_src = [len(s) + 1 for s in source_tokens]
        full = [
            w if w is not None else np.zeros((layers, heads, 0, n), np.float32)
            for w, n in zip(ws, n_src, strict=True)
        ]
        arrays[f"{v}_shapes"] = np.array([w.shape for w in full], np.int32).reshape(-1, 4)
        arrays[f"{v}_weights"] = np.concatenate([w.astype(np.float16).ravel() for w in full])
    np.savez_compressed(path, **arrays)
    return meta


def _all_heads(loaded: LoadedModel, src_ids, tgt_ids, batch_size: int, one_shape: bool) -> list[np.ndarray]:
    """Every decoder layer's cross-attention heads, teacher-forced on ``tgt_ids``: ``[L, H, m + 1, n + 1]`` each."""
    from flax import nnx

    sv, tv = loaded.src_vocab, loaded.tgt_vocab
    graphdef, state = nnx.split(loaded.model)
    out: list[np.ndarray] = [None] * len(src_ids)  # type: ignore[list-item]
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids, strict=True)]
    for chunk, width, rows in length_batches(lengths, batch_size, one_shape=one_shape):
        src, mask = pad_rows([src_ids[i] for i in chunk], width, rows, sv.eos_id, sv.pad_id)
        tgt_in = np.full((rows, width), tv.pad_id, np.int32)
        for r in range(rows):
            t = tgt_ids[chunk[r] if r < len(chunk) else chunk[0]]
            tgt_in[r, : len(t) + 1] = [tv.bos_id, *t]
        heads, _ = _cross_attention_layers()(graphdef, state, src, mask, tgt_in)
        heads = np.asarray(heads)  # [B, L, H, T, S]
        for r, i in enumerate(chunk):
            out[i] = heads[r, :, :, : len(tgt_ids[i]) + 1, : len(src_ids[i]) + 1]
    return out
