"""A network namespace for one sandboxed program, made by this process: loopback only, and on it
one listening socket at 127.0.0.1:PORT that this process serves (the rollout's interception
URL). The program joins the namespace before exec, so its only way out is that socket.

unshare(CLONE_NEWNET) changes the namespace of the calling thread alone, so it runs in a thread
of its own that returns to its namespace before ending. It needs CAP_SYS_ADMIN (root)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import struct
import threading
from dataclasses import dataclass

from rlbus.producers.runtimes.linux import CLONE_NEWNET, setns, unshare

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH22x"  # struct ifreq: name, then flags in a 24-byte union


@dataclass
class Netns:
    fd: int
    """An open /proc/thread-self/ns/net of the namespace, for the program's setns."""
    listener: socket.socket | None
    """Listening on 127.0.0.1:port inside the namespace (None when no port was asked for)."""

    def enter(self) -> None:
        """In the program's first process, between fork and exec."""
        setns(self.fd, CLONE_NEWNET)

    def close(self) -> None:
        """The namespace goes once its last process and socket are gone."""
        os.close(self.fd)
        if self.listener is not None:
            self.listener.close()


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _make(port: int | None) -> Netns:
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        unshare(CLONE_NEWNET)
        try:
            _loopback_up()
            listener = None
            if port is not None:
                listener = socket.create_server(("127.0.0.1", port), backlog=128)
            return Netns(os.open("/proc/thread-self/ns/net", os.O_RDONLY), listener)
        finally:
            setns(home, CLONE_NEWNET)
    finally:
        os.close(home)


def _made(port: int | None) -> Netns | BaseException:
    try:
        return _make(port)
    except BaseException as exc:
        return exc


async def make_netns(port: int | None) -> Netns:
    """A fresh namespace with loopback up and (given a port) a listener on 127.0.0.1:port."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[Netns] = loop.create_future()

    def deliver(result: Netns | BaseException) -> None:
        if made.cancelled():
            if isinstance(result, Netns):
                result.close()
        elif isinstance(result, BaseException):
            made.set_exception(result)
        else:
            made.set_result(result)

    threading.Thread(
        target=lambda: loop.call_soon_threadsafe(deliver, _made(port)), name="rlbus-netns"
    ).start()
    return await made


def make_netns_blocking(port: int | None) -> Netns:
    """make_netns for callers without an event loop."""
    made: list[Netns | BaseException] = []
    thread = threading.Thread(target=lambda: made.append(_made(port)), name="rlbus-netns")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]
