"""The worker that hosts one environment in an interpreter of its own (the venv `rlbus env
install` made for it), serving many rollouts to rlbus's env producer. Run by that venv's python
as `python host.py KIND TARGET ARGS_JSON`; it imports the standard library and the adapter for
KIND (in adapters/, which imports the environment's own packages), never rlbus: the
environment's pins (verifiers 0.4 wants openai<3) need not agree with rlbus's.

The protocol is JSON lines: requests on stdin, replies on stdout (the file descriptor the
environment's own prints no longer reach: they go to stderr, which rlbus keeps a tail of).

- First, unasked, the host writes `{"id": 0, "ok": true, "result": DESCRIBE}` once the adapter
  loaded, or `{"id": 0, "ok": false, "error": ...}` and exits 3.
- A request is `{"id": N, "op": OP, "params": {...}}`; its reply `{"id": N, "ok": true,
  "result": ...}` or `{"id": N, "ok": false, "error": "..."}`. Requests run concurrently, and
  replies come in the order they finish.
- OP is one of the adapter's operations (`tasks`, and `rollout` for an adapter that plays whole
  episodes, or `reset` / `step` / `close` for one whose environment the rlbus harness steps),
  `ping`, or `cancel` (params `{"target": N}`: cancel request N, which replies as an error).
- End of stdin (rlbus closed it, or died) ends the host: its requests are cancelled and the
  adapter closed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

ADAPTERS = Path(__file__).resolve().parent / "adapters"
KINDS = {"verifiers": "verifiers_v1", "openenv": "openenv_server", "textarena": "textarena_game"}
"""Each kind's adapter module in ADAPTERS."""
OPERATIONS = frozenset({"tasks", "rollout", "reset", "step", "close"})
LOAD_FAILED = 3
LINE_LIMIT = 1 << 26
"""Longest request line (64 MiB): a task row with a long prompt fits."""


def _failure(exc: BaseException) -> str:
    tail = "".join(traceback.format_exception(exc, limit=-3)).strip()
    return f"{type(exc).__name__}: {exc}\n{tail}"


def _adapter_module(kind: str) -> Any:
    if kind not in KINDS:
        raise ValueError(f"no adapter for environment kind {kind!r} (known: {sorted(KINDS)})")
    path = ADAPTERS / f"{KINDS[kind]}.py"
    spec = importlib.util.spec_from_file_location(f"rlbus_hosted_{kind}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an import would: dataclasses (and typing) look their
    # module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Host:
    def __init__(self, out: Any):
        self.out = out
        self.running: dict[int, asyncio.Task[None]] = {}

    def send(self, reply: dict[str, Any]) -> None:
        self.out.write(json.dumps(reply, default=str) + "\n")
        self.out.flush()

    async def handle(self, adapter: Any, request: dict[str, Any]) -> None:
        rid = request.get("id", -1)
        op, params = request.get("op"), request.get("params") or {}
        try:
            if op == "ping":
                result: Any = {"pid": os.getpid()}
            elif op in OPERATIONS and callable(getattr(adapter, op, None)):
                result = await getattr(adapter, op)(**params)
            else:
                raise ValueError(f"this environment has no operation {op!r}")
            self.send({"id": rid, "ok": True, "result": result})
        except asyncio.CancelledError:
            self.send({"id": rid, "ok": False, "error": "cancelled"})
        except Exception as exc:
            self.send({"id": rid, "ok": False, "error": _failure(exc)})
        finally:
            self.running.pop(rid, None)

    async def serve(self, adapter: Any) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            try:
                request = json.loads(line)
            except ValueError as exc:
                self.send({"id": -1, "ok": False, "error": f"unreadable request: {exc}"})
                continue
            if request.get("op") == "cancel":
                target = self.running.get((request.get("params") or {}).get("target", -1))
                if target is not None:
                    target.cancel()
                continue
            rid = request.get("id", -1)
            self.running[rid] = asyncio.create_task(self.handle(adapter, request))
        for task in list(self.running.values()):
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)


async def main(kind: str, target: str, args: dict[str, Any]) -> int:
    # The protocol keeps the real stdout; whatever the environment prints goes to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    host = Host(out)
    adapter: Any = None
    try:
        try:
            adapter = _adapter_module(kind).Adapter(target, args)
            described = await adapter.describe()
        except Exception as exc:
            host.send({"id": 0, "ok": False, "error": _failure(exc)})
            return LOAD_FAILED
        host.send({"id": 0, "ok": True, "result": described})
        await host.serve(adapter)
        return 0
    finally:
        # Whatever the adapter started (a server, an interception pool) ends with it, also
        # when describing failed.
        closing = getattr(adapter, "aclose", None)
        if closing is not None:
            await closing()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
