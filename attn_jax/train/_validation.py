"""Validation by translation: decode the validation split during training and score it with BLEU and chrF.

``validation.bleu=True`` makes every validation translate the kept validation pairs (``data.max_eval_examples``
of them when set) with beam search (``validation.beam_size``; 1 is greedy decoding), batched and length-limited
as ``attn-jax evaluate`` does (:func:`attn_jax.decoding.search_batches`), and score the hypotheses with the
functions ``evaluate`` scores with: :func:`attn_jax.eval.corpus_bleu` (``evaluate``'s overall BLEU) and
:func:`attn_jax.eval.corpus_chrf`, with the same tokeniser and detokeniser settings. The sentences and their
padded shapes are the same at every validation, so the search compiles once per batch shape, at the first.

In a multi-process run each process translates its share of the sentences (every ``process_count``-th one),
and the token ids are gathered across processes. Every process then scores all of them, so the scores are
those of one process translating the whole split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from attn_jax.decoding import LengthLimit, search_batches
from attn_jax.train._step import build_module

__all__ = ["TranslationScores", "TranslationValidator"]

_ADVICE = (
    "Set validation.detokenize=moses and validation.detokenize_lang=LANG to score detokenised text, or "
    "validation.bleu_tokenize=none to score the tokens as given"
)


class TranslationScores(NamedTuple):
    """One validation's translations and their scores.

    Attributes:
      record: the fields added to the validation record: ``bleu``, ``chrf``, ``translations`` (sentences
        decoded) and ``stopped_at_limit`` (of those, how many stopped at the length limit instead of ending
        with ``</s>``).
      hypotheses: the translation of each validation source, in corpus order.
    """

    record: dict[str, float | int]
    hypotheses: list[str]


class TranslationValidator:
    """Translates the validation sources with a run's parameters and scores them against the references.

    Args:
      config: the run's config (``validation.*``, ``data.max_target_length``, ``data.eval_batch_size``).
      sources, references: the validation pairs as text.
      src_vocab, tgt_vocab: the run's vocabularies.
      model: the run's model config (:class:`attn_jax.models.ModelConfig`).
      shard: ``(process index, process count)``: this process translates sentences ``index, index + count,
        ...``. None: ``jax.process_index()`` and ``jax.process_count()``.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        sources: Sequence[str],
        references: Sequence[str],
        src_vocab,
        tgt_vocab,
        model,
        shard: tuple[int, int] | None = None,
    ):
        from attn_jax import eval as ev

        v = config.validation
        self.settings = v
        self.model_config = model
        self.sources, self.references = list(sources), list(references)
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.encoded = [src_vocab.encode(s) for s in self.sources]
        self.todo = [i for i, ids in enumerate(self.encoded) if ids]  # an empty source translates to ""
        if shard is None:
            import jax

            shard = (jax.process_index(), jax.process_count())
        self.shard = shard
        self.mine = self.todo[shard[0] :: shard[1]]  # strided: every share gets short and long sentences
        self.copies = bool(getattr(model, "copy", False))
        self.extended = None
        if self.copies:
            from attn_jax.data import extend_with_source

            self.extended = [extend_with_source(s, "", tgt_vocab) for s in self.sources]
        self.limit = LengthLimit(
            int(config.data.max_target_length or 0), float(v.max_length_ratio), int(v.max_length_offset)
        ).check()
        self.batch_size = v.batch_size or config.data.eval_batch_size
        self.bleu_kw: dict[str, Any] = {
            "tokenize": v.bleu_tokenize or "13a",
            "detokenize": v.detokenize,
            "detokenize_lang": v.detokenize_lang,
        }
        self.options = ev.bleu_options(
            self.references,
            bleu_tokenize=v.bleu_tokenize or None,
            detokenize=v.detokenize,
            detokenize_lang=v.detokenize_lang,
            built_in=str(config.data.corpus) == "synthetic",
            advice=_ADVICE,
        )
        self.signatures: tuple[str, str] | None = None  # (BLEU's, chrF's), known after the first scoring

    def describe(self) -> str:
        """The start-up line: what is translated, how, and how it is scored."""
        v = self.settings
        search = "greedy decoding" if v.beam_size == 1 else f"beam {v.beam_size}, α {v.alpha:g}, β {v.beta:g}"
        detok = "" if v.detokenize == "none" else f", detokenised ({v.detokenize}-{v.detokenize_lang})"
        return (
            f"validation: translating the {len(self.sources):,} validation pairs at every validation ({search}, "
            f"batches of {self.batch_size}, length limit {self.limit.describe()}"
            + (f", each of {self.shard[1]} processes a share" if self.shard[1] > 1 else "")
            + f"); BLEU (tok:"
            f"{self.bleu_kw['tokenize']}{detok}) and chrF by sacreBLEU, as attn-jax evaluate scores them"
        )

    def translate(self, params) -> tuple[list[str], int, int]:
        """``(hypotheses, sentences decoded, of those stopped at the length limit)`` with ``params``, over every
        process's share."""
        return self.merge(self.gather(self.decode_share(params)))

    def decode_share(self, params) -> np.ndarray:
        """This process's share, translated: int32 ``[sentences, 3 + longest]``, a row per sentence holding its
        index, 1 if it stopped at the length limit, its length ``n`` and its ``n`` ids (then zeros)."""
        v, tv = self.settings, self.tgt_vocab
        model = build_module(self.model_config, params)
        rows = []
        batches = search_batches(
            model,
            [self.encoded[i] for i in self.mine],
            limit=self.limit,
            beam_size=v.beam_size,
            alpha=v.alpha if v.beam_size > 1 else 0.0,
            beta=v.beta if v.beam_size > 1 else 0.0,
            batch_size=self.batch_size,
            src_eos_id=self.src_vocab.eos_id,
            src_pad_id=self.src_vocab.pad_id,
            bos_id=tv.bos_id,
            eos_id=tv.eos_id,
            pad_id=tv.pad_id,
            sources_ext=None if self.extended is None else [self.extended[i][0] for i in self.mine],
        )
        for members, _, out in batches:
            for r, c in enumerate(members):
                length = int(out.lengths[r, 0])
                rows.append((self.mine[c], bool(out.truncated[r, 0]), out.tokens[r, 0, : max(length - 1, 0)]))
        table = np.zeros((len(rows), 3 + max((len(ids) for *_, ids in rows), default=0)), np.int32)
        for k, (i, stopped, ids) in enumerate(rows):
            table[k, :3] = i, stopped, len(ids)
            table[k, 3 : 3 + len(ids)] = ids
        return table

    def gather(self, table: np.ndarray) -> list[np.ndarray]:
        """Every process's :meth:`decode_share` table (this one's alone in a single process)."""
        if self.shard[1] == 1:
            return [table]
        from jax.experimental import multihost_utils

        # One shape for all: rows to the largest share, columns to the longest translation; row index -1 pads.
        shapes = np.asarray(multihost_utils.process_allgather(np.asarray(table.shape, np.int32)))
        padded = np.zeros(tuple(shapes.max(axis=0)), np.int32)
        padded[:, 0] = -1
        padded[: table.shape[0], : table.shape[1]] = table
        tables = np.asarray(multihost_utils.process_allgather(padded))
        return [t[t[:, 0] >= 0] for t in tables]

    def merge(self, tables: Sequence[np.ndarray]) -> tuple[list[str], int, int]:
        """``(hypotheses, sentences decoded, of those stopped at the length limit)`` from every share's table."""
        hypotheses = [""] * len(self.sources)
        decoded = stopped = 0
        for table in tables:
            for row in table:
                i, limited, n = (int(x) for x in row[:3])
                hypotheses[i] = self._text(i, [int(t) for t in row[3 : 3 + n]])
                decoded += 1
                stopped += limited
        return hypotheses, decoded, stopped

    def _text(self, i: int, ids: list[int]) -> str:
        """A hypothesis' text, as ``attn-jax translate`` writes it (copied words spelt out)."""
        tv = self.tgt_vocab
        if self.copies:
            oov, size = self.extended[i][2], tv.size
            return " ".join(oov[t - size] if t >= size else tv.tokens[t] for t in ids)
        return tv.decode(ids)

    def score(self, hypotheses: Sequence[str]) -> dict[str, float]:
        """``{"bleu", "chrf"}`` of ``hypotheses`` against the references (sacreBLEU, ``evaluate``'s settings)."""
        from attn_jax import eval as ev

        with ev.sacrebleu_tokenized_warning_dropped():  # the start-up warning has said it once
            bleu = ev.corpus_bleu(hypotheses, self.references, **self.bleu_kw)
            chrf = ev.corpus_chrf(
                hypotheses,
                self.references,
                detokenize=self.bleu_kw["detokenize"],
                detokenize_lang=self.bleu_kw["detokenize_lang"],
            )
        self.signatures = (bleu.signature, chrf.signature)
        return {"bleu": bleu.score, "chrf": chrf.score}

    def __call__(self, params) -> TranslationScores:
        """Translate the validation sources with ``params`` and score them."""
        hypotheses, decoded, stopped = self.translate(params)
        record: dict[str, float | int] = dict(self.score(hypotheses))
        record.update(translations=decoded, stopped_at_limit=stopped)
        return TranslationScores(record, hypotheses)


def write_lines(path: str, lines: Sequence[str]) -> None:
    """One sentence a line (``hypotheses-<step>.txt``, ``references.txt``)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def host_params(params) -> Any:
    """Parameters as NumPy arrays on this host, gathered from every process of a multi-process run."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(params, tiled=True)
    return jax.tree.map(np.asarray, jax.device_get(params))
