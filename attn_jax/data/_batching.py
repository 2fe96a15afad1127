"""Batching for XLA: length filters, a few fixed padded shapes, seeded shuffling, exact resumption, shards.

Built on a grain ``MapDataset``; each process reads its own rows of every global batch.

The whole schedule is a pure function of ``(corpus, config, epoch)``: epoch ``e`` groups the kept pairs by
bucket, shuffles each bucket with ``numpy.random.default_rng((seed, e))``, cuts it into batches of the
bucket's fixed size and shuffles the batch order. Global batch ``k`` of the run is batch ``k % n`` of epoch
``k // n``, so an iterator's whole state is the index of the next global batch (grain's ``{"next_index":
k}``), and every process computes the same schedule and keeps its own rows of each global batch.

Batch layout (``B`` rows, one padded length ``L`` per bucket, ``S == T == L``)::

    src       int32 [B, S]  x_1 .. x_n </s> <pad> ..     (no </s> when add_source_eos=False)
    src_len   int32 [B]     n + 1 (0 on padding rows)
    tgt_in    int32 [B, T]  <s> y_1 .. y_m <pad> ..       decoder input (teacher forcing)
    tgt_out   int32 [B, T]  y_1 .. y_m </s> <pad> ..      decoder labels: tgt_out[:, j] follows tgt_in[:, j]
    tgt_len   int32 [B]     m + 1 (0 on padding rows)
    example_id int32 [B]    index of the pair in the corpus; -1 on padding rows
    gold      bool [B, T, S] or None   gold[b, j, i]: target word j (tgt_out[:, j]) aligned to source word i
    src_ext     int32 [B, S] or None  copying only (``encode_corpus(..., copy=True)``): ``src`` in the extended
                                      target vocabulary (``data.extend_with_source``; ``</s>`` stays ``</s>``)
    tgt_out_ext int32 [B, T] or None  copying only: ``tgt_out`` with out-of-vocabulary words that occur in the
                                      source at their extended ids

Padding rows (all <pad>, lengths 0) appear only when ``drop_remainder=False`` fills the last batch of a
bucket.

Packed batches (``make_batch_iterator(..., pack=True)``, the trainer's ``data.pack``): several pairs per row
of one fixed width ``L`` (:func:`pack_pairs`, :class:`PackedPlan`), each pair a contiguous run laid out as
above, the runs one after another from the left; four more arrays say where each pair sits::

    src_segments  int32 [B, S]  1 1 1 2 2 2 2 3 3 0 ..   pair n of the row (1-based); 0 on padding
    src_positions int32 [B, S]  0 1 2 0 1 2 3 0 1 0 ..   position within its pair (restarts per pair)
    tgt_segments, tgt_positions int32 [B, T]             the same for tgt_in / tgt_out
    src_len, tgt_len                                     the row's real positions (all its pairs together)
    example_id                                           the row's first pair (-1 on padding rows)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import grain
import numpy as np

from attn_jax.data._copy import extend_with_source
from attn_jax.data._corpus import CorpusError, ParallelCorpus
from attn_jax.data._vocab import BOS_ID, EOS_ID, PAD_ID, Vocabulary

# ------------------------------------------------------------------------------------------------------------
# Encoded corpora.


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedCorpus:
    """Token ids of a corpus, stored flat: source ``i`` is ``src_tokens[src_offsets[i]:src_offsets[i+1]]``.

    Attributes:
      src_tokens: int32 [total source tokens], no specials.
      src_offsets: int64 [N + 1].
      tgt_tokens: int32 [total target tokens], no specials.
      tgt_offsets: int64 [N + 1].
      alignments: the corpus' gold alignments when both vocabularies are word-level (positions are word
        positions), else None.
      name: the corpus name.
      src_ext_tokens: int32 like ``src_tokens``, the source in the extended target vocabulary (copying,
        ``encode_corpus(..., copy=True)``), else None.
      tgt_ext_tokens: int32 like ``tgt_tokens``, the target in the extended target vocabulary, else None.
      digest: the :meth:`fingerprint`, when known without reading every array (a prepared corpus stores it in
        its manifest: :func:`attn_jax.data.open_prepared`); "" computes it.
    """

    src_tokens: np.ndarray
    src_offsets: np.ndarray
    tgt_tokens: np.ndarray
    tgt_offsets: np.ndarray
    alignments: tuple[str, ...] | None = None
    name: str = ""
    src_ext_tokens: np.ndarray | None = None
    tgt_ext_tokens: np.ndarray | None = None
    digest: str = ""

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def source(self, i: int) -> np.ndarray:
        return _row(self.src_tokens, self.src_offsets, i)

    def target(self, i: int) -> np.ndarray:
        return _row(self.tgt_tokens, self.tgt_offsets, i)

    @property
    def src_lengths(self) -> np.ndarray:
        return _lengths(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return _lengths(self.tgt_offsets)

    def fingerprint(self) -> str:
        """A hash of the ids, so that a saved iterator state is not restored onto a different corpus."""
        if self.digest:
            return self.digest
        h = hashlib.sha256()
        for a in (self.src_tokens, self.src_offsets, self.tgt_tokens, self.tgt_offsets):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]


def _read(array: np.ndarray, start: int, count: int) -> np.ndarray:
    """``array[start:start + count]``, read with ``pread`` from the file behind a memory map that carries an
    open ``_file`` (:func:`attn_jax.data.open_prepared`): a page fault through the map would make the
    kernel map its neighbours too, and a long run would keep much of the corpus resident."""
    f = getattr(array, "_file", None)
    if f is None:
        return np.asarray(array[start : start + count])
    raw = os.pread(f.fileno(), count * array.itemsize, array.offset + start * array.itemsize)
    return np.frombuffer(raw, array.dtype, count)


def _row(tokens: np.ndarray, offsets: np.ndarray, i: int) -> np.ndarray:
    a, b = _read(offsets, int(i), 2)
    return _read(tokens, int(a), int(b - a))


def _lengths(offsets: np.ndarray) -> np.ndarray:
    """int64 ``[N]``: ``offsets``' differences. A memory-mapped file is read in blocks rather than through its
    map, so that a process keeps resident only the offsets of the rows it batches."""
    if not isinstance(offsets, np.memmap) or offsets.filename is None:
        return np.diff(offsets)
    out = np.empty(len(offsets) - 1, np.int64)
    block = 1 << 20
    with open(offsets.filename, "rb") as f:
        for start in range(0, len(out), block):
            f.seek(offsets.offset + start * offsets.itemsize)
            values = np.fromfile(f, offsets.dtype, min(block, len(out) - start) + 1)
            np.subtract(values[1:], values[:-1], out=out[start : start + len(values) - 1])
    return out


# Pairs whose lengths a batch plan reads at a time: bounds its memory whatever the corpus size.
_BLOCK = 1 << 20


def length_blocks(offsets: np.ndarray, block: int = _BLOCK) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, int64 lengths of pairs start, start + 1, ...)``: ``offsets``' differences, ``block`` pairs at
    a time. A prepared corpus' memory map is read with ``pread``, so no block stays resident."""
    n = len(offsets) - 1
    for start in range(0, n, block):
        values = _read(offsets, start, min(block, n - start) + 1).astype(np.int64)
        yield start, np.diff(values)


class _Spill:
    """An int64 ``[n]`` array in an anonymous temporary file, read a slice at a time with ``pread``.

    A batch plan over a prepared corpus keeps its index arrays here (bucket members, each epoch's order),
    so that they grow the file, not the process, with the corpus. The file has no name: it disappears with
    the process, and processes that share a directory never meet.
    """

    def __init__(self, directory: str) -> None:
        try:
            self._file = tempfile.TemporaryFile(dir=directory)
        except OSError:  # a read-only prepared directory: the system's temporary directory holds it
            self._file = tempfile.TemporaryFile()
        self.n = 0

    def append(self, values: np.ndarray) -> None:
        for start in range(0, len(values), _BLOCK):  # converted a block at a time, never all at once
            self._file.write(np.ascontiguousarray(values[start : start + _BLOCK], np.int64).tobytes())
        self._file.flush()
        self.n += len(values)

    def __len__(self) -> int:
        return self.n

    def read(self, start: int, count: int) -> np.ndarray:
        """``array[start:start + count]`` (read-only)."""
        raw = os.pread(self._file.fileno(), count * 8, start * 8)
        return np.frombuffer(raw, np.int64, count)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.empty(self.n, dtype or np.int64)
        for start in range(0, self.n, _BLOCK):
            out[start : start + _BLOCK] = self.read(start, min(_BLOCK, self.n - start))
        return out

    def tolist(self) -> list[int]:
        return self.read(0, self.n).tolist()


def _flat(seqs: Sequence[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    tokens = np.fromiter((t for s in seqs for t in s), np.int32, count=int(offsets[-1]))
    return tokens, offsets


def encode_corpus(
    corpus: ParallelCorpus, source_vocab: Vocabulary, target_vocab: Vocabulary, *, copy: bool = False
) -> EncodedCorpus:
    """Encode every pair with the given vocabularies (no ``<s>``/``</s>``; the batcher adds them).

    ``copy=True`` (the pointer-generator, ``model.copy``; word-level vocabularies only) also encodes both sides
    in the extended target vocabulary of each pair (:func:`attn_jax.data.extend_with_source`), and the batches
    then carry ``src_ext`` and ``tgt_out_ext``.
    """
    src_tokens, src_offsets = _flat([source_vocab.encode(s) for s in corpus.sources])
    tgt_tokens, tgt_offsets = _flat([target_vocab.encode(t) for t in corpus.targets])
    word_level = source_vocab.word_level and target_vocab.word_level
    src_ext = tgt_ext = None
    if copy:
        if not word_level:
            raise ValueError("copy=True needs word-level vocabularies: source token k must be source word k")
        pairs = [
            extend_with_source(s, t, target_vocab)
            for s, t in zip(corpus.sources, corpus.targets, strict=True)
        ]
        src_ext, _ = _flat([p[0] for p in pairs])
        tgt_ext, _ = _flat([p[1] for p in pairs])
    return EncodedCorpus(
        src_tokens,
        src_offsets,
        tgt_tokens,
        tgt_offsets,
        corpus.alignments if word_level else None,
        corpus.name,
        src_ext,
        tgt_ext,
    )


# ------------------------------------------------------------------------------------------------------------
# Configuration and the schedule.


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """How pairs become batches.

    Attributes:
      batch_size: sentences per global batch, in every bucket. Exactly one of batch_size / tokens_per_batch.
      tokens_per_batch: token budget per global batch: a bucket of padded length L holds
        ``tokens_per_batch // L`` rows (rounded down to a multiple of ``batch_multiple``; a bucket left with no
        row is an error, never a batch over the budget).
      bucket_boundaries: padded lengths; a pair goes to the smallest boundary >= max(source + </s>, target +
        1). If a kept pair is longer than the last boundary, one more boundary (rounded up to a multiple of 8)
        is added.
      max_source_length: drop pairs with more source tokens (the paper's 30 or 50 words); None keeps all.
      max_target_length: drop pairs with more target tokens; None keeps all.
      shuffle: shuffle within buckets and the batch order, differently each epoch.
      seed: shuffling seed.
      num_epochs: epochs to iterate; None repeats forever.
      drop_remainder: drop each bucket's last incomplete batch (training); otherwise pad it with padding rows.
      add_source_eos: end every source with ``</s>``, as in Bahdanau et al.'s encoder.
      batch_multiple: every batch size is a multiple of this (e.g. the device count); must be divisible by the
        number of processes.
    """

    batch_size: int | None = 64
    tokens_per_batch: int | None = None
    bucket_boundaries: tuple[int, ...] = (16, 24, 32, 48, 64, 96, 128)
    max_source_length: int | None = None
    max_target_length: int | None = None
    shuffle: bool = True
    seed: int = 0
    num_epochs: int | None = None
    drop_remainder: bool = True
    add_source_eos: bool = True
    batch_multiple: int = 1

    def __post_init__(self) -> None:
        if (self.batch_size is None) == (self.tokens_per_batch is None):
            raise ValueError(
                f"give exactly one of batch_size={self.batch_size} and "
                f"tokens_per_batch={self.tokens_per_batch}"
            )
        b = list(self.bucket_boundaries)
        if not b or b != sorted(set(b)) or b[0] < 2:
            raise ValueError(
                f"bucket_boundaries must be increasing integers >= 2, got {self.bucket_boundaries}"
            )
        if self.batch_multiple < 1:
            raise ValueError(f"batch_multiple must be >= 1, got {self.batch_multiple}")
        if self.batch_size is not None and (self.batch_size < 1 or self.batch_size % self.batch_multiple):
            raise ValueError(
                f"batch_size={self.batch_size} must be a positive multiple of "
                f"batch_multiple={self.batch_multiple}"
            )
        if self.tokens_per_batch is not None and self.tokens_per_batch < 1:
            raise ValueError(f"tokens_per_batch must be positive, got {self.tokens_per_batch}")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"num_epochs must be >= 1 or None, got {self.num_epochs}")

    def keeps(self, src_lengths, tgt_lengths) -> np.ndarray:
        """bool ``[N]``: which pairs the length filter keeps, from their token counts (no specials)."""
        keep = np.ones(len(src_lengths), bool)
        if self.max_source_length is not None:
            keep &= np.asarray(src_lengths) <= self.max_source_length
        if self.max_target_length is not None:
            keep &= np.asarray(tgt_lengths) <= self.max_target_length
        return keep


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class Bucket(NamedTuple):
    """One padded shape: ``batch_size`` rows of ``length`` positions, holding the pairs ``members``."""

    length: int
    batch_size: int
    members: np.ndarray  # int64 [n], corpus indices (on disk for a prepared corpus: :class:`_Spill`)


class BucketStats(NamedTuple):
    """One bucket's batches over epoch 0 (:meth:`BatchPlan.bucket_stats`).

    Attributes:
      length: the padded length L (source and target).
      rows: rows a batch (B); a batch has ``B · L`` padded positions on each side.
      budget_rows: rows the token budget holds (``tokens_per_batch // L``) before rounding down to the batch
        multiple; ``rows`` without a budget.
      batches: batches in epoch 0.
      pairs: pairs in those batches (more than ``rows · batches`` when rows are packed).
      src_tokens, tgt_tokens: their real source and target positions (``src_len`` and ``tgt_len`` summed:
        each side with its ``</s>``).
    """

    length: int
    rows: int
    budget_rows: int
    batches: int
    pairs: int
    src_tokens: int
    tgt_tokens: int


class BatchPlan:
    """The global batch schedule of a corpus under a :class:`BatchConfig` (identical on every process).

    With ``scratch`` (a directory: the prepared corpus') the index arrays (each bucket's members, each
    epoch's shuffled order) live in anonymous files there, read a batch at a time, and the lengths are read
    a block at a time: the process does not grow with the corpus. Without it they are in memory. The
    schedule is the same either way.

    Attributes:
      buckets: the non-empty buckets, shortest first.
      batches_per_epoch: global batches in one epoch (the same every epoch).
      num_batches: global batches in the run (``sys.maxsize`` when repeating forever).
      num_filtered: pairs dropped by the length limits.
    """

    def __init__(self, corpus: EncodedCorpus, config: BatchConfig, scratch: str | None = None) -> None:
        self.config = config
        self._scratch = scratch
        self._index_dtype = np.int32 if len(corpus) < 2**31 else np.int64
        boundaries = list(config.bucket_boundaries)
        # Bucket len(boundaries) holds the pairs longer than the last boundary (its length is known at the end).
        parts: list[list[np.ndarray]] = [[] for _ in range(len(boundaries) + 1)]
        spills = [_Spill(scratch) for _ in parts] if scratch is not None else None
        self.num_filtered, longest = 0, 0
        blocks = zip(length_blocks(corpus.src_offsets), length_blocks(corpus.tgt_offsets), strict=True)
        for (start, src_len), (_, tgt_len) in blocks:
            keep = config.keeps(src_len, tgt_len)
            self.num_filtered += int((~keep).sum())
            kept = np.flatnonzero(keep)
            need = np.maximum(src_len[kept] + int(config.add_source_eos), tgt_len[kept] + 1)
            longest = max(longest, int(need.max(initial=0)))
            which = np.searchsorted(boundaries, need, side="left")
            for k in np.unique(which):
                members = start + kept[which == k]
                if spills is not None:
                    spills[k].append(members)
                else:
                    parts[k].append(members)
        if self.num_filtered == len(corpus):
            raise CorpusError(
                f"{corpus.name}: no pairs left after the length filter (max_source_length="
                f"{config.max_source_length}, max_target_length={config.max_target_length}, "
                f"{len(corpus)} pairs)"
            )
        if longest > boundaries[-1]:
            boundaries.append(_round_up(longest, 8))
        self.buckets: list[Bucket] = []
        for k, length in enumerate(boundaries):
            members = spills[k] if spills is not None else np.concatenate([*parts[k], np.zeros(0, np.int64)])
            if len(members):
                self.buckets.append(Bucket(length, self._batch_size(length), members))
        del parts
        # Batches per bucket per epoch: fixed, since shuffling only permutes within a bucket.
        self._counts = [
            len(b.members) // b.batch_size if config.drop_remainder else -(-len(b.members) // b.batch_size)
            for b in self.buckets
        ]
        self.batches_per_epoch = sum(self._counts)
        if self.batches_per_epoch == 0:
            raise CorpusError(
                f"{corpus.name}: no complete batch ({len(corpus) - self.num_filtered} pairs, buckets "
                f"{[(b.length, len(b.members)) for b in self.buckets]}, batch sizes "
                f"{[b.batch_size for b in self.buckets]}); lower the batch size or set drop_remainder=False"
            )
        self.num_batches = (
            sys.maxsize if config.num_epochs is None else config.num_epochs * self.batches_per_epoch
        )
        self._lock = threading.Lock()
        self._cache: dict[int, _Epoch] = {}

    def _batch_size(self, length: int) -> int:
        """Rows of a batch of padded length ``length``; a token budget never gives more than it holds."""
        c = self.config
        if c.batch_size is not None:
            return c.batch_size
        rows = c.tokens_per_batch // length // c.batch_multiple * c.batch_multiple
        if rows == 0:
            raise ValueError(
                f"a token budget of {c.tokens_per_batch:,} holds {c.tokens_per_batch // length} row(s) of padded "
                f"length {length}, fewer than the batch multiple {c.batch_multiple}; raise it to at least "
                f"{c.batch_multiple * length:,} or lower the length limits"
            )
        return rows

    def bucket_stats(self, corpus: EncodedCorpus) -> list[BucketStats]:
        """What the batches of each bucket that yields batches hold, counted over epoch 0."""
        eos = int(self.config.add_source_eos)
        src_need, tgt_need = corpus.src_lengths + eos, corpus.tgt_lengths + 1
        sums = np.zeros((len(self.buckets), 4), np.int64)  # batches, pairs, source, target
        for k, rows in self.epoch(0):
            pairs = self._pairs(rows)
            sums[k] += (1, len(pairs), src_need[pairs].sum(), tgt_need[pairs].sum())
        c = self.config
        return [
            BucketStats(
                length=b.length,
                rows=b.batch_size,
                budget_rows=b.batch_size if c.tokens_per_batch is None else c.tokens_per_batch // b.length,
                batches=int(n),
                pairs=int(p),
                src_tokens=int(s),
                tgt_tokens=int(t),
            )
            for b, (n, p, s, t) in zip(self.buckets, sums, strict=True)
            if n
        ]

    def _pairs(self, rows: np.ndarray) -> np.ndarray:
        """The corpus indices a batch's rows hold."""
        return rows[rows >= 0]

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """``(batch size, padded length)`` of each bucket that yields batches: every shape a run compiles."""
        return [(b.batch_size, b.length) for b, n in zip(self.buckets, self._counts, strict=True) if n]

    def epoch(self, e: int) -> list[tuple[int, np.ndarray]]:
        """Epoch ``e``: ``(bucket index, corpus indices [batch size], -1 on padding rows)`` per batch."""
        table = self._epoch(e)
        return [self._batch(table, i) for i in range(len(table.bucket))]

    def _epoch(self, e: int) -> _Epoch:
        with self._lock:
            if e not in self._cache:
                if len(self._cache) > 2:
                    self._cache.pop(min(self._cache))
                self._cache[e] = self._make_epoch(e)
            return self._cache[e]

    def _make_epoch(self, e: int) -> _Epoch:
        rng = np.random.default_rng((self.config.seed, e)) if self.config.shuffle else None
        rows: list[np.ndarray | _Spill] = []
        for bucket, count in zip(self.buckets, self._counts, strict=True):
            # A copy, shuffled in place: the draws of rng.permutation(members), in half the memory when
            # the indices fit int32 (the shuffle's draws depend on the length alone).
            members = np.array(bucket.members, self._index_dtype)
            if rng is not None:
                rng.shuffle(members)
            size = count * bucket.batch_size
            n = min(len(members), size)
            if self._scratch is not None:
                out = _Spill(self._scratch)
                out.append(members[:n])
                out.append(np.full(size - n, -1, np.int64))
            else:
                out = np.full(size, -1, np.int64)
                out[:n] = members[:n]
            del members
            rows.append(out)
        bucket_of = np.repeat(np.arange(len(self.buckets), dtype=np.int32), self._counts)
        index = np.concatenate([np.arange(c, dtype=np.int64) for c in self._counts])
        if rng is not None:
            order = rng.permutation(len(bucket_of))
            bucket_of, index = bucket_of[order], index[order]
        return _Epoch(bucket_of, index, rows)

    def _batch(self, table: _Epoch, i: int) -> tuple[int, np.ndarray]:
        k = int(table.bucket[i])
        size = self.buckets[k].batch_size
        start, rows = int(table.index[i]) * size, table.rows[k]
        if isinstance(rows, _Spill):
            return k, rows.read(start, size)
        return k, rows[start : start + size]

    def global_batch(self, k: int) -> tuple[int, np.ndarray]:
        """Global batch ``k`` of the run: ``(bucket index, corpus indices)``."""
        if not 0 <= k < self.num_batches:
            raise IndexError(f"global batch {k} out of range [0, {self.num_batches})")
        e, i = divmod(k, self.batches_per_epoch)
        return self._batch(self._epoch(e), i)


class _Epoch(NamedTuple):
    """One epoch's schedule, without one array object per batch."""

    bucket: np.ndarray  # int32 [batches]: each batch's bucket, in the epoch's order
    index: np.ndarray  # int64 [batches]: the batch's place in its bucket's rows
    rows: list[np.ndarray | _Spill]  # per bucket: shuffled corpus indices [batches × batch size], -1: padding


# ------------------------------------------------------------------------------------------------------------
# Batches.


class Batch(NamedTuple):
    """A padded batch of NumPy arrays; see the module docstring for the layout."""

    src: np.ndarray
    src_len: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray
    tgt_len: np.ndarray
    example_id: np.ndarray
    gold: np.ndarray | None = None
    src_segments: np.ndarray | None = None  # packed rows only (see the module docstring)
    tgt_segments: np.ndarray | None = None
    src_positions: np.ndarray | None = None
    tgt_positions: np.ndarray | None = None
    src_ext: np.ndarray | None = None  # copying only (see the module docstring)
    tgt_out_ext: np.ndarray | None = None

    @property
    def src_mask(self) -> np.ndarray:
        """bool [B, S]: True on real source positions (including ``</s>``)."""
        return np.arange(self.src.shape[1]) < self.src_len[:, None]

    @property
    def tgt_mask(self) -> np.ndarray:
        """bool [B, T]: True on target positions that carry a label."""
        return np.arange(self.tgt_out.shape[1]) < self.tgt_len[:, None]


def parse_alignment(alignment: str) -> list[tuple[int, int]]:
    """Pharaoh ``"i-j i-j ..."`` (``i?j``: possible link) as a list of ``(source, target)`` pairs."""
    links = []
    for link in alignment.split():
        i, _, j = link.replace("?", "-").partition("-")
        links.append((int(i), int(j)))
    return links


def assemble_batch(
    corpus: EncodedCorpus,
    rows: np.ndarray,
    length: int,
    *,
    add_source_eos: bool = True,
    with_gold: bool = False,
) -> Batch:
    """Pad the pairs ``rows`` (corpus indices, -1 for padding rows) to ``length`` positions."""
    n = len(rows)
    src = np.full((n, length), PAD_ID, np.int32)
    tgt_in = np.full((n, length), PAD_ID, np.int32)
    tgt_out = np.full((n, length), PAD_ID, np.int32)
    src_len = np.zeros(n, np.int32)
    tgt_len = np.zeros(n, np.int32)
    gold = np.zeros((n, length, length), bool) if with_gold else None
    copy = corpus.src_ext_tokens is not None
    src_ext = np.full((n, length), PAD_ID, np.int32) if copy else None
    tgt_out_ext = np.full((n, length), PAD_ID, np.int32) if copy else None
    for b, i in enumerate(rows):
        if i < 0:
            continue
        s, t = corpus.source(i), corpus.target(i)
        src[b, : len(s)] = s
        if add_source_eos:
            src[b, len(s)] = EOS_ID
        src_len[b] = len(s) + int(add_source_eos)
        tgt_in[b, 0] = BOS_ID
        tgt_in[b, 1 : len(t) + 1] = t
        tgt_out[b, : len(t)] = t
        tgt_out[b, len(t)] = EOS_ID
        tgt_len[b] = len(t) + 1
        if gold is not None:
            for si, tj in parse_alignment(corpus.alignments[i]):
                gold[b, tj, si] = True
        if copy:
            src_ext[b, : len(s)] = corpus.src_ext_tokens[corpus.src_offsets[i] : corpus.src_offsets[i + 1]]
            if add_source_eos:
                src_ext[b, len(s)] = EOS_ID  # attending to the source's end copies </s>
            tgt_out_ext[b, : len(t)] = corpus.tgt_ext_tokens[
                corpus.tgt_offsets[i] : corpus.tgt_offsets[i + 1]
            ]
            tgt_out_ext[b, len(t)] = EOS_ID
    example_id = np.where(np.asarray(rows) < 0, -1, rows).astype(np.int32)
    if copy:
        return Batch(
            src, src_len, tgt_in, tgt_out, tgt_len, example_id, gold, src_ext=src_ext, tgt_out_ext=tgt_out_ext
        )
    return Batch(src, src_len, tgt_in, tgt_out, tgt_len, example_id, gold)


# ------------------------------------------------------------------------------------------------------------
# Packing: several pairs per row.


class Packing(NamedTuple):
    """Pairs packed into rows by :func:`pack_pairs`.

    Attributes:
      rows: one int64 array of pair indices per row, in the order they sit in the row.
      dropped: int64 indices of the pairs that fit no row (longer than the width on either side).
      src_width, tgt_width: the rows' widths.
      src_used, tgt_used: positions the pairs fill in all rows together (fill = used / (rows · width)).
    """

    rows: list[np.ndarray]
    dropped: np.ndarray
    src_width: int
    tgt_width: int
    src_used: int
    tgt_used: int

    def summary(self) -> str:
        """One line: pairs, rows, fill of each side, drops."""
        n = sum(len(r) for r in self.rows)
        cells = max(len(self.rows), 1)
        return (
            f"packed {n:,} pairs into {len(self.rows):,} rows of width {self.src_width}/{self.tgt_width} "
            f"(source/target; {n / cells:.2f} pairs a row, {self.src_used / (cells * self.src_width):.1%} / "
            f"{self.tgt_used / (cells * self.tgt_width):.1%} of positions real); {len(self.dropped):,} pairs "
            "longer than a row dropped"
        )


def pack_pairs(
    src_needs: Sequence[int] | np.ndarray,
    tgt_needs: Sequence[int] | np.ndarray,
    src_width: int,
    tgt_width: int,
    order: Sequence[int] | np.ndarray | None = None,
) -> Packing:
    """Greedy first-fit packing: each pair, in ``order``, goes to the first row with room on both sides.

    A pair needs ``src_needs[i]`` source and ``tgt_needs[i]`` target positions (specials included). First-fit
    rather than the Flax examples' sequential packing (append to the open row, start a new one when the pair
    does not fit): packing happens once per run, offline, so its cost does not matter, and first-fit leaves
    fewer, fuller rows because a short pair can still go back to an earlier row's tail. Every pair is placed
    exactly once or, when it exceeds a width, listed in :attr:`Packing.dropped` (never silently lost).

    Args:
      src_needs, tgt_needs: positions each pair needs on each side, ``[N]``, each >= 1.
      src_width, tgt_width: the rows' widths.
      order: the order pairs are placed in (a permutation of a subset of ``0..N-1``); default ``0..N-1``.

    Returns:
      :class:`Packing`.

    >>> p = pack_pairs([3, 4, 2, 1, 9], [3, 4, 2, 1, 1], 5, 5)  # pair 2 goes back to row 0's tail
    >>> [r.tolist() for r in p.rows], p.dropped.tolist()
    ([[0, 2], [1, 3]], [4])
    """
    src_needs = np.asarray(src_needs, np.int64)
    tgt_needs = np.asarray(tgt_needs, np.int64)
    if src_needs.ndim != 1 or src_needs.shape != tgt_needs.shape:
        raise ValueError(
            f"src_needs and tgt_needs must be [N] of one N, got {src_needs.shape} and {tgt_needs.shape}"
        )
    for name, w in (("src_width", src_width), ("tgt_width", tgt_width)):
        if isinstance(w, bool) or not isinstance(w, int | np.integer) or w < 1:
            raise ValueError(f"{name} must be a positive int, got {w!r}")
    if len(src_needs) and min(src_needs.min(), tgt_needs.min()) < 1:
        raise ValueError("every pair needs at least one position on each side")
    order = np.arange(len(src_needs)) if order is None else np.asarray(order, np.int64)
    if len(np.unique(order)) != len(order) or (
        len(order) and not 0 <= order.min() <= order.max() < len(src_needs)
    ):
        raise ValueError("order must list distinct pair indices in [0, N)")
    fits = (src_needs[order] <= src_width) & (tgt_needs[order] <= tgt_width)
    dropped = np.sort(order[~fits])
    placed = order[fits]
    src_free = np.empty(len(placed), np.int64)  # at most one row per pair
    tgt_free = np.empty(len(placed), np.int64)
    members: list[list[int]] = []
    for i in placed:
        s, t = src_needs[i], tgt_needs[i]
        room = np.flatnonzero((src_free[: len(members)] >= s) & (tgt_free[: len(members)] >= t))
        if len(room):
            r = room[0]
            members[r].append(int(i))
        else:
            r = len(members)
            members.append([int(i)])
            src_free[r], tgt_free[r] = src_width, tgt_width
        src_free[r] -= s
        tgt_free[r] -= t
    return Packing(
        rows=[np.asarray(m, np.int64) for m in members],
        dropped=dropped,
        src_width=int(src_width),
        tgt_width=int(tgt_width),
        src_used=int(src_needs[placed].sum()),
        tgt_used=int(tgt_needs[placed].sum()),
    )


class PackedPlan(BatchPlan):
    """The schedule of packed batches: the kept pairs packed once into rows of one width, rows batched.

    The width is the padded length :class:`BatchPlan` would give the longest kept pair (its bucket), on both
    sides, so no kept pair is too long. The pairs are packed once, by :func:`pack_pairs` in a seeded random
    order (``numpy.random.default_rng((seed, "pack"))``; corpus order without ``shuffle``), and each epoch
    shuffles the *rows* as :class:`BatchPlan` shuffles a bucket: a fixed number of batches per epoch keeps the
    schedule a pure function of the global batch index (exact resumption, shards). A batch holds
    ``batch_size`` rows (or ``tokens_per_batch // width``), so it carries more pairs than an unpacked batch.

    Attributes (besides :class:`BatchPlan`'s): ``packing`` (:class:`Packing`, rows of corpus indices) and
    ``width``.
    """

    def __init__(self, corpus: EncodedCorpus, config: BatchConfig) -> None:
        probe = BatchPlan(corpus, config)  # the length filter, its errors and the widest bucket
        self.config = config
        self.num_filtered = probe.num_filtered
        self.width = probe.buckets[-1].length
        kept = np.concatenate([b.members for b in probe.buckets])
        kept.sort()
        if config.shuffle:
            kept = np.random.default_rng((config.seed, int.from_bytes(b"pack", "big"))).permutation(kept)
        src_need = corpus.src_lengths + int(config.add_source_eos)
        self.packing = pack_pairs(src_need, corpus.tgt_lengths + 1, self.width, self.width, order=kept)
        if len(self.packing.dropped):  # cannot happen: the width holds the longest kept pair
            raise AssertionError(f"packing dropped {len(self.packing.dropped)} kept pairs")
        rows = len(self.packing.rows)
        self.buckets = [Bucket(self.width, self._batch_size(self.width), np.arange(rows))]
        bs = self.buckets[0].batch_size
        self._counts = [rows // bs if config.drop_remainder else -(-rows // bs)]
        self.batches_per_epoch = self._counts[0]
        if self.batches_per_epoch == 0:
            raise CorpusError(
                f"{corpus.name}: no complete packed batch ({rows} rows of width {self.width}, batch size {bs}); "
                "lower the batch size or set drop_remainder=False"
            )
        self.num_batches = (
            sys.maxsize if config.num_epochs is None else config.num_epochs * self.batches_per_epoch
        )
        self._scratch = None  # the packing's rows are in memory: so are the rows' indices
        self._index_dtype = np.int64
        self._lock = threading.Lock()
        self._cache = {}

    def _pairs(self, rows: np.ndarray) -> np.ndarray:
        rows = rows[rows >= 0]
        return np.concatenate([self.packing.rows[r] for r in rows]) if len(rows) else rows


def assemble_packed_batch(
    corpus: EncodedCorpus,
    rows: Sequence[np.ndarray | None],
    width: int,
    *,
    add_source_eos: bool = True,
) -> Batch:
    """Lay out packed rows (each an array of corpus indices; ``None`` for a padding row) in ``width``
    positions, with segment ids and per-pair positions (see the module docstring)."""
    n = len(rows)
    src, tgt_in, tgt_out = (np.full((n, width), PAD_ID, np.int32) for _ in range(3))
    src_seg, tgt_seg, src_pos, tgt_pos = (np.zeros((n, width), np.int32) for _ in range(4))
    src_len, tgt_len = np.zeros(n, np.int32), np.zeros(n, np.int32)
    example_id = np.full(n, -1, np.int32)
    for b, members in enumerate(rows):
        if members is None or len(members) == 0:
            continue
        example_id[b] = members[0]
        a = c = 0  # next free source / target position
        for k, i in enumerate(members, start=1):
            s, t = corpus.source(i), corpus.target(i)
            ls, lt = len(s) + int(add_source_eos), len(t) + 1
            if a + ls > width or c + lt > width:
                raise ValueError(f"row {b}: pairs {list(members)} need more than {width} positions")
            src[b, a : a + len(s)] = s
            if add_source_eos:
                src[b, a + len(s)] = EOS_ID
            tgt_in[b, c] = BOS_ID
            tgt_in[b, c + 1 : c + lt] = t
            tgt_out[b, c : c + len(t)] = t
            tgt_out[b, c + len(t)] = EOS_ID
            src_seg[b, a : a + ls], src_pos[b, a : a + ls] = k, np.arange(ls)
            tgt_seg[b, c : c + lt], tgt_pos[b, c : c + lt] = k, np.arange(lt)
            a, c = a + ls, c + lt
        src_len[b], tgt_len[b] = a, c
    return Batch(src, src_len, tgt_in, tgt_out, tgt_len, example_id, None, src_seg, tgt_seg, src_pos, tgt_pos)


class _ShardSource:
    """grain random-access source: element ``k`` is this process's rows of global batch ``k``."""

    def __init__(self, corpus, plan, process_index, process_count, with_gold) -> None:
        self.corpus, self.plan, self.with_gold = corpus, plan, with_gold
        self.process_index, self.process_count = process_index, process_count

    def __len__(self) -> int:
        return self.plan.num_batches

    def __getitem__(self, k: int) -> Batch:
        bucket, rows = self.plan.global_batch(int(k))
        per = len(rows) // self.process_count
        mine = rows[self.process_index * per : (self.process_index + 1) * per]
        if isinstance(self.plan, PackedPlan):
            packed = [None if r < 0 else self.plan.packing.rows[r] for r in mine]
            return assemble_packed_batch(
                self.corpus, packed, self.plan.width, add_source_eos=self.plan.config.add_source_eos
            )
        return assemble_batch(
            self.corpus,
            mine,
            self.plan.buckets[bucket].length,
            add_source_eos=self.plan.config.add_source_eos,
            with_gold=self.with_gold,
        )


class BatchIterator(grain.DatasetIterator):
    """Iterator over this process's batches; its state (:meth:`get_state`) restores the exact position.

    It is a grain ``DatasetIterator``, so Orbax can checkpoint it beside the model (grain's
    ``save``/``load``).
    """

    def __init__(self, corpus: EncodedCorpus, plan: BatchPlan, source: _ShardSource, prefetch: int) -> None:
        read = grain.ReadOptions(num_threads=1 if prefetch else 0, prefetch_buffer_size=prefetch)
        inner = iter(grain.MapDataset.source(source).to_iter_dataset(read))
        super().__init__(inner)
        self.plan = plan
        self.process_index, self.process_count = source.process_index, source.process_count
        self._fingerprint = hashlib.sha256(
            json.dumps(
                [
                    corpus.fingerprint(),
                    dataclasses.asdict(plan.config),
                    self.process_index,
                    self.process_count,
                    # only when packed, so unpacked runs keep the fingerprints their checkpoints hold
                    *(["packed"] if isinstance(plan, PackedPlan) else []),
                ],
                sort_keys=True,
            ).encode()
        ).hexdigest()[:16]

    def __next__(self) -> Batch:
        return next(self._parent)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """``(rows on this process, padded length)`` of every batch shape this iterator yields."""
        return [(b // self.process_count, n) for b, n in self.plan.shapes]

    def get_state(self) -> dict[str, Any]:
        """``{"next_index": global batches consumed, "fingerprint": corpus/config/process hash}``."""
        return {"next_index": int(self._parent.get_state()["next_index"]), "fingerprint": self._fingerprint}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a state of an iterator over the same corpus, config and process."""
        if state.get("fingerprint") != self._fingerprint:
            raise ValueError(
                f"iterator state {state} was saved for another corpus, batch config or process "
                f"(this iterator's fingerprint is {self._fingerprint})"
            )
        self._parent.set_state({"next_index": int(state["next_index"])})


def make_batch_iterator(
    corpus: EncodedCorpus,
    config: BatchConfig,
    *,
    process_index: int = 0,
    process_count: int = 1,
    with_gold: bool = False,
    prefetch: int = 2,
    pack: bool = False,
    scratch: str | None = None,
) -> BatchIterator:
    """Batches of ``corpus`` under ``config``; process ``process_index`` of ``process_count`` gets its rows.

    Args:
      corpus: encoded pairs (:func:`encode_corpus`).
      config: filtering, bucketing, batch sizes, shuffling and epochs.
      process_index: this process (``jax.process_index()``).
      process_count: number of processes (``jax.process_count()``); each global batch of B rows is split into
        contiguous blocks of ``B // process_count`` rows, block ``p`` going to process ``p``.
      with_gold: include the gold alignment matrix ``gold`` (needs word-level vocabularies and a corpus with
        alignments, e.g. the built-in one).
      prefetch: batches assembled ahead in a background thread (0: none).
      pack: several pairs per row (:class:`PackedPlan`; batches carry segment ids and positions).
      scratch: a directory for the schedule's index arrays (:class:`BatchPlan`), e.g. the prepared corpus';
        None keeps them in memory. Packed plans keep them in memory.

    Returns:
      A :class:`BatchIterator`. Raises :class:`CorpusError` when filtering leaves nothing and ``ValueError``
      on inconsistent arguments.
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"need 0 <= process_index < process_count, got {process_index} and {process_count}")
    if with_gold and corpus.alignments is None:
        raise ValueError(
            f"{corpus.name}: no word-level gold alignments "
            "(the corpus has none, or a vocabulary is not word-level)"
        )
    if pack and with_gold:
        raise ValueError("packed batches carry no gold alignments (with_gold=True needs pack=False)")
    if pack and corpus.src_ext_tokens is not None:
        raise ValueError(
            "packed batches carry no extended ids for copying (encode_corpus copy=True needs pack=False)"
        )
    plan = PackedPlan(corpus, config) if pack else BatchPlan(corpus, config, scratch)
    bad = [b for b, _ in plan.shapes if b % process_count]
    if bad:
        raise ValueError(
            f"batch sizes {bad} are not divisible by process_count={process_count}; "
            f"set batch_multiple to a multiple of {process_count}"
        )
    source = _ShardSource(corpus, plan, process_index, process_count, with_gold)
    return BatchIterator(corpus, plan, source, prefetch)
