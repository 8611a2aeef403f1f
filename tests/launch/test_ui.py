"""`rlbus ui` over a real run's store: a 4-step in-process RL run on a tiny model, then a sink
process that holds the store (as a live run does) while more events arrive through it: an
errored rollout, a second score for a rollout, a dead letter and a second run on the same tasks.
The real `rlbus ui` command serves it through the sink's endpoint; pages are checked over HTTP
against the store's own SQL, and in Debian's headless chromium (DOM, keys, screenshots)."""

from __future__ import annotations

import asyncio
import gc
import html
import http.client
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
from playwright.sync_api import Page
from support.browser import BrowserMissing, chromium_page, executable, timing
from support.in_process import run_in_process
from support.isolated import module_settings
from support.runs import EXAMPLE, run_config
from support.sinks import publish, start_sink
from tokenizers import Tokenizer

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import Store, open_store
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, settings_variables
from rlbus.consumers.inference.model_init import init_model
from rlbus.launch.processes import alive
from rlbus.schemas import DeadLetter, RolloutCompleted, RolloutScored, derived_id
from rlbus.ui.charts import format_number
from rlbus.ui.server import serve

pytestmark = pytest.mark.xdist_group("ui-world")  # the module's world: one run, made once

NEWEST_SCORES = "(SELECT * FROM scored FINAL ORDER BY rollout_id, ts DESC LIMIT 1 BY rollout_id)"
"""Each rollout's newest score (a rescore replaces what the run's pages count), from the base
table."""
MARKER = "<script>alert('owned')</script> half an answer"
"""An errored rollout's completion: shown as text, never run."""


@dataclass
class World:
    settings: Settings
    url: str
    run: str
    other: str
    shots: Path
    tokenizer: Path
    errored: str
    rescored: str
    shared_task: str

    def get(self, path: str, **params: Any) -> str:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=60)
        assert response.status_code == 200, response.text[-2000:]
        return response.text


def start_ui(
    settings: Settings, log: Path, tokenizer: Path | None = None
) -> tuple[subprocess.Popen, str]:
    """The real command, on a free port; its URL is the first thing it prints."""
    decode = ["--tokenizer", str(tokenizer)] if tokenizer else []
    process = subprocess.Popen(
        [sys.executable, "-m", "rlbus", "ui", "--port", "0", *decode],
        env={**os.environ, **settings_variables(settings), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not found:
        process.kill()
        raise AssertionError(f"rlbus ui printed {line!r}; log: {log.read_text()[-2000:]}")
    return process, found.group(0)


def extras(store: Store, run: str, other: str) -> tuple[list, str, str, str]:
    """Events a live run could add: an errored rollout, a second score (a rescore) of a stored
    rollout, a dead letter, and a second run's rollouts of two of this run's tasks."""
    # Two different tasks: a task redelivered under load is rolled out again under the same
    # rollout id, and both copies of that rollout would otherwise be the first two rows.
    rows = store.query(
        "SELECT any(rollout_id), task_id, any(group_id), any(prompt), any(env) FROM rollouts "
        "WHERE run_id = {run:String} GROUP BY task_id ORDER BY task_id LIMIT 2",
        {"run": run},
    ).rows
    (rescored, task, group, prompt, env), (_, other_task, *_) = rows
    errored = derived_id("errored", run)
    events: list = [
        RolloutCompleted(
            run_id=run,
            rollout_id=errored,
            group_id=group,
            task_id=task,
            env=env,
            prompt=prompt,
            completion=[{"role": "assistant", "content": MARKER}],
            status="error",
            error="the harness timed out",
            error_kind="timeout",
            duration_s=8.0,
        ),
        RolloutScored(
            run_id=run, rollout_id=errored, group_id=group, task_id=task, env=env, status="error"
        ),
        RolloutScored(
            run_id=run,
            rollout_id=rescored,
            group_id=group,
            task_id=task,
            env=env,
            reward=0.625,
            rewards={"rescored": 0.625},
        ),
        DeadLetter(
            run_id=run,
            origin_topic="tasks",
            origin_partition=0,
            origin_offset=7,
            consumer_group="env",
            error="decode: not msgpack",
        ),
    ]
    for t in (task, other_task):
        for sample in range(2):
            rollout = derived_id("other", t, sample)
            rollout_completed = RolloutCompleted(
                run_id=other,
                rollout_id=rollout,
                event_id=derived_id(rollout, "completed"),
                group_id=derived_id("other-group", t),
                task_id=t,
                env=env,
                sample_index=sample,
                group_size=2,
                prompt=prompt,
                completion=[{"role": "assistant", "content": f"run B says {sample}"}],
                duration_s=1.0,
            )
            events += [
                rollout_completed,
                RolloutScored(
                    run_id=other,
                    rollout_id=rollout,
                    group_id=derived_id("other-group", t),
                    task_id=t,
                    env=env,
                    sample_index=sample,
                    group_size=2,
                    reward=float(sample),
                ),
            ]
    # A redelivered task rolled out again: the same ids, other timings (two contents, one id).
    first = next(e for e in events if isinstance(e, RolloutCompleted) and e.run_id == other)
    events.append(msgspec.structs.replace(first, duration_s=2.5))
    return events, errored, rescored, task


@pytest.fixture(scope="module")
def world(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("ui")
    settings = module_settings(broker, tmp)
    model = tmp / "tiny"
    init_model(model, seed=0)
    cfg = run_config(settings, model, tmp, drop_zero_signal=False)
    asyncio.run(run_in_process(cfg, EXAMPLE, timeout_s=240))
    sink = start_sink(settings, tmp / "logs")
    ui = None
    try:
        run, other = settings.run_id, f"{settings.run_id}-b"
        with open_store(settings.store.url, read_only=True) as store:
            assert store.via is not None  # the sink holds the store; reads go through it
            events, errored, rescored, task = extras(store, run, other)
            asyncio.run(publish(settings, events))
            wait_for(
                lambda: store.query(
                    "SELECT (SELECT count() FROM rollouts WHERE run_id = {o:String}) = 5 "
                    "AND (SELECT count() FROM dead_letters WHERE run_id = {r:String}) = 1 "
                    "AND (SELECT count() FROM scored WHERE rollout_id = {s:String}) = 2",
                    {"o": other, "r": run, "s": rescored},
                ).rows[0][0],
                60,
                "the extra events in the store",
                check=alive(sink),
            )
        ui, url = start_ui(settings, tmp / "ui.log", model)
        shots = tmp / "screenshots"
        shots.mkdir()
        yield World(settings, url, run, other, shots, model, errored, rescored, task)
    finally:
        if ui is not None:
            ui.terminate()
            ui.wait(15)
        sink.stop()


def sql(world: World, query: str, **params: Any) -> list[tuple]:
    with open_store(world.settings.store.url, read_only=True) as store:
        return store.query(query, {"run": world.run, **params}).rows


def rollout_ids(page: str) -> list[str]:
    return re.findall(r'<a href="/rollouts/([0-9a-f-]{36})"', page)


def cursor(page: str, rel: str) -> dict[str, str] | None:
    found = re.search(rf'<a rel="{rel}" href="/rollouts\?([^"]+)"', page)
    if not found:
        return None
    return dict(httpx.QueryParams(html.unescape(found.group(1))))


# -- over HTTP -------------------------------------------------------------------------


def test_runs_page_lists_both_runs_with_mode_steps_and_latest_reward(world: World) -> None:
    page = world.get("/")
    (steps,) = sql(world, "SELECT max(step) FROM train_steps WHERE run_id = {run:String}")[0]
    version, reward = sql(
        world,
        f"SELECT policy_version, avgIf(reward, status = 'ok') FROM {NEWEST_SCORES} "
        "WHERE run_id = {run:String} GROUP BY policy_version ORDER BY policy_version DESC LIMIT 1",
    )[0]
    row = re.search(rf'<tr>\s*<td><a href="/runs/{world.run}">.*?</tr>', page, re.S)
    assert row, page
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)
    text = [re.sub(r"<[^>]+>", "", c).strip() for c in cells]
    assert text[1] == "reverse_text" and text[3] == "train" and text[5] == str(steps)
    assert text[8] == f"{format_number(reward)} @v{version}"
    assert f'href="/runs/{world.other}"' in page and ">eval<" in page


def test_run_page_shows_the_curves_and_the_views(world: World) -> None:
    page = world.get(f"/runs/{world.run}")
    for chart in ("reward", "held_out", "loss", "staleness", "drops", "throughput", "weights"):
        assert f'id="chart-{chart}"' in page
    # The run's real weight updates: every version the trainer wrote was served by inference.
    updates = sql(
        world,
        "SELECT version, workers, last_served_s, write_s FROM weight_updates "
        "WHERE run_id = {run:String} AND version > 0 ORDER BY version",
    )
    assert updates and all(workers >= 1 and served >= 0 for _, workers, served, _ in updates)
    for version, _, served, _ in updates:
        assert f"to last worker · version {version}: {format_number(served)}" in page
    losses = sql(
        world, "SELECT step, loss FROM train_steps FINAL WHERE run_id = {run:String} ORDER BY step"
    )
    for step, loss in losses:
        assert f"loss · step {step}: {format_number(loss)}" in page
    # Reward by version, from the base table rather than the view the page reads.
    for version, rollouts, mean in sql(
        world,
        f"SELECT policy_version, count(), avgIf(reward, status = 'ok') FROM {NEWEST_SCORES} "
        "WHERE run_id = {run:String} GROUP BY policy_version ORDER BY policy_version",
    ):
        assert f"all · version {version}: {format_number(mean)}" in page
        assert re.search(rf"<td class=\"n\">{version}</td>\s*<td class=\"n\">{rollouts}</td>", page)
    assert 'href="/rollouts?run=' in page and "error_kind=timeout" in page
    assert "dead_letter:tasks" in page and "pass@k" in page


def test_rollouts_pages_forwards_and_back_by_cursor(world: World) -> None:
    expected = [
        r[0]
        for r in sql(
            world,
            "SELECT DISTINCT rollout_id FROM rollouts WHERE run_id = {run:String} "
            "ORDER BY rollout_id",
        )
    ]
    assert len(expected) > 50  # more than one page
    seen, params, pages = [], {"run": world.run}, []
    while params is not None:
        page = world.get("/rollouts", **params)
        pages.append(rollout_ids(page))
        seen += pages[-1]
        params = cursor(page, "next")
    assert seen == expected
    back = cursor(world.get("/rollouts", run=world.run, after=pages[0][-1]), "prev")
    assert back is not None and rollout_ids(world.get("/rollouts", **back)) == pages[0]


@pytest.mark.parametrize(
    "filters, where",
    [
        ({"version": "{sampled}"}, "{sampled} BETWEEN min_policy_version AND max_policy_version"),
        ({"error_kind": "timeout"}, "status != 'ok' AND error_kind = 'timeout'"),
        (
            {"min_reward": "0.5", "max_reward": "0.75"},
            "rollout_id IN (SELECT rollout_id FROM scored WHERE reward BETWEEN 0.5 AND 0.75)",
        ),
        (
            {"env": "reverse_text", "text": "half an ANSWER"},
            "positionCaseInsensitive(completion, 'half an answer') > 0",
        ),
    ],
)
def test_rollout_filters_select_what_sql_selects(
    world: World, filters: dict[str, str], where: str
) -> None:
    # {sampled}: the first trained version some rollout was sampled at. Which versions that
    # is depends on timing (a CI run had no rollout at version 1); a run with none is a failure.
    ((sampled,),) = sql(
        world,
        "SELECT min(max_policy_version) FROM rollouts "
        "WHERE run_id = {run:String} AND max_policy_version > 0",
    )
    assert sampled > 0
    filters = {k: v.format(sampled=sampled) for k, v in filters.items()}
    where = where.format(sampled=sampled)
    expected = [
        r[0]
        for r in sql(
            world,
            f"SELECT DISTINCT rollout_id FROM rollouts WHERE run_id = {{run:String}} AND {where} "
            "ORDER BY rollout_id LIMIT 50",
        )
    ]
    assert expected
    assert rollout_ids(world.get("/rollouts", run=world.run, **filters)) == expected


def test_user_text_is_a_value_never_sql_nor_markup(world: World) -> None:
    for text in ("' OR 1=1 --", "{text:String}", "\\'; DROP TABLE rollouts"):
        page = world.get("/rollouts", text=text)
        assert 'id="no-rollouts"' in page and rollout_ids(page) == []
    page = world.get("/rollouts", version="two")
    assert "version: &#39;two&#39; is not an integer" in page
    shown = world.get(f"/rollouts/{world.errored}")
    assert "<script>alert" not in shown and "&lt;script&gt;alert(&#39;owned&#39;)" in shown


def test_rollout_page_has_messages_trace_scores_timing_and_tokens(world: World) -> None:
    page = world.get(f"/rollouts/{world.rescored}")
    # Every score, the rescore included.
    rewards = sql(
        world, "SELECT reward FROM scored FINAL WHERE rollout_id = {r:String}", r=world.rescored
    )
    scores = re.search(r'<table class="nav" id="scores">.*?</table>', page, re.S).group(0)
    assert len(re.findall(r"<tr>", scores)) == 1 + len(rewards) == 3
    assert all(format_number(r) in scores for (r,) in rewards) and "rescored" in scores
    # The trace graph: a node per stored trace node.
    (nodes,) = sql(
        world,
        "SELECT count() FROM trace_nodes FINAL WHERE rollout_id = {r:String}",
        r=world.rescored,
    )[0]
    assert len(re.findall(r'<circle class="node ', page)) == nodes > 0
    # Timing: the model's share is the sum of its calls.
    (model_s, duration) = sql(
        world,
        "SELECT (SELECT sum(duration_s) FROM tokens FINAL WHERE rollout_id = {r:String}), "
        "(SELECT any(duration_s) FROM rollouts WHERE rollout_id = {r:String})",
        r=world.rescored,
    )[0]
    assert 0 < model_s < duration
    assert (
        f"model {format_number(model_s)} s" in page
        and f"{format_number(duration)} s in all" in page
    )
    # Token strip: one underlined (loss) token per sampled id, decoded, with its version.
    ((ids, version),) = sql(
        world,
        "SELECT completion_ids, policy_version FROM tokens FINAL WHERE rollout_id = {r:String}",
        r=world.rescored,
    )
    sampled = re.findall(
        r'<span class="tok lp(\d) m1" title="id (\d+) · logprob [^"]* version (\d+)">'
        r"([^<]*)</span>",
        page,
    )
    assert [int(i) for _, i, _, _ in sampled] == list(ids)
    assert {int(v) for *_, v, _ in sampled} == {version}
    # Decoded with the run's tokenizer: each token's own text (a byte token may be part of a
    # character, so the strip shows what that one token decodes to).
    tokenizer = Tokenizer.from_file(str(world.tokenizer / "tokenizer.json"))
    assert [html.unescape(t) for *_, t in sampled] == [
        tokenizer.decode([i], skip_special_tokens=False) for i in ids
    ]


def test_compare_shows_both_curves_and_the_same_task_side_by_side(world: World) -> None:
    page = world.get("/compare", a=world.run, b=world.other, task=world.shared_task)
    assert "A reward" in page and "B reward" in page
    assert "run B says 0" in page and "run B says 1" in page
    sides = re.search(r'<div class="sides" id="sides">.*', page, re.S).group(0)
    a_side, b_side = sides.split('<section class="side">')[1:3]
    a_rollouts = sql(
        world,
        "SELECT DISTINCT rollout_id FROM rollouts "
        "WHERE run_id = {run:String} AND task_id = {t:String}",
        t=world.shared_task,
    )
    assert {r for (r,) in a_rollouts} == set(
        re.findall(r'href="/rollouts/([0-9a-f-]{36})"', a_side)
    )
    assert len(re.findall(r'href="/rollouts/', b_side)) == 2


def test_console_is_read_only_and_bounded(world: World) -> None:
    page = world.get(
        "/sql",
        q="SELECT step, loss FROM train_steps WHERE run_id = '" + world.run + "' ORDER BY step",
    )
    assert 'id="chart-console"' in page and 'id="result"' in page
    refused = world.get("/sql", q="DROP TABLE rollouts")
    assert "refused" in refused and 'id="result"' not in refused
    assert sql(world, "SELECT count() > 0 FROM rollouts")[0][0]  # still there
    many = world.get("/sql", q="SELECT number FROM system.numbers LIMIT 5000")
    assert "1,000 rows (the limit" in many and '<td class="n">999</td>' in many
    assert '<td class="n">1000</td>' not in many


def test_a_foreign_host_name_is_refused(world: World) -> None:
    response = httpx.get(f"{world.url}/", headers={"Host": "rebound.example"})
    assert response.status_code == 400


# -- in the browser --------------------------------------------------------------------


def png_is_painted(path: Path) -> bool:
    """A PNG with more than a few distinct pixel bytes (a blank page has one or two)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    chunks, at = [], 8
    while at < len(data):
        (size,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        if kind == b"IDAT":
            chunks.append(data[at + 8 : at + 8 + size])
        at += 12 + size
    pixels = zlib.decompress(b"".join(chunks))
    return width > 100 and height > 100 and len(set(pixels[: 4 * width * 200])) > 16


def visit(page: Page, world: World, path: str, name: str) -> dict[str, Any]:
    page.goto(f"{world.url}{path}")
    loaded = timing(page)
    assert loaded["status"] == 200, (path, loaded)
    shot = world.shots / f"{name}.png"
    page.screenshot(path=shot, full_page=True)
    assert png_is_painted(shot), f"{shot} looks blank"
    return loaded


def press_to_open(page: Page, key: str) -> dict[str, Any]:
    """Press `key` (Playwright's names: "Control+Enter") as a user does; the timing of the page
    it opens."""
    with page.expect_navigation():
        page.keyboard.press(key)
    return timing(page)


def check_pages_in_browser(world: World) -> None:
    with chromium_page() as page:
        visit(page, world, "/", "runs")
        runs = page.evaluate(
            "[...document.querySelectorAll('#runs tbody tr td:first-child')]"
            ".map(t => t.textContent.trim())"
        )
        assert world.run in runs and world.other in runs

        visit(page, world, f"/runs/{world.run}", "run")
        charts = page.evaluate(
            "[...document.querySelectorAll('svg.chart')]"
            ".map(s => s.querySelectorAll('circle.dot').length)"
        )
        assert len(charts) == 7 and all(n > 0 for n in charts), charts
        assert page.evaluate("document.getElementById('run-id').textContent") == world.run

        visit(page, world, f"/rollouts?run={world.run}", "rollouts")
        rows = page.evaluate("document.querySelectorAll('#rollouts tbody tr').length")
        assert rows == 50

        visit(page, world, f"/rollouts/{world.rescored}", "rollout")
        strip = page.evaluate("document.querySelectorAll('#strip-0 .tok.m1').length")
        (ids,) = sql(
            world,
            "SELECT completion_ids FROM tokens FINAL WHERE rollout_id = {r:String}",
            r=world.rescored,
        )[0]
        assert strip == len(ids)
        assert page.evaluate("document.querySelectorAll('svg.trace circle.node').length") > 0

        visit(page, world, f"/compare?a={world.run}&b={world.other}", "compare")
        assert "run B says" in page.evaluate("document.getElementById('sides').textContent")

        visit(page, world, "/sql?q=SELECT+number,+number*number+AS+sq+FROM+numbers(8)", "sql")
        cells = page.evaluate(
            "[...document.querySelectorAll('#result tbody tr')].map(r => r.cells[1].textContent)"
        )
        assert cells == [str(n * n) for n in range(8)]
        assert page.evaluate("document.querySelectorAll('#chart-console circle.dot').length") == 8


def check_keys_in_browser(world: World) -> None:
    with chromium_page() as page:
        page.goto(f"{world.url}/rollouts?run={world.run}")
        page.keyboard.press("j")
        page.keyboard.press("j")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("k")
        selected = page.evaluate(
            "[...document.querySelectorAll('#rollouts tbody tr')]"
            ".findIndex(r => r.classList.contains('selected'))"
        )
        assert selected == 1
        first = page.evaluate(
            "document.querySelector('#rollouts tbody tr.selected a').getAttribute('href')"
        )
        opened = press_to_open(page, "Enter")
        assert opened and opened["url"].endswith(first)
        page.goto(f"{world.url}/rollouts?run={world.run}")
        page.keyboard.press("/")
        assert page.evaluate("document.activeElement.name") == "run"
        page.keyboard.press("Escape")
        later = press_to_open(page, "n")
        assert later and "after=" in later["url"]
        page.keyboard.press("g")
        console = press_to_open(page, "s")
        assert console and console["url"].endswith("/sql")
        page.evaluate(
            "document.querySelector('#console textarea').value = 'SELECT 41 + 1 AS answer'"
        )
        page.keyboard.press("/")
        ran = press_to_open(page, "Control+Enter")
        assert ran and "q=SELECT" in ran["url"]
        assert page.evaluate("document.querySelector('#result tbody td').textContent") == "42"
        page.keyboard.press("Escape")
        page.keyboard.press("?")
        assert page.evaluate("!document.getElementById('help').hidden")


def test_every_page_in_a_real_browser(world: World) -> None:
    """Debian's chromium, headless. Missing, it fails (never skips): `.ci/run` installs it."""
    check_pages_in_browser(world)
    assert sorted(p.name for p in world.shots.iterdir()) == sorted(
        f"{n}.png" for n in ("runs", "run", "rollouts", "rollout", "compare", "sql")
    )


def test_keyboard_moves_opens_filters_pages_and_runs_sql(world: World) -> None:
    check_keys_in_browser(world)


def test_a_missing_browser_fails_and_says_what_installs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrowserMissing, match=r"`\.ci/run` installs Debian's chromium"):
        executable()


def test_the_ui_reads_on_after_the_process_holding_the_store_stops(
    settings: Settings, tmp_path: Path
) -> None:
    """While a sink holds the store the ui reads through its endpoint; once it stops, the ui
    opens the directory itself and the same page still shows the run."""
    sink = start_sink(settings, tmp_path / "logs")
    ui = None
    try:
        scored = RolloutScored(
            run_id=settings.run_id, rollout_id="r1", group_id="g", task_id="t", env="e", reward=1
        )
        asyncio.run(publish(settings, [scored]))
        with open_store(settings.store.url, read_only=True) as store:
            wait_for(
                lambda: store.query("SELECT count() FROM scored").rows[0][0] == 1,
                60,
                "the score in the store",
                check=alive(sink),
            )
        ui, url = start_ui(settings, tmp_path / "ui.log")
        assert settings.run_id in httpx.get(f"{url}/", timeout=60).text
        sink.stop()
        response = httpx.get(f"{url}/", timeout=60)
        assert response.status_code == 200 and settings.run_id in response.text
        assert "through" not in response.text.split("<footer>")[1]  # read directly now
    finally:
        if ui is not None:
            ui.terminate()
            ui.wait(15)
        sink.stop()


def server_side(client: socket.socket) -> socket.socket:
    """This process's end of `client`'s connection (the ui runs in this process): the socket
    whose peer is `client`, found among the process's open files."""
    for fd in os.listdir("/proc/self/fd"):
        if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
            continue
        sock = socket.socket(fileno=os.dup(int(fd)))
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername() == client.getsockname():
                return sock
        except OSError:  # not connected, or not an inet socket
            pass
        sock.close()
    raise AssertionError(f"no socket in this process is connected to {client.getsockname()}")


def test_a_kept_alive_connection_does_not_wait_for_delayed_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Browsers keep connections alive: a response must not stall ~40 ms between its headers
    and its body (Nagle's algorithm against the client's delayed ACK), so every connection the
    ui accepts has TCP_NODELAY set."""
    servers: list[uvicorn.Server] = []
    real_run = uvicorn.Server.run

    def run(server: uvicorn.Server, sockets: list) -> None:
        servers.append(server)
        real_run(server, sockets=sockets)

    monkeypatch.setattr(uvicorn.Server, "run", run)
    urls: list[str] = []
    store = f"chdb://{tmp_path / 'store'}"
    thread = threading.Thread(target=serve, args=(store,), kwargs={"ready": urls.append})
    thread.start()
    try:
        wait_for(lambda: bool(servers) and servers[0].started, 60, "the ui", 0.05)
        port = int(urls[0].rsplit(":", 1)[1])
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            for _ in range(2):  # the second request on the same, kept-alive, connection
                client.request("GET", "/static/ui.css")
                response = client.getresponse()
                assert response.status == 200 and response.read()
            assert client.sock is not None  # still open: kept alive
            with server_side(client.sock) as accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            client.close()
    finally:
        if servers:
            servers[0].should_exit = True
        thread.join(60)
        gc.unfreeze()
    assert not thread.is_alive()


def test_the_ui_keeps_its_start_up_objects_out_of_full_collections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full garbage collection over the objects its imports made (~150k) took ~70 ms in the
    middle of a page; the ui freezes them once built, so collections scan what requests make."""
    frozen: list[int] = []

    def run(server: uvicorn.Server, sockets: list) -> None:
        frozen.append(gc.get_freeze_count())
        for sock in sockets:
            sock.close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    try:
        serve(f"chdb://{tmp_path / 'store'}", ready=lambda url: None)
    finally:
        gc.unfreeze()
    assert frozen and frozen[0] > 10_000
