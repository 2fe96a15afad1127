"""Prepared corpora: a split encoded once into memory-mapped token arrays on disk, for corpora larger than memory.

A prepared directory holds one split's :class:`~attn_jax.data.EncodedCorpus` as NumPy ``.npy`` files, read
back with ``mmap_mode="r"`` so that a process pages in only the rows it batches::

    manifest.json           format version, input files (size, modification time), the settings that shaped
                            the arrays, pair counts, drops by reason, length statistics, the fingerprint
    train.src_tokens.npy    int32 [source tokens]  source i is src_tokens[src_offsets[i]:src_offsets[i + 1]]
    train.src_offsets.npy   int64 [N + 1]
    train.tgt_tokens.npy    int32 [target tokens]
    train.tgt_offsets.npy   int64 [N + 1]
    vocab/                  the vocabularies (:func:`attn_jax.data.save_vocabularies`)

:func:`prepare_corpus` reads the text in streaming passes (the vocabulary pass, then the encoding pass, which
writes in chunks of pairs), so no pass holds the corpus. It writes into a temporary directory beside the
target and renames it into place, so a killed preparation never leaves a directory that looks prepared. It
reuses a directory whose inputs and settings are unchanged and rebuilds it otherwise, saying which either way.
:func:`open_prepared` checks every file against the manifest; a truncated or damaged one raises a one-line
:class:`~attn_jax.data.CorpusError` naming it.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from attn_jax.data._batching import EncodedCorpus, length_blocks
from attn_jax.data._corpus import CorpusError
from attn_jax.data._vocab import Vocabulary, load_vocabularies, save_vocabularies

# Bump when the files' layout or meaning changes: older directories are then rebuilt.
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_ARRAYS = (
    ("src_tokens", np.dtype("<i4")),
    ("src_offsets", np.dtype("<i8")),
    ("tgt_tokens", np.dtype("<i4")),
    ("tgt_offsets", np.dtype("<i8")),
)
# Pairs encoded and written at a time: bounds the encoding pass' memory whatever the corpus size.
_CHUNK = 1 << 15

Pairs = Callable[[], Iterator[tuple[str, str]]]


class PreparedCorpus(NamedTuple):
    """A prepared split, opened.

    Attributes:
      encoded: the pairs, its arrays memory-mapped read-only; its fingerprint is the manifest's.
      source_vocab: the source vocabulary the pairs are encoded with.
      target_vocab: the target vocabulary.
      manifest: the manifest (see the module docstring).
      directory: the prepared directory.
      reused: whether it was already prepared (False: this call built it).
    """

    encoded: EncodedCorpus
    source_vocab: Vocabulary
    target_vocab: Vocabulary
    manifest: dict[str, Any]
    directory: str
    reused: bool


def _file_path(directory: str, split: str, array: str) -> str:
    return os.path.join(directory, f"{split}.{array}.npy")


def _input_record(path: str) -> dict[str, Any]:
    """What identifies an input file's content cheaply: its path, size and modification time."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file") from None
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)}
    )
    return out.getvalue()


class _NpyWriter:
    """A 1-D ``.npy`` file written in chunks: the header, whose length does not depend on ``n`` below 10^18,
    is written last, once the length is known."""

    def __init__(self, path: str, dtype: np.dtype) -> None:
        self.path, self.dtype, self.n = path, dtype, 0
        self._size = len(_npy_header(dtype, 10**18 - 1))
        self._file = open(path, "wb")  # noqa: SIM115  closed by close()
        self._file.write(b"\0" * self._size)

    def write(self, values: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(values, self.dtype).tobytes())
        self.n += len(values)

    def close(self) -> None:
        header = _npy_header(self.dtype, self.n)
        if len(header) != self._size:  # cannot happen: numpy pads every header to a multiple of 64 bytes
            raise AssertionError(f"{self.path}: .npy header of {len(header)} bytes, {self._size} reserved")
        self._file.seek(0)
        self._file.write(header)
        self._file.close()


def _select(
    pairs: Pairs, max_examples: int, counts: dict[str, int] | None = None
) -> Iterator[tuple[str, str]]:
    """The non-empty pairs, the first ``max_examples`` of them (0: all); ``counts`` (when given) gets the pairs
    with an empty side (``empty``) and those past the cap (``beyond_max_examples``) over the whole input."""
    empty = beyond = taken = 0
    for s, t in pairs():
        if not s or not t:
            empty += 1
        elif max_examples and taken >= max_examples:
            beyond += 1
        else:
            taken += 1
            yield s, t
    if counts is not None:
        counts.update(empty=empty, beyond_max_examples=beyond)


def _within(length: int, limit: int | None) -> bool:
    return limit is None or length <= limit


def _stats(hist: np.ndarray) -> dict[str, Any]:
    """Length statistics of one side from its histogram (``hist[k]``: pairs of ``k`` tokens)."""
    n = int(hist.sum())
    if n == 0:
        return {"pairs": 0}
    cum = np.cumsum(hist)
    pct = {f"p{q}": int(np.searchsorted(cum, q / 100 * n)) for q in (50, 90, 99)}
    mean = float((np.arange(len(hist)) * hist).sum() / n)
    return {
        "tokens": int((np.arange(len(hist)) * hist).sum()),
        "mean": round(mean, 3),
        "min": int(np.flatnonzero(hist)[0]),
        "max": len(hist) - 1,
        **pct,
        "histogram": [int(c) for c in hist],
    }


def _add_hist(hist: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    counts = np.bincount(lengths)
    if len(counts) > len(hist):
        hist = np.concatenate([hist, np.zeros(len(counts) - len(hist), np.int64)])
    hist[: len(counts)] += counts
    return hist


def _encode_chunk(vocab: Vocabulary, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    ids = [vocab.encode(t) for t in texts]
    lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
    tokens = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lengths.sum()))
    return tokens, lengths


def _fingerprint(directory: str, split: str) -> str:
    """:meth:`EncodedCorpus.fingerprint` of the written arrays, read back in blocks (never all at once)."""
    h = hashlib.sha256()
    for array, _ in _ARRAYS:
        path = _file_path(directory, split, array)
        with open(path, "rb") as f:
            np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f)
            while block := f.read(1 << 24):
                h.update(block)
    return h.hexdigest()[:16]


def _build(
    directory: str,
    *,
    split: str,
    name: str,
    pairs: Pairs,
    inputs: list[dict[str, Any]],
    settings: Mapping[str, Any],
    max_source_length: int | None,
    max_target_length: int | None,
    max_examples: int,
    make_vocabularies: Callable[[Pairs], tuple[Vocabulary, Vocabulary, str]],
    vocabularies: tuple[Vocabulary, Vocabulary] | None,
) -> None:
    """Write a prepared split into the (empty) ``directory``: vocabularies, arrays, then the manifest."""
    if vocabularies is None:

        def kept() -> Iterator[tuple[str, str]]:
            # A pair over the limits in words never trains (a subword vocabulary gives at least one piece a
            # word), so its text does not shape the vocabulary: as the in-memory path decides.
            for s, t in _select(pairs, max_examples):
                if _within(len(s.split()), max_source_length) and _within(len(t.split()), max_target_length):
                    yield s, t

        src_vocab, tgt_vocab, vocab_line = make_vocabularies(kept)
    else:
        (src_vocab, tgt_vocab), vocab_line = vocabularies, ""
    save_vocabularies(os.path.join(directory, "vocab"), src_vocab, tgt_vocab)
    writers = {a: _NpyWriter(_file_path(directory, split, a), dtype) for a, dtype in _ARRAYS}
    totals = {"src": 0, "tgt": 0}
    for side in totals:
        writers[f"{side}_offsets"].write(np.zeros(1, np.int64))
    hists = {"src": np.zeros(0, np.int64), "tgt": np.zeros(0, np.int64)}
    drops = dict.fromkeys(("kept", "source_too_long", "target_too_long", "both_too_long"), 0)
    counts: dict[str, int] = {}
    stream = _select(pairs, max_examples, counts)
    while chunk := list(itertools.islice(stream, _CHUNK)):
        lengths = {}
        for side, vocab, k in (("src", src_vocab, 0), ("tgt", tgt_vocab, 1)):
            tokens, lengths[side] = _encode_chunk(vocab, [p[k] for p in chunk])
            writers[f"{side}_tokens"].write(tokens)
            writers[f"{side}_offsets"].write(totals[side] + np.cumsum(lengths[side]))
            totals[side] += len(tokens)
            hists[side] = _add_hist(hists[side], lengths[side])
        # The length filter's accounting, as the batcher's filter decides it on token counts.
        src_over = lengths["src"] > max_source_length if max_source_length is not None else False
        tgt_over = lengths["tgt"] > max_target_length if max_target_length is not None else False
        src_over = np.broadcast_to(src_over, len(chunk))
        tgt_over = np.broadcast_to(tgt_over, len(chunk))
        drops["kept"] += int((~(src_over | tgt_over)).sum())
        drops["source_too_long"] += int((src_over & ~tgt_over).sum())
        drops["target_too_long"] += int((tgt_over & ~src_over).sum())
        drops["both_too_long"] += int((src_over & tgt_over).sum())
    for w in writers.values():
        w.close()
    n = writers["src_offsets"].n - 1
    if n == 0:
        raise CorpusError(f"{name}: no sentence pairs (skipped {counts['empty']} pairs with an empty side)")
    manifest = {
        "format_version": FORMAT_VERSION,
        "split": split,
        "name": name,
        "inputs": inputs,
        "settings": dict(settings),
        "vocab_origin": "built" if vocabularies is None else "given",
        "vocab_line": vocab_line,
        "vocab_sizes": [src_vocab.size, tgt_vocab.size],
        "pairs": n,
        "tokens": [totals["src"], totals["tgt"]],
        "counts": {**drops, **counts},
        "lengths": {"source": _stats(hists["src"]), "target": _stats(hists["tgt"])},
        "fingerprint": _fingerprint(directory, split),
    }
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a prepared directory. Raises :class:`CorpusError` naming it when it is unreadable."""
    path = os.path.join(os.fspath(directory), MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict):
            raise ValueError(f"a JSON {type(manifest).__name__}, not an object")
        for key in ("format_version", "split", "pairs", "tokens", "inputs", "settings", "fingerprint"):
            if key not in manifest:
                raise ValueError(f"no {key!r}")
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file: not a prepared corpus") from None
    except (OSError, ValueError) as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CorpusError(
            f"{path}: damaged prepared manifest ({' '.join(str(e).split())}); delete {directory} to prepare "
            "it again"
        ) from None
    return manifest


def _damaged(path: str, what: str) -> CorpusError:
    return CorpusError(
        f"{path}: damaged prepared file: {what}; delete {os.path.dirname(path)} to prepare it again"
    )


def _open_array(path: str, dtype: np.dtype, n: int) -> np.memmap:
    """A memory map of a 1-D ``.npy`` file, checked against the dtype and length the manifest gives."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, got = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, got = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy version {version}")
            offset = f.tell()
    except FileNotFoundError:
        raise _damaged(path, "missing") from None
    except (OSError, ValueError, EOFError) as e:
        raise _damaged(path, f"bad .npy header ({' '.join(str(e).split())})") from None
    if got != dtype or shape != (n,) or fortran:
        raise _damaged(path, f"holds {got}{list(shape)}, the manifest says {dtype}[{n}]")
    size, want = os.path.getsize(path), offset + n * dtype.itemsize
    if size != want:
        raise _damaged(path, f"{size:,} bytes, expected {want:,} (truncated or extended)")
    if n == 0:
        return np.zeros(0, dtype)
    array = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(n,))
    array._file = open(path, "rb")  # noqa: SIM115  rows are read through it (closed with the array)
    return array


def _check_offsets(path: str, offsets: np.ndarray, tokens: int) -> None:
    """Offsets start at 0, never decrease and end at the token count. Checked on the lengths, a block at a
    time read from the file, never through the map: opening a corpus does not grow the process with it."""
    if offsets[0] != 0 or offsets[-1] != tokens:
        raise _damaged(path, f"offsets run from {offsets[0]} to {offsets[-1]}, expected 0 to {tokens:,}")
    for start, lengths in length_blocks(offsets):
        bad = np.flatnonzero(lengths < 0)
        if len(bad):
            raise _damaged(path, f"offsets decrease at entry {start + int(bad[0]) + 1}")


def open_prepared(directory: str | os.PathLike, *, reused: bool = True) -> PreparedCorpus:
    """Open a prepared split read-only, checking every file against the manifest.

    Raises:
      CorpusError: one line naming the file that is missing, truncated or damaged (a wrong size or dtype, a
        bad ``.npy`` header, offsets that decrease or do not end at the token count, an unreadable manifest
        or vocabulary).
    """
    directory = os.fspath(directory)
    manifest = read_manifest(directory)
    if manifest["format_version"] != FORMAT_VERSION:
        raise CorpusError(
            f"{os.path.join(directory, MANIFEST)}: prepared format version {manifest['format_version']}, this "
            f"attn_jax reads version {FORMAT_VERSION}; delete {directory} to prepare it again"
        )
    split, n = manifest["split"], int(manifest["pairs"])
    lengths = {"src_tokens": manifest["tokens"][0], "tgt_tokens": manifest["tokens"][1]}
    arrays = {}
    for array, dtype in _ARRAYS:
        arrays[array] = _open_array(_file_path(directory, split, array), dtype, lengths.get(array, n + 1))
    for side in ("src", "tgt"):
        path = _file_path(directory, split, f"{side}_offsets")
        _check_offsets(path, arrays[f"{side}_offsets"], lengths[f"{side}_tokens"])
    vocab_dir = os.path.join(directory, "vocab")
    try:
        src_vocab, tgt_vocab = load_vocabularies(vocab_dir)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise CorpusError(
            f"{vocab_dir}: damaged prepared vocabulary ({' '.join(str(e).split())}); delete {directory} to "
            "prepare it again"
        ) from None
    encoded = EncodedCorpus(**arrays, name=manifest.get("name", directory), digest=manifest["fingerprint"])
    return PreparedCorpus(encoded, src_vocab, tgt_vocab, manifest, directory, reused)


def _changes(
    manifest: dict[str, Any],
    inputs: list[dict[str, Any]],
    settings: Mapping[str, Any],
    given: bool,
) -> str:
    """Why a prepared directory no longer fits its inputs and settings ("" when it does)."""
    if manifest["format_version"] != FORMAT_VERSION:
        return f"its format version changed ({manifest['format_version']} -> {FORMAT_VERSION})"
    old_paths = [r.get("path") for r in manifest["inputs"]]
    if old_paths != [r["path"] for r in inputs]:
        return f"the input files changed ({', '.join(map(str, old_paths))} -> {', '.join(r['path'] for r in inputs)})"
    for old, new in zip(manifest["inputs"], inputs, strict=True):
        if (old.get("size"), old.get("mtime_ns")) != (new["size"], new["mtime_ns"]):
            return f"{new['path']} changed (size or modification time)"
    old_settings = manifest["settings"]
    for key in sorted(set(old_settings) | set(settings)):
        if old_settings.get(key) != settings.get(key):
            return f"{key} changed ({old_settings.get(key)!r} -> {settings.get(key)!r})"
    if not given and manifest.get("vocab_origin") != "built":
        return "its vocabularies came from another run's directory, and this run builds its own"
    return ""


def prepare_corpus(
    directory: str | os.PathLike,
    *,
    name: str,
    pairs: Pairs,
    inputs: Sequence[str],
    settings: Mapping[str, Any],
    make_vocabularies: Callable[[Pairs], tuple[Vocabulary, Vocabulary, str]],
    max_source_length: int | None = None,
    max_target_length: int | None = None,
    max_examples: int = 0,
    vocabularies: tuple[Vocabulary, Vocabulary] | None = None,
    build: bool = True,
    split: str = "train",
    log: Callable[[str], None] | None = None,
) -> PreparedCorpus:
    """Prepare a split in ``directory``, or reuse it when its inputs and settings are unchanged.

    Args:
      directory: the prepared directory (created; its parent must be writable).
      name: the corpus name for messages (e.g. ``src | tgt``).
      pairs: a function that reads the input afresh each call and yields every pair, both sides stripped,
        pairs with an empty side included (:func:`attn_jax.data.iter_plain_pairs`).
      inputs: the files ``pairs`` reads: their sizes and modification times decide reuse.
      settings: every other setting that shapes the arrays or the vocabularies (JSON values); a change in
        any of them rebuilds.
      make_vocabularies: builds ``(source, target, line)`` from a function yielding the training pairs within
        the length limits in words; it may call it several times (each call is one streaming pass).
      max_source_length, max_target_length: the length filter, counted in tokens for the manifest's drops
        and in words for the vocabulary's pairs (None: no limit).
      max_examples: keep the first this many non-empty pairs (0: all); the rest are counted.
      vocabularies: encode with these instead of building them (a resumed run's); a prepared directory
        whose vocabularies differ is rebuilt.
      build: False: never build, raise when the directory is missing or out of date (the processes of a
        multi-process run that wait for the first one to prepare).
      split: the split name in the file names.
      log: receives one line saying whether the directory is reused or (re)built and why, and the
        preparing speed.

    Returns:
      The opened :class:`PreparedCorpus`. Raises :class:`CorpusError` for unreadable input, a damaged
      prepared file (one line naming it) or a non-empty ``directory`` that is not a prepared corpus.
    """
    directory = os.path.abspath(os.fspath(directory))
    say = log or (lambda line: None)
    records = [_input_record(p) for p in inputs]
    reason = "none is there yet"
    if os.path.isdir(directory) and os.listdir(directory):
        if not os.path.exists(os.path.join(directory, MANIFEST)):
            raise CorpusError(
                f"{directory}: not a prepared corpus (no {MANIFEST}) and not empty; choose another directory"
            )
        manifest = read_manifest(directory)
        reason = _changes(manifest, records, settings, vocabularies is not None)
        if not reason:
            prepared = open_prepared(directory)
            if vocabularies is not None and (prepared.source_vocab, prepared.target_vocab) != tuple(
                vocabularies
            ):
                reason = "its vocabularies differ from the run's own"
            else:
                say(
                    f"data: reusing prepared {split} split in {directory} ({manifest['pairs']:,} pairs; its input "
                    "files and settings are unchanged)"
                )
                return prepared
        verb = "rebuilding"
    else:
        verb = "preparing"
    if not build:
        raise CorpusError(f"{directory}: prepared {split} split missing or out of date: {reason}")
    if verb == "preparing":
        say(f"data: preparing the {split} split in {directory} (none is there yet)")
    else:
        say(f"data: rebuilding the prepared {split} split in {directory} because {reason}")
    start = time.perf_counter()
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        _build(
            tmp,
            split=split,
            name=name,
            pairs=pairs,
            inputs=records,
            settings=settings,
            max_source_length=max_source_length,
            max_target_length=max_target_length,
            max_examples=max_examples,
            make_vocabularies=make_vocabularies,
            vocabularies=vocabularies,
        )
        if os.path.exists(
            directory
        ):  # renamed aside first: a kill here leaves no directory, never half of one
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old-", dir=parent)
            os.rename(directory, os.path.join(old, "d"))
            os.rename(tmp, directory)
            shutil.rmtree(old)
        else:
            os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prepared = open_prepared(directory, reused=False)
    seconds = time.perf_counter() - start
    n = prepared.manifest["pairs"]
    size = sum(os.path.getsize(_file_path(directory, split, a)) for a, _ in _ARRAYS)
    say(
        f"data: prepared {n:,} pairs in {seconds:.1f} s ({n / max(seconds, 1e-9):,.0f} pairs/s), "
        f"{size / 1e6:,.1f} MB of token arrays in {directory}"
    )
    return prepared
