"""Each config key's meaning, read from the source that defines the key.

A key of :func:`~attn_jax.train.default_config` is explained by the comment lines directly above its assignment
(``c.seed = 0``) or its dict entry (``batch_size=80,``). A ``model.*`` key is a field of the architecture's
config class and an ``optimizer.*`` key a field of :class:`~attn_jax.train.OptimizerConfig`: each is explained
by its entry in the class docstring's ``Attributes:`` section, or else by the comment lines above the field.
Reading the source, not a second table, keeps one home for each meaning: a key added with its comment is
documented everywhere, and a key added without one fails the test that every key has help.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize

import ml_collections

from attn_jax.train._config import default_config, flatten_config, model_class
from attn_jax.train._optim import OptimizerConfig

__all__ = ["config_help"]

# An ``Attributes:`` entry: ``name: text`` or ``name_a, name_b: text`` (the text may start on the next line).
_ENTRY = re.compile(r"^(\s*)(\w+(?:\s*,\s*\w+)*):(?:\s+(.*))?$")


def config_help(config: ml_collections.ConfigDict) -> dict[str, str]:
    """``{"model.hidden": "n, GRU state width ...", ...}``: each key of ``config`` and its meaning, on one line.

    The text keeps the source's reST markup (double backticks, roles). A key whose source has no comment and
    no ``Attributes:`` entry (a field of a user's model class that documents none) gets ``""``.

    >>> config_help(default_config())["data.batch_size"]
    'Training pairs per batch.'
    """
    schema = _default_config_help()
    model = _field_help(model_class(config.model.arch))
    optimizer = _field_help(OptimizerConfig)
    out = {}
    for key in flatten_config(config):
        group, _, name = key.partition(".")
        if key == "model.arch":  # not a field of every class, and it picks the class: the group's comment
            text = schema.get("model", "")
        elif group == "model":
            text = model.get(name, "")
        elif group == "optimizer":
            text = optimizer.get(name, "")
        else:
            text = schema.get(key, "")
        out[key] = text
    return out


def _comment_lines(source: str) -> dict[int, str]:
    """Line number -> text of every line of ``source`` that holds only a comment."""
    out = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not token.line[: token.start[1]].strip():
            out[token.start[0]] = token.string.lstrip("#").strip()
    return out


def _comment_above(comments: dict[int, str], lineno: int) -> str:
    """The comment lines directly above line ``lineno``, joined into one line."""
    lines = []
    while lineno - 1 in comments:
        lineno -= 1
        lines.append(comments[lineno])
    return " ".join(reversed(lines))


@functools.cache
def _default_config_help() -> dict[str, str]:
    """Dotted key -> the comment above its assignment or dict entry in :func:`default_config`'s source."""
    source = textwrap.dedent(inspect.getsource(default_config))
    comments = _comment_lines(source)
    out: dict[str, str] = {}

    def entries(
        node: ast.AST, prefix: str
    ) -> None:  # the keys of dict(k=v, ...) / {"k": v} / ConfigDict(...)
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg is not None:
                    out[prefix + kw.arg] = _comment_above(comments, kw.lineno)
                    entries(kw.value, f"{prefix}{kw.arg}.")
            for arg in node.args:
                entries(arg, prefix)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    out[prefix + key.value] = _comment_above(comments, key.lineno)
                    entries(value, f"{prefix}{key.value}.")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            key = _dotted(node.targets[0])
            if key is not None:
                out[key] = _comment_above(comments, node.lineno)
                entries(node.value, f"{key}.")
    return out


def _dotted(target: ast.AST) -> str | None:
    """``c.data.pack`` -> ``"data.pack"``; ``None`` for a target that is not an attribute of ``c``."""
    names = []
    while isinstance(target, ast.Attribute):
        names.append(target.attr)
        target = target.value
    if not (names and isinstance(target, ast.Name) and target.id == "c"):
        return None
    return ".".join(reversed(names))


@functools.cache
def _field_help(cls: type) -> dict[str, str]:
    """Field name -> its ``Attributes:`` entry in ``cls``'s docstring, else the comment above the field."""
    out = _attributes(inspect.cleandoc(cls.__doc__ or ""))
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # a class defined where its source cannot be read: its docstring only
        return out
    comments = _comment_lines(source)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if name in fields and not out.get(name):
                out[name] = _comment_above(comments, node.lineno)
    return out


def _attributes(doc: str) -> dict[str, str]:
    """The entries of a Google-style ``Attributes:`` section, each joined into one line."""
    out: dict[str, str] = {}
    lines = doc.splitlines()
    if "Attributes:" not in (line.strip() for line in lines):
        return out
    start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:") + 1
    section = len(lines[start - 1]) - len(lines[start - 1].lstrip())
    entry_indent, names, text = None, [], []
    for line in [*lines[start:], ""]:
        indent = len(line) - len(line.lstrip())
        match = _ENTRY.match(line)
        if line.strip() and indent <= section:
            break  # the next section
        if match and (entry_indent is None or indent == entry_indent):
            out.update(dict.fromkeys(names, " ".join(text)))
            entry_indent = indent
            names = [n.strip() for n in match.group(2).split(",")]
            text = [match.group(3)] if match.group(3) else []
        elif line.strip() and names:
            text.append(line.strip())
    out.update(dict.fromkeys(names, " ".join(text)))
    return out
