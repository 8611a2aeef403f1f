"""OpenEnv environments hosted in a venv of their own (`rlbus env install`, then
`openenv:PACKAGE`), for real: examples/openenv/guess_env and echo_env (OpenEnv's package
layout) installed by rlbus's installer with openenv-core from the registry, their worker
(environment/hosted/host.py) starting the package's own uvicorn server and playing each rollout
as a WebSocket session through OpenEnv's client, a scripted model over HTTP, and for
`rlbus eval` the embedded broker and a sink into chdb.

Installing needs the registry; under CI=true a failed install fails the module, elsewhere it
skips naming the failure."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ScriptedModel, ScriptedServer
from support.isolated import isolated_settings, running_sink
from support.pids import alive

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.config import Settings
from rlbus.environment import Environment, load_environment
from rlbus.environment.hosted.venvs import EnvInstallError, install_env
from rlbus.launch.eval import run_eval
from rlbus.schemas.chat import text_of

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("openenv-venvs")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "openenv"
TARGETS = (50, 7, 93, 1, 100)
RESETS = [{"target": t} for t in TARGETS] + [{"seed": s} for s in range(3)]
"""The guessing game's tasks: the number given, or drawn from a seed."""


def target_of(reset: dict[str, Any]) -> int:
    """The number a reset picks (as guess_env's environment draws it)."""
    return reset["target"] if "target" in reset else random.Random(reset["seed"]).randint(1, 100)


@pytest.fixture(scope="module")
def envs_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where this module's environments are installed (RLBUS_ENVS_DIR while it runs)."""
    root = tmp_path_factory.mktemp("openenv")
    old = os.environ.get("RLBUS_ENVS_DIR")
    os.environ["RLBUS_ENVS_DIR"] = str(root / "envs")
    try:
        yield root
    finally:
        if old is None:
            os.environ.pop("RLBUS_ENVS_DIR", None)
        else:
            os.environ["RLBUS_ENVS_DIR"] = old


def install(root: Path, name: str) -> Path:
    """examples/openenv/NAME installed by rlbus's installer: its venv. From a copy: setuptools
    builds in the source tree, where another test process may be building it too."""
    source = shutil.copytree(
        EXAMPLES / name, root / "src" / name, ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    try:
        return Path(install_env(root, str(source), say=lambda line: None).path)
    except EnvInstallError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI installs openenv-core 0.3.0 from the registry, and here: {exc}")
        pytest.skip(f"openenv-core 0.3.0 cannot be installed here: {exc}")


@pytest.fixture(scope="module")
def guess_venv(envs_root: Path) -> Path:
    return install(envs_root, "guess_env")


@pytest.fixture(scope="module")
def echo_venv(envs_root: Path) -> Path:
    return install(envs_root, "echo_env")


# -- scripted players ----------------------------------------------------------------------


def _turns(messages: list[dict[str, Any]]) -> int:
    return sum(m.get("role") == "assistant" for m in messages)


def binary_search(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """Halves the range the game's answers leave, replying in turn as a bare number, a JSON
    object and fenced JSON (each a form of action the adapter takes)."""
    low, high, last = 1, 100, None
    for message in messages:
        text = text_of(message.get("content"))
        if message.get("role") == "assistant":
            number = re.search(r"\d+", text)
            last = int(number.group()) if number else None
        elif message.get("role") == "user" and last is not None:
            if "too low" in text:
                low = last + 1
            elif "too high" in text:
                high = last - 1
    guess = (low + high) // 2
    action = json.dumps({"guess": guess})
    forms = [str(guess), action, f"My guess:\n```json\n{action}\n```"]
    return {"content": forms[_turns(messages) % 3]}


def always_50(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    return {"content": "50"}


def wrong_first(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """Words first (not an action), then a binary search."""
    return {"content": "fifty, I think"} if not _turns(messages) else binary_search(messages, None)


def echo_words(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    """Messages whose lengths differ by turn and by task (its reset, in the first user turn)."""
    first = next(text_of(m.get("content")) for m in messages if m.get("role") == "user")
    return {"content": f"echo {'x' * (len(first) % 7)} turn {'y' * _turns(messages)}"}


class Players:
    """One scripted model server; each test says who plays."""

    def __init__(self) -> None:
        self.play: Callable[[list[dict[str, Any]], Any], dict[str, Any]] = binary_search
        self.server = ScriptedServer(ScriptedModel(chat=lambda m, t: self.play(m, t)))


@pytest.fixture(scope="module")
def players() -> Iterator[Players]:
    chosen = Players()
    with chosen.server:
        yield chosen


def overrides(players: Players, **more: Any) -> dict[str, Any]:
    model = {"name": "scripted", "base_url": f"{players.server.url}/v1"}
    return {"model": model, "group_size": 1, **more}


@pytest.fixture(scope="module")
def guess(guess_venv: Path, players: Players) -> Iterator[Environment]:
    """openenv:guess_env with RESETS twice over; its worker (and server) shared by the tests."""
    env = load_environment(
        "openenv:guess_env", overrides(players, args={"resets": RESETS, "repeat": 2})
    )
    yield env
    env.taskset.worker.close()


@pytest.fixture(scope="module")
def settings(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("openenv-store")
    settings = isolated_settings(broker, root, flush_interval_s=0.1)
    with running_sink(settings, root / "logs"):
        yield settings


def evaluate(env: Environment, settings: Settings, n: int) -> str:
    run_id = f"oe-{uuid.uuid4().hex[:8]}"
    result = run_eval(env, settings, n=n, run_id=run_id, show_progress=False)
    assert (result.tally.rollouts, result.tally.errors) == (n, 0)
    return run_id


def stored(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    """Each rollout of the run: its reset, reward, turns, tokens and completion."""
    with open_store(settings.store.url, read_only=True) as store:
        rows = store.query(
            "SELECT r.info, s.reward, r.num_turns, r.prompt_tokens, r.completion_tokens, "
            "r.completion, r.status FROM scored AS s FINAL INNER JOIN "
            "(SELECT * FROM rollouts FINAL WHERE run_id = {run:String}) AS r USING rollout_id "
            "WHERE s.run_id = {run:String}",
            {"run": run_id},
        ).rows
    keys = ("info", "reward", "turns", "prompt_tokens", "completion_tokens", "completion")
    out = []
    for *values, status in rows:
        assert status == "ok"
        row = dict(zip(keys, values, strict=True))
        for key in ("info", "completion"):
            row[key] = json.loads(row[key]) if isinstance(row[key], str) else row[key]
        row["reset"] = row["info"]["hosted"]["reset"]
        out.append(row)
    return out


# -- tests ---------------------------------------------------------------------------------


def test_tasks_are_one_per_reset_repeated_and_the_same_each_time(guess: Environment) -> None:
    worker = guess.taskset.worker
    rows = worker.call("tasks", split="eval", start=0, count=100)
    assert (
        len(rows) == 2 * len(RESETS)
        and worker.call("tasks", split="eval", start=0, count=100) == rows
    )
    assert worker.call("tasks", split="eval", start=len(rows), count=10) == []
    assert [r["info"]["hosted"]["reset"] for r in rows] == RESETS + RESETS
    assert len({r["task_id"] for r in rows}) == len(rows)  # the same first observation for all
    system, user = rows[0]["prompt"]
    assert system["role"] == "system" and "just the value of its field `guess`" in system["content"]
    assert json.loads(user["content"]) == {
        "message": "I picked a number from 1 to 100. Guess it.",
        "tries_left": 7,
    }
    assert worker.described["framework"] == "openenv-core 0.3.0"


def test_rlbus_eval_of_the_guessing_game_stores_rewards_and_tokens(
    guess: Environment, players: Players, settings: Settings
) -> None:
    """A binary search finds every number (reward 1, at most 7 guesses); a player that always
    says 50 finds only 50, in one guess, and uses up its 7 tries elsewhere."""
    n = len(RESETS)
    players.play = binary_search
    searched = stored(settings, evaluate(guess, settings, n))
    assert sorted(r["reward"] for r in searched) == [1.0] * n
    assert all(1 <= r["turns"] <= 7 for r in searched)
    assert all(r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 for r in searched)

    players.play = always_50
    run_id = evaluate(guess, settings, n)
    fifties = stored(settings, run_id)
    got = sorted((json.dumps(r["reset"]), r["reward"], r["turns"]) for r in fifties)
    want = sorted(
        (json.dumps(reset), float(target_of(reset) == 50), 1 if target_of(reset) == 50 else 7)
        for reset in RESETS
    )
    assert got == want
    with open_store(settings.store.url, read_only=True) as store:
        sampled, tokened = store.query(
            "SELECT (SELECT count() FROM trace_nodes FINAL WHERE run_id = {run:String} AND "
            "sampled), (SELECT uniqExact(rollout_id) FROM tokens WHERE run_id = {run:String})",
            {"run": run_id},
        ).rows[0]
    assert sampled == sum(r["turns"] for r in fifties) and tokened == n


def test_an_invalid_action_gets_the_parse_error_back_and_no_step(
    guess: Environment, players: Players, settings: Settings
) -> None:
    players.play = wrong_first
    (row,) = stored(settings, evaluate(guess, settings, 1))
    assert row["reward"] == 1.0
    said = row["completion"][1]
    assert (
        said["role"] == "user"
        and "Invalid action (guess: Input should be a valid integer" in said["content"]
    )

    # What the worker reports for the rollout (the harness puts it in the rollout's state).
    worker = guess.taskset.worker
    task = worker.call("tasks", split="eval", start=0, count=1)[0]  # target 50
    worker.call("reset", session="s", task=task)
    wrong = worker.call("step", session="s", action='{"number": 50}')
    assert "guess: Field required" in wrong["observation"] and wrong["done"] is False
    right = worker.call("step", session="s", action="```\n50\n```")
    assert (right["reward"], right["done"]) == (1.0, True)
    assert worker.call("close", session="s") == {
        "reward": 1.0,
        "rewards": {"openenv_reward": 1.0},
        "metrics": {"steps": 1, "invalid_actions": 1},
        "stop": "done",
    }


ECHO_CHECK = """
import asyncio, json, sys
from echo_env import EchoAction, EchoEnv

async def main(url, episodes):
    totals = []
    for reset, actions in episodes:
        async with EchoEnv(base_url=url) as env:
            await env.reset(**reset)
            total = 0.0
            for action in actions:
                result = await env.step(EchoAction(message=action))
                total += result.reward or 0.0
        totals.append(total)
    print(json.dumps(totals))

asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
"""


def test_echo_rewards_are_what_openenv_own_client_gets_from_the_same_server(
    echo_venv: Path, players: Players, settings: Settings
) -> None:
    """The stored reward of each rollout is the total that echo_env's own client gets stepping
    the same server with the rollout's replies; an episode without an end stops at max_turns."""
    resets = [{"max_steps": 3}, {"max_steps": 1}, {}]
    env = load_environment(
        "openenv:echo_env",
        overrides(players, args={"resets": resets}, harness={"max_turns": 4}),
    )
    players.play = echo_words
    try:
        rows = stored(settings, evaluate(env, settings, len(resets)))
        url = env.taskset.worker.described["server"]["url"]
        episodes = [
            (
                r["reset"],
                [text_of(m["content"]) for m in r["completion"] if m["role"] == "assistant"],
            )
            for r in rows
        ]
        assert sorted(len(actions) for _, actions in episodes) == [1, 3, 4]
        check = subprocess.run(
            [
                str(echo_venv / "bin" / "python"),
                "-c",
                ECHO_CHECK,
                url,
                json.dumps(episodes),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert check.returncode == 0, check.stderr[-3000:]
        theirs = json.loads(check.stdout)
        assert len(set(theirs)) == 3 and min(theirs) > 0
        assert [r["reward"] for r in rows] == pytest.approx(theirs)
    finally:
        env.taskset.worker.close()


def _gone(pid: int, within_s: float = 15) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def test_the_server_ends_with_its_worker_closed_or_killed(
    guess_venv: Path, players: Players
) -> None:
    env = load_environment("openenv:guess_env", overrides(players))
    worker = env.taskset.worker
    described = worker.start()
    host, server = worker.pid, described["server"]["pid"]
    assert host is not None and alive(server)
    os.kill(host, signal.SIGKILL)  # no aclose: the server dies with it (its death signal)
    assert _gone(server), f"the server {server} outlived its worker {host}"

    described = worker.start()  # a new worker, a new server
    host, server = worker.pid, described["server"]["pid"]
    assert host is not None and alive(server)
    worker.close()
    assert _gone(host) and _gone(server)


def test_a_killed_worker_passes_for_dead_while_its_reader_thread_waits_on_it(
    guess_venv: Path, players: Players
) -> None:
    """Popen.poll() answers None while another thread holds the process's waitpid lock (the
    reader thread reaping a worker that just died): start() must not take that for running
    and hand back the dead worker's description (CI once got its dead server's pid)."""
    env = load_environment("openenv:guess_env", overrides(players))
    worker = env.taskset.worker
    first = worker.start()
    process = worker._process
    assert process is not None
    try:
        with process._waitpid_lock:  # as the reader thread holds it while it reaps
            os.kill(process.pid, signal.SIGKILL)
            assert _gone(process.pid)  # a zombie nobody can reap yet
            again = worker.start()
        assert worker.pid != process.pid
        assert again["server"]["pid"] != first["server"]["pid"] and alive(again["server"]["pid"])
    finally:
        worker.close()


CAPACITY_ONE = """
from openenv.core.env_server.http_server import create_app
from guess_env.models import GuessAction, GuessObservation
from guess_env.server.guess_env_environment import GuessEnvironment

app = create_app(GuessEnvironment, GuessAction, GuessObservation)  # one session at a time
"""


def test_rollouts_wait_for_a_session_on_a_server_of_one(
    guess_venv: Path, players: Players, settings: Settings
) -> None:
    """OpenEnv's default server takes one session at a time: rollouts in flight together queue
    for it instead of failing."""
    site = next(guess_venv.glob("lib/python*/site-packages"))
    (site / "guess_one.py").write_text(CAPACITY_ONE)
    resets = [{"target": t} for t in TARGETS]
    args = {"resets": resets, "app": "guess_one:app"}
    env = load_environment("openenv:guess_env", overrides(players, args=args))
    players.play = binary_search
    try:
        rows = stored(settings, evaluate(env, settings, len(resets)))
    finally:
        env.taskset.worker.close()
    assert [r["reward"] for r in rows] == [1.0] * len(resets)
