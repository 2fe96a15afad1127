"""How ``evaluate`` scores BLEU: sacreBLEU's tokeniser, an optional detokeniser, and one warning for tokenised
text that nobody chose a setting for."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

__all__ = ["bleu_flags_problem", "bleu_options"]


def bleu_flags_problem(bleu_tokenize: str | None, detokenize: str, detokenize_lang: str) -> str | None:
    """Why ``--bleu-tokenize``/``--detokenize``/``--detokenize-lang`` cannot be used, or None when they can."""
    from attn_jax.eval import DETOKENIZERS

    if detokenize not in DETOKENIZERS:
        return f"--detokenize must be one of {', '.join(DETOKENIZERS)}, got {detokenize!r}"
    lang = detokenize_lang
    if not (
        isinstance(lang, str) and lang.isascii() and lang.isalpha() and lang.islower() and 2 <= len(lang) <= 3
    ):
        return f"--detokenize-lang must be a Moses language code such as en, fr or de, got {lang!r}"
    if bleu_tokenize is not None:
        from sacrebleu.metrics import BLEU

        if bleu_tokenize not in BLEU.TOKENIZERS:
            names = ", ".join(BLEU.TOKENIZERS)
            return f"--bleu-tokenize must be a sacreBLEU tokeniser ({names}), got {bleu_tokenize!r}"
    return None


def bleu_options(
    references: Sequence[str],
    *,
    bleu_tokenize: str | None = None,
    detokenize: str = "none",
    detokenize_lang: str = "en",
    built_in: bool = False,
) -> dict[str, Any]:
    """How :func:`evaluate_workdir` scores BLEU, and the warning to give when nobody chose it for tokenised text.

    Returns ``{"tokenize", "detokenize", "detokenize_lang" (None without detokenising), "looks_tokenized"
    (``attn_jax.eval.looks_tokenized`` of the references), "warning" (one sentence, or None)}``. The warning is
    given when the references look tokenised and neither ``--detokenize`` nor ``--bleu-tokenize`` was chosen
    (``bleu_tokenize`` None, ``detokenize="none"``), except on the built-in corpus, whose BLEU is defined on its
    tokens (it has no raw form): sacreBLEU's ``13a`` on tokenised text is not the standard, comparable score.

    >>> bleu_options(["l' ordinateur , dit-il ."])["warning"].startswith("BLEU is scored with tok:13a on text")
    True
    >>> bleu_options(["l' ordinateur , dit-il ."], built_in=True)["warning"] is None  # the built-in corpus
    True
    >>> bleu_options(["l' ordinateur , dit-il ."], detokenize="moses", detokenize_lang="fr")["warning"] is None
    True
    """
    from attn_jax.eval import looks_tokenized

    tokenized = looks_tokenized(references)
    warning = None
    if tokenized and bleu_tokenize is None and detokenize == "none" and not built_in:
        warning = (
            "BLEU is scored with tok:13a on text that looks tokenised (the references have punctuation set off by "
            "spaces): not the standard sacreBLEU score of raw text. Pass --detokenize moses --detokenize-lang "
            "LANG to score detokenised text, or --bleu-tokenize none to score the tokens as given"
        )
    return {
        "tokenize": bleu_tokenize or "13a",
        "detokenize": detokenize,
        "detokenize_lang": detokenize_lang if detokenize != "none" else None,
        "looks_tokenized": tokenized,
        "warning": warning,
    }


class _DropTokenizedWarning(logging.Filter):
    """Drops sacreBLEU's three-line "forgot to detokenize" warning (it comes once per scored subset)."""

    _STARTS = (
        "That's 100 lines that end in a tokenized period",
        "It looks like you forgot to detokenize",
        "If you insist",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self._STARTS)


@contextlib.contextmanager
def _without_sacrebleu_tokenized_warning():
    """sacreBLEU's tokenised-text warning silenced while scoring: :func:`bleu_options` gives one line instead."""
    logger = logging.getLogger("sacrebleu")
    drop = _DropTokenizedWarning()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
