"""The body of ``POST /translate``, checked: sentences within the limits and options of known names and types."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

__all__ = ["OPTION_TYPES", "Limits", "RequestError", "TranslateRequest", "parse_request"]

# JSON key -> its type. The keys are ``attn-jax translate``'s flags without ``--``, with ``_`` for ``-``.
OPTION_TYPES: dict[str, type] = {
    "beam": int,
    "alpha": float,
    "beta": float,
    "max_length": int,
    "max_length_ratio": float,
    "max_length_offset": int,
    "no_repeat_ngram": int,
    "min_length": int,
    "replace_unk": bool,
}


class RequestError(ValueError):
    """A request the server refuses: its HTTP status, a reason (the metrics key) and a one-line message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(" ".join(message.split()))
        self.status = status
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold.

    Attributes:
      max_sentences: sentences per request.
      max_tokens: whitespace tokens per sentence.
      max_body_bytes: bytes of the request body.
    """

    max_sentences: int = 64
    max_tokens: int = 200
    max_body_bytes: int = 1 << 20


@dataclasses.dataclass(frozen=True)
class TranslateRequest:
    """A checked request: sentences stripped of surrounding whitespace, and the options given (JSON keys)."""

    sentences: tuple[str, ...]
    options: tuple[tuple[str, Any], ...]  # sorted (key, value) pairs: hashable, so batches group by it


def _typed(key: str, value: Any) -> Any:
    """``value`` as ``OPTION_TYPES[key]``, or a RequestError; an int is a float, a bool is never a number."""
    kind = OPTION_TYPES[key]
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    if not ok:
        raise RequestError(422, "bad_option", f"option {key!r} must be {kind.__name__}, got {value!r}")
    return value


def parse_request(body: bytes, limits: Limits) -> TranslateRequest:
    """Check a ``POST /translate`` body: ``{"sentences": [str, ...], "<option>": value, ...}``.

    A sentence is one line: it may not hold ``\\n``. Surrounding whitespace is stripped, as
    ``attn-jax translate`` strips its input lines; a blank sentence gets a blank translation.

    Raises:
      RequestError: 413 for a body, sentence count or sentence over its limit; 400 for a body that is not a
        JSON object with a list of strings under ``sentences``; 422 for an unknown option or a wrong type.
    """
    if len(body) > limits.max_body_bytes:
        raise RequestError(
            413,
            "body_too_large",
            f"the body has {len(body)} bytes, over the limit of {limits.max_body_bytes}",
        )
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(400, "not_json", f"the body is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise RequestError(400, "bad_request", f"the body must be a JSON object, got {type(data).__name__}")
    sentences = data.get("sentences")
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise RequestError(400, "bad_request", 'the body needs "sentences": a list of strings')
    if len(sentences) > limits.max_sentences:
        raise RequestError(
            413,
            "too_many_sentences",
            f"{len(sentences)} sentences, over the limit of {limits.max_sentences} per request",
        )
    for i, s in enumerate(sentences):
        if "\n" in s:
            raise RequestError(400, "bad_request", f"sentence {i} holds a line break: send one line per item")
        tokens = len(s.split())
        if tokens > limits.max_tokens:
            raise RequestError(
                413,
                "sentence_too_long",
                f"sentence {i} has {tokens} tokens, over the limit of {limits.max_tokens}",
            )
    unknown = sorted(k for k in data if k != "sentences" and k not in OPTION_TYPES)
    if unknown:
        raise RequestError(
            422,
            "bad_option",
            f"unknown option {unknown[0]!r}; known: {', '.join(OPTION_TYPES)}",
        )
    options = tuple(sorted((k, _typed(k, v)) for k, v in data.items() if k != "sentences" and v is not None))
    return TranslateRequest(tuple(s.strip() for s in sentences), options)
