"""The pairs of a run's corpus to evaluate: a split, and a sample of it spread over the length buckets."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

__all__ = ["load_split", "select_examples"]


def load_split(config, split: str, *, test_per_bucket: int | None = None):
    """The ``split`` of the run's corpus as an ``attn_jax.data.ParallelCorpus``.

    The built-in corpus without TFDS (``data.use_tfds=False``) is generated in memory, the test split included
    (the trainer reads only train/validation that way): a named config (``small``, ...) uses its own
    ``test_per_bucket``; ``custom`` uses ``test_per_bucket`` or ``ceil(validation_size / 7)`` (at least 1) per
    length bucket. Other corpora are read by ``attn_jax.train.load_corpus``.
    """
    from attn_jax import data
    from attn_jax.train import load_corpus

    d = config.data
    if d.corpus == "synthetic" and not d.use_tfds and split.split("[")[0] == "test":
        named = {c.name: c.spec for c in data.AttnJaxSynthetic.BUILDER_CONFIGS}
        if d.synthetic in named:
            spec = named[d.synthetic]
            if test_per_bucket is not None:
                spec = dataclasses.replace(spec, test_per_bucket=test_per_bucket)
        else:
            s = d.synthetic_spec
            per_bucket = test_per_bucket or max(1, math.ceil(s.validation_size / 7))
            spec = data.SyntheticSpec(
                train_size=s.train_size,
                validation_size=s.validation_size,
                test_per_bucket=per_bucket,
                seed=s.seed,
                min_length=s.min_length,
                max_length=s.max_length,
            )
        pairs = data.generate_synthetic(spec)["test"]
        return data.corpus_from_pairs(
            [(p.source, p.target, p.alignment) for p in pairs], name=f"attn_jax_synthetic/{d.synthetic}[test]"
        )
    return load_corpus(d, split)


def select_examples(sources: Sequence[str], max_examples: int | None) -> list[int]:
    """Indices of at most ``max_examples`` pairs, spread evenly over the length buckets 0-9 ... 60+.

    Round robin over the buckets (corpus order inside each), so a small sample still fills every bucket of the
    BLEU-by-length table; all pairs when ``max_examples`` is None or not smaller than the corpus.
    """
    from attn_jax.eval import PAPER_BUCKETS, bucket_index

    n = len(sources)
    if max_examples is None or max_examples >= n:
        return list(range(n))
    groups: list[list[int]] = [[] for _ in PAPER_BUCKETS]
    for i, s in enumerate(sources):
        groups[bucket_index(len(s.split()))].append(i)
    picked: list[int] = []
    depth = 0
    while len(picked) < max_examples:
        for g in groups:
            if depth < len(g) and len(picked) < max_examples:
                picked.append(g[depth])
        depth += 1
    return sorted(picked)
