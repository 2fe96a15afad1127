"""An HTTP JSON translation server: dynamic batching behind a bounded queue, with health and metrics.

The request checks (:func:`parse_request`), the batcher (:class:`Batcher`) and the counters
(:class:`Metrics`) are plain Python, testable without a server. :func:`build_app` puts Starlette routes
over them; :func:`run` serves the app with uvicorn. ``attn-jax serve`` does both; docs/serving.md is the guide.
Starlette and uvicorn come with the ``serve`` extra.
"""

from attn_jax.serve._app import Translator, build_app
from attn_jax.serve._batcher import Batcher, BatchResult, QueueFull, ShuttingDown
from attn_jax.serve._metrics import LATENCY_BUCKETS_S, Metrics
from attn_jax.serve._requests import OPTION_TYPES, Limits, RequestError, TranslateRequest, parse_request
from attn_jax.serve._run import bind, run
from attn_jax.serve._translators import ExportTranslator, RunTranslator

__all__ = [
    "LATENCY_BUCKETS_S",
    "OPTION_TYPES",
    "BatchResult",
    "Batcher",
    "ExportTranslator",
    "Limits",
    "Metrics",
    "QueueFull",
    "RequestError",
    "RunTranslator",
    "ShuttingDown",
    "TranslateRequest",
    "Translator",
    "bind",
    "build_app",
    "parse_request",
    "run",
]
