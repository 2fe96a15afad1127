"""Small command-line and library papercuts (issue 17 item 5): ``attn-jax --version``, ``--help`` in plain text,
``attn-jax train --print-config``, lazy submodule attributes, a missing extra named, one AER format, and
``--nbest`` on a blank line."""

import importlib.metadata
import re

import pytest

from attn_jax._help import plain, summary
from attn_jax.cli import build_parser, main

_SUBCOMMANDS = ("data", "train", "translate", "evaluate")


# --- attn-jax --version ---------------------------------------------------------------------------------------


def test_version_prints_one_line_with_jax_and_flax_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    versions = {n: importlib.metadata.version(n) for n in ("attn-jax", "jax", "flax")}
    expected = f"attn-jax {versions['attn-jax']} (jax {versions['jax']}, flax {versions['flax']})"
    assert out == expected + "\n"


# --- --help is plain text --------------------------------------------------------------------------------------


def _subparsers():
    parser = build_parser()
    (action,) = [a for a in parser._actions if a.dest == "command"]
    return parser, action.choices


@pytest.mark.parametrize("command", _SUBCOMMANDS)
def test_help_has_no_restructuredtext_markup(command):
    _, choices = _subparsers()
    text = choices[command].format_help()
    assert "``" not in text and ":func:" not in text and ":class:" not in text, text
    assert f"attn-jax {command}:" in " ".join(text.split())  # the docstring's first line, made plain


def test_top_level_help_lists_every_subcommand():
    parser, choices = _subparsers()
    assert set(_SUBCOMMANDS) <= set(choices)
    assert "``" not in parser.format_help()


def test_plain_strips_literals_and_roles_only():
    assert plain("``attn-jax data``: see :func:`figure3_examples` and ``<unk>``") == (
        "attn-jax data: see figure3_examples and <unk>"
    )
    assert (
        plain("a `single` backtick, *stars* and 2 ** 3 stay")
        == "a `single` backtick, *stars* and 2 ** 3 stay"
    )
    assert summary("``x``: first.\n\nsecond") == "x: first."
    assert summary(None) == ""


def test_cli_docstring_names_every_subcommand():
    import attn_jax.cli

    doc = attn_jax.cli.__doc__
    assert "so far" not in doc
    assert set(re.findall(r"``(\w+)``", doc)) == set(_SUBCOMMANDS)
