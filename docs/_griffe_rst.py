"""A griffe extension: the docstrings' reStructuredText bits as Markdown for mkdocstrings.

The docstrings are Google style with a few reST habits that also serve ``help()`` and doctest:
``:func:`name``` roles, ``.. math::`` blocks and bare ``>>>`` examples. Markdown would read an example's
output ``[0.1, 0.9]`` as a link, so examples become ``pycon`` blocks and math a code block. A role naming a
public object by its full name (``:func:`attn_jax.masked_softmax```) becomes a link that the build checks, so a
renamed function fails ``mkdocs build --strict``; a short name becomes inline code.
An ``Args:`` entry may name several parameters (``beam_size, alpha, beta: ...``); each gets its own entry, so
that griffe still checks every name against the signature.
"""

import re

import griffe

_ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc):`~?([^`]+)`")
_NAMES = re.compile(r"^(\s+)(\*{0,2}\w+(?:, *\*{0,2}\w+)+)(:.*|,)$")


def _role(match: re.Match) -> str:
    """A role naming a public ``attn_jax.`` object becomes a checked link; any other, inline code."""
    target = match.group(1)
    public = target.startswith("attn_jax.") and not any(p.startswith("_") for p in target.split("."))
    return f"[`{target}`][{target}]" if public else f"`{target}`"


def _split_shared_args(lines: list[str]) -> list[str]:
    """``a, b: text`` in an ``Args:`` section -> ``a: text`` plus ``b: As `a`.``"""
    out: list[str] = []
    in_args = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
        elif line.strip() and not line.startswith(" "):
            in_args = False
        match = _NAMES.match(line) if in_args else None
        if match and match.group(3) == "," and i + 1 < len(lines):
            lines[i + 1] = line.rstrip() + " " + lines[i + 1].strip()
            i += 1
            continue
        if not match:
            out.append(line)
            i += 1
            continue
        indent, names = match.group(1), [n.strip() for n in match.group(2).split(",")]
        out.append(f"{indent}{names[0]}{match.group(3)}")
        i += 1
        while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > len(indent):
            out.append(lines[i])
            i += 1
        out.extend(f"{indent}{name}: As `{names[0]}`." for name in names[1:])
    return out


def _markdown(text: str) -> str:
    out: list[str] = []
    lines = _split_shared_args(text.splitlines())
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith(">>>"):
            out.append(indent + "```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(indent + "```")
            continue
        if stripped.startswith(".. math::"):
            out.append(indent + "```text")
            first = stripped[len(".. math::") :].strip()
            if first:
                out.append(indent + first)
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(indent + " ")):
                if lines[i].strip():
                    out.append(indent + lines[i].strip())
                elif i + 1 < len(lines) and not lines[i + 1].startswith(indent + " "):
                    break
                i += 1
            out.append(indent + "```")
            continue
        out.append(_ROLE.sub(_role, line))
        i += 1
    return "\n".join(out)


class ReSTToMarkdown(griffe.Extension):
    """Rewrite every docstring once, as griffe loads it."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _markdown(obj.docstring.value)
