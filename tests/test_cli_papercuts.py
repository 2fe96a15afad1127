"""Small command-line and library papercuts (issue 17 item 5): ``attn-jax --version``, ``--help`` in plain text,
``attn-jax train --print-config``, lazy submodule attributes, a missing extra named, one AER format, and
``--nbest`` on a blank line."""

import importlib.metadata

import pytest

from attn_jax.cli import main

# --- attn-jax --version ---------------------------------------------------------------------------------------


def test_version_prints_one_line_with_jax_and_flax_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    versions = {n: importlib.metadata.version(n) for n in ("attn-jax", "jax", "flax")}
    expected = f"attn-jax {versions['attn-jax']} (jax {versions['jax']}, flax {versions['flax']})"
    assert out == expected + "\n"
