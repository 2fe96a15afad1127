"""Write the small English-French corpus of docs/own-corpus.md (self-written).

    python tests/data/own_corpus/make_corpus.py      # rewrites {train,valid,test}.{en,fr} beside this file

Everyday sentences written as text is (capitals, punctuation attached to words, French elision and
contractions: "l'enfant", "n'aime", "au chat", a space before "?" in French), from a hand-made lexicon and
nine templates, drawn with a fixed seed: 400 training, 40 validation and 40 test pairs. One training pair and
one test pair have an empty French side on purpose, so the walkthrough shows how they are reported
(``attn-jax data``, the trainer's start-up lines, ``attn-jax evaluate``). tests/test_readme_own_corpus.py checks
that the shipped files are this script's output.
"""

from __future__ import annotations

import pathlib
import random

# (English, French, French gender) — singular third persons, so one verb form per language.
SUBJECTS = [
    ("the cat", "le chat", "m"),
    ("the dog", "le chien", "m"),
    ("my sister", "ma sœur", "f"),
    ("my brother", "mon frère", "m"),
    ("the teacher", "le professeur", "m"),
    ("the old woman", "la vieille femme", "f"),
    ("the child", "l'enfant", "m"),
    ("our neighbour", "notre voisin", "m"),
    ("the baker", "le boulanger", "m"),
    ("the girl", "la fille", "f"),
    ("the doctor", "le médecin", "m"),
    ("my friend", "mon amie", "f"),
    ("the student", "l'étudiante", "f"),
    ("the farmer", "le fermier", "m"),
]
# (English 3rd person, French 3rd person)
INTRANSITIVE = [
    ("sleeps", "dort"),
    ("works", "travaille"),
    ("waits", "attend"),
    ("sings", "chante"),
    ("eats", "mange"),
    ("reads", "lit"),
    ("plays", "joue"),
    ("walks", "se promène"),
    ("runs", "court"),
    ("dances", "danse"),
]
PLACES = [
    ("in the garden", "dans le jardin"),
    ("in the kitchen", "dans la cuisine"),
    ("at school", "à l'école"),
    ("near the river", "près de la rivière"),
    ("in the park", "dans le parc"),
    ("at the station", "à la gare"),
    ("in the library", "à la bibliothèque"),
    ("on the beach", "sur la plage"),
    ("behind the house", "derrière la maison"),
    ("in the village", "dans le village"),
]
# (English 3rd person, English base form, French 3rd person)
TRANSITIVE = [
    ("reads", "read", "lit"),
    ("buys", "buy", "achète"),
    ("sees", "see", "voit"),
    ("wants", "want", "veut"),
    ("likes", "like", "aime"),
    ("opens", "open", "ouvre"),
    ("finds", "find", "trouve"),
    ("carries", "carry", "porte"),
    ("cleans", "clean", "nettoie"),
    ("forgets", "forget", "oublie"),
]
# (English, French, definite?) — negation uses the definite ones (French "pas de" would change the article).
OBJECTS = [
    ("a book", "un livre", False),
    ("a letter", "une lettre", False),
    ("the door", "la porte", True),
    ("the window", "la fenêtre", True),
    ("a red apple", "une pomme rouge", False),
    ("the newspaper", "le journal", True),
    ("a small box", "une petite boîte", False),
    ("the bread", "le pain", True),
    ("a new car", "une nouvelle voiture", False),
    ("the old map", "la vieille carte", True),
    ("a cup of tea", "une tasse de thé", False),
    ("the key", "la clé", True),
    ("the umbrella", "le parapluie", True),
    ("a green bicycle", "un vélo vert", False),
]
TIMES = [
    ("every morning", "chaque matin"),
    ("today", "aujourd'hui"),
    ("on Sundays", "le dimanche"),
    ("in the evening", "le soir"),
    ("after lunch", "après le déjeuner"),
    ("before dinner", "avant le dîner"),
]
# (English, French masculine, French feminine)
ADJECTIVES = [
    ("tired", "fatigué", "fatiguée"),
    ("happy", "heureux", "heureuse"),
    ("busy", "occupé", "occupée"),
    ("ready", "prêt", "prête"),
    ("sick", "malade", "malade"),
    ("very kind", "très gentil", "très gentille"),
    ("late", "en retard", "en retard"),
    ("angry", "en colère", "en colère"),
]

VOWELS = "aeiouéèêàâh"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _to(fr: str) -> str:
    """French "à" + a noun phrase, with the contraction "au"."""
    if fr.startswith("le "):
        return "au " + fr[3:]
    return "à " + fr


def _ne(verb: str) -> str:
    return ("n'" if verb[0] in VOWELS else "ne ") + verb


def _pronoun(gender: str) -> tuple[str, str]:
    return ("he", "il") if gender == "m" else ("she", "elle")


def _pair(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(9)
    s_en, s_fr, g = rng.choice(SUBJECTS)
    if kind == 0:
        (v_en, v_fr), (p_en, p_fr) = rng.choice(INTRANSITIVE), rng.choice(PLACES)
        return f"{_cap(s_en)} {v_en} {p_en}.", f"{_cap(s_fr)} {v_fr} {p_fr}."
    if kind == 1:
        (v_en, _, v_fr), (o_en, o_fr, _) = rng.choice(TRANSITIVE), rng.choice(OBJECTS)
        return f"{_cap(s_en)} {v_en} {o_en}.", f"{_cap(s_fr)} {v_fr} {o_fr}."
    if kind == 2:
        (v_en, _, v_fr), (o_en, o_fr, _), (t_en, t_fr) = (
            rng.choice(TRANSITIVE),
            rng.choice(OBJECTS),
            rng.choice(TIMES),
        )
        return f"{_cap(s_en)} {v_en} {o_en} {t_en}.", f"{_cap(s_fr)} {v_fr} {o_fr} {t_fr}."
    if kind == 3:
        o_en, o_fr, _ = rng.choice([o for o in OBJECTS if o[2]])
        return f"Where is {o_en}?", f"Où est {o_fr} ?"
    if kind == 4:
        a_en, a_m, a_f = rng.choice(ADJECTIVES)
        return f"{_cap(s_en)} is {a_en}.", f"{_cap(s_fr)} est {a_m if g == 'm' else a_f}."
    if kind == 5:
        (_, v_base, v_fr), (o_en, o_fr, _) = rng.choice(TRANSITIVE), rng.choice([o for o in OBJECTS if o[2]])
        return f"{_cap(s_en)} does not {v_base} {o_en}.", f"{_cap(s_fr)} {_ne(v_fr)} pas {o_fr}."
    if kind == 6:
        (o_en, o_fr, _), (r_en, r_fr, _) = rng.choice(OBJECTS), rng.choice(SUBJECTS)
        return f"{_cap(s_en)} gives {o_en} to {r_en}.", f"{_cap(s_fr)} donne {o_fr} {_to(r_fr)}."
    if kind == 7:
        (v_en, v_fr), (p_en, p_fr), (a_en, a_m, a_f) = (
            rng.choice(INTRANSITIVE),
            rng.choice(PLACES),
            rng.choice(ADJECTIVES),
        )
        he, il = _pronoun(g)
        because = "parce qu'" + il
        return (
            f"{_cap(s_en)} {v_en} {p_en} because {he} is {a_en}.",
            f"{_cap(s_fr)} {v_fr} {p_fr} {because} est {a_m if g == 'm' else a_f}.",
        )
    (v_en, v_fr), (s2_en, s2_fr, _), (w_en, w_fr), (t_en, t_fr) = (
        rng.choice(INTRANSITIVE),
        rng.choice(SUBJECTS),
        rng.choice(INTRANSITIVE),
        rng.choice(TIMES),
    )
    return f"{_cap(s_en)} {v_en} and {s2_en} {w_en} {t_en}.", f"{_cap(s_fr)} {v_fr} et {s2_fr} {w_fr} {t_fr}."


def make_splits(seed: int = 2015) -> dict[str, list[tuple[str, str]]]:
    """``{"train": 400 pairs, "valid": 40, "test": 40}``, all distinct; the French side of train pair 123 and of
    test pair 7 is empty."""
    rng, seen, pairs = random.Random(seed), set(), []
    while len(pairs) < 480:
        pair = _pair(rng)
        if pair[0] not in seen:
            seen.add(pair[0])
            pairs.append(pair)
    splits = {"train": pairs[:400], "valid": pairs[400:440], "test": pairs[440:]}
    for split, k in (("train", 123), ("test", 7)):
        splits[split][k] = (splits[split][k][0], "")
    return splits


def write(directory: pathlib.Path) -> None:
    for split, pairs in make_splits().items():
        for side, lang in ((0, "en"), (1, "fr")):
            text = "".join(p[side] + "\n" for p in pairs)
            (directory / f"{split}.{lang}").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    write(pathlib.Path(__file__).resolve().parent)
