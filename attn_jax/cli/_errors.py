"""The one error line every subcommand prints: ``attn-jax COMMAND: error: MESSAGE``, whitespace folded."""

from __future__ import annotations

import sys


def error_line(command: str, message: object, status: int = 1) -> int:
    """Print ``message`` as one line on stderr, prefixed with the subcommand; return ``status`` to exit with."""
    print(f"attn-jax {command}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return status
