"""The vocabulary of a Marian (OPUS-MT) checkpoint, renumbered into attn-jax's special-id layout.

A Marian checkpoint segments text with SentencePiece (``source.spm``, ``target.spm``) and maps the pieces to
ids with its own ``vocab.json``, whose special ids differ from attn-jax's: ``</s>`` is 0, ``<unk>`` 1 and
``<pad>`` the last id, which is also the decoder's start token. :class:`MarianVocabulary` keeps the pieces in
attn-jax's order instead: ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3, then every other piece in Marian's
order. :func:`marian_order` gives that order as Marian ids, so the importer permutes the embedding rows the same
way, and every decoder, batcher and server of attn-jax works on the model unchanged.

Encoding follows ``transformers.MarianTokenizer``: a leading language code such as ``>>fra<<`` is one token
when the vocabulary has it, the rest is split into pieces by SentencePiece, and a piece outside the vocabulary
becomes ``<unk>``. Decoding joins the pieces with SentencePiece, as the tokenizer's ``decode`` does, and writes
an ``<unk>`` token as the text ``<unk>``, so an unknown word stays visible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence

from attn_jax._extras import needed_by
from attn_jax.data._vocab import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, _strip_specials

__all__ = ["MarianVocabulary", "marian_order"]

_SPM_FILE = "spm.model"
_VOCAB_FILE = "vocab.json"
_SPIECE_UNDERLINE = "\u2581"


def marian_order(
    pieces: Mapping[str, int], *, pad_id: int, start_id: int, eos_id: int, unk_id: int
) -> list[int]:
    """The Marian id behind each attn-jax id: ``[pad, start, eos, unk, every other id ascending]``.

    The decoder's start token (``start_id``, Marian's ``<pad>`` in OPUS-MT) becomes attn-jax's ``<s>``, so its
    embedding row appears twice: as ``<pad>`` and as ``<s>``. The list is one longer than ``pieces``.

    Raises:
      ValueError: ids that are not exactly ``0..N-1``, or a special id outside them.

    >>> marian_order({"</s>": 0, "<unk>": 1, "a": 2, "<pad>": 3}, pad_id=3, start_id=3, eos_id=0, unk_id=1)
    [3, 3, 0, 1, 2]
    """
    ids = sorted(pieces.values())
    if ids != list(range(len(ids))):
        raise ValueError(f"vocabulary ids must be 0..{len(ids) - 1}, each once")
    for name, i in (("pad", pad_id), ("decoder start", start_id), ("eos", eos_id), ("unk", unk_id)):
        if not 0 <= i < len(ids):
            raise ValueError(f"the {name} id {i} is outside the vocabulary's ids 0..{len(ids) - 1}")
    special = {pad_id, eos_id, unk_id}
    return [pad_id, start_id, eos_id, unk_id, *(i for i in ids if i not in special)]


class MarianVocabulary:
    """A Marian checkpoint's pieces in attn-jax's id layout, with the SentencePiece model of one side.

    ``tokens[i]`` is the piece of attn-jax id ``i``; ids 0 to 3 are ``<pad>``, ``<s>``, ``</s>``, ``<unk>``.

    Args:
      tokens: the pieces in attn-jax's order (see :func:`marian_order`).
      model_proto: the side's SentencePiece model (``source.spm`` or ``target.spm``).
    """

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    word_level = False

    def __init__(self, tokens: Sequence[str], model_proto: bytes) -> None:
        with needed_by("a Marian vocabulary"):
            import sentencepiece as spm

        self.tokens = tuple(tokens)
        if self.tokens[:4] != SPECIAL_TOKENS:
            raise ValueError(f"a Marian vocabulary must start with {SPECIAL_TOKENS}, got {self.tokens[:4]}")
        self.model_proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
        # A piece that appears twice keeps its first (lowest) id, as a dict of Marian's vocab.json would.
        self._ids: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            self._ids.setdefault(t, i)
        self._ids["<pad>"], self._ids["<s>"] = PAD_ID, BOS_ID

    @classmethod
    def from_marian(
        cls,
        pieces: Mapping[str, int],
        model_proto: bytes,
        *,
        pad_id: int,
        start_id: int,
        eos_id: int,
        unk_id: int,
    ) -> MarianVocabulary:
        """The vocabulary of a Marian ``vocab.json`` (``piece -> id``) and one side's SentencePiece model."""
        by_id = {i: p for p, i in pieces.items()}
        order = marian_order(pieces, pad_id=pad_id, start_id=start_id, eos_id=eos_id, unk_id=unk_id)
        return cls(SPECIAL_TOKENS + tuple(by_id[i] for i in order[4:]), model_proto)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``: a leading ``>>code<<`` the vocabulary has, then the pieces (``<unk>`` if unknown)."""
        head: list[int] = []
        if text.startswith(">>") and (end := text.find("<<")) != -1 and text[: end + 2] in self._ids:
            head, text = [self._ids[text[: end + 2]]], text[end + 2 :]
        ids = self._ids
        return head + [ids.get(p, UNK_ID) for p in self._sp.encode(text, out_type=str)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the pieces up to the first ``</s>``, without ``<pad>``/``<s>``; ``<unk>`` stays as text."""
        out, run = [], []
        for i in _strip_specials(ids):
            if i == UNK_ID:
                out.append(self._sp.decode_pieces(run) + "<unk> ")
                run = []
            else:
                run.append(self.tokens[i])
        out.append(self._sp.decode_pieces(run))
        return "".join(out).replace(_SPIECE_UNDERLINE, " ").strip()

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``directory/spm.model`` and ``directory/vocab.json`` (the pieces in attn-jax's order)."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, _SPM_FILE), "wb") as f:
            f.write(self.model_proto)
        with open(os.path.join(directory, _VOCAB_FILE), "w", encoding="utf-8") as f:
            json.dump(
                {"kind": "marian", "model": _SPM_FILE, "tokens": list(self.tokens)}, f, ensure_ascii=False
            )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MarianVocabulary) and (self.tokens, self.model_proto) == (
            other.tokens,
            other.model_proto,
        )

    def __hash__(self) -> int:
        return hash((self.tokens, self.model_proto))

    def __repr__(self) -> str:
        return f"MarianVocabulary(size={self.size})"
