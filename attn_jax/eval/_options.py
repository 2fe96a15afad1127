"""How a BLEU score was asked for, and one warning for tokenised text that nobody chose a setting for.

``attn-jax evaluate`` and the trainer's validation by translation share this rule, so that their scores are
made and flagged the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from attn_jax.eval._detok import DETOKENIZERS, looks_tokenized

__all__ = ["BleuSettings", "bleu_options", "sacrebleu_tokenized_warning_dropped"]

_ADVICE = (
    "Pass --detokenize moses --detokenize-lang LANG to score detokenised text, or --bleu-tokenize none to score the "
    "tokens as given"
)


@dataclasses.dataclass(frozen=True)
class BleuSettings:
    """How hypotheses and references are scored: sacreBLEU's tokeniser and an optional detokeniser.

    :meth:`check` refuses a value out of range with a ValueError that names the field, so a command line can
    reword it with its flag names.

    Attributes:
      tokenize: sacreBLEU's BLEU tokeniser (``13a``, ``none``, ``intl``, ...); None: ``13a``, not chosen, so
        tokenised references get :func:`bleu_options`' warning.
      detokenize: ``"moses"`` detokenises hypotheses and references before BLEU, chrF and TER; ``"none"``
        scores them as given.
      detokenize_lang: the Moses language code of the target side (``en``, ``fr``, ``de``, ...).

    >>> BleuSettings(detokenize="moses", detokenize_lang="fr").check().detokenize_lang
    'fr'
    >>> BleuSettings(detokenize_lang="French").check()
    Traceback (most recent call last):
    ...
    ValueError: detokenize_lang must be a Moses language code such as en, fr or de, got 'French'
    """

    tokenize: str | None = None
    detokenize: str = "none"
    detokenize_lang: str = "en"

    def check(self) -> BleuSettings:
        """``self``, or a one-line ValueError naming the first field out of range."""
        if self.detokenize not in DETOKENIZERS:
            raise ValueError(f"detokenize must be one of {', '.join(DETOKENIZERS)}, got {self.detokenize!r}")
        lang = self.detokenize_lang
        if not (
            isinstance(lang, str)
            and lang.isascii()
            and lang.isalpha()
            and lang.islower()
            and 2 <= len(lang) <= 3
        ):
            raise ValueError(
                f"detokenize_lang must be a Moses language code such as en, fr or de, got {lang!r}"
            )
        if self.tokenize is not None:
            from sacrebleu.metrics import BLEU

            if self.tokenize not in BLEU.TOKENIZERS:
                names = ", ".join(BLEU.TOKENIZERS)
                raise ValueError(f"tokenize must be a sacreBLEU tokeniser ({names}), got {self.tokenize!r}")
        return self


def bleu_options(
    references: Sequence[str],
    *,
    bleu_tokenize: str | None = None,
    detokenize: str = "none",
    detokenize_lang: str = "en",
    built_in: bool = False,
    advice: str = _ADVICE,
) -> dict[str, Any]:
    """The BLEU settings used, and the warning to give when nobody chose them for tokenised text.

    Returns ``{"tokenize", "detokenize", "detokenize_lang" (None without detokenising), "looks_tokenized"
    (:func:`looks_tokenized` of the references), "warning" (one sentence, or None)}``. The warning is given when
    the references look tokenised and neither a detokeniser nor a tokeniser was chosen (``bleu_tokenize`` None,
    ``detokenize="none"``), except on the built-in corpus, whose BLEU is defined on its tokens (it has no raw
    form): sacreBLEU's ``13a`` on tokenised text is not the standard, comparable score. ``advice`` ends the
    warning; it names the settings to use (command-line flags by default).

    >>> bleu_options(["l' ordinateur , dit-il ."])["warning"].startswith("BLEU is scored with tok:13a on text")
    True
    >>> bleu_options(["l' ordinateur , dit-il ."], built_in=True)["warning"] is None  # the built-in corpus
    True
    """
    tokenized = looks_tokenized(references)
    warning = None
    if tokenized and bleu_tokenize is None and detokenize == "none" and not built_in:
        warning = (
            "BLEU is scored with tok:13a on text that looks tokenised (the references have punctuation set off by "
            f"spaces): not the standard sacreBLEU score of raw text. {advice}"
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
def sacrebleu_tokenized_warning_dropped() -> Iterator[None]:
    """sacreBLEU's tokenised-text warning silenced while scoring: :func:`bleu_options` gives one line instead."""
    logger = logging.getLogger("sacrebleu")
    drop = _DropTokenizedWarning()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
