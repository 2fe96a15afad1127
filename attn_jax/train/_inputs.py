"""The trainer's input side: reading the configured corpus, vocabularies beside the checkpoints, iterators.

In a multi-process run every process reads the whole corpus, builds the same vocabularies and the same global
batch schedule, and keeps its own block of rows of every global batch (``process_index`` of ``process_count``
blocks, :func:`attn_jax.data.make_batch_iterator`).

**Iterator state in checkpoints.** Every process's iterator is at the same global batch index (each update
consumes one global batch on every process), so a checkpoint stores one state (:func:`data_state`): the index,
the writing iterator's fingerprint and the fingerprint of the global schedule (corpus and batching config,
independent of the process layout). :func:`restore_data_state` accepts it on an iterator of the same schedule
under any process count: a run saved by 2 processes resumes in 1, and the other way round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, NamedTuple

import ml_collections

from attn_jax import data
from attn_jax.train._config import batch_configs, synthetic_spec

__all__ = ["Inputs", "data_state", "load_corpus", "make_inputs", "restore_data_state"]


def load_corpus(d: ml_collections.ConfigDict, split: str, max_examples: int = 0) -> data.ParallelCorpus:
    """Split ``split`` of the corpus ``config.data`` describes (at most ``max_examples`` pairs; 0: all).

    ``corpus='synthetic'`` without ``use_tfds`` runs the built-in generator in memory: the same pairs as the
    TFDS dataset of that name (``train``, ``validation`` or the stratified ``test``), without TensorFlow.
    """
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
        if max_examples:
            pairs = pairs[:max_examples]
        return data.corpus_from_pairs(
            [(p.source, p.target, p.alignment) for p in pairs],
            name=f"attn_jax_synthetic/{d.synthetic}[{split}]",
        )
    if d.corpus == "synthetic":
        corpus = data.load_synthetic_corpus(split, d.synthetic, data_dir=data_dir)
    elif d.corpus == "tfds":
        return data.load_tfds_corpus(
            d.tfds_name,
            split,
            source_key=d.source_key or None,
            target_key=d.target_key or None,
            data_dir=data_dir,
            max_examples=max_examples or None,
        )
    elif d.corpus == "plain":
        corpus = data.read_plain_corpus(d.source_path.format(split=split), d.target_path.format(split=split))
    else:
        corpus = data.read_tsv_corpus(d.tsv_path.format(split=split))
    if max_examples and len(corpus) > max_examples:
        n = max_examples
        alignments = corpus.alignments[:n] if corpus.alignments is not None else None
        corpus = data.ParallelCorpus(corpus.sources[:n], corpus.targets[:n], alignments, corpus.name)
    return corpus


class Inputs(NamedTuple):
    """Vocabularies, the training iterator and the (materialised) validation batches."""

    src_vocab: data.Vocabulary
    tgt_vocab: data.Vocabulary
    train: data.BatchIterator
    validation: list[data.Batch]
    train_pairs: int
    validation_pairs: int
    schedule: str = ""  # fingerprint of the global training schedule (corpus + batching), any process layout
    train_dropped: int = 0  # pairs the length filter dropped (max_source_length / max_target_length)
    validation_dropped: int = 0


def make_inputs(
    config: ml_collections.ConfigDict,
    vocab_dir: str,
    *,
    reuse_vocab: bool,
    process_index: int = 0,
    process_count: int = 1,
    save_vocab: bool = True,
) -> Inputs:
    """Read the corpus, build (or, with ``reuse_vocab``, reload) the vocabularies in ``vocab_dir``, and batch.

    The vocabularies are the paper's shortlists: the ``src_vocab_size`` / ``tgt_vocab_size`` most frequent
    words of each side (plus four specials) of the training pairs the length filter keeps — a dropped pair
    never trains, so its words must not take shortlist places (or, without a shortlist, embedding rows).
    :attr:`Inputs.train_dropped` / ``validation_dropped`` count the pairs the filter dropped (the trainer
    logs them). Validation batches carry gold alignments when the corpus has them and the vocabularies are
    word-level (the built-in corpus). Training and validation batches hold block ``process_index`` of
    ``process_count`` of every global batch's rows; only one process of a multi-process run should
    ``save_vocab``.
    """
    d = config.data
    train_corpus = load_corpus(d, d.train_split, d.max_train_examples)
    eval_corpus = load_corpus(d, d.eval_split, d.max_eval_examples)
    train_cfg, eval_cfg = batch_configs(config)
    if reuse_vocab and os.path.isdir(vocab_dir):
        src_vocab, tgt_vocab = data.load_vocabularies(vocab_dir)
    else:
        # Word vocabularies give one token per whitespace word: the batcher's filter, applied before encoding.
        keep = train_cfg.keeps(
            [len(s.split()) for s in train_corpus.sources], [len(t.split()) for t in train_corpus.targets]
        )
        kept = [i for i in range(len(train_corpus)) if keep[i]]
        src_vocab = data.WordVocabulary.build(
            [train_corpus.sources[i] for i in kept], max_size=d.src_vocab_size
        )
        tgt_vocab = data.WordVocabulary.build(
            [train_corpus.targets[i] for i in kept], max_size=d.tgt_vocab_size
        )
        if save_vocab:
            data.save_vocabularies(vocab_dir, src_vocab, tgt_vocab)
    train_encoded = data.encode_corpus(train_corpus, src_vocab, tgt_vocab)
    eval_encoded = data.encode_corpus(eval_corpus, src_vocab, tgt_vocab)
    shard = dict(process_index=process_index, process_count=process_count)
    train_it = data.make_batch_iterator(train_encoded, train_cfg, prefetch=d.prefetch, **shard)
    eval_it = data.make_batch_iterator(
        eval_encoded, eval_cfg, with_gold=eval_encoded.alignments is not None, prefetch=0, **shard
    )
    schedule = json.dumps([train_encoded.fingerprint(), dataclasses.asdict(train_cfg)], sort_keys=True)
    return Inputs(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        train=train_it,
        validation=list(eval_it),
        train_pairs=len(train_corpus) - train_it.plan.num_filtered,
        validation_pairs=len(eval_corpus) - eval_it.plan.num_filtered,
        schedule=hashlib.sha256(schedule.encode()).hexdigest()[:16],
        train_dropped=train_it.plan.num_filtered,
        validation_dropped=eval_it.plan.num_filtered,
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
