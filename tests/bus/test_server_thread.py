"""ServerThread's close: requests in flight get their grace, connections that are idle or
silent do not hold it up, whenever they arrived."""

from __future__ import annotations

import socket
import threading
import time
from http.client import HTTPConnection

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from support.uvicorn_log import uvicorn_said

from rlbus.bus.server_thread import ServerThread


async def _hold_the_loop(request: Request) -> PlainTextResponse:
    time.sleep(0.5)  # blocks the server's event loop: a connection made now waits to be accepted
    return PlainTextResponse("held")


def test_a_connection_accepted_as_close_begins_does_not_hold_it_up() -> None:
    """The connection is accepted in the same loop pass as the shutdown starts, so uvicorn's
    one request to its connections to close misses it; a connection that never sends has no
    timeout of its own, and close waited out its whole grace for it (found in CI under load).
    uvicorn says "timeout graceful shutdown exceeded" whenever its grace runs out, so its log
    tells whether the close waited for the silent connection, however fast the machine."""
    server = ServerThread(Starlette(routes=[Route("/hold", _hold_the_loop)]), graceful_s=5)
    server.start()
    answers: list[bytes] = []

    def ask() -> None:
        client = HTTPConnection("127.0.0.1", server.port, timeout=30)
        client.request("GET", "/hold")
        answers.append(client.getresponse().read())
        client.close()

    asking = threading.Thread(target=ask)
    asking.start()
    time.sleep(0.15)  # the request is in its handler, the loop held
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    with uvicorn_said() as said:
        server.close()
    asking.join()
    try:
        assert answers == [b"held"]  # the request in flight still got its answer
        # The grace did not run out: the silent connection was asked to close, not waited for.
        assert not [line for line in said if "graceful shutdown exceeded" in line]
        assert silent.recv(1) == b""  # closed by the server
    finally:
        silent.close()
