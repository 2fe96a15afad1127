"""Decoding and BLEU options: the library names the field at fault, the command line names the flag."""

import pytest

from attn_jax.cli import main
from attn_jax.cli._options import flag_worded
from attn_jax.eval import BleuSettings
from attn_jax.pipeline import DecodeOptions, TranslateError

BAD_DECODE = [
    (dict(beam_size=0), "beam_size must be >= 1, got 0"),
    (dict(beam_size=2, nbest=3), "nbest must be between 1 and beam_size 2, got 3"),
    (dict(alpha=float("nan")), "alpha must be a finite number >= 0, got nan"),
    (dict(beta=-1.0), "beta must be a finite number >= 0, got -1.0"),
    (dict(max_length=0), "max_length must be >= 1, got 0"),
    (dict(max_length=5, max_length_ratio=3.0), "give max_length (the same limit"),
    (dict(max_length_offset=-1), "max_length_offset must be >= 0, got -1"),
    (dict(max_length_ratio=0.0, max_length_offset=0), "max_length_ratio 0 with max_length_offset 0"),
    (dict(min_length=True), "min_length must be an int >= 0, got True"),
]


@pytest.mark.parametrize("fields, message", BAD_DECODE)
def test_decode_options_name_the_field(fields, message):
    with pytest.raises(TranslateError) as e:
        DecodeOptions(**fields).check()
    assert str(e.value).startswith(message) and "--" not in str(e.value)


def test_bleu_settings_name_the_field():
    for fields, message in (
        (dict(detokenize="spm"), "detokenize must be one of none, moses, got 'spm'"),
        (dict(detokenize_lang="French"), "detokenize_lang must be a Moses language code"),
        (dict(tokenize="moses"), "tokenize must be a sacreBLEU tokeniser"),
    ):
        with pytest.raises(ValueError, match=message):
            BleuSettings(**fields).check()
    assert BleuSettings().check() == BleuSettings(None, "none", "en")


def test_flags_replace_field_names_but_never_the_value_given():
    assert flag_worded("nbest must be between 1 and beam_size 2, got 3") == (
        "--nbest must be between 1 and --beam 2, got 3"
    )
    assert flag_worded("max_length_ratio 0 with max_length_offset 0 leaves no room; use max_length N") == (
        "--max-length-ratio 0 with --max-length-offset 0 leaves no room; use --max-length N"
    )
    assert flag_worded("tokenize must be a sacreBLEU tokeniser (13a), got 'detokenize'") == (
        "--bleu-tokenize must be a sacreBLEU tokeniser (13a), got 'detokenize'"
    )


@pytest.mark.parametrize(
    "command, flags, line",
    [
        ("translate", ["--beam", "2", "--nbest", "3"], "--nbest must be between 1 and --beam 2, got 3"),
        ("evaluate", ["--beam", "0"], "--beam must be >= 1, got 0"),
        ("evaluate", ["--alpha", "-1"], "--alpha must be a finite number >= 0, got -1.0"),
        ("translate", ["--max-length", "0"], "--max-length must be >= 1, got 0"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag_before_any_load(tmp_path, capsys, command, flags, line):
    status = main([command, "--workdir", str(tmp_path / "no_run"), *flags])
    err = capsys.readouterr().err
    assert status == 2 and err == f"attn-jax {command}: error: {line}\n"
