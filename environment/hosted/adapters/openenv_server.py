"""OpenEnv (openenv-core): an environment package in OpenEnv's layout (`models.py`,
`server/app.py` holding `app = create_app(...)`, `client.py`), installed in this venv. Its
server is started here, once per worker, as OpenEnv runs one without Docker (`python -m uvicorn
PACKAGE.server.app:app`), and each rollout is one WebSocket session on it through OpenEnv's own
client, so many episodes run at once. rlbus's chat loop plays the episode: each model reply is
parsed into an action and stepped, the observation comes back as the next user turn, and the
reward is the total of the step rewards. A task's prompt is a system message saying how to write
an action (from the server's /schema) and the first observation of a reset made when the task
is read; the rollout then resets a session of its own with the same arguments.

Args (env.toml `args`): `resets` (a list of reset keyword arguments, one task each; default
`[{}]`; give a seed where the environment draws its episode, so a task is the same episode
every time), `repeat` (the list that many times over; default 1), `app` (`module:attr` of the
FastAPI app, when it is not TARGET's `server.app:app`), `message_timeout_s` (the longest a reset
or step may take; default 300).
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path
from typing import Any

HEALTH_TIMEOUT_S = 120.0
"""How long the server may take to answer /health (importing openenv-core alone takes ~5 s)."""
STOP_TIMEOUT_S = 5.0
"""How long the server may take to exit on SIGTERM before it is killed."""
CAPACITY_RETRY_S = (0.05, 1.0)
"""First and longest wait before asking again for a session when the server is at its
`max_concurrent_envs` (OpenEnv's default is 1): rollouts queue for its sessions."""
CLOSE_TIMEOUT_S = 5.0
"""How long a closed session waits for the server to close its connection."""
OPENING = 16
"""Sessions opened at once to read tasks' first observations."""
PR_SET_PDEATHSIG = 1
_FENCE = re.compile(r"```(?:[A-Za-z][\w+-]*[ \t]*\n)?(.*?)```", re.DOTALL)
"""A code fence; a language tag only before a line break (```50``` holds 50)."""
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""HTTP to the server on loopback, never through a proxy the environment passes on."""


class InvalidAction(ValueError):
    """A reply that is not an action; its message goes back to the model."""


class ServerError(RuntimeError):
    """An error the server answered a session's message with (OpenEnv's WSErrorResponse)."""

    def __init__(self, data: dict[str, Any]):
        self.code = str(data.get("code", "UNKNOWN"))
        self.data = data
        super().__init__(f"{data.get('message', 'unknown error')} ({self.code})")

    def details(self) -> str:
        """The validation errors, as a person reads them."""
        errors = self.data.get("errors") or []
        parts = [
            f"{'.'.join(map(str, e.get('loc', ()))) or 'action'}: {e.get('msg')}" for e in errors
        ]
        return "; ".join(parts) or str(self)


_client_class: Any = None


def _session_class() -> Any:
    """OpenEnv's generic client, keeping the server's error details (its own raises a
    RuntimeError without the validation errors), and reading an error the server sent before
    closing the connection (a full server refuses a session that way)."""
    global _client_class
    if _client_class is not None:
        return _client_class
    from openenv.core.generic_client import GenericEnvClient
    from websockets.exceptions import ConnectionClosed

    class Session(GenericEnvClient):
        async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
            try:
                await self._send(message)
            except ConnectionClosed:
                pass  # what the server said before closing is still to be read
            response = await self._receive()
            if response.get("type") == "error":
                raise ServerError(response.get("data") or {})
            return response

        async def disconnect(self) -> None:
            # OpenEnv's own sends `close` and closes the socket at once; the server, closing
            # it too, then fails with a traceback in its log for every session. Here the
            # server closes first.
            ws, self._ws = self._ws, None
            if ws is None:
                return
            try:
                await ws.send(json.dumps({"type": "close"}))
                await asyncio.wait_for(ws.wait_closed(), CLOSE_TIMEOUT_S)
            except (ConnectionClosed, TimeoutError, OSError):
                pass
            finally:
                await ws.close()

    _client_class = Session
    return Session


def observation_text(observation: Any) -> str:
    """An observation as the model reads it: its fields as JSON (OpenEnv's serialized
    observation holds neither reward nor done)."""
    return json.dumps(observation, ensure_ascii=False)


def parse_action(reply: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The model's reply as an action: a JSON object (in a code fence or not), or, for an
    action with one required field, that field's value: for a string field the reply as it is
    (an echo's reward counts its every character), or what its code fence holds; else the
    reply as JSON."""
    fenced = _FENCE.search(reply)
    text = fenced.group(1).strip() if fenced else reply
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None
        parsed = False
    else:
        parsed = True
    if isinstance(value, dict):
        return value
    required = schema.get("required") or []
    if len(required) != 1:
        raise InvalidAction(f"the reply is not a JSON object with the fields {required}")
    field = required[0]
    declared = (schema.get("properties") or {}).get(field, {})
    kinds = [declared.get("type"), *(o.get("type") for o in declared.get("anyOf", []))]
    return {field: text if "string" in kinds or not parsed else value}


def action_format(schema: dict[str, Any]) -> str:
    """How to reply, from the action's JSON schema (its `metadata` is OpenEnv's own field)."""
    shown = {
        **schema,
        "properties": {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"},
    }
    required = schema.get("required") or []
    single = f", or just the value of its field `{required[0]}`" if len(required) == 1 else ""
    return (
        f"a JSON object matching this JSON schema{single}:\n{json.dumps(shown, ensure_ascii=False)}"
    )


SERVER_TRIES = 3
"""Starts of the server, each on a port of its own, before its exit is the worker's error."""


class ServerExited(RuntimeError):
    """The OpenEnv server exited before it served."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on loopback `port` (Linux /proc): a
    /health answer on a port taken meanwhile by another process's server is not ours."""
    try:
        sockets = {
            link[len("socket:[") : -1]
            for fd in os.listdir(f"/proc/{pid}/fd")
            if (link := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith("socket:[")
        }
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
    except OSError:  # gone, or not Linux: the health check alone decides
        return not sys.platform.startswith("linux")
    # local address (hex ip:port), state 0A = LISTEN, inode
    return any(
        int(row[1].rsplit(":", 1)[1], 16) == port and row[3] == "0A" and row[9] in sockets
        for row in rows
    )


def _die_with_parent() -> Callable[[], None] | None:
    """For Popen's preexec_fn (Linux): the child is SIGKILLed when this process dies, even by
    SIGKILL, when aclose never runs. The death signal is tied to the thread that forks: the
    server is started from the event loop's thread, which lives as long as the worker."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the worker died before the signal was armed
            os._exit(1)

    return arm


def _app_of(target: str, args: dict[str, Any]) -> str:
    """The server's app: `args.app`, else `server/app.py`'s `app` in TARGET's module, or in a
    module the installed distribution provides (OpenEnv names its packages `openenv-NAME`),
    found without importing it (importing openenv-core takes seconds: the server does it)."""
    if args.get("app"):
        return str(args["app"])
    module = target.replace("-", "_")
    candidates = [module]
    try:  # rlbus env install's record of this venv
        record = json.loads((Path(sys.prefix) / "rlbus-env.json").read_text())
        candidates += [m for m in record.get("modules", []) if m != module]
    except (OSError, ValueError):
        pass
    for name in candidates:
        try:
            spec = util.find_spec(name)
        except (ImportError, ValueError):
            continue
        places = list(spec.submodule_search_locations or []) if spec else []
        if any((Path(place) / "server" / "app.py").is_file() for place in places):
            return f"{name}.server.app:app"
    raise ValueError(
        f"no OpenEnv server app for {target!r} in this venv: neither {module}.server.app nor "
        f"the installed modules {candidates[1:]} have one; name it with args.app = "
        f"'module:attr'"
    )


@dataclass
class Episode:
    """One rollout's session."""

    client: Any
    total: float = 0.0
    steps: int = 0
    invalid: int = 0
    done: bool = False


class Adapter:
    def __init__(self, target: str, args: dict[str, Any]):
        self.target = target
        self.app = _app_of(target, args)
        resets = args.get("resets", [{}])
        if not isinstance(resets, list) or not all(isinstance(r, dict) for r in resets):
            raise ValueError(f"args.resets must be a list of reset keyword dicts, not {resets!r}")
        self.resets: list[dict[str, Any]] = resets or [{}]
        self.repeat = int(args.get("repeat", 1))
        self.message_timeout_s = float(args.get("message_timeout_s", 300))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen[bytes] | None = None
        self.schema: dict[str, Any] = {}
        self.first: dict[int, str] = {}
        """The first observation of each entry of `resets` (read once: rows are stable)."""
        self.episodes: dict[str, Episode] = {}
        self.warned = False
        # OpenEnv's client sets NO_PROXY around each connect and puts the old value back, which
        # races between concurrent sessions: loopback is made proxy-free once, here.
        for var in ("NO_PROXY", "no_proxy"):
            have = os.environ.get(var, "")
            os.environ[var] = f"{have},127.0.0.1,localhost" if have else "127.0.0.1,localhost"

    # -- the server ------------------------------------------------------------------------

    async def describe(self) -> dict[str, Any]:
        for attempt in range(1, SERVER_TRIES + 1):
            self._start_server()
            try:
                _session_class()  # imports openenv-core while the server does the same
                await self._until_healthy()
                self.schema = self._get("/schema")["action"]
                break
            except ServerExited:
                # Its port was free when chosen; another process may have bound it since.
                await self._stop_server()
                if attempt == SERVER_TRIES:
                    raise
                self.port = _free_port()
                self.url = f"http://127.0.0.1:{self.port}"
            except BaseException:
                await self._stop_server()  # the host does not call aclose when loading fails
                raise
        version = metadata.version("openenv-core")
        return {
            "mode": "steps",
            "framework": f"openenv-core {version}",
            "server": {"url": self.url, "pid": self.server.pid, "app": self.app},
        }

    def _start_server(self) -> None:
        module, _, attr = self.app.partition(":")
        argv = [sys.executable, "-m", "uvicorn", f"{module}:{attr or 'app'}"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        # Its output goes to the worker's stderr (rlbus keeps its tail); it stays in the
        # worker's process group, so killing the worker's group kills it too.
        self.server = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent()
        )

    def _get(self, path: str, timeout: float = 10.0) -> Any:
        with _DIRECT.open(f"{self.url}{path}", timeout=timeout) as response:
            return json.load(response)

    async def _until_healthy(self) -> None:
        assert self.server is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HEALTH_TIMEOUT_S
        while True:
            code = self.server.poll()
            if code is not None:
                raise ServerExited(
                    f"the OpenEnv server ({self.app}) exited with code {code} before it served "
                    f"(its output is in the worker's stderr)"
                )
            try:
                healthy = self._get("/health", timeout=1.0).get("status") == "healthy"
                if healthy and _listens(self.server.pid, self.port):
                    return
            except (OSError, ValueError):
                pass
            if loop.time() > deadline:
                raise TimeoutError(
                    f"the OpenEnv server ({self.app}) did not answer {self.url}/health within "
                    f"{HEALTH_TIMEOUT_S:g}s"
                )
            await asyncio.sleep(0.1)

    async def _stop_server(self) -> None:
        server, self.server = self.server, None
        if server is None or server.poll() is not None:
            return
        server.terminate()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_TIMEOUT_S
        while server.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if server.poll() is None:
            server.kill()
            server.wait()

    async def aclose(self) -> None:
        episodes, self.episodes = list(self.episodes.values()), {}
        await asyncio.gather(*(e.client.disconnect() for e in episodes), return_exceptions=True)
        await self._stop_server()

    # -- sessions --------------------------------------------------------------------------

    async def _open(self, kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """A new session, reset with `kwargs`: the client and the reset's result. A full server
        is asked again until it has room."""
        wait, longest = CAPACITY_RETRY_S
        while True:
            client = _session_class()(base_url=self.url, message_timeout_s=self.message_timeout_s)
            try:
                await client.connect()
                return client, await client.reset(**kwargs)
            except ServerError as exc:
                await client.disconnect()
                if exc.code != "CAPACITY_REACHED":
                    raise
            except BaseException:
                await client.disconnect()
                raise
            await asyncio.sleep(wait)
            wait = min(2 * wait, longest)

    async def _first_observation(self, entry: int) -> str:
        if entry not in self.first:
            client, result = await self._open(self.resets[entry])
            await client.disconnect()
            self.first.setdefault(entry, observation_text(result.observation))
        return self.first[entry]

    # -- operations ------------------------------------------------------------------------

    async def tasks(self, split: str, start: int, count: int) -> list[dict[str, Any]]:
        end = min(start + count, len(self.resets) * self.repeat)
        indices = range(start, end)
        entries = sorted({i % len(self.resets) for i in indices})
        gate = asyncio.Semaphore(OPENING)

        async def read(entry: int) -> None:
            async with gate:
                await self._first_observation(entry)

        await asyncio.gather(*(read(e) for e in entries))
        system = (
            f"You act in the OpenEnv environment {self.target}. Each of your replies is one "
            f"action: {action_format(self.schema)}\nThe environment answers each action with "
            f"its observation, as JSON."
        )
        rows = []
        for index in indices:
            entry = index % len(self.resets)
            reset = self.resets[entry]
            digest = hashlib.blake2b(
                json.dumps([self.target, split, index, reset], sort_keys=True).encode(),
                digest_size=6,
            ).hexdigest()
            rows.append(
                {
                    # The first observation alone need not tell tasks apart (a guessing game's
                    # does not say the number): the id names the reset.
                    "task_id": f"openenv:{self.target}:{split}:{index}:{digest}",
                    "prompt": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": self.first[entry]},
                    ],
                    "answer": "",
                    "info": {"hosted": {"index": index, "reset": reset}},
                }
            )
        return rows

    async def reset(self, session: str, task: dict[str, Any]) -> dict[str, Any]:
        if session in self.episodes:
            raise ValueError(f"session {session} is already open")
        reset = task["info"]["hosted"]["reset"]
        client, result = await self._open(reset)
        self.episodes[session] = Episode(client)
        observation = observation_text(result.observation)
        prompt = task.get("prompt") or []
        if prompt and prompt[-1].get("content") != observation and not self.warned:
            self.warned = True
            print(
                f"openenv:{self.target}: an episode began otherwise than its task's prompt says "
                f"(reset {reset}): give the resets a seed so that a task is one episode",
                file=sys.stderr,
            )
        return {"observation": observation}

    async def step(self, session: str, action: str) -> dict[str, Any]:
        episode = self.episodes[session]
        try:
            result = await episode.client.step(parse_action(action, self.schema))
        except (InvalidAction, ServerError) as exc:
            if isinstance(exc, ServerError) and exc.code != "VALIDATION_ERROR":
                raise
            # Not an action: no step; the model reads why and may try again.
            episode.invalid += 1
            why = exc.details() if isinstance(exc, ServerError) else str(exc)
            return {
                "observation": f"Invalid action ({why}). Reply with {action_format(self.schema)}",
                "reward": 0.0,
                "done": False,
            }
        reward = float(result.reward or 0.0)
        episode.steps += 1
        episode.total += reward
        episode.done = bool(result.done)
        return {
            "observation": observation_text(result.observation),
            "reward": reward,
            "done": episode.done,
        }

    async def close(self, session: str) -> dict[str, Any]:
        episode = self.episodes.pop(session, None)
        if episode is None:
            raise ValueError(f"no open session {session}")
        await episode.client.disconnect()
        return {
            "reward": episode.total,
            "rewards": {"openenv_reward": episode.total},
            "metrics": {"steps": episode.steps, "invalid_actions": episode.invalid},
            # rlbus's chat loop ends an episode that is not done only at its max_turns.
            "stop": "done" if episode.done else "max_turns",
        }
