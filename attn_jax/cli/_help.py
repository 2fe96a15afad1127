"""Turns module docstrings (reStructuredText) into the plain text ``--help`` prints."""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :func:`figure3_examples` -> figure3_examples
_LITERAL = re.compile(r"``(.+?)``")  # ``attn-jax data`` -> attn-jax data


def plain(text: str) -> str:
    """``text`` without reStructuredText markup: roles and double-backtick literals become their bare text."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


def summary(doc: str | None) -> str:
    """The first paragraph of a module docstring as plain text, for an ``argparse`` description."""
    return plain((doc or "").split("\n\n")[0]).strip()
