"""How ``evaluate`` scores BLEU: sacreBLEU's tokeniser, an optional detokeniser, and one warning for tokenised
text that nobody chose a setting for."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

__all__ = ["bleu_options"]


def bleu_options(
    references: Sequence[str],
    *,
    bleu_tokenize: str | None = None,
    detokenize: str = "none",
    detokenize_lang: str = "en",
    built_in: bool = False,
) -> dict[str, Any]:
    """How :func:`evaluate_workdir` scores BLEU, and the warning to give when nobody chose it for tokenised text.

    ``attn_jax.eval.bleu_options`` with the advice naming ``evaluate``'s flags: returns ``{"tokenize",
    "detokenize", "detokenize_lang", "looks_tokenized", "warning"}``. The warning is given when the references
    look tokenised and neither ``--detokenize`` nor ``--bleu-tokenize`` was chosen, except on the built-in corpus.

    >>> bleu_options(["l' ordinateur , dit-il ."])["warning"].startswith("BLEU is scored with tok:13a on text")
    True
    >>> bleu_options(["l' ordinateur , dit-il ."], built_in=True)["warning"] is None  # the built-in corpus
    True
    >>> bleu_options(["l' ordinateur , dit-il ."], detokenize="moses", detokenize_lang="fr")["warning"] is None
    True
    """
    from attn_jax.eval import bleu_options as options

    return options(
        references,
        bleu_tokenize=bleu_tokenize,
        detokenize=detokenize,
        detokenize_lang=detokenize_lang,
        built_in=built_in,
    )


@contextlib.contextmanager
def _without_sacrebleu_tokenized_warning():
    """sacreBLEU's tokenised-text warning silenced while scoring (``attn_jax.eval``'s filter)."""
    from attn_jax.eval import sacrebleu_tokenized_warning_dropped

    with sacrebleu_tokenized_warning_dropped():
        yield
