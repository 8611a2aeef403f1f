"""Debian's headless chromium under Playwright, for the ui's browser tests and
bench/analytics.py: one tab to drive, and the timing of the page it shows. The system's chromium
is launched by path, so nothing is downloaded (no `playwright install`)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

from playwright.sync_api import Page, sync_playwright

EXECUTABLES = ("chromium", "chromium-browser", "google-chrome")
LOADED = "performance.getEntriesByType('navigation')[0]?.loadEventEnd > 0"
"""Playwright's `load` is the event firing; its end (what `load` times) is set only after the
event's handlers ran."""
NAVIGATION_TIMING = """(() => {
  const n = performance.getEntriesByType("navigation")[0];
  return {load: n.loadEventEnd - n.startTime, response: n.responseStart - n.requestStart,
          status: n.responseStatus || 0, url: location.href};
})()"""


class BrowserMissing(RuntimeError):
    """No Chromium on PATH."""


def executable() -> str:
    for name in EXECUTABLES:
        if path := shutil.which(name):
            return path
    raise BrowserMissing(
        f"no headless browser found (looked for {', '.join(EXECUTABLES)} on PATH): "
        "`.ci/run` installs Debian's chromium (apt-get install -y chromium)"
    )


@contextlib.contextmanager
def chromium_page(width: int = 1280, height: int = 900, timeout_s: float = 60) -> Iterator[Page]:
    """`with chromium_page() as page: page.goto(url)`: one tab of a fresh headless chromium,
    closed on leaving; `timeout_s` bounds the launch and every action on the page."""
    path = executable()
    with (
        sync_playwright() as playwright,
        playwright.chromium.launch(
            executable_path=path, headless=True, timeout=timeout_s * 1000
        ) as browser,
    ):
        page = browser.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(timeout_s * 1000)
        yield page


def timing(page: Page) -> dict[str, Any]:
    """The shown page's navigation once its load event ended: `load` (request to load event
    end) and `response` (request to first byte) in ms, its HTTP `status` and its `url`."""
    page.wait_for_function(LOADED)
    return page.evaluate(NAVIGATION_TIMING)
