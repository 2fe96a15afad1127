"""Small command-line and library papercuts (issue 17 item 5): ``attn-jax --version``, ``--help`` in plain text,
``attn-jax train --print-config``, lazy submodule attributes, a missing extra named, one AER format, and
``--nbest`` on a blank line."""

import glob
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from attn_jax._extras import EXTRA_OF, MissingExtra, missing_extra, require
from attn_jax.cli import build_parser, main
from attn_jax.cli._help import plain, summary

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
    named = set(re.findall(r"``(\w[\w-]*)``", doc)) - {"attn-jax"}  # the command's own name is no subcommand
    assert named == set(_subparsers()[1])  # those the parser has, no more


# --- attn-jax train --print-config ----------------------------------------------------------------------------

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIGS = sorted(glob.glob(os.path.join(_ROOT, "configs", "*.py")))


@pytest.mark.parametrize("path", [*_CONFIGS, os.path.join(_ROOT, "configs", "rnnsearch_cpu.py:smoke")])
def test_print_config_lists_every_key_as_overrides_that_rebuild_it(path, capsys):
    from attn_jax.train import apply_overrides, default_config, flatten_config, load_config

    status = main(["train", "--config", path, "--print-config"])
    out, err = capsys.readouterr()
    assert status == 0 and err == "", err
    lines = out.splitlines()
    config = load_config(path)
    assert [line.split("=", 1)[0] for line in lines] == list(flatten_config(config))
    # Every line is a valid override, and applying them all to the schema's defaults gives the config back.
    rebuilt = apply_overrides(default_config(config.model.arch), lines)
    assert flatten_config(rebuilt) == flatten_config(config)


def test_print_config_applies_overrides_and_does_not_train(tmp_path, capsys):
    smoke = os.path.join(_ROOT, "configs", "rnnsearch_cpu.py:smoke")
    args = ["train", "--config", smoke, "--config.model.hidden=7", "--config.data.bucket_boundaries", "9,13"]
    status = main([*args, "--workdir", str(tmp_path / "run"), "--print-config"])
    out, _ = capsys.readouterr()
    assert status == 0 and not (tmp_path / "run").exists()
    assert "model.hidden=7" in out.splitlines() and "data.bucket_boundaries=9,13" in out.splitlines()


def test_print_config_refuses_a_bad_override_and_train_still_needs_a_workdir(capsys):
    smoke = os.path.join(_ROOT, "configs", "rnnsearch_cpu.py:smoke")
    assert main(["train", "--config", smoke, "--config.model.hiden=7", "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "did you mean 'model.hidden'" in err, err
    assert main(["train", "--config", smoke]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "attn-jax train: error: the following arguments are required: --workdir\n"


def test_train_help_points_at_print_config_not_a_private_module(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--print-config" in out and "_config.py" not in out


# --- submodules as attributes of a light `import attn_jax` ------------------------------------------------------

_HEAVY = ("flax", "optax", "orbax", "grain", "tensorflow", "tensorflow_datasets", "ml_collections")


def _imports_after(code: str) -> set[str]:
    """The heavy packages imported once ``code`` (after ``import attn_jax``) has run, in a fresh interpreter."""
    script = f"import sys, attn_jax\n{code}\nprint(' '.join(m for m in {_HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_import_attn_jax_alone_stays_light():
    assert _imports_after("") == set()


@pytest.mark.parametrize(
    "name, allowed",
    [
        ("nn", {"flax", "optax"}),  # flax itself imports optax
        ("models", {"flax", "optax"}),
        ("decoding", {"flax", "optax"}),
        ("eval", set()),
        ("typing", set()),
    ],
)
def test_submodule_is_an_attribute_imported_on_first_use(name, allowed):
    code = f"m = attn_jax.{name}\nassert m is sys.modules['attn_jax.{name}'] and '{name}' in dir(attn_jax)"
    assert _imports_after(code) <= allowed


def test_unknown_attribute_still_raises_attribute_error():
    import attn_jax

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attn_jax.nope  # noqa: B018
    assert not hasattr(attn_jax, "cli_nope") and attn_jax.train is sys.modules["attn_jax.train"]


# --- a missing extra is named ----------------------------------------------------------------------------------


def _hide(monkeypatch, package: str) -> None:
    """Make ``package`` (and its loaded submodules) look uninstalled: a ``None`` in sys.modules stops an import."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] or [package]:
        monkeypatch.setitem(sys.modules, name, None)


def test_every_optional_package_maps_to_the_extra_that_installs_it():
    import importlib.metadata
    import tomllib

    with open(os.path.join(_ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    distributions = importlib.metadata.packages_distributions()
    for module, extra in EXTRA_OF.items():
        required = {norm(re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0]) for r in extras[extra]}
        assert {norm(d) for d in distributions[module]} & required, (module, extra)


def test_missing_extra_names_only_optional_packages():
    assert missing_extra(ModuleNotFoundError("x", name="orbax.checkpoint")) == (
        "the 'train' extra (orbax is not installed): pip install 'attn-jax[train]'"
    )
    assert missing_extra(ModuleNotFoundError("x", name="numpy")) is None  # core: not an extra's
    assert missing_extra(ImportError("cannot import name 'x'", name="grain")) is None  # installed but broken


def test_require_raises_one_line_naming_the_extra(monkeypatch):
    _hide(monkeypatch, "grain")
    with pytest.raises(MissingExtra) as info:
        require("grain", "attn_jax.data")
    assert str(info.value) == (
        "attn_jax.data needs the 'data' extra (grain is not installed): pip install 'attn-jax[data]'"
    )
    assert isinstance(info.value, ModuleNotFoundError) and info.value.name == "grain"
    with pytest.raises(ModuleNotFoundError) as info:  # a package of no extra: the plain error
        require("no_such_module_anywhere", "x")
    assert not isinstance(info.value, MissingExtra)


def test_library_functions_name_the_extra_of_their_lazy_imports(monkeypatch):
    from attn_jax.data._vocab import SentencePieceVocabulary
    from attn_jax.eval import _bleu, _detok, _plots

    for package, call, extra in (
        ("sacremoses", lambda: _detok._moses.__wrapped__("en"), "eval"),
        ("sacrebleu", lambda: _bleu._metric("13a", False), "eval"),
        ("matplotlib", lambda: _plots._figure((2.0, 2.0), 10), "eval"),
        ("sentencepiece", lambda: SentencePieceVocabulary(b""), "data"),
    ):
        with monkeypatch.context() as m:
            _hide(m, package)
            with pytest.raises(
                MissingExtra, match=rf"needs the '{extra}' extra \({package} is not installed\)"
            ):
                call()


def _cli_without(package: str, argv: list[str]) -> subprocess.CompletedProcess:
    script = (
        f"import sys\nsys.modules[{package!r}] = None\nfrom attn_jax.cli import main\n"
        f"raise SystemExit(main({argv!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=_ROOT
    )


@pytest.mark.parametrize(
    "package, argv, extra",
    [
        ("grain", ["data", "--config", "tiny"], "data"),
        (
            "ml_collections",
            ["train", "--config", "configs/rnnsearch_cpu.py:smoke", "--print-config"],
            "train",
        ),
    ],
)
def test_cli_without_an_extra_says_which_to_install(package, argv, extra):
    done = _cli_without(package, argv)
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert done.stderr == (
        f"attn-jax {argv[0]}: error: needs the '{extra}' extra ({package} is not installed): "
        f"pip install 'attn-jax[{extra}]'\n"
    )


def test_submodule_attribute_without_its_extra_names_it():
    script = "import sys\nsys.modules['grain'] = None\nimport attn_jax\nattn_jax.data"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "attn_jax._extras.MissingExtra: attn_jax.data needs the 'data' extra (grain is not installed): "
        "pip install 'attn-jax[data]'"
    )


# --- one AER format --------------------------------------------------------------------------------------------


def test_aer_prints_in_percent_as_in_the_tables_and_json_keeps_the_fraction():
    from attn_jax.eval import SystemScores, alignment_error_rate, corpus_bleu, summary_json, summary_markdown

    # |A| = 3, |S| = 2, |P| = 3 (a possible link 1?1): A∩S = {0-0}, A∩P = {0-0, 1-1};
    # AER = 1 - (1 + 2) / (3 + 2) = 0.4, P = 2/3, R = 1/2.
    aer = alignment_error_rate(["0-0 1-1 2-0"], ["0-0 1-2 1?1"])
    assert str(aer) == "AER = 40.00 % (P = 66.67 %, R = 50.00 %, 1 sentences)"
    scores = SystemScores(corpus_bleu(["a b c d"], ["a b c d"]), aer=aer)
    row = summary_markdown({"sys": scores}).splitlines()[2]
    assert row.endswith("| 40.00 | 66.67 | 50.00 |")  # the same numbers in the "AER (%)" columns
    assert summary_json({"sys": scores})["sys"]["aer"]["aer"] == pytest.approx(0.4)
    assert str(alignment_error_rate([""], [""])) == "AER = — (P = —, R = —, 1 sentences)"  # nothing to score


# --- --nbest K on a blank line: K lines ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
    from tests.test_cli_translate import make_run

    return make_run(tmp_path_factory.mktemp("run"))


def test_blank_line_gets_nbest_empty_hypotheses(translate_run):
    from attn_jax.cli._translate import format_translations
    from attn_jax.pipeline import load_model, translate_sentences

    loaded = load_model(translate_run)
    results = translate_sentences(loaded, ["", ""], beam_size=3, nbest=3)  # nothing to decode
    assert [len(hyps) for hyps in results] == [3, 3]
    assert all(h.text == "" and h.score == 0.0 and h.limit is None for hyps in results for h in hyps)
    assert (
        format_translations(1, "", results[1], nbest=True, alignment=None)
        == ["1 |||  ||| 0.000000 ||| 0.000000"] * 3
    )
    assert format_translations(1, "", results[1], nbest=False, alignment=None) == [""]  # plain: one line
    assert [len(h) for h in translate_sentences(loaded, [""], beam_size=3, nbest=1)] == [1]


def test_translate_nbest_keeps_k_lines_for_a_blank_input_line(translate_run, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("the dog slept .\n\n.\n", encoding="utf-8")
    status = main(
        ["translate", "--workdir", translate_run, "--input", str(src), "--beam", "2", "--nbest", "2"]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    indices = [int(line.split(" ||| ")[0]) for line in out.splitlines()]
    assert indices == [0, 0, 1, 1, 2, 2]
    assert out.splitlines()[2:4] == ["1 |||  ||| 0.000000 ||| 0.000000"] * 2
