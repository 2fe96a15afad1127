"""``attn_jax.pipeline`` is the run pipeline's library home (load a run, translate, evaluate): its public names
are there and documented, it never reaches back into the CLI, and importing it stays light."""

import ast
import pathlib
import subprocess
import sys

import attn_jax.pipeline as pipeline

PUBLIC = {
    "WEIGHTS",
    "AttentionChoice",
    "AttentionChoiceError",
    "DecodeOptions",
    "HeatmapPick",
    "ImportedRun",
    "LengthLimitReport",
    "LoadedModel",
    "MarianImportError",
    "ScoredPair",
    "TranslateError",
    "Translation",
    "bleu_options",
    "choose_attention",
    "decode_progress",
    "evaluate_workdir",
    "figure3_examples",
    "hypothesis_cross_attention",
    "import_marian",
    "length_batches",
    "length_limit",
    "length_limit_report",
    "load_ensemble",
    "load_model",
    "load_split",
    "merge_length_limit_reports",
    "model_length_cap",
    "pad_rows",
    "padded_width",
    "quiet_checkpoint_logs",
    "read_marian",
    "reference_attention",
    "reference_cross_attention",
    "score_pairs",
    "select_examples",
    "sharpest_head",
    "translate_sentences",
}


def test_public_names_are_exported_and_documented():
    assert set(pipeline.__all__) == PUBLIC
    assert pipeline.WEIGHTS == ("raw", "ema")  # the one constant: what --weights accepts
    for name in PUBLIC - {"WEIGHTS"}:
        obj = getattr(pipeline, name)
        assert obj.__module__.startswith("attn_jax.pipeline._"), name
        assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def _imported_modules(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_pipeline_imports_neither_argparse_nor_the_cli():
    files = sorted(pathlib.Path(pipeline.__file__).parent.glob("*.py"))
    assert len(files) > 1
    for path in files:
        bad = {
            m
            for m in _imported_modules(path)
            if m == "argparse" or m.startswith("attn_jax.cli") or m.startswith("attn_jax.cli._help")
        }
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_import_pipeline_stays_light():
    # A fresh interpreter: this one has imported whatever other tests needed.
    code = (
        "import sys, attn_jax\n"
        "m = attn_jax.pipeline\n"
        "assert m is sys.modules['attn_jax.pipeline'] and 'pipeline' in dir(attn_jax)\n"
        "heavy = ('tensorflow', 'tensorflow_datasets', 'flax', 'orbax', 'grain', 'sacrebleu', 'matplotlib')\n"
        "print(' '.join(h for h in heavy if h in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
