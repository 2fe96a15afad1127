"""Every config key is explained where it is defined, and ``attn-jax train --help-config`` prints it."""

import dataclasses
import pathlib

import pytest

from attn_jax.cli import main
from attn_jax.train import config_help, default_config, flatten_config
from attn_jax.train._config import MODEL_CLASSES
from attn_jax.train._config_help import _attributes, _comment_above, _comment_lines, _field_help

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("arch", sorted(MODEL_CLASSES))
def test_every_key_of_every_architecture_has_help(arch):
    config = default_config(arch)
    helps = config_help(config)
    assert set(helps) == set(flatten_config(config))
    missing = sorted(key for key, text in helps.items() if len(text.split()) < 2)
    assert not missing, (
        f"config keys without help: {missing}; add a comment line above each in default_config(), or an "
        "Attributes: entry in the model or optimizer config class"
    )


def test_the_comment_directly_above_is_the_help():
    source = (
        "def f():\n"
        "    c = {}\n"
        "    # The first line\n"
        "    # and the second.\n"
        "    c.a = 1  # trailing: not help\n"
        "    # Separated by a blank line: not help.\n"
        "\n"
        "    c.b = '# in a string'\n"
        "    c.c = 3\n"
    )
    comments = _comment_lines(source)
    assert sorted(comments) == [3, 4, 6]
    assert _comment_above(comments, 5) == "The first line and the second."
    assert _comment_above(comments, 8) == ""
    assert _comment_above(comments, 9) == ""


def test_attributes_entries_and_comments_above_fields():
    doc = (
        "Summary.\n\n"
        "Attributes:\n"
        "  a, b: shared text\n"
        "    that goes on.\n"
        "  c:\n"
        "    text on the next line.\n\n"
        "Returns:\n"
        "  d: not an attribute.\n"
    )
    assert _attributes(doc) == {
        "a": "shared text that goes on.",
        "b": "shared text that goes on.",
        "c": "text on the next line.",
    }

    @dataclasses.dataclass(frozen=True)
    class Own:
        """A model config documented by comments.

        Attributes:
          width: from the docstring.
        """

        # Overridden by the docstring's entry.
        width: int = 3
        # From the comment above the field.
        depth: int = 2
        undocumented: int = 1

    assert _field_help(Own) == {
        "width": "from the docstring.",
        "depth": "From the comment above the field.",
        "undocumented": "",
    }


def test_help_config_prints_the_overridden_value_and_the_help(capsys):
    status = main(
        [
            "train",
            "--config",
            f"{CONFIGS / 'rnnsearch_cpu.py'}:smoke",
            "--config.model.hidden=37",
            "--config.data.batch_size=11",
            "--help-config",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    keys = [line for line in out if not line.startswith(" ")]
    assert len(keys) == len(flatten_config(default_config())) and all("=" in line for line in keys)
    hidden = out.index("model.hidden=37")
    assert out[hidden + 1] == "    n, GRU state width of encoder and decoder (paper: 1000)."
    batch = out.index("data.batch_size=11")
    assert out[batch + 1] == "    Training pairs per batch."
    # Every key is followed by its indented help, with the reST markup taken out.
    for i, line in enumerate(out):
        if not line.startswith(" "):
            assert out[i + 1].startswith("    ") and len(out[i + 1].split()) >= 2, line
    assert not any("``" in line or ":class:" in line for line in out)
