"""Detokenisation before BLEU (Moses, via sacremoses) and a check for text that looks Moses-tokenised."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from attn_jax._extras import needed_by

#: Detokenisers ``corpus_bleu`` and friends accept: ``"none"`` scores the text as given, ``"moses"`` joins
#: Moses-tokenised text back into running text with sacremoses' ``MosesDetokenizer`` first.
DETOKENIZERS = ("none", "moses")

# A Moses language code (ISO 639-1, as sacremoses' per-language rules use): it becomes part of the signature.
_LANG = re.compile(r"[a-z]{2,3}")
# A comma or full stop standing alone as a token, or a Moses escape: raw text almost never has either.
_TOKENISED = re.compile(r"(?:^|\s)[.,](?:\s|$)|&(?:apos|quot|amp|lt|gt|#124|#91|#93);")
_PUNCT = re.compile(r"[.,]|&(?:apos|quot|amp|lt|gt|#124|#91|#93);")


def check_detokenize(detokenize: str, lang: str) -> None:
    """ValueError unless ``detokenize`` is one of :data:`DETOKENIZERS` and ``lang`` a 2-3 letter code."""
    if detokenize not in DETOKENIZERS:
        raise ValueError(f"detokenize must be one of {DETOKENIZERS}, got {detokenize!r}")
    if detokenize != "none" and not (isinstance(lang, str) and _LANG.fullmatch(lang)):
        raise ValueError(
            f"detokenize_lang must be a 2-3 letter lowercase language code (en, fr, de), got {lang!r}"
        )


def detokenize(sentences: Sequence[str], method: str = "moses", lang: str = "en") -> list[str]:
    """Moses-tokenised sentences joined back into running text, as the raw corpus had them.

    ``MosesDetokenizer(lang).detokenize(s.split())`` of sacremoses (the Python port of Moses'
    ``detokenizer.perl``): attaches punctuation and clitics by the language's rules (``"it 's"`` -> ``"it's"``,
    ``"l' ordinateur"`` -> ``"l'ordinateur"``) and unescapes ``&apos;`` and friends. sacremoses is imported here
    only (the ``eval`` extra).

    Args:
      sentences: N sentences, tokens separated by whitespace.
      method: ``"moses"``, or ``"none"`` to return the sentences unchanged.
      lang: the Moses language code of the sentences (``en``, ``fr``, ``de``, ...).

    Returns:
      N detokenised sentences.

    >>> detokenize(["l&apos; ordinateur , dit-il , est en panne ."], lang="fr")
    ["l'ordinateur, dit-il, est en panne."]
    """
    check_detokenize(method, lang)
    if method == "none":
        return list(sentences)
    detok = _moses(lang)
    return [detok.detokenize(s.split()) for s in sentences]


@functools.cache
def _moses(lang: str):
    """One sacremoses detokeniser per language (building it compiles its rules)."""
    with needed_by("Moses detokenisation"):
        from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


def looks_tokenized(sentences: Sequence[str]) -> bool:
    """Whether text looks Moses-tokenised: most sentences with a comma, full stop or Moses escape have one standing
    alone as a token (``"dit-il , est"``, ``"panne ."``) or escaped (``&apos;``). Raw text almost never does
    (``"3.5"``, ``"..."`` and ``"dit-il, est"`` do not count); a corpus without such punctuation is not flagged.

    >>> looks_tokenized(["l' ordinateur , dit-il .", "oui ."]), looks_tokenized(["L'ordinateur, dit-il.", "3.5 km"])
    (True, False)
    """
    marked = with_punct = 0
    for s in sentences:
        if _PUNCT.search(s):
            with_punct += 1
            marked += bool(_TOKENISED.search(s))
    return marked > 0 and 2 * marked >= with_punct
