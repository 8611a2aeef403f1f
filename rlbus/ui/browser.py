"""A headless Chromium (Debian's `chromium` package; nothing is downloaded) driven over the
DevTools protocol: load a page and time it, run a script in it, press keys, take a screenshot.
The ui's browser tests and bench/analytics.py use it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

EXECUTABLES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
NAVIGATION_TIMING = """(() => {
  const n = performance.getEntriesByType("navigation")[0];
  return {load: n.loadEventEnd - n.startTime, response: n.responseStart - n.requestStart,
          status: n.responseStatus || 0, url: location.href};
})()"""
KEYS = {
    "ArrowDown": 40,
    "ArrowUp": 38,
    "Enter": 13,
    "Escape": 27,
}


class BrowserMissing(RuntimeError):
    """No Chromium on PATH."""


class BrowserError(RuntimeError):
    """The browser or a page did not do what was asked; says what."""


def executable() -> str:
    for name in EXECUTABLES:
        if path := shutil.which(name):
            return path
    raise BrowserMissing(
        f"no headless browser found (looked for {', '.join(EXECUTABLES)} on PATH): "
        "`.ci/run` installs Debian's chromium (apt-get install -y chromium)"
    )


class Browser:
    """`async with Browser() as b: await b.goto(url)`; one tab, closed with the browser."""

    def __init__(self, width: int = 1280, height: int = 900, timeout_s: float = 60):
        self.size = (width, height)
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Browser:
        self._profile = profile = Path(tempfile.mkdtemp(prefix="rlbus-chromium-"))
        self._log = (profile / "chromium.log").open("wb")
        self._proc = subprocess.Popen(
            [
                executable(),
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={self.size[0]},{self.size[1]}",
                "about:blank",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # chromium's helpers (zygote, crashpad) outlive the main process and keep writing
            # into the profile: a group of their own lets shutdown stop them all
            start_new_session=True,
        )
        try:
            port = await self._devtools_port(profile / "DevToolsActivePort")
            self._http = http = aiohttp.ClientSession()
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            page = next(t for t in targets if t.get("type") == "page")
            self._ws = await http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
            self._reader = asyncio.create_task(self._read())
            await self.send("Page.enable")
            await self.send("Runtime.enable")
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._shutdown()

    async def _devtools_port(self, announced: Path) -> int:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrowserError(
                    f"chromium exited with code {self._proc.returncode}: "
                    f"{Path(self._log.name).read_text(errors='replace')[-2000:]}"
                )
            lines = announced.read_text().split() if announced.exists() else []
            if lines:
                return int(lines[0])
            await asyncio.sleep(0.05)
        raise BrowserError(f"chromium did not open its DevTools port in {self.timeout_s:.0f}s")

    async def _shutdown(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        self._signal_group(signal.SIGTERM)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._signal_group(signal.SIGKILL)
        self._proc.wait()
        self._log.close()
        await self._remove_profile()

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    async def _remove_profile(self) -> None:
        # a killed helper's last write can still land just after the kill
        for _ in range(20):
            try:
                shutil.rmtree(self._profile)
                return
            except FileNotFoundError:
                return
            except OSError:
                await asyncio.sleep(0.1)
        shutil.rmtree(self._profile, ignore_errors=True)

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self._events.put_nowait(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        if self._ws is None:
            raise BrowserError("the browser is not started: use `async with Browser() as b`")
        call = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[call] = future
        await self._ws.send_str(json.dumps({"id": call, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, self.timeout_s)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    async def _event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while (left := deadline - time.monotonic()) > 0:
            event = await asyncio.wait_for(self._events.get(), left)
            if event.get("method") == method:
                return event.get("params", {})
        raise BrowserError(f"no {method} within {self.timeout_s:.0f}s")

    def _forget_events(self) -> None:
        while not self._events.empty():
            self._events.get_nowait()

    async def goto(self, url: str) -> dict[str, float]:
        """Load `url`; returns its timing (see `loaded`)."""
        self._forget_events()
        reply = await self.send("Page.navigate", url=url)
        if reply.get("errorText"):
            raise BrowserError(f"{url}: {reply['errorText']}")
        return await self.loaded()

    async def loaded(self) -> dict[str, float]:
        """Wait for the page's load event; the navigation's timing in ms (`load`: request to
        load event end, `response`: request to first byte) and its HTTP `status`."""
        await self._event("Page.loadEventFired")
        for _ in range(20):  # loadEventEnd is set just after the event's handlers ran
            timing = await self.evaluate(NAVIGATION_TIMING)
            if timing["load"] > 0:
                return timing
            await asyncio.sleep(0.02)
        return timing

    async def evaluate(self, expression: str) -> Any:
        reply = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in reply:
            raise BrowserError(
                f"script failed: {reply['exceptionDetails'].get('text')}: {expression[:200]}"
            )
        return reply["result"].get("value")

    async def dom(self) -> str:
        return await self.evaluate("document.documentElement.outerHTML")

    async def press(
        self, key: str, navigates: bool = False, ctrl: bool = False
    ) -> dict[str, float] | None:
        """One key press as a user makes it: keydown (with its text) then keyup; with
        `navigates`, wait for the page it opens and return its timing."""
        self._forget_events()
        code = KEYS.get(key, ord(key.upper()) if len(key) == 1 else 0)
        text = {"text": key} if len(key) == 1 and not ctrl else {}
        for kind in ("keyDown", "keyUp"):
            await self.send(
                "Input.dispatchKeyEvent",
                type=kind,
                key=key,
                windowsVirtualKeyCode=code,
                modifiers=2 if ctrl else 0,
                **(text if kind == "keyDown" else {}),
            )
        return await self.loaded() if navigates else None

    async def screenshot(self, path: Path) -> Path:
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path
