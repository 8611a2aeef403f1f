"""Serve the ui with uvicorn on a socket bound here, so the URL (with a free port when 0 is
asked for) is known, and printed, before the first request."""

from __future__ import annotations

from collections.abc import Callable

import uvicorn

from rlbus.bus.server_thread import listening_socket
from rlbus.launch.collector import steady_collector
from rlbus.ui.app import LOCAL_HOSTS, create_app

ANY_ADDRESS = ("0.0.0.0", "::")


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
    sock = listening_socket(host, port)
    shown = f"[{host}]" if ":" in host else host
    ready(f"http://{shown}:{sock.getsockname()[1]}")
    # What the imports made lives as long as the process: kept out of full collections, which
    # otherwise scan it all in the middle of some page (docs/benchmarks.md records the pause).
    with steady_collector():
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        server.run(sockets=[sock])
