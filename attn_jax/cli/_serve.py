"""``attn-jax serve``: translate over HTTP, with requests that arrive together decoded in one batch.

    attn-jax serve --workdir runs/rnnsearch_cpu --port 8000
    attn-jax serve --exported exports/rnnsearch --port 0          # a free port, printed on stderr
    curl -s localhost:8000/translate -d '{"sentences": ["the dog slept ."], "beam": 4}'

``POST /translate`` takes ``{"sentences": [...]}`` and translate's decoding options by their flag names
(``beam``, ``alpha``, ``max_length_ratio``, ...); it answers ``{"translations": [...], "stopped_at_limit":
[...]}``. ``GET /health`` and ``GET /metrics`` report state and counts. docs/serving.md is the guide.

Exit status: 0 stopped by SIGINT or SIGTERM (after answering the requests in flight); 1 a run or export that
cannot be loaded, or a port that cannot be bound; 2 a bad flag.
"""

from __future__ import annotations

import argparse
import sys

from attn_jax.cli._errors import error_line
from attn_jax.cli._translate import parse_checkpoint

__all__ = ["add_serve_parser", "run_serve"]


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to an ``argparse`` subparsers object; its handler is :func:`run_serve`."""
    from attn_jax.cli._help import summary
    from attn_jax.pipeline import WEIGHTS

    p = subparsers.add_parser(
        "serve",
        help="an HTTP JSON translation server with dynamic batching (needs the 'serve' extra)",
        description=summary(__doc__),
        epilog="Exit status: 0 stopped by a signal, 1 run/export or port problem, 2 bad flag.",
    )
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--workdir",
        action="append",
        metavar="DIR",
        help="the training run's directory; repeat it for an ensemble (as in translate)",
    )
    model.add_argument("--exported", metavar="DIR", help="an export written by attn-jax export")
    p.add_argument(
        "--checkpoint",
        type=parse_checkpoint,
        default="best",
        metavar="best|last|STEP",
        help="which checkpoint of --workdir (default: %(default)s, as in translate)",
    )
    p.add_argument(
        "--weights", choices=WEIGHTS, default="raw", help="raw or ema parameters (as in translate)"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default: %(default)s, this machine only)",
    )
    p.add_argument("--port", type=int, default=8000, help="the port (default: %(default)s; 0: a free one)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        metavar="N",
        help="most sentences per model call (default: %(default)s)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=5.0,
        metavar="MS",
        help="how long a batch waits for more requests after its first (default: %(default)s)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=256,
        metavar="N",
        help="most sentences waiting; more are answered 503 (default: %(default)s)",
    )
    p.add_argument(
        "--max-sentences",
        type=int,
        default=64,
        metavar="N",
        help="most sentences per request (default: %(default)s)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=200,
        metavar="N",
        help="most whitespace tokens per sentence (default: %(default)s)",
    )
    p.add_argument(
        "--graceful-s",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, how long requests in flight may take to finish (default: %(default)s)",
    )
    p.set_defaults(func=run_serve)
    return p


def _error(message: object, status: int = 1) -> int:
    return error_line("serve", message, status)


def run_serve(args: argparse.Namespace) -> int:
    """Run ``attn-jax serve`` with parsed arguments; returns the exit status."""
    from attn_jax._extras import require

    for flag in ("batch_size", "max_queue", "max_sentences", "max_tokens"):
        if getattr(args, flag) < 1:
            return _error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}", 2)
    if args.max_queue < args.max_sentences:
        return _error(f"--max-queue {args.max_queue} must be >= --max-sentences {args.max_sentences}", 2)
    if args.max_wait_ms < 0 or args.graceful_s < 0:
        return _error("--max-wait-ms and --graceful-s must be >= 0", 2)
    if not 0 <= args.port <= 65535:
        return _error(f"--port must be in 0..65535, got {args.port}", 2)
    require("starlette", "attn-jax serve")
    require("uvicorn", "attn-jax serve")
    from attn_jax.exported import ExportError
    from attn_jax.pipeline import TranslateError
    from attn_jax.serve import ExportTranslator, Limits, RunTranslator, bind, build_app, run

    try:
        if args.exported is not None:
            translator = ExportTranslator(args.exported, batch_size=args.batch_size)
        else:
            translator = RunTranslator(
                args.workdir, args.checkpoint, args.weights, batch_size=args.batch_size
            )
    except (TranslateError, ExportError) as e:
        return _error(e)
    if translator.note:
        print(f"attn-jax serve: warning: {translator.note}", file=sys.stderr)
    app = build_app(
        translator,
        limits=Limits(max_sentences=args.max_sentences, max_tokens=args.max_tokens),
        max_batch=args.batch_size,
        max_wait_s=args.max_wait_ms / 1000,
        max_queue=args.max_queue,
    )
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        return _error(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"

    def ready() -> None:
        print(f"attn-jax serve: {translator.description} on {url}", file=sys.stderr, flush=True)

    run(app, sock, graceful_s=args.graceful_s, on_ready=ready)
    print("attn-jax serve: stopped", file=sys.stderr, flush=True)
    return 0
