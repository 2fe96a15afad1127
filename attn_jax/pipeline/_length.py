"""The decoding length limit ``translate`` and ``evaluate`` share, and the count of translations it cut."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from attn_jax.pipeline._load import LoadedModel, TranslateError

__all__ = [
    "LengthLimitReport",
    "length_limit",
    "length_limit_report",
    "merge_length_limit_reports",
    "model_length_cap",
]


def length_limit(
    config,
    *,
    max_length: int | None = None,
    max_length_ratio: float | None = None,
    max_length_offset: int | None = None,
):
    """The decoding length limit of a run, the one rule ``attn-jax translate`` and ``evaluate`` share.

    The rule is :class:`attn_jax.decoding.LengthLimit`'s. Its ``minimum`` is the longest target the run trained
    on (``config.data.max_target_length``; 0 when it sets none or ``config`` is None). ``ratio`` and ``offset``
    keep their defaults unless given. ``max_length`` gives every sentence that many tokens instead, and cannot
    be combined with a ratio or an offset.

    Returns:
      An ``attn_jax.decoding.LengthLimit``.

    Raises:
      TranslateError: a value out of range, or ``max_length`` together with a ratio or an offset.
    """
    from attn_jax.decoding import DEFAULT_MAX_LENGTH_OFFSET, DEFAULT_MAX_LENGTH_RATIO, LengthLimit

    _check_length_options(max_length, max_length_ratio, max_length_offset)
    if max_length is not None:
        return LengthLimit.fixed(max_length)
    data = getattr(config, "data", None) if config is not None else None
    trained = data.get("max_target_length") if data is not None else None
    return LengthLimit(
        int(trained or 0),
        DEFAULT_MAX_LENGTH_RATIO if max_length_ratio is None else float(max_length_ratio),
        DEFAULT_MAX_LENGTH_OFFSET if max_length_offset is None else int(max_length_offset),
    ).check()


def _check_length_options(
    max_length: int | None, max_length_ratio: float | None, max_length_offset: int | None
) -> None:
    """A one-line :class:`TranslateError` naming the length option out of range, if one is."""
    if max_length is not None and (max_length_ratio is not None or max_length_offset is not None):
        raise TranslateError(
            "give max_length (the same limit for every sentence) or max_length_ratio/max_length_offset "
            "(a limit that grows with the source), not both"
        )
    if max_length is not None and max_length < 1:
        raise TranslateError(f"max_length must be >= 1, got {max_length}")
    if max_length_ratio is not None and not (math.isfinite(max_length_ratio) and max_length_ratio >= 0):
        raise TranslateError(f"max_length_ratio must be a finite number >= 0, got {max_length_ratio}")
    if max_length_offset is not None and max_length_offset < 0:
        raise TranslateError(f"max_length_offset must be >= 0, got {max_length_offset}")
    if max_length_ratio == 0 and max_length_offset == 0:
        raise TranslateError("max_length_ratio 0 with max_length_offset 0 leaves no room; use max_length N")


def model_length_cap(model) -> int | None:
    """The most target tokens (with ``</s>``) a model can produce, or None (``attn_jax.decoding.model_length_cap``:
    a Transformer's decoder cache holds ``model.config.max_length`` positions)."""
    from attn_jax.decoding import model_length_cap as cap

    return cap(model)


class LengthLimitReport(NamedTuple):
    """How many translations the length limit cut, for stderr, ``summary.json`` and the reports.

    Attributes:
      rule: the ``attn_jax.decoding.LengthLimit`` asked for.
      translations: sentences decoded (blank lines are not).
      stopped: of those, how many best translations stopped at their limit instead of ending with ``</s>``.
      shortest, longest: the smallest and largest limit the sentences had (tokens without ``</s>``).
      model_cap: the most tokens (without ``</s>``) the model can produce, when it cut the rule's limit for
        some sentence (a Transformer's ``model.max_length``); None otherwise.
    """

    rule: Any
    translations: int
    stopped: int
    shortest: int | None
    longest: int | None
    model_cap: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``stopped_at_limit`` of ``translations``, the rule (``minimum``, ``ratio``, ``offset``
        and in words), the smallest and largest limit applied (tokens without ``</s>``) and ``model_cap``."""
        return {
            "stopped_at_limit": self.stopped,
            "translations": self.translations,
            "fraction_stopped": self.stopped / self.translations if self.translations else 0.0,
            "rule": self.rule.describe(),
            "minimum": self.rule.minimum,
            "ratio": self.rule.ratio,
            "offset": self.rule.offset,
            "shortest_limit": self.shortest,
            "longest_limit": self.longest,
            "model_cap": self.model_cap,
        }

    def describe_limit(self) -> str:
        """The limit as applied: ``'26 tokens'``, or the rule with the range it gave (``'...; 16-40 here'``)."""
        text = self.rule.describe()
        if self.shortest is not None and not self.rule.is_fixed:
            here = f"{self.shortest}" if self.shortest == self.longest else f"{self.shortest}-{self.longest}"
            text += f", {here} here"
        if self.model_cap is not None:
            text += f", at most {self.model_cap} for this model (its decoder holds {self.model_cap + 1} positions)"
        return text

    def message(self) -> str | None:
        """The warning line for stderr (without the command's prefix), or None when nothing was cut."""
        if not self.stopped:
            return None
        advice = "raise --max-length or --max-length-ratio"
        if self.model_cap is not None:
            advice += f" (the model stops at {self.model_cap} tokens whatever the flags)"
        return (
            f"{self.stopped} of {self.translations} translations stopped at the length limit "
            f"({self.describe_limit()}) instead of ending with </s>: {advice}"
        )


def length_limit_report(loaded: LoadedModel, sentences: Sequence[str], results, rule) -> LengthLimitReport:
    """Count the best translations of :func:`translate_sentences` that stopped at their length limit."""
    decoded = [hyps[0] for hyps in results if hyps and hyps[0].limit is not None]
    limits = [h.limit for h in decoded]
    cap = model_length_cap(loaded.model)
    capped = None
    if cap is not None:
        wanted = max(
            (rule.tokens(len(loaded.src_vocab.encode(s))) for s in sentences if s.split()), default=0
        )
        capped = cap - 1 if wanted > cap - 1 else None
    return LengthLimitReport(
        rule,
        len(decoded),
        sum(h.truncated for h in decoded),
        min(limits, default=None),
        max(limits, default=None),
        capped,
    )


def merge_length_limit_reports(a: LengthLimitReport | None, b: LengthLimitReport) -> LengthLimitReport:
    """The report of two groups of sentences from the reports of each (``a`` None: ``b``): streamed input is
    translated a batch at a time and its length-limit summary given once, at the end."""
    if a is None:
        return b

    def pick(f, x, y):
        return x if y is None else y if x is None else f(x, y)

    return LengthLimitReport(
        a.rule,
        a.translations + b.translations,
        a.stopped + b.stopped,
        pick(min, a.shortest, b.shortest),
        pick(max, a.longest, b.longest),
        pick(max, a.model_cap, b.model_cap),
    )
