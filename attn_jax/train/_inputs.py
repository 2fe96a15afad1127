"""The trainer's input side: reading the configured corpus, vocabularies beside the checkpoints, iterators.

In a multi-process run every process builds the same vocabularies and the same global batch schedule, and keeps
its own block of rows of every global batch (``process_index`` of ``process_count`` blocks,
:func:`attn_jax.data.make_batch_iterator`). In memory every process reads the whole corpus; with
``data.prepared_dir``, or a training file of more than ``data.prepare_above`` lines (:func:`choose_prepared_dir`),
the first process prepares the training split on disk (:func:`prepare_train_split`) and every process reads only
its rows from it.

**Iterator state in checkpoints.** Every process's iterator is at the same global batch index (each update
consumes one global batch on every process), so a checkpoint stores one state (:func:`data_state`): the index,
the writing iterator's fingerprint and the fingerprint of the global schedule (corpus and batching config,
independent of the process layout). :func:`restore_data_state` accepts it on an iterator of the same schedule
under any process count: a run saved by 2 processes resumes in 1, and the other way round.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from attn_jax import data
from attn_jax.train._config import ConfigError, batch_configs, has_eval_split, synthetic_spec

__all__ = [
    "CopyCounts",
    "Inputs",
    "SplitReport",
    "data_state",
    "describe_batches",
    "describe_copy",
    "describe_packing",
    "describe_split",
    "load_corpus",
    "make_inputs",
    "prepare_train_split",
    "restore_data_state",
    "resolve_corpus_split",
    "resolve_prepared_dir",
]


def _patterns(d: ml_collections.ConfigDict) -> list[str] | None:
    """The path patterns of a file corpus (``{split}`` in them names the split), None for the others."""
    if d.corpus == "plain":
        return [d.source_path, d.target_path]
    if d.corpus == "tsv":
        return [d.tsv_path]
    return None


def resolve_corpus_split(d: ml_collections.ConfigDict, split: str, *, choose: str = "the split") -> str:
    """The split of ``config.data``'s corpus to read for ``split``: itself, or for ``validation`` of a file
    corpus without such files the ``valid`` or ``dev`` one (:func:`attn_jax.data.resolve_split`).

    ``choose`` names what the user sets to pick a split, for the one-line :class:`attn_jax.data.CorpusError`
    when ``valid`` and ``dev`` both exist or none of the three does.
    """
    patterns = _patterns(d)
    if patterns is None:
        return split
    skip = "data.eval_split=none" if choose == "data.eval_split" else ""
    return data.resolve_split(patterns, split, choose=choose, skip=skip)


def _read_split(
    d: ml_collections.ConfigDict, split: str, max_examples: int = 0
) -> tuple[data.ParallelCorpus, int]:
    """``(corpus, pairs left out by max_examples)``; the count is 0 where the reader stops early (TFDS)."""
    data_dir = d.data_dir or None
    if d.corpus == "synthetic" and not d.use_tfds:
        base = split.split("[")[0]
        if split != base or base not in ("train", "validation", "test"):
            raise data.CorpusError(
                f"attn_jax_synthetic (in memory): unknown split {split!r}; expected train, validation or test "
                "(slicing needs data.use_tfds=True)"
            )
        spec = synthetic_spec(d)
        if base != "test":
            spec = dataclasses.replace(spec, test_per_bucket=0)  # the stratified test split is slow to draw
        pairs = data.generate_synthetic(spec)[base]
        beyond = max(0, len(pairs) - max_examples) if max_examples else 0
        if max_examples:
            pairs = pairs[:max_examples]
        corpus = data.corpus_from_pairs(
            [(p.source, p.target, p.alignment) for p in pairs],
            name=f"attn_jax_synthetic/{d.synthetic}[{split}]",
        )
        return corpus, beyond
    if d.corpus == "synthetic":
        corpus = data.load_synthetic_corpus(split, d.synthetic, data_dir=data_dir)
    elif d.corpus == "tfds":
        corpus = data.load_tfds_corpus(
            d.tfds_name,
            split,
            source_key=d.source_key or None,
            target_key=d.target_key or None,
            data_dir=data_dir,
            max_examples=max_examples or None,
        )
        return corpus, 0
    else:
        split = resolve_corpus_split(d, split)
        pattern = d.get("alignment_path", "")  # a run saved before the key existed has none
        links = data.split_path(pattern, split) if pattern else None
        if d.corpus == "plain":
            corpus = data.read_plain_corpus(
                data.split_path(d.source_path, split), data.split_path(d.target_path, split), links
            )
        else:
            corpus = data.read_tsv_corpus(data.split_path(d.tsv_path, split), alignment_path=links)
    beyond = 0
    if max_examples and len(corpus) > max_examples:
        n, beyond = max_examples, len(corpus) - max_examples
        alignments = corpus.alignments[:n] if corpus.alignments is not None else None
        corpus = data.ParallelCorpus(
            corpus.sources[:n], corpus.targets[:n], alignments, corpus.name, corpus.skipped_empty
        )
    return corpus, beyond


def load_corpus(d: ml_collections.ConfigDict, split: str, max_examples: int = 0) -> data.ParallelCorpus:
    """Split ``split`` of the corpus ``config.data`` describes (at most ``max_examples`` pairs; 0: all).

    ``corpus='synthetic'`` without ``use_tfds`` runs the built-in generator in memory: the same pairs as the
    TFDS dataset of that name (``train``, ``validation`` or the stratified ``test``), without TensorFlow.
    File corpora (``plain``, ``tsv``) replace ``{split}`` in their paths by the split name; ``validation``
    reads the ``valid`` or ``dev`` files when there are no ``validation`` ones (:func:`resolve_corpus_split`;
    the corpus' ``name`` names the files read).
    """
    return _read_split(d, split, max_examples)[0]


class SplitReport(NamedTuple):
    """What became of one split's pairs: every pair read is kept or counted under one reason for dropping it.

    Attributes:
      split: the split read (``valid`` when ``data.eval_split=validation`` found only ``valid`` files).
      asked: the split the config names (``data.train_split`` / ``data.eval_split``).
      name: what was read: the files (``src | tgt``) or the dataset and split.
      kept: pairs that train (or validate).
      source_too_long: pairs dropped because the source is over ``data.max_source_length`` (target within).
      target_too_long: pairs dropped because the target is over ``data.max_target_length`` (source within).
      both_too_long: pairs dropped with both sides over their limits.
      empty: pairs the reader skipped because a side (or the whole TSV line) was empty.
      beyond_max_examples: pairs past ``data.max_train_examples`` / ``max_eval_examples``, not read further
        (0 for TFDS, which stops reading there).
    """

    split: str
    asked: str
    name: str
    kept: int
    source_too_long: int
    target_too_long: int
    both_too_long: int
    empty: int
    beyond_max_examples: int

    @property
    def dropped(self) -> int:
        """Pairs dropped for any reason."""
        return (
            self.source_too_long
            + self.target_too_long
            + self.both_too_long
            + self.empty
            + self.beyond_max_examples
        )

    @property
    def read(self) -> int:
        """Pairs read: kept plus dropped."""
        return self.kept + self.dropped


def _split_report(
    split: str, asked: str, corpus: data.ParallelCorpus, encoded: data.EncodedCorpus, cfg, beyond: int
) -> SplitReport:
    """Count the length filter's drops by the limit that dropped them (the batcher's own filter decides)."""
    n = len(encoded)
    src_over = (
        encoded.src_lengths > cfg.max_source_length
        if cfg.max_source_length is not None
        else np.zeros(n, bool)
    )
    tgt_over = (
        encoded.tgt_lengths > cfg.max_target_length
        if cfg.max_target_length is not None
        else np.zeros(n, bool)
    )
    return SplitReport(
        split=split,
        asked=asked,
        name=corpus.name,
        kept=int((~(src_over | tgt_over)).sum()),
        source_too_long=int((src_over & ~tgt_over).sum()),
        target_too_long=int((tgt_over & ~src_over).sum()),
        both_too_long=int((src_over & tgt_over).sum()),
        empty=corpus.skipped_empty,
        beyond_max_examples=beyond,
    )


def describe_split(report: SplitReport, role: str, d: ml_collections.ConfigDict, unit: str = "words") -> str:
    """The start-up line of one split: what was read, how many pairs were kept, and every drop with its reason.

    ``role`` is ``training`` or ``validation``; ``unit`` what the length limits count (``words`` for word
    vocabularies).
    """
    where = report.name
    if report.split != report.asked:
        key = "data.train_split" if role == "training" else "data.eval_split"
        where += f"; no {report.asked!r} files, so {key}={report.asked} reads {report.split!r}"
    cap = "data.max_train_examples" if role == "training" else "data.max_eval_examples"
    reasons = [
        f"{report.source_too_long:,} with the source over data.max_source_length={d.max_source_length} {unit}",
        f"{report.target_too_long:,} with the target over data.max_target_length={d.max_target_length} {unit}",
        f"{report.both_too_long:,} with both over",
        f"{report.empty:,} with an empty side",
    ]
    if report.beyond_max_examples:
        reasons.append(f"{report.beyond_max_examples:,} beyond {cap}={d[cap.split('.')[1]]}")
    return (
        f"data: {role} split {report.split} ({where}): {report.kept:,} of {report.read:,} pairs kept; "
        f"{report.dropped:,} dropped: {', '.join(reasons)}"
    )


# SentencePiece trains in memory on at most this many sentences per language (the first ones: deterministic).
SENTENCEPIECE_MAX_SENTENCES = 1_000_000


KeptPairs = Callable[[], Iterator[tuple[str, str]]]


def _train_sentencepiece(
    d: ml_collections.ConfigDict, kept: KeptPairs, n: int
) -> tuple[data.Vocabulary, data.Vocabulary, str]:
    """One SentencePiece model per language (``data.sentencepiece_type``) of ``data.src_vocab_size`` /
    ``tgt_vocab_size`` pieces plus the four specials, trained on the ``n`` kept training pairs ``kept()``
    yields (each call one streaming pass); and the start-up line saying how many pieces each got (fewer than
    asked when the corpus supports no more) and, past :data:`SENTENCEPIECE_MAX_SENTENCES` pairs, that only the
    first ones trained them. With ``data.joint_vocab`` one model of ``data.src_vocab_size`` pieces trains on
    the first sentences of both sides and serves both."""
    cap = SENTENCEPIECE_MAX_SENTENCES
    joint = bool(d.get("joint_vocab", False))

    def side(k: int) -> Iterator[str]:
        return itertools.islice((pair[k] for pair in kept()), cap)

    sides = (
        [("joint", "src", lambda: itertools.chain(side(0), side(1)), d.src_vocab_size + 4)]
        if joint
        else [
            ("source", "src", lambda: side(0), d.src_vocab_size + 4),
            ("target", "tgt", lambda: side(1), d.tgt_vocab_size + 4),
        ]
    )
    vocabs, got = [], []
    for name, key, text, size in sides:
        try:
            vocab = data.SentencePieceVocabulary.train(
                text(), size, model_type=d.sentencepiece_type, max_sentences=2 * cap
            )
        except (ValueError, RuntimeError) as e:  # SentencePiece's own refusal, as one line naming our key
            raise data.CorpusError(
                f"cannot train the {name} SentencePiece {d.sentencepiece_type} model of {size:,} pieces "
                f"(data.{key}_vocab_size={size - 4:,} plus 4 specials): {' '.join(str(e).split())}"
            ) from None
        vocabs.append(vocab)
        fewer = f" (of {size:,} asked: the corpus supports no more)" if vocab.size < size else ""
        got.append(f"{name} {vocab.size:,} pieces{fewer}")
    first = f"the first {cap:,} of " if n > cap else ""
    what = (
        f"one joint SentencePiece {d.sentencepiece_type} vocabulary (data.joint_vocab) trained on the sources and "
        "targets of"
        if joint
        else f"SentencePiece {d.sentencepiece_type} vocabularies trained on"
    )
    line = (
        f"data: {what} {first}the {n:,} training pairs of at most {d.max_source_length} source and "
        f"{d.max_target_length} target words: {', '.join(got)}, the four specials included"
    )
    src, tgt = (vocabs[0], vocabs[0]) if joint else vocabs
    return src, tgt, line


def _build_vocabularies(
    d: ml_collections.ConfigDict, kept: KeptPairs, n: int | None = None
) -> tuple[data.Vocabulary, data.Vocabulary, str]:
    """The vocabularies of ``config.data`` from the kept training pairs, read in streaming passes over
    ``kept()`` (one for word counts; a subword model reads up to its sentence cap per side); ``n``, their
    number, is counted by one more pass when None and needed. Returns ``(source, target, vocab_line)``.

    With ``data.joint_vocab`` and words: the ``data.src_vocab_size`` most frequent words of both sides together
    serve as both vocabularies, and the line says how many word types there were.
    """
    if d.vocab == "sentencepiece":
        if n is None:
            n = sum(1 for _ in kept())
        return _train_sentencepiece(d, kept, n)
    joint = bool(d.get("joint_vocab", False))
    src_counts: collections.Counter[str] = collections.Counter()
    tgt_counts = src_counts if joint else collections.Counter()
    n = 0
    for s, t in kept():
        src_counts.update(s.split())
        tgt_counts.update(t.split())
        n += 1
    if not joint:
        src = data.WordVocabulary.from_counts(src_counts, max_size=d.src_vocab_size)
        tgt = data.WordVocabulary.from_counts(tgt_counts, max_size=d.tgt_vocab_size)
        return src, tgt, ""
    every = data.WordVocabulary.from_counts(src_counts)
    vocab = data.WordVocabulary(every.tokens[: 4 + d.src_vocab_size])
    line = (
        f"data: one joint word vocabulary (data.joint_vocab) over the sources and targets of the {n:,} "
        f"kept training pairs: the {vocab.size - 4:,} most frequent of {every.size - 4:,} word types "
        "(data.src_vocab_size), plus the four specials"
    )
    return vocab, vocab, line


def _vocab_settings(d: ml_collections.ConfigDict) -> dict[str, Any]:
    """The keys that decide the vocabularies, as a prepared corpus records them (a change rebuilds it)."""
    settings = {
        "data.vocab": d.vocab,
        "data.src_vocab_size": d.src_vocab_size,
        "data.tgt_vocab_size": d.tgt_vocab_size,
    }
    if d.get("joint_vocab", False):
        settings["data.joint_vocab"] = True
    if d.vocab == "sentencepiece":
        settings["data.sentencepiece_type"] = d.sentencepiece_type
        settings["sentencepiece_max_sentences"] = SENTENCEPIECE_MAX_SENTENCES
    return settings


def resolve_prepared_dir(d: ml_collections.ConfigDict, workdir: str) -> str:
    """Where ``data.prepared_dir`` puts the prepared training split: "" (in memory), ``<workdir>/prepared``
    for ``auto``, else the path given."""
    where = d.get("prepared_dir", "")  # a run saved before the key existed has none
    if not where:
        return ""
    return os.path.join(workdir, "prepared") if where == "auto" else os.path.expanduser(where)


def count_lines(path: str) -> int:
    """Lines of a file as the corpus readers split it (a last line without ``\\n`` counts), read in 16 MiB
    blocks: counting a corpus never holds it."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def choose_prepared_dir(
    config: ml_collections.ConfigDict, workdir: str, log: Callable[[str], None] | None = None
) -> str:
    """Where the trainer reads the training split from: "" (into memory) or a prepared directory.

    ``data.prepared_dir`` decides when set (:func:`resolve_prepared_dir`). Otherwise a plain or TSV training
    file of more than ``data.prepare_above`` lines (0: never) is prepared in ``<workdir>/prepared`` and
    streamed from there, and ``log`` gets one line saying so. The lines are counted in one streaming pass.
    A corpus that a prepared directory cannot hold (gold alignments, ``model.copy``) stays in memory, and
    the line says why.
    """
    d = config.data
    explicit = resolve_prepared_dir(d, workdir)
    above = d.get("prepare_above", 0)  # a run saved before the key existed has none
    if explicit or not above or d.corpus not in ("plain", "tsv"):
        return explicit
    split = resolve_corpus_split(d, d.train_split, choose="data.train_split")
    path = data.split_path(d.source_path if d.corpus == "plain" else d.tsv_path, split)
    if not os.path.isfile(path):
        return ""  # the reader says what is wrong with it
    n = count_lines(path)
    if n <= above:
        return ""
    say = log or (lambda line: None)
    what = f"data: the training file {path} has {n:,} lines, over data.prepare_above={above:,}"
    held = [
        key
        for key, on in (
            ("data.alignment_path", bool(d.get("alignment_path", ""))),
            ("model.copy", bool(config.model.get("copy", False))),
        )
        if on
    ]
    if held:
        say(
            f"{what}, but it is read into memory: a prepared corpus keeps token ids only, and {held[0]} is set"
        )
        return ""
    directory = os.path.join(workdir, "prepared")
    say(
        f"{what}: it is prepared on disk in {directory} and streamed from there (data.prepared_dir chooses "
        "the directory; data.prepare_above=0 reads it into memory)"
    )
    return directory


def prepare_train_split(
    config: ml_collections.ConfigDict,
    directory: str,
    *,
    vocabularies: tuple[data.Vocabulary, data.Vocabulary] | None = None,
    build: bool = True,
    log: Callable[[str], None] | None = None,
) -> data.PreparedCorpus:
    """Prepare (or reuse) the training split of a plain or TSV corpus in ``directory``
    (:func:`attn_jax.data.prepare_corpus`): the vocabularies in streaming passes, the pairs encoded into
    memory-mapped arrays. ``vocabularies`` (a resumed run's) replace building them; ``build=False`` only opens
    an up-to-date directory (the processes that wait for the first one). ``log`` gets the reuse/rebuild line.
    """
    d = config.data
    if d.corpus not in ("plain", "tsv"):
        raise data.CorpusError(f"data.prepared_dir needs a plain or tsv corpus, not data.corpus={d.corpus!r}")
    split = resolve_corpus_split(d, d.train_split, choose="data.train_split")
    if d.corpus == "plain":
        paths = [data.split_path(d.source_path, split), data.split_path(d.target_path, split)]
        name = f"{paths[0]} | {paths[1]}"

        def pairs():
            return data.iter_plain_pairs(*paths)
    else:
        paths = [data.split_path(d.tsv_path, split)]
        name = paths[0]

        def pairs():
            return data.iter_tsv_pairs(paths[0])

    settings = {
        "data.corpus": d.corpus,
        "data.train_split": split,
        "data.max_source_length": d.max_source_length,
        "data.max_target_length": d.max_target_length,
        "data.max_train_examples": d.max_train_examples,
        **_vocab_settings(d),
    }
    return data.prepare_corpus(
        directory,
        name=name,
        pairs=pairs,
        inputs=paths,
        settings=settings,
        make_vocabularies=lambda kept: _build_vocabularies(d, kept),
        max_source_length=d.max_source_length,
        max_target_length=d.max_target_length,
        max_examples=d.max_train_examples,
        vocabularies=vocabularies,
        build=build,
        log=log,
    )


def describe_batches(config: ml_collections.ConfigDict, stats: list[data.BucketStats]) -> list[str]:
    """The start-up lines of token batches: per bucket, sentences a batch and real / padded tokens."""
    d = config.data
    lines = [
        f"data: token batches (data.batch_tokens={d.batch_tokens:,}): rows × padded length <= "
        f"{d.batch_tokens:,} in every bucket (source and target share the padded length); per bucket, over "
        "epoch 0 (real tokens count </s>):"
    ]
    for b in stats:
        padded = b.batches * b.rows * b.length
        rounded = (
            f", the budget's {b.budget_rows} rows rounded down to a multiple of the data axis"
            if b.budget_rows != b.rows
            else ""
        )
        lines.append(
            f"data:   length {b.length}: {b.rows} rows a batch ({b.rows * b.length:,} padded tokens{rounded}), "
            f"{b.batches:,} batches, {b.pairs / b.batches:,.1f} sentences and {b.src_tokens / b.batches:,.0f} "
            f"source / {b.tgt_tokens / b.batches:,.0f} target real tokens a batch ({b.src_tokens / padded:.1%} / "
            f"{b.tgt_tokens / padded:.1%} of padded)"
        )
    padded = sum(b.batches * b.rows * b.length for b in stats)
    src, tgt = sum(b.src_tokens for b in stats), sum(b.tgt_tokens for b in stats)
    lines.append(
        f"data:   in all: {sum(b.batches for b in stats):,} batches of {sum(b.pairs for b in stats):,} sentences, "
        f"{src:,} source / {tgt:,} target real tokens of {padded:,} padded ({src / padded:.1%} / {tgt / padded:.1%})"
    )
    return lines


class CopyCounts(NamedTuple):
    """``model.copy``: unknown target words of the training pairs read (before the length filter), and what
    became of them.

    Attributes:
      pairs: training pairs counted.
      unknown: target words outside the target vocabulary.
      copies: of those, the words that occur in their source: learnt as copies (the rest stay ``<unk>``).
      source_oov: source words outside the target vocabulary.
    """

    pairs: int
    unknown: int
    copies: int
    source_oov: int


def describe_copy(counts: CopyCounts) -> str:
    """The start-up line of ``model.copy``: how many unknown target words are learnt as copies."""
    return (
        f"data: copying (model.copy), counted over the {counts.pairs:,} training pairs read (before the "
        f"length filter): {counts.unknown:,} training target words are outside the target vocabulary; "
        f"{counts.copies:,} of them occur in their source and are learnt as copies, "
        f"{counts.unknown - counts.copies:,} stay <unk>; "
        f"{counts.source_oov:,} source words are outside the target vocabulary"
    )


def describe_packing(packing: data.Packing, rows: int) -> str:
    """The start-up line of ``data.pack``: the packing's summary and the target tokens a batch of ``rows``."""
    per_row = packing.tgt_used / max(len(packing.rows), 1)  # real target positions a row
    return (
        f"data: {packing.summary()}; {rows} rows a batch, about {rows * per_row:,.0f} target tokens a batch "
        "(data.pack)"
    )


class Inputs(NamedTuple):
    """Vocabularies, the training iterator and the (materialised) validation batches."""

    src_vocab: data.Vocabulary
    tgt_vocab: data.Vocabulary
    train: data.BatchIterator
    validation: list[data.Batch]  # empty without a validation split (data.eval_split=none)
    train_pairs: int
    validation_pairs: int
    schedule: str = ""  # fingerprint of the global training schedule (corpus + batching), any process layout
    train_dropped: int = 0  # pairs the length filter dropped (max_source_length / max_target_length)
    validation_dropped: int = 0
    train_report: SplitReport | None = None  # every pair read, kept or dropped and why
    validation_report: SplitReport | None = None  # None: no validation split (data.eval_split=none)
    vocab_line: str = ""  # how the vocabularies were learnt ("": one word list per language, or reloaded)
    packing: data.Packing | None = None  # data.pack: how the training pairs were packed (None: not packed)
    packed_rows: int = 0  # data.pack: rows a training batch
    copy_counts: CopyCounts | None = (
        None  # model.copy: target words outside the vocabulary (None: no copying)
    )
    batch_stats: tuple[data.BucketStats, ...] = ()  # data.batch_tokens: what each bucket's batches hold
    # The validation pairs the length filter keeps, as text (sources, references): what validation translates.
    validation_text: tuple[list[str], list[str]] = ([], [])


def make_inputs(
    config: ml_collections.ConfigDict,
    vocab_dir: str,
    *,
    reuse_vocab: bool,
    process_index: int = 0,
    process_count: int = 1,
    save_vocab: bool = True,
    data_axis: int = 1,
    prepared_dir: str = "",
    build_prepared: bool = True,
    log: Callable[[str], None] | None = None,
) -> Inputs:
    """Read the corpus, build (or, with ``reuse_vocab``, reload) the vocabularies in ``vocab_dir``, and batch.

    The vocabularies are the paper's shortlists: the ``src_vocab_size`` / ``tgt_vocab_size`` most frequent
    words of each side (plus four specials) of the training pairs the length filter keeps — a dropped pair
    never trains, so its words must not take shortlist places (or, without a shortlist, embedding rows). With
    ``data.vocab=sentencepiece`` they are SentencePiece models of that many pieces (plus the specials) trained
    on the same sentences, and the length limits count pieces (:attr:`Inputs.vocab_line` says what was
    trained).
    :attr:`Inputs.train_report` / ``validation_report`` account for every pair read: kept, or dropped by
    ``max_source_length``, ``max_target_length``, both, an empty side or ``max_*_examples`` (the trainer logs
    them with :func:`describe_split`); ``train_dropped`` / ``validation_dropped`` count the length filter's
    drops alone. The validation split is ``data.eval_split``, ``valid`` or ``dev`` when a file corpus has no
    ``validation`` files, or none at all with ``data.eval_split=none`` (then ``validation`` is empty and
    ``validation_report`` None). Validation batches carry gold alignments when the corpus has them and the
    vocabularies are word-level (the built-in corpus). Training and validation batches hold block
    ``process_index`` of ``process_count`` of every global batch's rows; only one process of a multi-process
    run should ``save_vocab``. With ``data.batch_tokens`` the rows of a training batch are rounded down to a
    multiple of ``data_axis`` (the mesh's data axis), and :attr:`Inputs.batch_stats` says what the batches hold.
    With ``data.joint_vocab`` one vocabulary is learnt over both sides and serves as both (saved twice).

    With ``prepared_dir`` (:func:`choose_prepared_dir`) the training split is read from a prepared directory
    of memory-mapped arrays (:func:`prepare_train_split`, built or rebuilt there first when out of date, unless
    ``build_prepared`` is False; ``log`` gets the line saying which), not held in memory; the batch schedule's
    index arrays live there too. The batches are the same as in memory. The validation split is read into
    memory either way.
    """
    d = config.data
    train_split = resolve_corpus_split(d, d.train_split, choose="data.train_split")
    train_cfg, eval_cfg = batch_configs(config, data_axis)
    given = data.load_vocabularies(vocab_dir) if reuse_vocab and os.path.isdir(vocab_dir) else None
    vocab_line = ""
    train_corpus = train_beyond = prepared = None
    if prepared_dir:
        prepared = prepare_train_split(
            config, prepared_dir, vocabularies=given, build=build_prepared, log=log
        )
        src_vocab, tgt_vocab = prepared.source_vocab, prepared.target_vocab
        if given is None:
            vocab_line = prepared.manifest["vocab_line"]
    else:
        train_corpus, train_beyond = _read_split(d, train_split, d.max_train_examples)
    if given is not None:
        src_vocab, tgt_vocab = given
    elif prepared is None:
        # Word vocabularies give one token per whitespace word: the batcher's filter, applied before encoding.
        # SentencePiece gives at least one piece per word, so a pair over the limits in words is over in pieces
        # too and never trains: its text does not train the pieces either.
        keep = train_cfg.keeps(
            [len(s.split()) for s in train_corpus.sources], [len(t.split()) for t in train_corpus.targets]
        )
        kept = np.flatnonzero(keep)
        src_vocab, tgt_vocab, vocab_line = _build_vocabularies(
            d, lambda: ((train_corpus.sources[i], train_corpus.targets[i]) for i in kept), len(kept)
        )
    if given is None and save_vocab:
        data.save_vocabularies(vocab_dir, src_vocab, tgt_vocab)
    eval_split = (
        resolve_corpus_split(d, d.eval_split, choose="data.eval_split") if has_eval_split(d) else None
    )
    if eval_split is not None:
        eval_corpus, eval_beyond = _read_split(d, eval_split, d.max_eval_examples)
    copy = bool(config.model.get("copy", False))  # the pointer-generator: batches carry extended ids
    if prepared is not None:
        train_encoded = prepared.encoded
    else:
        train_encoded = data.encode_corpus(train_corpus, src_vocab, tgt_vocab, copy=copy)
    guided = config.lambda_align > 0  # training batches carry gold only for guided alignment: else unchanged
    if guided and train_encoded.alignments is None:
        raise data.CorpusError(
            f"{train_encoded.name}: lambda_align={config.lambda_align} needs gold word alignments for training, and "
            "this corpus has none (give a plain or tsv corpus data.alignment_path, a Pharaoh file per {split})"
        )
    shard = dict(process_index=process_index, process_count=process_count)
    try:
        train_it = data.make_batch_iterator(
            train_encoded,
            train_cfg,
            prefetch=d.prefetch,
            with_gold=guided,
            pack=d.pack,
            scratch=prepared.directory if prepared is not None else None,
            **shard,
        )
    except ValueError as e:
        if not train_cfg.tokens_per_batch:
            raise
        raise ConfigError(
            f"data.batch_tokens={d.batch_tokens}: {e} (the batch multiple is the data axis)"
        ) from None
    batch_stats = tuple(train_it.plan.bucket_stats(train_encoded)) if train_cfg.tokens_per_batch else ()
    copy_counts = None
    if copy:  # never silent: how many unknown target words became copy labels, how many stay <unk>
        copy_counts = CopyCounts(
            pairs=len(train_encoded),
            unknown=int(np.sum(train_encoded.tgt_tokens == data.UNK_ID)),
            copies=int(np.sum(train_encoded.tgt_ext_tokens >= tgt_vocab.size)),
            source_oov=int(np.sum(train_encoded.src_ext_tokens >= tgt_vocab.size)),
        )
    if prepared is not None:  # counted while preparing, by the same rule as _split_report
        c = prepared.manifest["counts"]
        train_report = SplitReport(
            train_split,
            d.train_split,
            prepared.manifest["name"],
            **{k: c[k] for k in SplitReport._fields[3:]},
        )
    else:
        train_report = _split_report(
            train_split, d.train_split, train_corpus, train_encoded, train_cfg, train_beyond
        )
    validation, validation_report, validation_dropped, validation_text = [], None, 0, ([], [])
    if eval_split is not None:
        eval_encoded = data.encode_corpus(eval_corpus, src_vocab, tgt_vocab, copy=copy)
        eval_it = data.make_batch_iterator(
            eval_encoded, eval_cfg, with_gold=eval_encoded.alignments is not None, prefetch=0, **shard
        )
        validation, validation_dropped = list(eval_it), eval_it.plan.num_filtered
        validation_report = _split_report(
            eval_split, d.eval_split, eval_corpus, eval_encoded, eval_cfg, eval_beyond
        )
        kept = np.flatnonzero(eval_cfg.keeps(eval_encoded.src_lengths, eval_encoded.tgt_lengths))
        validation_text = ([eval_corpus.sources[i] for i in kept], [eval_corpus.targets[i] for i in kept])
    schedule = json.dumps(
        [train_encoded.fingerprint(), dataclasses.asdict(train_cfg), *(["packed"] if d.pack else [])],
        sort_keys=True,
    )
    return Inputs(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        train=train_it,
        validation=validation,
        train_pairs=len(train_encoded) - train_it.plan.num_filtered,
        validation_pairs=validation_report.kept if validation_report is not None else 0,
        schedule=hashlib.sha256(schedule.encode()).hexdigest()[:16],
        train_dropped=train_it.plan.num_filtered,
        validation_dropped=validation_dropped,
        train_report=train_report,
        validation_report=validation_report,
        vocab_line=vocab_line,
        packing=train_it.plan.packing if d.pack else None,
        packed_rows=train_it.plan.buckets[0].batch_size if d.pack else 0,
        copy_counts=copy_counts,
        batch_stats=batch_stats,
        validation_text=validation_text,
    )


def data_state(inputs: Inputs) -> dict[str, Any]:
    """The training iterator's position as a checkpoint stores it: ``{"next_index", "fingerprint",
    "schedule"}`` (the iterator's own state plus the process-independent schedule fingerprint)."""
    return {**inputs.train.get_state(), "schedule": inputs.schedule}


def restore_data_state(inputs: Inputs, state: dict[str, Any]) -> None:
    """Move the training iterator to a checkpoint's position, saved by this or another process layout.

    Raises:
      ValueError: ``state`` belongs to another corpus or batching config.
    """
    own = inputs.train.get_state()["fingerprint"]
    if state.get("fingerprint") != own and state.get("schedule") == inputs.schedule:
        state = {"next_index": state["next_index"], "fingerprint": own}  # same schedule, other process layout
    inputs.train.set_state(state)
