"""The ASGI layer: Starlette routes over the pure core (request checks, batcher, metrics)."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Protocol

from attn_jax.serve._batcher import Batcher, QueueFull, ShuttingDown
from attn_jax.serve._metrics import Metrics
from attn_jax.serve._requests import Limits, RequestError, parse_request

__all__ = ["Translator", "build_app"]


class Translator(Protocol):
    """What the server translates with (``RunTranslator``, ``ExportTranslator`` or a test's stand-in)."""

    description: str

    def key(self, options: tuple[tuple[str, Any], ...]) -> Any:
        """The checked options, hashable; RequestError for a bad one."""

    def check(self, sentences: Any) -> None:
        """RequestError for a sentence the model cannot take."""

    def __call__(self, sentences: list[str], key: Any) -> Any:
        """A BatchResult for ``sentences`` with the options ``key``."""


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def build_app(
    translator: Translator,
    *,
    limits: Limits | None = None,
    max_batch: int = 32,
    max_wait_s: float = 0.005,
    max_queue: int = 256,
    metrics: Metrics | None = None,
):
    """The Starlette app: ``POST /translate``, ``GET /health`` and ``GET /metrics`` (docs/serving.md).

    The batcher starts and stops with the app's lifespan. Under uvicorn a SIGTERM first lets the requests in
    flight finish, then stops the batcher.

    Args:
      translator: the model; its calls run one at a time in a worker thread.
      limits: what one request may hold (:class:`Limits`).
      max_batch, max_wait_s, max_queue: the batcher's (:class:`Batcher`).
      metrics: the counters to fill (a new :class:`Metrics` when None).
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    limits = limits or Limits()
    metrics = metrics or Metrics()
    if max_queue < limits.max_sentences:
        raise ValueError(
            f"max_queue {max_queue} is below max_sentences {limits.max_sentences}: a full request could never wait"
        )
    batcher = Batcher(
        translator, max_batch=max_batch, max_wait_s=max_wait_s, max_queue=max_queue, metrics=metrics
    )

    def refuse(status: int, reason: str, message: str, start: float, **headers: str) -> JSONResponse:
        metrics.answered(status, time.monotonic() - start, reason)
        return JSONResponse({"error": message, "reason": reason}, status_code=status, headers=headers or None)

    async def translate(request: Request) -> JSONResponse:
        start = time.monotonic()
        try:
            declared = int(request.headers.get("content-length") or 0)
        except ValueError:
            declared = 0
        if declared > limits.max_body_bytes:
            return refuse(
                413,
                "body_too_large",
                f"the body has {declared} bytes, over the limit of {limits.max_body_bytes}",
                start,
            )
        body = bytearray()
        async for chunk in request.stream():  # a chunked body has no length to check first
            body += chunk
            if len(body) > limits.max_body_bytes:
                return refuse(
                    413,
                    "body_too_large",
                    f"the body is over the limit of {limits.max_body_bytes} bytes",
                    start,
                )
        try:
            parsed = parse_request(bytes(body), limits)
            key = translator.key(parsed.options)
            translator.check(parsed.sentences)
        except RequestError as e:
            return refuse(e.status, e.reason, str(e), start)
        try:
            pairs = await batcher.submit(parsed.sentences, key)
        except QueueFull as e:
            return refuse(503, "queue_full", str(e), start, **{"Retry-After": "1"})
        except ShuttingDown as e:
            return refuse(503, "shutting_down", str(e), start)
        except Exception as e:  # noqa: BLE001 - a failed model call is one line and a count, never a traceback
            return refuse(500, "model_error", f"translation failed: {_one_line(e)}", start)
        body = {
            "translations": [t for t, _ in pairs],
            "stopped_at_limit": [i for i, (_, cut) in enumerate(pairs) if cut],
        }
        metrics.answered(200, time.monotonic() - start)
        return JSONResponse(body)

    async def health(request: Request) -> JSONResponse:
        status = "shutting_down" if batcher.closing else "ok"
        return JSONResponse({"status": status, "model": translator.description})

    async def show_metrics(request: Request) -> JSONResponse:
        return JSONResponse(
            metrics.snapshot(
                queue_waiting=batcher.waiting,
                queue_running=batcher.running,
                max_queue=batcher.max_queue,
                max_batch=batcher.max_batch,
            )
        )

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, f"http_{exc.status_code}")
        return refuse(exc.status_code, reason, _one_line(exc.detail), time.monotonic())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = Starlette(
        routes=[
            Route("/translate", translate, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", show_metrics, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    app.state.batcher = batcher
    app.state.metrics = metrics
    return app
