"""How long a translation may grow: one rule for every command that decodes (``translate``, ``evaluate``)."""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["DEFAULT_MAX_LENGTH_OFFSET", "DEFAULT_MAX_LENGTH_RATIO", "LengthLimit"]

DEFAULT_MAX_LENGTH_RATIO = 2.0
DEFAULT_MAX_LENGTH_OFFSET = 10


class LengthLimit(NamedTuple):
    """The most target tokens a translation may have, ``</s>`` not counted, for a source of ``n`` tokens::

        limit(n) = max(minimum, ⌊ratio · n⌋ + offset)          n: source tokens without </s>

    A run's default (``attn_jax.pipeline.length_limit``) is ``minimum`` = the longest target it trained on
    (``data.max_target_length``), ``ratio`` 2 and ``offset`` 10: no sentence gets less room than the training
    targets had, and a long source gets twice its length. ``LengthLimit.fixed(N)`` allows ``N`` tokens to
    every sentence. Beam search forces ``</s>`` after ``limit(n)`` tokens and reports each hypothesis it cut
    there (``BeamResult.truncated``).

    Attributes:
      minimum: tokens every sentence may have, however short its source (``>= 0``).
      ratio: tokens allowed per source token (``>= 0``; 0 for a fixed limit).
      offset: tokens added to ``⌊ratio · n⌋`` (``>= 0``).

    >>> rule = LengthLimit(14, 2.0, 10)
    >>> rule.tokens(3), rule.tokens(8), rule.describe()
    (16, 26, 'max(14, ⌊2·n⌋ + 10) tokens for a source of n tokens')
    >>> LengthLimit.fixed(40).tokens(100), LengthLimit.fixed(40).describe()
    (40, '40 tokens')
    """

    minimum: int
    ratio: float = DEFAULT_MAX_LENGTH_RATIO
    offset: int = DEFAULT_MAX_LENGTH_OFFSET

    @classmethod
    def fixed(cls, tokens: int) -> LengthLimit:
        """``tokens`` for every sentence, whatever its source length."""
        return cls(tokens, 0.0, 0)

    def check(self) -> LengthLimit:
        """``self``, or a one-line ValueError naming the field out of range."""
        for name in ("minimum", "offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"length limit {name} must be an int >= 0, got {value!r}")
        if isinstance(self.ratio, bool) or not (
            isinstance(self.ratio, int | float) and math.isfinite(self.ratio) and self.ratio >= 0
        ):
            raise ValueError(f"length limit ratio must be a finite number >= 0, got {self.ratio!r}")
        if self.minimum == 0 and self.ratio == 0 and self.offset == 0:
            raise ValueError("length limit allows no token at all (minimum, ratio and offset are 0)")
        return self

    @property
    def is_fixed(self) -> bool:
        """True when every sentence gets the same limit."""
        return self.ratio == 0

    def tokens(self, source_tokens: int) -> int:
        """``limit(n)``: the most target tokens (without ``</s>``) for a source of ``source_tokens`` tokens."""
        # 1e-4: 0.1 · 30 must give 3, not 2 (float rounding below the integer).
        return max(self.minimum, math.floor(self.ratio * source_tokens + 1e-4) + self.offset)

    def describe(self) -> str:
        """The rule in words: ``'40 tokens'`` or ``'max(14, ⌊2·n⌋ + 10) tokens for a source of n tokens'``."""
        if self.is_fixed:
            return f"{max(self.minimum, self.offset)} tokens"
        ratio = f"{self.ratio:g}"
        rule = f"⌊{ratio}·n⌋" + (f" + {self.offset}" if self.offset else "")
        if self.minimum:
            rule = f"max({self.minimum}, {rule})"
        return f"{rule} tokens for a source of n tokens"
