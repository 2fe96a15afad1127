"""``attn-jax train``: train a model from a config file, with checkpoints, metrics and exact resumption.

    attn-jax train --config configs/rnnsearch_cpu.py --workdir runs/rnnsearch_cpu
    attn-jax train --config configs/rnnsearch_cpu.py:smoke --workdir /tmp/smoke          # a seconds-long variant
    attn-jax train --config configs/rnnsearch50.py --workdir runs/rnnsearch50 --config.data.batch_size=40
    attn-jax train --config configs/rnnsearch50.py --workdir runs/rnnsearch50 --resume   # after a crash/kill

Every config field can be overridden with ``--config.<key>=<value>`` (or ``--config.<key> <value>``); the value
is parsed as the field's type (``true``/``false`` for booleans, ``16,32`` for tuples). The workdir receives
``checkpoints/``, ``vocab/``, ``metrics.jsonl``, ``tensorboard/`` and ``config.json``.

Exit status: 0 done; 1 the corpus cannot be read or the machine ran out of memory; 2 a bad flag, config file,
key or value (one line on stderr, no traceback); 3 training diverged (NaN/inf loss; nothing saved after the last
good checkpoint); 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

_PREFIX = "--config."


def _split_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Separate ``--config.key=value`` / ``--config.key value`` items (as ``key=value``) from the rest."""
    overrides, rest = [], []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(_PREFIX):
            if "=" in arg:
                overrides.append(arg[len(_PREFIX) :])
            elif i + 1 < len(args):
                overrides.append(f"{arg[len(_PREFIX) :]}={args[i + 1]}")
                i += 1
            else:
                overrides.append(arg[len(_PREFIX) :])  # no value: reported by apply_overrides
        else:
            rest.append(arg)
        i += 1
    return overrides, rest


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``train`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_train`."""
    p = subparsers.add_parser(
        "train",
        help="train a model from a config file (checkpoints, metrics, --resume)",
        description=__doc__.split("\n\n")[0],
        epilog=(
            "Config overrides: --config.KEY=VALUE for any field of the config (e.g. --config.model.hidden=256 "
            "--config.optimizer.name=adam --config.data.bucket_boundaries=16,32); see configs/*.py and "
            "attn_jax/train/_config.py for the schema. A config file is PATH.py or PATH.py:VARIANT (e.g. "
            ":smoke). Set JAX_COMPILATION_CACHE_DIR to reuse compiled steps across runs. Exit status: 0 done, "
            "1 corpus or memory error, 2 bad flag/config, 3 diverged (NaN/inf), 130 interrupted."
        ),
    )
    p.add_argument(
        "--config",
        required=True,
        metavar="FILE[:VARIANT]",
        help="config file defining get_config(), e.g. configs/rnnsearch_cpu.py",
    )
    p.add_argument(
        "--workdir", required=True, metavar="DIR", help="run directory: checkpoints, vocab, metrics"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --workdir (bit-for-bit as if never interrupted)",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "lines"),
        default="auto",
        help="progress bar (a terminal) or plain log lines (default: %(default)s = bar on a terminal)",
    )
    p.set_defaults(func=run_train, overrides=[])

    parse_known_args = p.parse_known_args

    def parse_with_overrides(args=None, namespace=None):
        overrides, rest = _split_overrides(list(sys.argv[1:] if args is None else args))
        ns, extras = parse_known_args(rest, namespace)
        ns.overrides = overrides
        return ns, extras

    # argparse cannot declare "any --config.<key>" options: the subcommand takes them out before parsing.
    p.parse_known_args = parse_with_overrides
    return p


def _error(message: str, status: int) -> int:
    print(f"attn-jax train: error: {' '.join(str(message).split())}", file=sys.stderr)
    return status


def run_train(args: argparse.Namespace) -> int:
    """Run ``attn-jax train`` with parsed arguments; returns the exit status."""
    import jax  # lazy: `attn-jax --help` and `attn-jax data` stay fast

    from attn_jax.data import CorpusError
    from attn_jax.train import (
        ConfigError,
        TrainingDiverged,
        apply_overrides,
        check_config,
        load_config,
        train_and_evaluate,
    )

    try:
        config = apply_overrides(load_config(args.config), args.overrides)
        check_config(config)
        tty = {"auto": None, "bar": True, "lines": False}[args.progress]
        result = train_and_evaluate(config, args.workdir, resume=args.resume, tty=tty)
    except ConfigError as e:
        return _error(e, 2)
    except CorpusError as e:
        return _error(e, 1)
    except TrainingDiverged as e:
        return _error(e, 3)
    except (MemoryError, jax.errors.JaxRuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in first or "memory" in first.lower():
            return _error(f"out of memory (model or batch too large for this machine): {first[:300]}", 1)
        raise
    except KeyboardInterrupt:
        print("attn-jax train: interrupted; resume with --resume", file=sys.stderr)
        return 130
    if result.validation is not None:
        print(
            f"final validation: loss {result.validation['loss']:.4f}, ppl {result.validation['ppl']:.2f} "
            f"(best checkpoint: step {result.best_step})"
        )
    return 0
