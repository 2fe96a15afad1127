"""Extended vocabularies for copying (See, Liu & Manning 2017): per sentence, source words outside the target
vocabulary get temporary ids ``V, V+1, …``, and a target word outside it that occurs in the source gets the id
of that source word, so that the pointer-generator (``model.copy``) can be trained to copy it."""

from __future__ import annotations

from attn_jax.data._vocab import UNK_ID, WordVocabulary

__all__ = ["extend_with_source"]


def extend_with_source(
    source: str, target: str, target_vocab: WordVocabulary
) -> tuple[list[int], list[int], list[str]]:
    """``(source ids, target ids, out-of-vocabulary source words)`` in the extended target vocabulary.

    Source word ``k`` gets its target-vocabulary id when the target vocabulary has it, else ``V + r`` where
    ``r`` is the rank of its first occurrence among the sentence's distinct out-of-vocabulary words (repeats share
    an id). A target word keeps its id, or takes its source word's ``V + r``, or is ``<unk>`` when it is in
    neither. Words are the vocabulary's whitespace tokens (lowercased when it lowercases), so source id ``k``
    belongs to source token ``k``.

    >>> v = WordVocabulary(("<pad>", "<s>", "</s>", "<unk>", "the"))
    >>> extend_with_source("the Zorg met Zorg and Ada", "Ada saw the Zorg and Bob", v)
    ([4, 5, 6, 5, 7, 8], [8, 3, 4, 5, 7, 3], ['Zorg', 'met', 'and', 'Ada'])
    """
    if not isinstance(target_vocab, WordVocabulary):
        raise ValueError(
            f"copying needs a word-level target vocabulary (words outside it are copied), got {target_vocab!r}"
        )
    v = target_vocab.size
    fold = str.lower if target_vocab.lowercase else (lambda w: w)
    oov: dict[str, int] = {}
    src_ids = []
    for word in map(fold, source.split()):
        i = target_vocab.encode(word)[0]
        if i == UNK_ID:
            i = oov.setdefault(word, v + len(oov))
        src_ids.append(i)
    tgt_ids = []
    for word in map(fold, target.split()):
        i = target_vocab.encode(word)[0]
        tgt_ids.append(oov.get(word, UNK_ID) if i == UNK_ID else i)
    return src_ids, tgt_ids, list(oov)
