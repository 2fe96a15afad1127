"""Run an app under uvicorn on a socket bound here, so that port 0 gives a free port that can be printed."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable

__all__ = ["bind", "run"]


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one; ``sock.getsockname()[1]`` says which)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run(
    app,
    sock: socket.socket,
    *,
    graceful_s: float = 30.0,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM, then return.

    On the signal uvicorn stops accepting connections, lets the requests in flight finish (at most
    ``graceful_s`` seconds), then runs the app's shutdown. ``on_ready`` is called once the app has started.
    """
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=graceful_s,
    )
    server = uvicorn.Server(config)
    capture = server.capture_signals

    @contextlib.contextmanager
    def graceful_exit():
        # uvicorn raises the signal again after its shutdown, which would end the process by it; a stop by
        # SIGTERM after the requests were answered is a normal end (exit status 0).
        with capture():
            try:
                yield
            finally:
                server._captured_signals.clear()

    server.capture_signals = graceful_exit
    if on_ready is not None:
        startup = server.startup

        async def started(sockets=None):
            await startup(sockets=sockets)
            on_ready()

        server.startup = started
    server.run(sockets=[sock])
