"""Where RNNsearch's attention points, relative to the gold alignment: the offset of each target word's
most-attended source word from its nearest gold source word, overall and by the source word's class.

    python experiments/bahdanau2015/offsets.py runs/demo/rnnsearch_cpu                  # best checkpoint
    python experiments/bahdanau2015/offsets.py runs/demo/rnnsearch_cpu --checkpoint 1000 --sentences 200

Teacher-forced on the first ``--sentences`` validation pairs within the training lengths (``reference_attention``
of ``attn-jax evaluate``). Offset 0 is a gold hit; +1 means the attention sits one word to the right of the aligned
source word -- the failure mode the seed study (README.md) looks for: the forward GRU's annotation of word j+1
still carries word j, so a decoder can translate well while attending one word too far right. Offsets beyond ±2
are pooled into ±2. Word classes come from the built-in corpus' lexicon (noun, adjective, determiner, ...), so
the breakdown is for runs on the built-in corpus; any other corpus gets the overall row only.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable, Sequence

import numpy as np

CLIP = 2


def offset_counts(
    attention: np.ndarray, gold: dict[int, Sequence[int]], source_words: Sequence[str], word_class: Callable
) -> dict[str, collections.Counter]:
    """Per source-word class (and ``"all"``), a Counter of offsets ``argmax_j attention[t, :n] - nearest gold j``.

    Args:
      attention: ``[m(+1), n(+1)]`` teacher-forced weights, rows target words, columns source words (a trailing
        ``</s>`` row/column is ignored: the argmax runs over the ``n`` source words only).
      gold: target index -> its gold source indices (target words without a link are skipped).
      source_words: the ``n`` source words.
      word_class: source word -> class name; the class of a target word is that of its first gold source word.

    >>> att = np.array([[0.1, 0.8, 0.1], [0.7, 0.2, 0.1]])
    >>> out = offset_counts(att, {0: [0], 1: [0, 2]}, ["a", "b", "c"], lambda w: "x")
    >>> dict(out["all"]), dict(out["x"])
    ({1: 1, 0: 1}, {1: 1, 0: 1})
    """
    n = len(source_words)
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for t, sources in gold.items():
        if not sources:
            continue
        a = int(np.argmax(attention[t, :n]))
        d = min((a - s for s in sources), key=abs)
        d = max(-CLIP, min(CLIP, d))
        out["all"][d] += 1
        out[word_class(source_words[sources[0]])][d] += 1
    return out


def builtin_word_class(word: str) -> str:
    """The lexical class of a source word of the built-in corpus ("other" for anything else)."""
    from attn_jax.data import _lexicon as lex

    if word in lex.SINGULAR_DETERMINERS or word in lex.PLURAL_DETERMINERS:
        return "determiner"
    if word == lex.RELATIVE:
        return "which"
    if word in lex.CONNECTORS:
        return "connector"
    if word in (lex.COMMA, lex.PERIOD):
        return "punctuation"
    for name, label in (
        ("NOUNS", "noun"),
        ("ADJECTIVES", "adjective"),
        ("ADVERBS", "adverb"),
        ("PREPOSITIONS", "preposition"),
        ("INTRANSITIVE_VERBS", "verb"),
        ("TRANSITIVE_VERBS", "verb"),
    ):
        words = lex._words(getattr(lex, name))
        if word in words or (label == "noun" and word in {lex.pluralize(w) for w in words}):
            return label
    return "other"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workdir", help="an RNNsearch training run")
    p.add_argument("--checkpoint", default="best", help="best, last or a step (default: %(default)s)")
    p.add_argument("--sentences", type=int, default=200, help="validation pairs (default: %(default)s)")
    args = p.parse_args(argv)

    from attn_jax.eval import parse_pharaoh
    from attn_jax.pipeline import load_model, load_split, reference_attention

    ck = int(args.checkpoint) if args.checkpoint.isdigit() else args.checkpoint
    m = load_model(args.workdir, ck)
    c = load_split(m.config, "validation")
    if c.alignments is None:
        print(f"{args.workdir}: the validation split has no gold alignments", file=sys.stderr)
        return 2
    d = m.config.data
    idx = [
        i
        for i, s in enumerate(c.sources)
        if len(s.split()) <= d.max_source_length and len(c.targets[i].split()) <= d.max_target_length
    ][: args.sentences]
    src = [c.sources[i] for i in idx]
    att = reference_attention(m, src, [c.targets[i] for i in idx], batch_size=32)
    if att is None:
        print(f"{args.workdir}: this model has no attention", file=sys.stderr)
        return 2
    builtin = d.corpus == "synthetic"
    total: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for k, i in enumerate(idx):
        links = parse_pharaoh(c.alignments[i]) if isinstance(c.alignments[i], str) else c.alignments[i]
        gold: dict[int, list[int]] = {}
        for s, t in links.sure:
            gold.setdefault(t, []).append(s)
        words = src[k].split()
        counts = offset_counts(np.asarray(att[k]), gold, words, builtin_word_class if builtin else str)
        for cls, cnt in counts.items():
            if builtin or cls == "all":
                total[cls].update(cnt)
    cols = list(range(-CLIP, CLIP + 1))
    print(f"{args.workdir} step {m.step}, {len(idx)} validation pairs (offsets beyond ±{CLIP} pooled)")
    print("| source word | target words | " + " | ".join(f"{o:+d}" if o else "0 (gold)" for o in cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for cls in sorted(total, key=lambda x: (x != "all", -sum(total[x].values()))):
        n = sum(total[cls].values())
        print(f"| {cls} | {n} | " + " | ".join(f"{100 * total[cls][o] / n:.1f}%" for o in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
