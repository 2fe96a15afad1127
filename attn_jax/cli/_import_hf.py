"""``attn-jax import-hf``: a Hugging Face Marian (OPUS-MT) checkpoint as a run directory.

    attn-jax import-hf opus-mt-en-de --workdir runs/opus-en-de
    attn-jax translate --workdir runs/opus-en-de --input test.en --beam 4

``DIR`` is a local checkpoint directory: ``config.json``, ``model.safetensors``, ``vocab.json``, ``source.spm``
and ``target.spm``. The import reads it with NumPy only (no PyTorch) and writes ``WORKDIR`` as a run that
``translate``, ``evaluate``, ``score``, ``export`` and ``serve`` load unchanged. ``docs/pretrained.md`` says how
to download a model and what the import maps where.

Exit status: 0 done; 1 a missing or damaged file, an unknown or unsupported config field, a tensor missing or
unused, an existing WORKDIR; 2 a bad flag.
"""

from __future__ import annotations

import argparse

from attn_jax.cli._errors import error_line


def add_import_hf_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``import-hf`` subcommand; its handler is :func:`run_import_hf`."""
    from attn_jax.cli._help import summary

    p = subparsers.add_parser(
        "import-hf",
        help="import a Hugging Face Marian (OPUS-MT) checkpoint as a run that translate/evaluate load",
        description=summary(__doc__),
        epilog=(
            "Writes WORKDIR/{checkpoints/0/, vocab/, imported.json, hf_config.json}. Exit status: 0 done, "
            "1 unreadable or unsupported checkpoint or an existing WORKDIR, 2 bad flag."
        ),
    )
    p.add_argument("checkpoint", metavar="DIR", help="the checkpoint directory (save_pretrained's files)")
    p.add_argument(
        "--workdir", required=True, metavar="RUN", help="the run directory to create (must not exist)"
    )
    p.set_defaults(func=run_import_hf)
    return p


def run_import_hf(args: argparse.Namespace) -> int:
    """Run ``attn-jax import-hf`` with parsed arguments; returns the exit status."""
    from attn_jax.pipeline import MarianImportError, import_marian, quiet_checkpoint_logs

    quiet_checkpoint_logs()
    try:
        run = import_marian(args.checkpoint, args.workdir)
    except MarianImportError as e:
        return error_line("import-hf", e)
    r = run.record
    not_applied = ", ".join(f"{k}={v!r}" for k, v in r["not_applied"].items()) or "none"
    print(
        f"imported {args.checkpoint} into {run.workdir}: {r['vocab_size']['marian']} Marian ids as "
        f"{r['vocab_size']['attn_jax']} attn-jax ids (attn-jax translate --workdir {run.workdir})"
    )
    print(f"config fields not applied (training or generation settings): {not_applied}")
    return 0
