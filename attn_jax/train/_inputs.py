"""The trainer's input side: reading the configured corpus, vocabularies beside the checkpoints, iterators."""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

import ml_collections

from attn_jax import data
from attn_jax.train._config import batch_configs, synthetic_spec

__all__ = ["Inputs", "load_corpus", "make_inputs"]


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


def make_inputs(config: ml_collections.ConfigDict, vocab_dir: str, *, reuse_vocab: bool) -> Inputs:
    """Read the corpus, build (or, with ``reuse_vocab``, reload) the vocabularies in ``vocab_dir``, and batch.

    The vocabularies are the paper's shortlists: the ``src_vocab_size`` / ``tgt_vocab_size`` most frequent
    training words of each side (plus four specials). Validation batches carry gold alignments when the
    corpus has them and the vocabularies are word-level (the built-in corpus).
    """
    d = config.data
    train_corpus = load_corpus(d, d.train_split, d.max_train_examples)
    eval_corpus = load_corpus(d, d.eval_split, d.max_eval_examples)
    if reuse_vocab and os.path.isdir(vocab_dir):
        src_vocab, tgt_vocab = data.load_vocabularies(vocab_dir)
    else:
        src_vocab = data.WordVocabulary.build(train_corpus.sources, max_size=d.src_vocab_size)
        tgt_vocab = data.WordVocabulary.build(train_corpus.targets, max_size=d.tgt_vocab_size)
        data.save_vocabularies(vocab_dir, src_vocab, tgt_vocab)
    train_cfg, eval_cfg = batch_configs(config)
    train_encoded = data.encode_corpus(train_corpus, src_vocab, tgt_vocab)
    eval_encoded = data.encode_corpus(eval_corpus, src_vocab, tgt_vocab)
    train_it = data.make_batch_iterator(train_encoded, train_cfg, prefetch=d.prefetch)
    eval_it = data.make_batch_iterator(
        eval_encoded, eval_cfg, with_gold=eval_encoded.alignments is not None, prefetch=0
    )
    return Inputs(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        train=train_it,
        validation=list(eval_it),
        train_pairs=len(train_corpus) - train_it.plan.num_filtered,
        validation_pairs=len(eval_corpus) - eval_it.plan.num_filtered,
    )
