"""How a run's sentences are decoded: one set of options that ``translate`` and ``evaluate`` share."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from attn_jax.pipeline._load import TranslateError

__all__ = ["DecodeOptions"]


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """The options of :func:`translate_sentences` and :func:`evaluate_workdir`'s beam search.

    :meth:`check` refuses a value out of range with a :class:`TranslateError` that names the field, so a
    command line can reword it with its flag names.

    Attributes:
      beam_size: hypotheses kept per sentence (1: greedy).
      alpha: GNMT's length-normalisation weight α (0: raw log-probability).
      beta: GNMT's coverage-penalty weight β (0: off; needs attention).
      nbest: hypotheses returned per sentence, at most ``beam_size`` (:func:`evaluate_workdir` scores the best).
      max_length: every sentence may have this many tokens; not with a ratio or an offset.
      max_length_ratio, max_length_offset: the limit that grows with the source (:func:`length_limit`; None:
        the defaults of ``attn_jax.decoding.LengthLimit``).
      no_repeat_ngram: block any word that would repeat an n-gram of this size in a hypothesis (0: off).
      min_length: forbid ``</s>`` before this many target tokens; the length limit still wins (0: off).
      replace_unk: replace a produced ``<unk>`` with the most-attended source word (word-level vocabularies
        and models with attention only).

    >>> DecodeOptions(beam_size=4, nbest=2).check().nbest
    2
    >>> DecodeOptions(beam_size=2, nbest=3).check()
    Traceback (most recent call last):
    ...
    attn_jax.pipeline._load.TranslateError: nbest must be between 1 and beam_size 2, got 3
    """

    beam_size: int = 12
    alpha: float = 0.6
    beta: float = 0.0
    nbest: int = 1
    max_length: int | None = None
    max_length_ratio: float | None = None
    max_length_offset: int | None = None
    no_repeat_ngram: int = 0
    min_length: int = 0
    replace_unk: bool = False

    def check(self) -> DecodeOptions:
        """``self``, or a one-line :class:`TranslateError` naming the first field out of range."""
        from attn_jax.pipeline._length import _check_length_options

        if not _is_int(self.beam_size) or self.beam_size < 1:
            raise TranslateError(f"beam_size must be >= 1, got {self.beam_size}")
        if not _is_int(self.nbest) or not 1 <= self.nbest <= self.beam_size:
            raise TranslateError(f"nbest must be between 1 and beam_size {self.beam_size}, got {self.nbest}")
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise TranslateError(f"{name} must be a finite number >= 0, got {value}")
        _check_length_options(self.max_length, self.max_length_ratio, self.max_length_offset)
        for name in ("no_repeat_ngram", "min_length"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise TranslateError(f"{name} must be an int >= 0, got {value}")
        return self

    def length_limit(self, config):
        """The run's length limit with these options (:func:`length_limit`)."""
        from attn_jax.pipeline._length import length_limit

        return length_limit(
            config,
            max_length=self.max_length,
            max_length_ratio=self.max_length_ratio,
            max_length_offset=self.max_length_offset,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (``evaluation.json``'s ``options`` holds them)."""
        return dataclasses.asdict(self)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
