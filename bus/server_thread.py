"""Serve an ASGI app with uvicorn on a background thread (its own event loop), so that
synchronous code can own a server: the store's read-only endpoint, and the test servers.

The socket is bound before the thread starts, so `url` is known at once and port 0 means a
free port chosen by the system (no window for another process to take it).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Literal

import uvicorn
from starlette.types import ASGIApp

from rlbus.bus.waiting import wait_for


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (0: a free port) for uvicorn to serve, so its URL
    is known before the first request. IPPROTO_TCP is named so that asyncio sets TCP_NODELAY on
    each connection: without it a kept-alive connection waits out the client's delayed-ACK
    timer (Nagle's algorithm holds the body back) between a response's headers and its body."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections queue from now on, before the server's loop takes them
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, asking every connection to close for as long as its shutdown lasts.
    uvicorn asks the connections it knows once; one accepted in the same loop pass as the
    shutdown began is registered a moment later and never asked, and a connection that sends
    nothing has no timeout: close then waited out its whole grace. Asking twice is harmless:
    an idle connection is closed, a busy one answers its request and then closes."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        asking = asyncio.create_task(self._ask_connections_to_close())
        try:
            await super().shutdown(sockets)
        finally:
            asking.cancel()

    async def _ask_connections_to_close(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            for connection in list(self.server_state.connections):
                connection.shutdown()


class ServerThread:
    """`with ServerThread(app) as server:` then `server.url`; loopback unless `host` says so."""

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        lifespan: Literal["on", "off"] = "off",
        graceful_s: int | None = None,
        start_timeout_s: float = 60,
        name: str = "asgi-server",
    ):
        """`graceful_s`: how long `close()` waits for requests in flight (idle keep-alive
        connections are closed at once); None: not at all, and the app's lifespan shutdown
        is skipped too."""
        self._socket = listening_socket(host, port)
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._graceful = graceful_s is not None
        self._start_timeout_s = start_timeout_s
        self._server = _Server(
            uvicorn.Config(
                app,
                log_level="warning",
                lifespan=lifespan,
                access_log=False,
                server_header=False,
                timeout_graceful_shutdown=graceful_s,
            )
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True, name=name
        )

    def start(self) -> None:
        self._thread.start()

        def running() -> None:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on {self.url} stopped before it started")

        try:
            wait_for(lambda: self._server.started, self._start_timeout_s, self.url, 0.01, running)
        except (RuntimeError, TimeoutError):
            self._socket.close()
            raise

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.should_exit = True
            self._server.force_exit = not self._graceful
            self._thread.join()
        self._socket.close()  # uvicorn closes it too, unless it never started

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
