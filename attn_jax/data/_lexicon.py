"""Word lists of the built-in synthetic corpus: English-like source words and generated target words.

The source words are real English words, one part of speech each (no word is both a noun and a verb), so
that the source grammar stays LL(1) and every source sentence has exactly one parse. Verbs are in the past
tense; nouns are singular lemmas whose plural is formed by :func:`pluralize`. The target words are
pseudo-words drawn once from a fixed syllable inventory with a fixed seed (part of the corpus version,
not of the corpus seed).
"""

from __future__ import annotations

import hashlib
import random

NOUNS = """
dog cat bird horse cow pig goat duck rabbit fox bear lion tiger monkey donkey snake frog owl eagle crow parrot
spider ant bee beetle camel zebra whale dolphin shark turtle lizard mule hen rooster squirrel badger otter
beaver falcon hawk swan pigeon sparrow moth worm snail crab lobster king queen prince princess farmer teacher
doctor nurse student baker butcher soldier sailor pilot driver painter singer dancer writer poet judge lawyer
merchant priest monk knight guard hunter miner tailor clerk cook waiter artist actor author scholar captain
banker barber boxer builder carpenter chemist dentist designer editor engineer gardener guest host jester
juggler neighbor stranger traveler pirate wizard witch giant dwarf goblin dragon ghost robot table chair book
letter box bottle cup plate spoon fork key door window wall roof floor lamp candle clock mirror bed blanket
pillow basket bucket barrel hammer rope chain bell drum flute violin piano guitar ball kite wheel cart wagon
boat ship train truck bicycle coin ring crown sword shield helmet coat hat boot glove scarf shirt jacket
pocket bag map picture painting statue rock pebble brick tower bridge castle palace temple church house
cottage cabin barn tent garden field forest meadow river lake pond hill mountain valley island beach cliff
cave road street path village city harbor market shop bakery kitchen library school museum station prison
garage gate fence tree flower bush apple lemon banana cherry grape melon carrot onion cabbage cake cookie pie
song story dream plan idea question answer gift prize message promise rumor riddle puzzle diary journal poem
novel ticket envelope parcel umbrella ladder shovel bench cushion carpet curtain kettle teapot jar bowl napkin
needle button feather nest egg shell pearl diamond ruby emerald jewel necklace bracelet medal trophy flag
banner lantern torch compass telescope anchor sail oar raft canoe saddle bridle stable fountain chimney cellar
attic hallway staircase balcony porch courtyard orchard vineyard farm mill factory bank hotel restaurant
theater stadium airport hospital office tunnel canal dock lighthouse windmill pyramid volcano desert jungle
swamp glacier planet comet rocket engine motor machine computer camera radio phone
"""

ADJECTIVES = """
old young big small tall short long heavy dark bright red blue green yellow white black brown gray pink purple
golden silver wooden iron happy sad angry calm brave shy proud lazy clever foolish quiet loud gentle cruel
kind wise honest polite rude friendly lonely hungry thirsty tired sleepy busy rich poor famous strange curious
careful nervous jealous patient eager fierce wild tame clean dirty wet dry warm cold hot cool fresh rotten
sweet bitter sour salty soft hard smooth rough sharp dull round flat thick thin narrow wide deep shallow empty
full broken ancient modern new tiny huge little enormous fat slim ugly pretty beautiful handsome lovely
elegant plain fancy simple rare common hidden silent noisy dusty muddy sandy rocky sunny rainy windy snowy
frozen foggy shiny pale vivid crimson scarlet violet orange bald blind clumsy graceful nimble sturdy fragile
loyal faithful grumpy cheerful gloomy merry jolly sly mighty humble noble royal holy wicked odd weird
marvelous splendid gigantic delicate fearless helpful useful useless magic mysterious peaceful playful
precious quick slow stubborn sticky striped spotted wooly hairy fluffy greasy icy fiery stormy misty starry
dreadful awful lucky unlucky
"""

ADVERBS = """
quickly slowly quietly loudly happily sadly angrily calmly bravely shyly proudly lazily cleverly foolishly
gently cruelly kindly wisely honestly politely rudely eagerly fiercely carefully nervously patiently suddenly
finally often rarely seldom always never soon later yesterday again already barely hardly nearly almost easily
busily boldly warmly coldly sweetly bitterly softly sharply neatly secretly openly loyally gladly madly wildly
merrily gloomily cheerfully gracefully clumsily silently noisily briefly firmly freely greatly rapidly really
surely swiftly tightly truly vaguely humbly nobly
"""

PREPOSITIONS = """
on in near under behind beside above below with without from to into onto toward across along around beyond
inside outside past through over among against about for after before
"""

INTRANSITIVE_VERBS = """
slept ran walked jumped laughed cried smiled danced sang swam flew fell arrived waited shouted whispered sat
stood rested worked played prayed fainted sneezed coughed yawned trembled shivered wandered hurried escaped
vanished appeared disappeared returned stayed paused hesitated agreed complained grumbled giggled screamed
sighed snored barked roared howled growled chirped buzzed hissed crawled fled knelt slipped stumbled floated
sank glowed shone sparkled melted rose collapsed exploded nodded blinked frowned grinned wept bowed dreamed
thrived prospered improved recovered retired relaxed panicked protested surrendered triumphed
"""

TRANSITIVE_VERBS = """
saw chased caught found took gave brought carried pushed pulled kicked hit kissed hugged loved hated liked
feared admired praised blamed thanked helped followed visited watched noticed ignored remembered forgot
painted drew wrote read built broke fixed cleaned washed cooked ate drank bought sold stole hid opened closed
locked unlocked dropped lifted threw tossed held grabbed touched smelled tasted heard called named invited
greeted met married attacked defended protected rescued saved trapped released fed taught studied borrowed
lent sent received guarded hunted bit scratched licked chewed swallowed buried dug filled covered wrapped
packed carved cut polished burned tied untied folded hung measured counted weighed tested chose judged
described explained imagined expected envied pitied trusted doubted mocked teased scolded punished rewarded
warned advised obeyed served ruled led joined left passed crossed climbed entered explored reached approached
surrounded squeezed shook struck tickled pinched poked slapped
"""

# Singular and plural determiners. "the" has no target counterpart (it stays unaligned); the others are 1-1.
SINGULAR_DETERMINERS = ("the", "a", "every", "this", "that", "each")
PLURAL_DETERMINERS = ("the", "these", "those", "some", "many", "few", "several", "two", "three")
RELATIVE = "which"
# Clause connectors; those in COMMA_CONNECTORS are preceded by a comma token.
CONNECTORS = ("and", "but", "because", "while", "although", "so", "until")
COMMA_CONNECTORS = frozenset({"but", "because", "although", "so"})
COMMA = ","
PERIOD = "."

# Target function words.
TARGET_RELATIVE = "ku"
TARGET_PARTICLES = {("m", False): "lo", ("f", False): "la", ("m", True): "li", ("f", True): "le"}
TARGET_LEXICON_SEED = 20140901  # fixed: part of the corpus version, not of the corpus seed


def _words(block: str) -> tuple[str, ...]:
    """The distinct words of a whitespace-separated block, in order."""
    return tuple(dict.fromkeys(block.split()))


def pluralize(noun: str) -> str:
    """Regular English plural of ``noun`` (box -> boxes, cherry -> cherries, monkey -> monkeys)."""
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


_ONSETS = ("b", "d", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "kr", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")


def _draw_target_words(
    count: int, rng: random.Random, taken: set[str], syllables: tuple[int, int]
) -> list[str]:
    """``count`` distinct pseudo-words of ``syllables`` CV syllables, not in ``taken`` (updated in place)."""
    words = []
    while len(words) < count:
        n = syllables[0] + int(rng.random() * (syllables[1] - syllables[0] + 1))
        word = "".join(
            _ONSETS[int(rng.random() * len(_ONSETS))] + _VOWELS[int(rng.random() * len(_VOWELS))]
            for _ in range(n)
        )
        if rng.random() < 0.3:
            word += "n"
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


class Lexicon:
    """Source word classes and their target translations: the bilingual dictionary of the corpus."""

    def __init__(self) -> None:
        self.nouns = _words(NOUNS)
        self.adjectives = _words(ADJECTIVES)
        self.adverbs = _words(ADVERBS)
        self.prepositions = _words(PREPOSITIONS)
        self.intransitive_verbs = _words(INTRANSITIVE_VERBS)
        self.transitive_verbs = _words(TRANSITIVE_VERBS)
        self.plurals = tuple(pluralize(n) for n in self.nouns)

        # word -> part-of-speech tag; the parser reads this table, so the classes must be disjoint.
        self.tag: dict[str, str] = {}
        classes = [
            ("N", self.nouns),
            ("NP", self.plurals),
            ("ADJ", self.adjectives),
            ("ADV", self.adverbs),
            ("P", self.prepositions),
            ("VI", self.intransitive_verbs),
            ("VT", self.transitive_verbs),
            ("DS", tuple(d for d in SINGULAR_DETERMINERS if d != "the")),
            ("DP", tuple(d for d in PLURAL_DETERMINERS if d != "the")),
            ("THE", ("the",)),
            ("REL", (RELATIVE,)),
            ("CONJ", CONNECTORS),
            ("COMMA", (COMMA,)),
            ("END", (PERIOD,)),
        ]
        for tag, words in classes:
            for word in words:
                if word in self.tag:
                    raise AssertionError(f"lexicon: {word!r} is both {self.tag[word]} and {tag}")
                self.tag[word] = tag
        self.noun_of_plural = dict(zip(self.plurals, self.nouns, strict=True))

        # Target side: one pseudo-word per source content word, drawn in a fixed order with a fixed seed.
        rng = random.Random(TARGET_LEXICON_SEED)
        taken = set(self.tag) | set(TARGET_PARTICLES.values()) | {TARGET_RELATIVE, COMMA, PERIOD}
        determiners = tuple(dict.fromkeys(d for d in SINGULAR_DETERMINERS + PLURAL_DETERMINERS if d != "the"))
        self.translation: dict[str, str] = {}
        for words, syllables in [
            (self.nouns, (2, 3)),
            (self.adjectives, (2, 3)),
            (self.adverbs, (3, 3)),
            (self.prepositions, (1, 2)),
            (self.intransitive_verbs, (2, 3)),
            (self.transitive_verbs, (2, 3)),
            (determiners, (1, 1)),
            (CONNECTORS, (1, 2)),
        ]:
            self.translation.update(
                zip(words, _draw_target_words(len(words), rng, taken, syllables), strict=True)
            )
        self.translation[COMMA] = COMMA
        self.translation[PERIOD] = PERIOD
        self.translation[RELATIVE] = TARGET_RELATIVE
        # Grammatical gender of each target noun: fixed by the lexicon, chosen from the drawn word's hash.
        self.gender = {
            n: "mf"[hashlib.sha256(self.translation[n].encode()).digest()[0] % 2] for n in self.nouns
        }

    def source_vocabulary(self) -> tuple[str, ...]:
        """Every source word type, in a fixed order."""
        return tuple(self.tag)

    def target_vocabulary(self) -> tuple[str, ...]:
        """Every target word type, in a fixed order."""
        return tuple(dict.fromkeys([*self.translation.values(), *TARGET_PARTICLES.values()]))


LEXICON = Lexicon()
