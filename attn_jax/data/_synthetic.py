"""The built-in synthetic bilingual corpus: a seeded generator, its grammar, parser and translation function.

Source language (English-like, SVO, LL(1) so every sentence has exactly one parse)::

    S   -> CL ( [","] CONJ CL )* "."          "," exactly before but/because/although/so
    CL  -> NP VP
    NP  -> [DET] ADJ* N [PP | RC]             bare nouns must be plural; a/every/this/that/each: singular
                                              only; these/those/some/many/few/several/two/three: plural only
    PP  -> PREP NP
    RC  -> "which" VP                         subject relative clause (the gap is the subject)
    VP  -> [ADV] VT NP  |  [ADV] VI [PP]

A noun has at most one modifier (a PP or a relative clause), and a PP or relative clause always attaches to
the noun right before it, so recursion nests to the right and the parse is unique.

Target language (head-final clauses, its own vocabulary)::

    S   -> CL ( [","] CONJ' CL )* "."         connectors keep their place
    CL  -> NP VP
    VP  -> [NP_obj] [NP POSTP] [ADV'] V'      SOV; the intransitive verb's PP precedes the adverb and verb
    NP  -> [MOD] N' PART ADJ'* [DET']         adjectives follow the noun, in mirror order; no word for "the"
    MOD -> NP POSTP  |  VP "ku"               PPs and relative clauses precede their noun (postpositions)

``PART`` is a gender/number particle: each target noun has a fixed gender, the number comes from the source
noun form (``dog``/``dogs``), so a source noun aligns to two target words (``katrai lo``). The translation is
a function of the source tree, and the tree is a function of the source string (the grammar is LL(1)), so the
target is a function of the source sentence: a model can learn it perfectly, and long sentences with nested
clauses need long-distance reordering.

Alignments are Pharaoh ``i-j`` links (0-based source word ``i``, target word ``j``), sorted, all sure links.
Every target word is aligned to exactly one source word; the only unaligned source words are the ``the``
tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
from collections.abc import Sequence
from typing import NamedTuple

from attn_jax.data._lexicon import (
    COMMA,
    COMMA_CONNECTORS,
    CONNECTORS,
    LEXICON,
    PERIOD,
    PLURAL_DETERMINERS,
    RELATIVE,
    SINGULAR_DETERMINERS,
    TARGET_PARTICLES,
)

# Bumped whenever the grammar, lexicon or sampling changes: it is part of the TFDS version and of every seed.
GENERATOR_VERSION = "1.0.0"

# Source-length buckets of the test split: [0, 10), [10, 20), ..., [50, 60), [60, inf).
TEST_BUCKETS: tuple[tuple[int, int | None], ...] = (
    (0, 10),
    (10, 20),
    (20, 30),
    (30, 40),
    (40, 50),
    (50, 60),
    (60, None),
)
SPLITS = ("train", "validation", "test")
# Requested source lengths of test candidates (uniform), wide enough to fill every bucket of TEST_BUCKETS.
TEST_LENGTH_RANGE = (3, 80)


# ------------------------------------------------------------------------------------------------------------
# The tree.


@dataclasses.dataclass(frozen=True, slots=True)
class NounPhrase:
    """``[det] adjectives* noun [modifier]``; ``noun`` is the singular lemma, ``plural`` picks the form."""

    det: str | None
    adjectives: tuple[str, ...]
    noun: str
    plural: bool
    modifier: PrepPhrase | RelClause | None


@dataclasses.dataclass(frozen=True, slots=True)
class PrepPhrase:
    """``preposition NP``."""

    prep: str
    np: NounPhrase


@dataclasses.dataclass(frozen=True, slots=True)
class RelClause:
    """``which VP`` (the gap is the subject)."""

    vp: VerbPhrase


@dataclasses.dataclass(frozen=True, slots=True)
class VerbPhrase:
    """``[adverb] verb object`` (transitive) or ``[adverb] verb [PP]`` (intransitive)."""

    adverb: str | None
    verb: str
    obj: NounPhrase | None
    pp: PrepPhrase | None


@dataclasses.dataclass(frozen=True, slots=True)
class Clause:
    """``subject VP``."""

    subject: NounPhrase
    vp: VerbPhrase


@dataclasses.dataclass(frozen=True, slots=True)
class Sentence:
    """Clauses joined by connectors: ``len(connectors) == len(clauses) - 1``."""

    clauses: tuple[Clause, ...]
    connectors: tuple[str, ...]


class SyntheticPair(NamedTuple):
    """A sentence pair: whitespace-tokenised source and target, gold Pharaoh alignment ``"i-j ..."``."""

    source: str
    target: str
    alignment: str


# ------------------------------------------------------------------------------------------------------------
# Realisation: tree -> source tokens, target tokens, alignment.


class _Realiser:
    """Writes the source words of a tree, then its target words with the source position each comes from."""

    def __init__(self) -> None:
        self.src: list[str] = []
        self.tgt: list[str] = []
        self.links: list[tuple[int, int]] = []
        self._pos: dict[tuple[int, str | int], int] = {}

    # Source side: records the position of every word under (id(node), role).
    def _s(self, node: object, role: str | int, word: str) -> None:
        self._pos[(id(node), role)] = len(self.src)
        self.src.append(word)

    def source_np(self, np_: NounPhrase) -> None:
        if np_.det is not None:
            self._s(np_, "det", np_.det)
        for k, adj in enumerate(np_.adjectives):
            self._s(np_, k, adj)
        self._s(np_, "noun", LEXICON.plurals[_NOUN_INDEX[np_.noun]] if np_.plural else np_.noun)
        mod = np_.modifier
        if isinstance(mod, PrepPhrase):
            self._s(mod, "prep", mod.prep)
            self.source_np(mod.np)
        elif isinstance(mod, RelClause):
            self._s(mod, "rel", RELATIVE)
            self.source_vp(mod.vp)

    def source_vp(self, vp: VerbPhrase) -> None:
        if vp.adverb is not None:
            self._s(vp, "adv", vp.adverb)
        self._s(vp, "verb", vp.verb)
        if vp.obj is not None:
            self.source_np(vp.obj)
        if vp.pp is not None:
            self._s(vp.pp, "prep", vp.pp.prep)
            self.source_np(vp.pp.np)

    def source_sentence(self, s: Sentence) -> None:
        for k, clause in enumerate(s.clauses):
            if k:
                conn = s.connectors[k - 1]
                if conn in COMMA_CONNECTORS:
                    self._s(s, ("comma", k), COMMA)
                self._s(s, ("conn", k), conn)
            self.source_np(clause.subject)
            self.source_vp(clause.vp)
        self._s(s, "end", PERIOD)

    # Target side: every target word names the source word it translates.
    def _t(self, word: str, node: object, role: str | int | tuple) -> None:
        self.links.append((self._pos[(id(node), role)], len(self.tgt)))
        self.tgt.append(word)

    def target_np(self, np_: NounPhrase) -> None:
        mod = np_.modifier
        if isinstance(mod, PrepPhrase):
            self.target_np(mod.np)
            self._t(LEXICON.translation[mod.prep], mod, "prep")
        elif isinstance(mod, RelClause):
            self.target_vp(mod.vp)
            self._t(LEXICON.translation[RELATIVE], mod, "rel")
        self._t(LEXICON.translation[np_.noun], np_, "noun")
        self._t(TARGET_PARTICLES[(LEXICON.gender[np_.noun], np_.plural)], np_, "noun")
        for k in reversed(range(len(np_.adjectives))):
            self._t(LEXICON.translation[np_.adjectives[k]], np_, k)
        if np_.det is not None and np_.det != "the":
            self._t(LEXICON.translation[np_.det], np_, "det")

    def target_vp(self, vp: VerbPhrase) -> None:
        if vp.obj is not None:
            self.target_np(vp.obj)
        if vp.pp is not None:
            self.target_np(vp.pp.np)
            self._t(LEXICON.translation[vp.pp.prep], vp.pp, "prep")
        if vp.adverb is not None:
            self._t(LEXICON.translation[vp.adverb], vp, "adv")
        self._t(LEXICON.translation[vp.verb], vp, "verb")

    def target_sentence(self, s: Sentence) -> None:
        for k, clause in enumerate(s.clauses):
            if k:
                conn = s.connectors[k - 1]
                if conn in COMMA_CONNECTORS:
                    self._t(COMMA, s, ("comma", k))
                self._t(LEXICON.translation[conn], s, ("conn", k))
            self.target_np(clause.subject)
            self.target_vp(clause.vp)
        self._t(PERIOD, s, "end")


_NOUN_INDEX = {noun: k for k, noun in enumerate(LEXICON.nouns)}


def realize(sentence: Sentence) -> SyntheticPair:
    """The source sentence, its translation and their gold alignment, all determined by the tree."""
    r = _Realiser()
    r.source_sentence(sentence)
    r.target_sentence(sentence)
    alignment = " ".join(f"{i}-{j}" for i, j in sorted(r.links))
    return SyntheticPair(" ".join(r.src), " ".join(r.tgt), alignment)


# ------------------------------------------------------------------------------------------------------------
# Parsing: source string -> tree (LL(1) recursive descent), so translation is a function of the source string.


class _Parser:
    def __init__(self, tokens: Sequence[str]) -> None:
        self.tokens = list(tokens)
        self.tags = []
        for k, word in enumerate(self.tokens):
            if word not in LEXICON.tag:
                raise ValueError(f"word {k} {word!r} is not in the synthetic source lexicon")
            self.tags.append(LEXICON.tag[word])
        self.k = 0

    def _peek(self) -> str | None:
        return self.tags[self.k] if self.k < len(self.tags) else None

    def _take(self, *tags: str) -> str:
        tag = self._peek()
        if tag not in tags:
            found = repr(self.tokens[self.k]) if self.k < len(self.tokens) else "the end of the sentence"
            raise ValueError(f"word {self.k}: expected {'/'.join(tags)}, found {found}")
        self.k += 1
        return self.tokens[self.k - 1]

    def sentence(self) -> Sentence:
        clauses = [self.clause()]
        connectors = []
        while self._peek() in ("COMMA", "CONJ"):
            comma = self._peek() == "COMMA"
            if comma:
                self._take("COMMA")
            conn = self._take("CONJ")
            if comma != (conn in COMMA_CONNECTORS):
                raise ValueError(
                    f"word {self.k - 1}: {conn!r} {'needs' if not comma else 'takes no'} comma before it"
                )
            connectors.append(conn)
            clauses.append(self.clause())
        self._take("END")
        if self.k != len(self.tokens):
            raise ValueError(f"word {self.k}: text after the final {PERIOD!r}")
        return Sentence(tuple(clauses), tuple(connectors))

    def clause(self) -> Clause:
        return Clause(self.np(), self.vp())

    def np(self) -> NounPhrase:
        start = self.k
        det = self._take("DS", "DP", "THE") if self._peek() in ("DS", "DP", "THE") else None
        det_tag = self.tags[start] if det is not None else None
        adjectives = []
        while self._peek() == "ADJ":
            adjectives.append(self._take("ADJ"))
        word = self._take("N", "NP")
        plural = self.tags[self.k - 1] == "NP"
        if (det_tag == "DS" and plural) or (det_tag == "DP" and not plural) or (det is None and not plural):
            raise ValueError(f"word {start}: determiner {det!r} does not agree with {word!r}")
        noun = LEXICON.noun_of_plural[word] if plural else word
        modifier: PrepPhrase | RelClause | None = None
        if self._peek() == "P":
            modifier = PrepPhrase(self._take("P"), self.np())
        elif self._peek() == "REL":
            self._take("REL")
            modifier = RelClause(self.vp())
        return NounPhrase(det, tuple(adjectives), noun, plural, modifier)

    def vp(self) -> VerbPhrase:
        adverb = self._take("ADV") if self._peek() == "ADV" else None
        verb = self._take("VT", "VI")
        if self.tags[self.k - 1] == "VT":
            return VerbPhrase(adverb, verb, self.np(), None)
        pp = PrepPhrase(self._take("P"), self.np()) if self._peek() == "P" else None
        return VerbPhrase(adverb, verb, None, pp)


def parse_source(sentence: str) -> Sentence:
    """Parse a source sentence of the synthetic language into its (unique) tree.

    Args:
      sentence: whitespace-tokenised source text, e.g. ``"the dog which saw two cats slept ."``.

    Returns:
      The :class:`Sentence` tree. Raises ``ValueError`` naming the word position if it is not in the language.
    """
    return _Parser(sentence.split()).sentence()


def translate_source(sentence: str) -> SyntheticPair:
    """The exact translation and gold alignment of any sentence of the synthetic source language.

    This is the function the corpus samples from: ``translate_source(p.source) == p`` for every generated
    pair.

    >>> translate_source("the dog slept .").alignment
    '1-0 1-1 2-2 3-3'
    """
    return realize(parse_source(sentence))


# ------------------------------------------------------------------------------------------------------------
# Sampling.


def _pick(rng: random.Random, items: Sequence[str]) -> str:
    # Only Random.random() is guaranteed stable across Python versions, so every draw goes through it.
    return items[int(rng.random() * len(items))]


_SG_DETS = SINGULAR_DETERMINERS + ("the",) * 3  # "the" is the most common determiner
_PL_DETS = PLURAL_DETERMINERS + ("the",) * 3 + (None,) * 3  # bare plurals


class _Sampler:
    """Draws trees; ``p`` is the chance a noun takes a modifier, so it sets how deep sentences nest."""

    MAX_DEPTH = 4

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def np(self, depth: int, p: float) -> NounPhrase:
        rng = self.rng
        plural = rng.random() < 0.35
        det = _pick(rng, _PL_DETS) if plural else _pick(rng, _SG_DETS)
        u = rng.random()
        n_adj = 0 if u < 0.55 else 1 if u < 0.85 else 2 if u < 0.97 else 3
        adjectives: list[str] = []
        while len(adjectives) < n_adj:
            adj = _pick(rng, LEXICON.adjectives)
            if adj not in adjectives:
                adjectives.append(adj)
        noun = _pick(rng, LEXICON.nouns)
        modifier: PrepPhrase | RelClause | None = None
        if depth < self.MAX_DEPTH and rng.random() < p:
            if rng.random() < 0.55:
                modifier = PrepPhrase(_pick(rng, LEXICON.prepositions), self.np(depth + 1, p * 0.8))
            else:
                modifier = RelClause(self.vp(depth + 1, p * 0.8))
        return NounPhrase(det, tuple(adjectives), noun, plural, modifier)

    def vp(self, depth: int, p: float) -> VerbPhrase:
        rng = self.rng
        adverb = _pick(rng, LEXICON.adverbs) if rng.random() < 0.2 else None
        if rng.random() < 0.6:
            return VerbPhrase(adverb, _pick(rng, LEXICON.transitive_verbs), self.np(depth, p), None)
        pp = None
        if depth < self.MAX_DEPTH and rng.random() < 0.5:
            pp = PrepPhrase(_pick(rng, LEXICON.prepositions), self.np(depth + 1, p * 0.8))
        return VerbPhrase(adverb, _pick(rng, LEXICON.intransitive_verbs), None, pp)

    def sentence(self, length: int) -> Sentence:
        """A sentence of about ``length`` source words: clauses are added until the length is reached."""
        p = 0.1 + 0.4 * min(1.0, length / 60.0)
        clauses = [Clause(self.np(0, p), self.vp(0, p))]
        connectors: list[str] = []
        n = _source_length(clauses[0]) + 1
        while n < length:
            conn = _pick(self.rng, CONNECTORS)
            clause = Clause(self.np(0, p), self.vp(0, p))
            connectors.append(conn)
            clauses.append(clause)
            n += _source_length(clause) + 1 + (conn in COMMA_CONNECTORS)
        return Sentence(tuple(clauses), tuple(connectors))


def _source_length(node: object) -> int:
    """Number of source words of a clause/NP/VP subtree."""
    if isinstance(node, Clause):
        return _source_length(node.subject) + _source_length(node.vp)
    if isinstance(node, NounPhrase):
        n = (node.det is not None) + len(node.adjectives) + 1
        if node.modifier is not None:
            n += 1 + _source_length(
                node.modifier.np if isinstance(node.modifier, PrepPhrase) else node.modifier.vp
            )
        return n
    if isinstance(node, VerbPhrase):
        n = (node.adverb is not None) + 1
        if node.obj is not None:
            n += _source_length(node.obj)
        if node.pp is not None:
            n += 1 + _source_length(node.pp.np)
        return n
    raise TypeError(type(node))


# ------------------------------------------------------------------------------------------------------------
# The corpus.


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """Sizes and seed of a synthetic corpus.

    Attributes:
      train_size: training pairs.
      validation_size: validation pairs (same length distribution as train).
      test_per_bucket: test pairs in each source-length bucket of :data:`TEST_BUCKETS` (stratified).
      seed: corpus seed; the lexicon does not depend on it.
      min_length: shortest requested train/validation source length (words, including the final ".").
      max_length: longest requested train/validation source length; sentences overshoot it by at most one
        clause.
        The test split always requests lengths in :data:`TEST_LENGTH_RANGE` so that every bucket fills.
    """

    train_size: int = 50_000
    validation_size: int = 1_000
    test_per_bucket: int = 300
    seed: int = 0
    min_length: int = 3
    max_length: int = 60

    def __post_init__(self) -> None:
        if min(self.train_size, self.validation_size, self.test_per_bucket) < 0:
            raise ValueError(f"sizes must be >= 0, got {self}")
        if not 3 <= self.min_length <= self.max_length:
            raise ValueError(f"need 3 <= min_length <= max_length, got {self}")


def _split_rng(spec: SyntheticSpec, split: str) -> random.Random:
    digest = hashlib.sha256(f"attn_jax_synthetic/{GENERATOR_VERSION}/{spec.seed}/{split}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def _natural(spec: SyntheticSpec, split: str, size: int, exclude: set[str]) -> list[SyntheticPair]:
    """``size`` pairs, requested lengths uniform in [min_length, max_length], sources not in ``exclude``."""
    rng = _split_rng(spec, split)
    sampler = _Sampler(rng)
    pairs: list[SyntheticPair] = []
    seen = set(exclude)
    while len(pairs) < size:
        length = spec.min_length + int(rng.random() * (spec.max_length - spec.min_length + 1))
        pair = realize(sampler.sentence(length))
        if split == "train" or pair.source not in seen:  # only held-out splits are deduplicated
            seen.add(pair.source)
            pairs.append(pair)
    return pairs


def length_bucket(num_words: int) -> int:
    """Index into :data:`TEST_BUCKETS` of a sentence with ``num_words`` source words."""
    return min(num_words // 10, len(TEST_BUCKETS) - 1)


def _stratified(spec: SyntheticSpec, exclude: set[str]) -> list[SyntheticPair]:
    """Generate, then keep the first ``test_per_bucket`` distinct pairs of each source-length bucket."""
    rng = _split_rng(spec, "test")
    sampler = _Sampler(rng)
    counts = [0] * len(TEST_BUCKETS)
    pairs: list[SyntheticPair] = []
    seen = set(exclude)
    lo, hi = TEST_LENGTH_RANGE
    while min(counts) < spec.test_per_bucket:
        length = lo + int(rng.random() * (hi - lo + 1))
        pair = realize(sampler.sentence(length))
        b = length_bucket(len(pair.source.split()))
        if counts[b] < spec.test_per_bucket and pair.source not in seen:
            seen.add(pair.source)
            counts[b] += 1
            pairs.append(pair)
    return pairs


def generate_synthetic(spec: SyntheticSpec = SyntheticSpec()) -> dict[str, list[SyntheticPair]]:
    """Generate the train, validation and test splits of the built-in corpus, without TFDS.

    Deterministic given :data:`GENERATOR_VERSION` and ``spec``. Validation and test sources never occur in an
    earlier split (train, then validation); the test split holds ``spec.test_per_bucket`` pairs in every
    bucket of :data:`TEST_BUCKETS`.

    >>> splits = generate_synthetic(SyntheticSpec(train_size=3, validation_size=2, test_per_bucket=1))
    >>> [len(splits[s]) for s in ("train", "validation", "test")]
    [3, 2, 7]
    """
    return {name: list(pairs) for name, pairs in _generated(spec).items()}


@functools.lru_cache(maxsize=4)
def _generated(spec: SyntheticSpec) -> dict[str, tuple[SyntheticPair, ...]]:
    """The splits of ``spec``, drawn once per process: the trainer reads train and validation, the evaluation
    the test split, each from the whole corpus, and drawing 20,000 pairs takes seconds."""
    train = _natural(spec, "train", spec.train_size, set())
    train_sources = {p.source for p in train}
    validation = _natural(spec, "validation", spec.validation_size, train_sources)
    test = _stratified(spec, train_sources | {p.source for p in validation})
    return {"train": tuple(train), "validation": tuple(validation), "test": tuple(test)}
