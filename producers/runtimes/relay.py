"""Run inside a container that has no network: listen on 127.0.0.1:PORT, pass every connection on
to the unix socket SOCKET (the rollout's interception URL, mounted in from the host), run the
program, and exit with its status. Standard library only: it runs on the image's Python.

    python relay.py PORT SOCKET -- ARGV...
"""

import socket
import subprocess
import sys
import threading


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def relay_connections(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(source, sink), daemon=True).start()


def main() -> None:
    port, path, separator, *argv = sys.argv[1:]
    if separator != "--" or not argv:
        sys.exit("usage: relay.py PORT SOCKET -- ARGV...")
    listener = socket.create_server(("127.0.0.1", int(port)))
    threading.Thread(target=relay_connections, args=(listener, path), daemon=True).start()
    code = subprocess.call(argv)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
