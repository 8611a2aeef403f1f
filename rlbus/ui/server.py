"""Serve the ui with uvicorn on a socket bound here, so the URL (with a free port when 0 is
asked for) is known, and printed, before the first request."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn

from rlbus.ui.app import LOCAL_HOSTS, create_app

ANY_ADDRESS = ("0.0.0.0", "::")


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, so asyncio sets TCP_NODELAY on each connection: without it, a kept-alive
    # connection waits ~40 ms (delayed ACK) between a response's headers and its body.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def serve(
    url: str,
    host: str = "127.0.0.1",
    port: int = 0,
    tokenizer: str | None = None,
    ready: Callable[[str], None] = print,
) -> None:
    """Serve until SIGINT/SIGTERM; `ready` gets the ui's URL once the socket listens."""
    # Binding every interface is a choice the user made knowingly: any Host name is accepted.
    hosts = ["*"] if host in ANY_ADDRESS else [*LOCAL_HOSTS, host]
    app = create_app(url, tokenizer, hosts)
    sock = bind(host, port)
    shown = f"[{host}]" if ":" in host else host
    ready(f"http://{shown}:{sock.getsockname()[1]}")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    server.run(sockets=[sock])
