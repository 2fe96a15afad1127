"""Parallel corpora in memory, read from plain-text files, TSV files, TFDS datasets or the built-in generator.

Every reader returns a :class:`ParallelCorpus` of stripped, non-empty sentence pairs. Pairs where either side
is empty are skipped and counted (``skipped_empty``); every other problem raises :class:`CorpusError`, whose
message starts with ``file:line:`` (or the file, or the dataset name) so that the CLI can print it as one
line.

File corpora of several splits name their files with ``{split}`` (``data/{split}.en``): :func:`split_path`
fills it in, :func:`find_splits` lists the splits that have files, and :func:`resolve_split` reads ``valid`` or
``dev`` for ``validation`` when the corpus names its validation split so.

WMT'14 English-French, the data of Bahdanau et al. (2015), comes through TFDS. TFDS downloads and prepares it
once, on a machine with internet access; after that it loads offline from ``data_dir``::

    # once, with internet (about 40M pairs, several GB; takes hours):
    pip install 'attn-jax[data]' importlib-resources
    tfds build wmt14_translate/fr-en --data_dir ~/tensorflow_datasets
    # or, from Python: tfds.builder("wmt14_translate/fr-en", data_dir=...).download_and_prepare()

    # then, offline, anywhere the data_dir is mounted:
    corpus = load_tfds_corpus("wmt14_translate/fr-en", "train", source_key="en", target_key="fr",
                              data_dir="~/tensorflow_datasets")

(``importlib-resources``: TFDS 4.9.10 imports it when preparing any dataset but only declares it for Python <
3.9, tensorflow/datasets#11212.)
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import os
import re
from collections.abc import Iterable, Iterator, Sequence

from attn_jax.data._synthetic import SPLITS


class CorpusError(ValueError):
    """A corpus (or a saved vocabulary) cannot be read; the message names the file and line
    (``path:line: what is wrong``)."""


@dataclasses.dataclass(frozen=True)
class ParallelCorpus:
    """Sentence pairs, aligned by index.

    Attributes:
      sources: source sentences (stripped, never empty).
      targets: target sentences, ``targets[i]`` translates ``sources[i]``.
      alignments: gold word alignments (Pharaoh ``"i-j ..."`` over whitespace tokens), or None.
      name: where the pairs came from, for messages.
      skipped_empty: pairs dropped because one side was empty.
    """

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    alignments: tuple[str, ...] | None = None
    name: str = ""
    skipped_empty: int = 0

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.targets):
            raise ValueError(f"{self.name}: {len(self.sources)} sources but {len(self.targets)} targets")
        if self.alignments is not None and len(self.alignments) != len(self.sources):
            raise ValueError(f"{self.name}: {len(self.sources)} pairs but {len(self.alignments)} alignments")

    def __len__(self) -> int:
        return len(self.sources)


def _collect(
    name: str, rows: Iterable[tuple[str, str] | tuple[str, str, str]], *, with_alignments: bool
) -> ParallelCorpus:
    """Strip both sides, skip pairs with an empty side, and refuse an empty result."""
    sources, targets, alignments = [], [], []
    skipped = 0
    for row in rows:
        src, tgt = row[0].strip(), row[1].strip()
        if not src or not tgt:
            skipped += 1
            continue
        sources.append(src)
        targets.append(tgt)
        if with_alignments:
            alignments.append(row[2].strip())
    if not sources:
        raise CorpusError(f"{name}: no sentence pairs (skipped {skipped} pairs with an empty side)")
    return ParallelCorpus(
        tuple(sources), tuple(targets), tuple(alignments) if with_alignments else None, name, skipped
    )


def _iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a UTF-8 file one by one, without line endings (``\\n``, ``\\r\\n``) or a leading byte-order
    mark."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise CorpusError(
                        f"{path}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                    ) from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")
                yield line.rstrip("\r\n")
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CorpusError(f"{path}: is a directory, expected a text file") from None
    except PermissionError:
        raise CorpusError(f"{path}: permission denied") from None


def _read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 file (:func:`_iter_lines`) as a list."""
    return list(_iter_lines(path))


def iter_plain_pairs(
    source_path: str | os.PathLike, target_path: str | os.PathLike
) -> Iterator[tuple[str, str]]:
    """The pairs of two line-aligned files one at a time, both sides stripped, empty ones included.

    The streaming form of :func:`read_plain_corpus` (without alignments): it holds one line of each file, and
    raises the same :class:`CorpusError` for a missing file, invalid UTF-8 or different line counts (after
    the shorter file's last pair).
    """
    src, tgt = _iter_lines(source_path), _iter_lines(target_path)
    n = 0
    for s, t in itertools.zip_longest(src, tgt):
        if s is None or t is None:
            ns = n + (s is not None) + sum(1 for _ in src)
            nt = n + (t is not None) + sum(1 for _ in tgt)
            longer = source_path if ns > nt else target_path
            raise CorpusError(
                f"{os.fspath(longer)}:{n + 1}: line has no partner: "
                f"{os.fspath(source_path)} has {ns} lines but {os.fspath(target_path)} has {nt}"
            )
        n += 1
        yield s.strip(), t.strip()


def iter_tsv_pairs(
    path: str | os.PathLike, source_column: int = 0, target_column: int = 1
) -> Iterator[tuple[str, str]]:
    """The pairs of a TSV file one at a time, both sides stripped, blank lines and empty sides included as
    empty strings: the streaming form of :func:`read_tsv_corpus` (without alignments), with its errors."""
    path = os.fspath(path)
    need = max(source_column, target_column) + 1
    for lineno, line in enumerate(_iter_lines(path), start=1):
        if not line.strip():
            yield "", ""
            continue
        cols = line.split("\t")
        if len(cols) < need:
            raise CorpusError(f"{path}:{lineno}: expected {need} tab-separated columns, found {len(cols)}")
        yield cols[source_column].strip(), cols[target_column].strip()


def _check_links(path: str, lineno: int, line: str, source: str, target: str) -> str:
    """A Pharaoh line ``i-j ...`` (``i?j``: possible link) checked against its pair's whitespace tokens."""
    n_src, n_tgt = len(source.split()), len(target.split())
    for link in line.split():
        i, sep, j = link.replace("?", "-").partition("-")
        if not (sep and i.isdigit() and j.isdigit()):
            raise CorpusError(
                f"{path}:{lineno}: malformed alignment link {link!r}; expected source-target, e.g. 0-1"
            )
        if int(i) >= n_src or int(j) >= n_tgt:
            raise CorpusError(
                f"{path}:{lineno}: alignment link {link!r} out of range: the pair has {n_src} source and "
                f"{n_tgt} target words (0-based positions)"
            )
    return line


def _with_alignments(
    rows: list[tuple[str, str]], alignment_path: str | os.PathLike, text: str
) -> list[tuple[str, str, str]]:
    """``rows`` with line ``k`` of the Pharaoh file ``alignment_path`` as the third member of row ``k``."""
    path = os.fspath(alignment_path)
    lines = _read_lines(path)
    if len(lines) != len(rows):
        raise CorpusError(
            f"{path}:{min(len(lines), len(rows)) + 1}: alignment file has {len(lines)} lines but {text} has "
            f"{len(rows)}: one alignment line per sentence pair"
        )
    # A pair with an empty side is skipped (and counted) by the reader, its alignment line with it: unchecked.
    return [
        (src, tgt, _check_links(path, k, line, src, tgt) if src.strip() and tgt.strip() else line)
        for k, ((src, tgt), line) in enumerate(zip(rows, lines, strict=True), start=1)
    ]


def read_plain_corpus(
    source_path: str | os.PathLike,
    target_path: str | os.PathLike,
    alignment_path: str | os.PathLike | None = None,
) -> ParallelCorpus:
    """Read a parallel corpus from two line-aligned UTF-8 files (one sentence a line).

    Args:
      source_path: source sentences.
      target_path: target sentences; line ``k`` translates line ``k`` of ``source_path``.
      alignment_path: optional gold word alignments, line ``k`` for pair ``k`` in Pharaoh format ``i-j ...``
        (0-based source word ``i``, target word ``j``, whitespace tokens; ``i?j`` a possible link; an empty
        line: no links).

    Returns:
      The corpus. Pairs with an empty side are skipped and counted in ``skipped_empty``. Raises
      :class:`CorpusError` for a missing file, invalid UTF-8 (``file:line``), different line counts (naming
      the first line without a partner), a malformed or out-of-range alignment link (``file:line``) or no
      pairs left.
    """
    src, tgt = _read_lines(source_path), _read_lines(target_path)
    if len(src) != len(tgt):
        longer, n = (source_path, len(src)) if len(src) > len(tgt) else (target_path, len(tgt))
        raise CorpusError(
            f"{os.fspath(longer)}:{min(len(src), len(tgt)) + 1}: line has no partner: "
            f"{os.fspath(source_path)} has {len(src)} lines but {os.fspath(target_path)} has {len(tgt)}"
        )
    rows = list(zip(src, tgt, strict=True))
    if alignment_path is not None:
        rows = _with_alignments(rows, alignment_path, os.fspath(source_path))
    return _collect(
        f"{os.fspath(source_path)} | {os.fspath(target_path)}",
        rows,
        with_alignments=alignment_path is not None,
    )


SPLIT_FIELD = "{split}"
# What corpora commonly call the validation split; "validation" (the TFDS and built-in name) comes first.
VALIDATION_NAMES = ("validation", "valid", "dev")
# The order in which `attn-jax data` lists the splits it finds; others follow alphabetically.
_SPLIT_ORDER = ("train", *VALIDATION_NAMES, "test")


def split_path(pattern: str | os.PathLike, split: str) -> str:
    """``pattern`` with every ``{split}`` replaced by ``split`` (other braces are kept as they are).

    >>> split_path("data/{split}.en", "valid")
    'data/valid.en'
    """
    return os.fspath(pattern).replace(SPLIT_FIELD, split)


def find_splits(pattern: str | os.PathLike) -> list[str]:
    """The split names for which ``pattern`` (a path with ``{split}``) names an existing file or directory.

    Ordered train, validation, valid, dev, test, then the rest alphabetically; ``[]`` when none exists.

    >>> find_splits("/nonexistent/{split}.en")
    []
    """
    pattern = os.fspath(pattern)
    parts = pattern.split(SPLIT_FIELD)
    if len(parts) < 2:
        raise ValueError(f"{pattern}: has no {SPLIT_FIELD}")
    # Every {split} stands for the same name: the first one captures it, the others must repeat it.
    fields = [f"(?P<split>[^{re.escape(os.sep)}]+)"] + ["(?P=split)"] * (len(parts) - 2)
    regex = re.compile(
        re.escape(parts[0]) + "".join(f + re.escape(p) for f, p in zip(fields, parts[1:], strict=True))
    )
    found = set()
    for path in glob.glob("*".join(glob.escape(p) for p in parts)):
        m = regex.fullmatch(path)
        if m:
            found.add(m.group("split"))
    known = [s for s in _SPLIT_ORDER if s in found]
    return known + sorted(found - set(known))


def resolve_split(
    patterns: Sequence[str | os.PathLike], split: str, *, choose: str = "the split", skip: str = ""
) -> str:
    """The split to read for ``split`` from files named by ``patterns`` (paths with ``{split}``).

    ``split`` itself, unless it is ``validation`` and no file of it exists: then ``valid`` or ``dev``, whichever
    has files (corpora name their validation split either way). Patterns without ``{split}`` name the same
    files for every split and are left alone.

    Args:
      patterns: the corpus' path patterns (source and target, or one TSV path).
      split: the split asked for.
      choose: what the user sets to name a split, for the error message (e.g. ``data.eval_split``).
      skip: how to do without the split, for the error message (e.g. ``data.eval_split=none``).

    Returns:
      The split name whose files to read. Raises :class:`CorpusError` in one line when ``validation`` has no
      files and both ``valid`` and ``dev`` do (naming them), or when none of the three has files (naming
      the paths tried).
    """
    patterns = [os.fspath(p) for p in patterns]
    if split != VALIDATION_NAMES[0] or not any(SPLIT_FIELD in p for p in patterns):
        return split

    def exists(name: str) -> bool:
        return any(os.path.exists(split_path(p, name)) for p in patterns)

    if exists(split):
        return split
    present = [name for name in VALIDATION_NAMES[1:] if exists(name)]
    if len(present) == 1:
        return present[0]
    first = patterns[0]
    if present:
        named = " and ".join(f"{name} ({split_path(first, name)})" for name in present)
        raise CorpusError(
            f"{first}: no validation split ({split_path(first, split)}), and several candidates: {named}; "
            f"set {choose} to the one to use, e.g. {choose}={present[0]}"
        )
    tried = ", ".join(split_path(first, name) for name in VALIDATION_NAMES)
    instead = f", or {skip} to do without one" if skip else ""
    raise CorpusError(
        f"{first}: no validation split: none of {tried} exists; set {choose} to its name{instead}"
    )


def read_moses_corpus(prefix: str | os.PathLike, source_lang: str, target_lang: str) -> ParallelCorpus:
    """Read Moses-style ``prefix.source_lang`` / ``prefix.target_lang`` files (``train.en``, ``train.fr``)."""
    prefix = os.fspath(prefix)
    return read_plain_corpus(f"{prefix}.{source_lang}", f"{prefix}.{target_lang}")


def read_tsv_corpus(
    path: str | os.PathLike,
    source_column: int = 0,
    target_column: int = 1,
    alignment_path: str | os.PathLike | None = None,
) -> ParallelCorpus:
    """Read a parallel corpus from a UTF-8 file of tab-separated columns, one pair a line.

    Args:
      path: the TSV file.
      source_column: 0-based column of the source sentence.
      target_column: 0-based column of the target sentence.
      alignment_path: optional gold word alignments, line ``k`` for line ``k`` of ``path`` (blank lines
        included), as in :func:`read_plain_corpus`.

    Returns:
      The corpus; blank lines and pairs with an empty side are skipped and counted. A non-blank line with too
      few columns raises :class:`CorpusError` naming ``path:line``.
    """
    path = os.fspath(path)
    need = max(source_column, target_column) + 1
    rows = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            rows.append(("", ""))
            continue
        cols = line.split("\t")
        if len(cols) < need:
            raise CorpusError(f"{path}:{lineno}: expected {need} tab-separated columns, found {len(cols)}")
        rows.append((cols[source_column], cols[target_column]))
    if alignment_path is not None:
        rows = _with_alignments(rows, alignment_path, path)
    return _collect(path, rows, with_alignments=alignment_path is not None)


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclasses.dataclass(frozen=True)
class TfdsLocation:
    """Where a TFDS dataset lives on disk, as :func:`prepare_tfds_dataset` found or built it.

    Attributes:
      name: the TFDS name with config, e.g. ``"attn_jax_synthetic/tiny"``.
      data_dir: the data directory (the root holding every dataset), absolute.
      path: this dataset's directory, ``<data_dir>/<name>/<config>/<version>``.
      prepared: whether the dataset is prepared there (after building, when asked to build).
      built: whether this call prepared it (and so wrote ``bytes`` bytes).
      bytes: size on disk of ``path`` (0 when not prepared).
    """

    name: str
    data_dir: str
    path: str
    prepared: bool
    built: bool
    bytes: int


def _tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def _tfds_builder(name: str, data_dir: str | os.PathLike | None):
    import tensorflow_datasets as tfds

    import attn_jax.data._tfds_synthetic  # noqa: F401  registers attn_jax_synthetic

    if data_dir is not None:
        data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))
    try:
        return tfds.builder(name, data_dir=data_dir)
    except Exception as e:  # TFDS raises DatasetNotFoundError and friends with multi-line messages
        raise CorpusError(f"{name}: unknown TFDS dataset ({str(e).splitlines()[0]})") from None


def _download_and_prepare(builder, name: str) -> None:
    try:
        builder.download_and_prepare()
    except ModuleNotFoundError as e:
        raise CorpusError(
            f"{name}: preparing needs the missing module {e.name!r} (pip install importlib-resources; "
            "tensorflow/datasets#11212)"
        ) from None


def prepare_tfds_dataset(
    name: str, *, data_dir: str | os.PathLike | None = None, build: bool = False
) -> TfdsLocation:
    """Find a TFDS dataset's directory and, with ``build``, prepare it there if it is not yet.

    Call it before :func:`load_tfds_corpus` to say where a dataset is read from or written to, and how much was
    written: ``attn-jax data`` prints both before its statistics.

    Args:
      name: TFDS name with config, e.g. ``"attn_jax_synthetic/tiny"``.
      data_dir: TFDS data directory; None: TFDS's, ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets`` (or
        another directory TFDS knows that already holds the dataset). ``~`` is expanded.
      build: prepare the dataset when it is not (needs internet for real datasets; the built-in corpus builds
        offline).

    Returns:
      The :class:`TfdsLocation`. Raises :class:`CorpusError` for an unknown dataset.
    """
    builder = _tfds_builder(name, data_dir)
    # builder.is_prepared() would log a warning for a directory that does not exist yet
    prepared = (builder.data_path / "dataset_info.json").exists()
    built = build and not prepared
    if built:
        _download_and_prepare(builder, name)
        prepared = True
    path = os.fspath(builder.data_path)
    return TfdsLocation(
        name=name,
        data_dir=os.fspath(builder.data_dir_root),
        path=path,
        prepared=prepared,
        built=built,
        bytes=_tree_bytes(path) if prepared else 0,
    )


def load_tfds_corpus(
    name: str,
    split: str,
    *,
    source_key: str | None = None,
    target_key: str | None = None,
    alignment_key: str | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    max_examples: int | None = None,
) -> ParallelCorpus:
    """Read a TFDS translation dataset (e.g. ``wmt14_translate/fr-en``) into memory.

    The dataset must already be prepared in ``data_dir`` unless ``download`` is True; see the module docstring
    for the one-time ``tfds build`` on a machine with internet.

    Args:
      name: TFDS name with config, e.g. ``"wmt14_translate/fr-en"`` or ``"attn_jax_synthetic/tiny"``.
      split: TFDS split, slicing allowed (``"train[:1%]"``).
      source_key: feature holding the source text; default: the first of the dataset's ``supervised_keys``.
      target_key: feature holding the target text; default: the second of ``supervised_keys``.
      alignment_key: feature holding gold Pharaoh alignments, if any; default ``"alignment"`` when present.
      data_dir: TFDS data directory (default: TFDS's, ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
      download: prepare the dataset first if it is not (needs internet for real datasets).
      max_examples: read at most this many pairs (before skipping empty ones).

    Returns:
      The corpus. Raises :class:`CorpusError` when the dataset is unknown, not prepared, or lacks the keys.
    """
    import tensorflow_datasets as tfds  # lazy: TFDS (and TensorFlow when reading) only on this path

    builder = _tfds_builder(name, data_dir)
    features = builder.info.features
    keys = list(features.keys()) if hasattr(features, "keys") else []
    supervised = builder.info.supervised_keys
    if source_key is None or target_key is None:
        if not (
            isinstance(supervised, tuple)
            and len(supervised) == 2
            and all(isinstance(k, str) for k in supervised)
        ):
            raise CorpusError(
                f"{name}: no supervised keys; pass source_key and target_key (features: {keys})"
            )
        source_key = source_key or supervised[0]
        target_key = target_key or supervised[1]
    if alignment_key is None and "alignment" in keys:
        alignment_key = "alignment"
    for key in (source_key, target_key, alignment_key):
        if key is not None and key not in keys:
            raise CorpusError(f"{name}: no feature {key!r}; features are {keys}")
    if download:
        _download_and_prepare(builder, name)
    try:
        ds = builder.as_dataset(split=split, shuffle_files=False)
    except AssertionError:  # TFDS asserts that the data were prepared
        raise CorpusError(
            f"{name}: not prepared in {builder.data_dir}; on a machine with internet run "
            f"`tfds build {name} --data_dir DIR`, then pass data_dir=DIR"
        ) from None
    except ValueError as e:  # unknown split
        raise CorpusError(f"{name}: {str(e).splitlines()[0]}") from None
    if max_examples is not None:
        ds = ds.take(max_examples)

    keys = [k for k in (source_key, target_key, alignment_key) if k is not None]

    def rows():
        # Batched reading: one Python step per 1024 pairs instead of per pair.
        for ex in tfds.as_numpy(ds.batch(1024)):
            yield from zip(*([_text(v) for v in ex[k]] for k in keys), strict=True)

    return _collect(f"{name}[{split}]", rows(), with_alignments=alignment_key is not None)


def load_synthetic_corpus(
    split: str, config: str = "default", *, data_dir: str | os.PathLike | None = None
) -> ParallelCorpus:
    """A split of the built-in corpus ``attn_jax_synthetic/<config>``, built into ``data_dir`` on first use.

    Building needs no network: ``default`` takes about 20 s, ``small`` 5 s, ``tiny`` under a second (plus the
    TensorFlow import). The pairs equal :func:`generate_synthetic` of the config's spec, in order.
    """
    if split.split("[")[0] not in SPLITS:
        raise CorpusError(f"attn_jax_synthetic/{config}: unknown split {split!r}; expected one of {SPLITS}")
    return load_tfds_corpus(f"attn_jax_synthetic/{config}", split, data_dir=data_dir, download=True)


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """Where a corpus comes from, as a config value; :meth:`load` reads one split of it.

    Exactly one source: ``synthetic`` (a config name of the built-in corpus), ``tfds`` (a TFDS name),
    ``plain`` (``(source_path, target_path)``, or a Moses ``prefix`` with ``{split}`` in it, see :meth:`load`)
    or ``tsv`` (a path, ``{split}`` substituted).
    """

    synthetic: str | None = None
    tfds: str | None = None
    plain: tuple[str, str] | None = None
    tsv: str | None = None
    source_key: str | None = None
    target_key: str | None = None
    data_dir: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("synthetic", "tfds", "plain", "tsv") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"CorpusSpec needs exactly one of synthetic/tfds/plain/tsv, got {given or 'none'}"
            )

    def load(self, split: str) -> ParallelCorpus:
        """Read ``split``; for file corpora ``{split}`` in the paths is replaced by the split name, and
        ``validation`` reads ``valid`` or ``dev`` when it has no files (:func:`resolve_split`)."""
        if self.synthetic is not None:
            return load_synthetic_corpus(split, self.synthetic, data_dir=self.data_dir)
        if self.tfds is not None:
            return load_tfds_corpus(
                self.tfds,
                split,
                source_key=self.source_key,
                target_key=self.target_key,
                data_dir=self.data_dir,
            )
        if self.plain is not None:
            split = resolve_split(self.plain, split)
            return read_plain_corpus(*(split_path(p, split) for p in self.plain))
        return read_tsv_corpus(split_path(self.tsv, resolve_split([self.tsv], split)))


def corpus_from_pairs(
    pairs: Sequence[tuple[str, str]] | Sequence[tuple[str, str, str]], name: str = "pairs"
) -> ParallelCorpus:
    """A corpus from in-memory ``(source, target)`` or ``(source, target, alignment)`` tuples."""
    with_alignments = bool(pairs) and len(pairs[0]) == 3
    return _collect(name, pairs, with_alignments=with_alignments)
