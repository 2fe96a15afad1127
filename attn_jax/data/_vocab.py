"""Vocabularies: the paper's word-level shortlist and SentencePiece subwords, with one special-id layout.

Every vocabulary maps ``<pad>`` to 0, ``<s>`` to 1, ``</s>`` to 2 and ``<unk>`` to 3. ``encode`` never adds
``<s>``/``</s>`` (the batcher does); ``decode`` drops ``<pad>``/``<s>`` and stops at the first ``</s>``.
``save(directory)`` writes ``vocab.json`` (and ``spm.model`` for SentencePiece); :func:`load_vocabulary` reads
either back, so a checkpoint can keep the exact vocabulary it was trained with. It also reads the vocabulary of
an imported Marian checkpoint (:class:`attn_jax.data.MarianVocabulary`).
"""

from __future__ import annotations

import collections
import io
import itertools
import json
import os
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from attn_jax._extras import needed_by
from attn_jax.data._corpus import CorpusError

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
_VOCAB_FILE = "vocab.json"
_SPM_FILE = "spm.model"


@runtime_checkable
class Vocabulary(Protocol):
    """What the batcher, the decoders and the CLI need from a vocabulary.

    ``word_level`` is True when token ``k`` of ``encode(s)`` is word ``k`` of ``s.split()`` (so word
    alignments are token alignments).
    """

    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int
    word_level: bool

    @property
    def size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def save(self, directory: str | os.PathLike) -> None: ...


def _strip_specials(ids: Iterable[int]) -> list[int]:
    """Ids up to the first ``</s>``, without ``<pad>`` and ``<s>``."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


class WordVocabulary:
    """Whitespace-token vocabulary: the ``K`` most frequent words plus specials (Bahdanau et al.'s shortlist).

    Words outside the shortlist encode to ``<unk>``. Frequency ties are broken alphabetically, so building is
    deterministic.

    >>> v = WordVocabulary.build(["a b b", "b c"], max_size=2)
    >>> v.tokens, v.encode("b a c"), v.decode([1, 5, 4, 3, 2, 4])
    (('<pad>', '<s>', '</s>', '<unk>', 'b', 'a'), [4, 5, 3], 'a b <unk>')
    """

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    word_level = True

    def __init__(self, tokens: Sequence[str], *, lowercase: bool = False) -> None:
        tokens = tuple(tokens)
        if tokens[:4] != SPECIAL_TOKENS:
            raise ValueError(f"a word vocabulary must start with {SPECIAL_TOKENS}, got {tokens[:4]}")
        if len(set(tokens)) != len(tokens):
            raise ValueError("a word vocabulary must not repeat tokens")
        self.tokens = tokens
        self.lowercase = lowercase
        self._ids = {t: i for i, t in enumerate(tokens)}

    @classmethod
    def build(
        cls,
        sentences: Iterable[str],
        max_size: int | None = None,
        *,
        min_count: int = 1,
        lowercase: bool = False,
    ) -> WordVocabulary:
        """Count whitespace tokens and keep the ``max_size`` most frequent seen at least ``min_count`` times.

        Args:
          sentences: training sentences of one language.
          max_size: shortlist size K, not counting the four specials (None: every word).
          min_count: drop rarer words.
          lowercase: lowercase before counting and encoding.

        Returns:
          A vocabulary of size ``4 + min(K, number of kept word types)``.
        """
        counts: collections.Counter[str] = collections.Counter()
        for s in sentences:
            counts.update((s.lower() if lowercase else s).split())
        return cls.from_counts(counts, max_size, min_count=min_count, lowercase=lowercase)

    @classmethod
    def from_counts(
        cls,
        counts: collections.Counter[str],
        max_size: int | None = None,
        *,
        min_count: int = 1,
        lowercase: bool = False,
    ) -> WordVocabulary:
        """The vocabulary :meth:`build` makes from word counts gathered elsewhere (a streaming pass over a large
        corpus, or both sides of one). ``counts`` must already be lowercased when ``lowercase``.

        >>> import collections
        >>> WordVocabulary.from_counts(collections.Counter("a b b c".split()), max_size=2).tokens[4:]
        ('b', 'a')
        """
        if max_size is not None and max_size < 0:
            raise ValueError(f"max_size must be >= 0, got {max_size}")
        specials = set(SPECIAL_TOKENS)
        words = sorted(
            (w for w, c in counts.items() if c >= min_count and w not in specials),
            key=lambda w: (-counts[w], w),
        )
        return cls(SPECIAL_TOKENS + tuple(words[:max_size]), lowercase=lowercase)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Ids of the whitespace tokens of ``text``, ``<unk>`` for words outside the vocabulary."""
        ids = self._ids
        return [ids.get(w, UNK_ID) for w in (text.lower() if self.lowercase else text).split()]

    def decode(self, ids: Iterable[int]) -> str:
        """Tokens joined by spaces, up to the first ``</s>``, without ``<pad>``/``<s>``."""
        return " ".join(self.tokens[i] for i in _strip_specials(ids))

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``directory/vocab.json``."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, _VOCAB_FILE), "w", encoding="utf-8") as f:
            json.dump(
                {"kind": "word", "lowercase": self.lowercase, "tokens": list(self.tokens)},
                f,
                ensure_ascii=False,
            )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WordVocabulary) and (self.tokens, self.lowercase) == (
            other.tokens,
            other.lowercase,
        )

    def __hash__(self) -> int:
        return hash((self.tokens, self.lowercase))

    def __repr__(self) -> str:
        return f"WordVocabulary(size={self.size}, lowercase={self.lowercase})"


class SentencePieceVocabulary:
    """SentencePiece subwords (unigram or BPE) with the shared special ids; the GNMT wordpiece analogue."""

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    word_level = False

    def __init__(self, model_proto: bytes) -> None:
        with needed_by("a SentencePiece vocabulary"):
            import sentencepiece as spm

        self.model_proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self.model_proto)
        got = (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(), self._sp.unk_id())
        if got != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
            raise ValueError(
                f"SentencePiece model has special ids (pad, bos, eos, unk) = {got}, expected (0, 1, 2, 3)"
            )

    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        vocab_size: int,
        *,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        max_sentences: int = 1_000_000,
    ) -> SentencePieceVocabulary:
        """Train SentencePiece in memory on the training side of one language (or both, for a joint model).

        Args:
          sentences: training sentences.
          vocab_size: pieces including the four specials; a smaller vocabulary is produced when the data
            cannot support this many (``hard_vocab_limit=False``).
          model_type: ``"unigram"`` or ``"bpe"``.
          character_coverage: fraction of characters covered; rarer ones become ``<unk>``.
          max_sentences: train on at most this many sentences (the first ones, so training is deterministic).

        Returns:
          The trained vocabulary.
        """
        with needed_by("a SentencePiece vocabulary"):
            import sentencepiece as spm

        model = io.BytesIO()
        # A stream, never a list: the sentences may come straight from a file larger than memory.
        text = (s for s in itertools.islice(sentences, max_sentences) if s.strip())
        first = next(text, None)
        if first is None:
            raise ValueError("cannot train SentencePiece on no sentences")
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], text),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            pad_piece=SPECIAL_TOKENS[0],
            bos_piece=SPECIAL_TOKENS[1],
            eos_piece=SPECIAL_TOKENS[2],
            unk_piece=SPECIAL_TOKENS[3],
            hard_vocab_limit=False,
            shuffle_input_sentence=False,
            num_threads=1,
            minloglevel=2,
        )
        return cls(model.getvalue())

    @property
    def size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text``."""
        return list(self._sp.encode(text, out_type=int))

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenised text up to the first ``</s>``, without ``<pad>``/``<s>``."""
        return self._sp.decode(_strip_specials(ids))

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``directory/spm.model`` and ``directory/vocab.json``."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, _SPM_FILE), "wb") as f:
            f.write(self.model_proto)
        with open(os.path.join(directory, _VOCAB_FILE), "w", encoding="utf-8") as f:
            json.dump({"kind": "sentencepiece", "model": _SPM_FILE}, f)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SentencePieceVocabulary) and self.model_proto == other.model_proto

    def __hash__(self) -> int:
        return hash(self.model_proto)

    def __repr__(self) -> str:
        return f"SentencePieceVocabulary(size={self.size})"


def load_vocabulary(directory: str | os.PathLike) -> Vocabulary:
    """Read a vocabulary written by ``save(directory)``.

    A missing, damaged or foreign file raises :class:`CorpusError` in one line naming the file.
    """
    path = os.path.join(directory, _VOCAB_FILE)
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file (not a saved vocabulary)") from None
    except OSError as e:
        raise CorpusError(f"{path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CorpusError(f"{path}: not a saved vocabulary ({type(e).__name__}: {_one_line(e)})") from None
    kind = meta.get("kind") if isinstance(meta, dict) else None
    try:
        if kind == "word":
            tokens, lowercase = meta["tokens"], meta["lowercase"]
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise ValueError("its tokens are not a list of strings")
            return WordVocabulary(tokens, lowercase=bool(lowercase))
        if kind in ("sentencepiece", "marian"):
            model = meta["model"]
            if not isinstance(model, str):
                raise ValueError(f"its model is not a file name: {model!r}")
            if kind == "marian":
                tokens = meta["tokens"]
                if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                    raise ValueError("its tokens are not a list of strings")
            with open(os.path.join(directory, model), "rb") as f:
                proto = f.read()
            if kind == "marian":
                from attn_jax.data._marian import MarianVocabulary

                return MarianVocabulary(tokens, proto)
            return SentencePieceVocabulary(proto)
    except KeyError as e:
        raise CorpusError(f"{path}: not a saved vocabulary (no {e.args[0]!r})") from None
    except OSError as e:
        raise CorpusError(f"{e.filename or path}: {e.strerror or e}") from None
    except (ValueError, RuntimeError) as e:  # RuntimeError: SentencePiece cannot parse the model
        raise CorpusError(f"{path}: not a saved vocabulary ({_one_line(e)})") from None
    raise CorpusError(f"{path}: unknown vocabulary kind {kind!r}")


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())[:300]


def save_vocabularies(directory: str | os.PathLike, source: Vocabulary, target: Vocabulary) -> None:
    """Write the source and target vocabularies to ``directory/source`` and ``directory/target``.

    A joint vocabulary (one for both sides) is written to both, so a reader needs no marker to find it.
    """
    source.save(os.path.join(directory, "source"))
    target.save(os.path.join(directory, "target"))


def load_vocabularies(directory: str | os.PathLike) -> tuple[Vocabulary, Vocabulary]:
    """Read ``(source, target)`` vocabularies written by :func:`save_vocabularies`."""
    return load_vocabulary(os.path.join(directory, "source")), load_vocabulary(
        os.path.join(directory, "target")
    )
