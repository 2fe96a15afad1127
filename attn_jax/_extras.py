"""The optional extras of ``pyproject.toml`` and the one-line error that names the extra to install.

A missing optional package otherwise surfaces as a bare ``No module named 'grain'``; here it becomes
``attn_jax.data needs the 'data' extra (grain is not installed): pip install 'attn-jax[data]'``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType

# Top-level module -> the extra whose requirements install it (pyproject.toml [project.optional-dependencies]).
EXTRA_OF = {
    "optax": "train",
    "orbax": "train",
    "ml_collections": "train",
    "grain": "data",
    "tensorflow": "data",
    "tensorflow_datasets": "data",
    "sentencepiece": "data",
    "importlib_resources": "data",
    "sacrebleu": "eval",
    "sacremoses": "eval",
    "matplotlib": "eval",
    "starlette": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
}


class MissingExtra(ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that installs it."""


def missing_extra(error: ImportError) -> str | None:
    """``"the 'data' extra (grain is not installed): pip install 'attn-jax[data]'"`` when ``error`` is a
    missing optional package; None for any other import error (a missing core package, a broken install)."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    package = error.name.split(".")[0]
    extra = EXTRA_OF.get(package)
    if extra is None:
        return None
    return f"the '{extra}' extra ({package} is not installed): pip install 'attn-jax[{extra}]'"


@contextlib.contextmanager
def needed_by(what: str) -> Iterator[None]:
    """Within the block, a missing optional package raises :class:`MissingExtra` saying ``what`` needs it."""
    try:
        yield
    except ModuleNotFoundError as e:
        message = missing_extra(e)
        if message is None or isinstance(e, MissingExtra):
            raise
        raise MissingExtra(f"{what} needs {message}", name=e.name) from None


def require(module: str, what: str) -> ModuleType:
    """``import module``, or :class:`MissingExtra` naming the extra that ``what`` needs."""
    with needed_by(what):
        return importlib.import_module(module)
