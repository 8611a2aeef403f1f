"""What the SQL security tests attack: a store with data, a secret file, a user script that
leaves a marker when run, an INTO OUTFILE target and a listener that counts requests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

from rlbus.bus.store import open_store
from rlbus.schemas import TokenRecord

CANARY = "canary-5f0d2a9e-the-secret-file"


class Listener(BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self) -> None:
        Listener.requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"1\n")

    do_PUT = do_POST = do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@dataclass
class Target:
    """A store holding data, with what an attacker would go for around it."""

    data_dir: Path
    secret: Path
    marker: Path
    outfile: Path
    listener: str

    def attacks(self) -> dict[str, tuple[str, str]]:
        """name: (query, what its refusal must name)."""
        script = "rlbus_probe.sh"
        return {
            "file table function": (
                f"SELECT * FROM file('{self.secret}', 'LineAsString')",
                "file()",
            ),
            "file function": (f"SELECT file('{self.secret}')", "file()"),
            "proc environ": ("SELECT * FROM file('/proc/self/environ', 'LineAsString')", "file()"),
            "url": (f"SELECT * FROM url('{self.listener}/x', 'CSV', 'a String')", "url()"),
            "describe url": (f"DESCRIBE url('{self.listener}/d', 'CSV')", "url()"),
            "s3": (f"SELECT * FROM s3('{self.listener}/b/k', 'CSV', 'a String')", "s3()"),
            "executable": (
                f"SELECT * FROM executable('{script}', 'TSV', 'a String')",
                "executable()",
            ),
            "remote": ("SELECT * FROM remote('127.0.0.1:9000', system.one)", "remote()"),
            "into outfile": (f"SELECT 1 INTO OUTFILE '{self.outfile}'", "INTO OUTFILE"),
            "two statements": ("SELECT 1; DROP TABLE tokens", "statement"),
            "settings clause": ("SELECT 1 SETTINGS allow_introspection_functions = 1", "SETTINGS"),
            "dictionary": ("SELECT dictGet('d', 'a', toUInt64(1))", "dictGet()"),
        }

    def untouched(self) -> None:
        """Nothing read, requested, run or written."""
        assert Listener.requests == []
        assert not self.marker.exists(), "a user script ran"
        assert not self.outfile.exists(), "INTO OUTFILE wrote a file"


def make_target(tmp_path: Path) -> Iterator[Target]:
    """The body of the tests' `target` fixture."""
    data_dir = tmp_path / "data"
    with open_store(f"chdb://{data_dir}") as store:
        store.insert_events([TokenRecord(rollout_id="r1")], [(0, 0)], "t")
    scripts = data_dir / "user_scripts"
    scripts.mkdir()
    marker = tmp_path / "script-ran"
    probe = scripts / "rlbus_probe.sh"
    probe.write_text(f"#!/bin/sh\ntouch {marker}\necho ran\n")
    probe.chmod(0o755)
    secret = tmp_path / "secret.txt"
    secret.write_text(CANARY)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    Thread(target=server.serve_forever, daemon=True).start()
    Listener.requests = []
    try:
        yield Target(
            data_dir,
            secret,
            marker,
            tmp_path / "out.tsv",
            f"http://127.0.0.1:{server.server_address[1]}",
        )
    finally:
        server.shutdown()
        server.server_close()
