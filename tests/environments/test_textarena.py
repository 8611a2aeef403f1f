"""TextArena games hosted in a venv of their own (`textarena:GAME`), for real: textarena 0.7.4
installed from the registry by rlbus's installer, its worker (environment/hosted/host.py with
adapters/textarena_game.py) run by that venv's python, `run_eval` through the embedded broker
into chdb, and a scripted model over HTTP playing the games.

What rlbus stored is checked against TextArena itself: the same moves replayed in the same
seeded game by the venv's python, with none of rlbus's code, give the same rewards and endings.
Installing needs the registry; under CI=true a failed install fails the module, elsewhere it
skips naming the failure."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ScriptedModel, ScriptedServer
from support.isolated import isolated_settings, running_sink

from rlbus.bus import EmbeddedBroker
from rlbus.bus.store import open_store
from rlbus.config import ConfigError, Settings
from rlbus.environment import Environment, load_environment
from rlbus.environment.hosted.venvs import EnvInstallError, install_env, venv_python
from rlbus.launch.eval import run_eval
from rlbus.schemas.chat import text_of

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("textarena-venv")]

TEXTARENA = "textarena==0.7.4"
EVAL_SEEDS = 1_000_000
"""Where the adapter's eval seeds start."""
WON = "Congratulations! You guessed the correct number."
"""TextArena's reason for a won Guess The Number."""

REPLAY = """
import json, random, sys
import textarena as ta
out = []
for game in json.load(sys.stdin):
    random.seed(game["seed"])
    env = ta.make(env_id=game["game"])
    env.reset(num_players=1, seed=game["seed"])
    done = False
    for action in game["actions"]:
        done, _ = env.step(action)
        if done:
            break
    rewards, info = env.close()
    out.append({"done": done, "reward": (rewards or {}).get(0), "reason": info[0].get("reason")})
print("REPLAYED " + json.dumps(out))
"""
"""TextArena's own account of a game: seed, make, reset, the moves; its rewards and reason."""


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The python of textarena's venv, installed by rlbus's installer into a data dir of its
    own, which the task set finds through the settings (RLBUS_STORE__URL)."""
    root = tmp_path_factory.mktemp("textarena-data")
    patch = pytest.MonkeyPatch()
    patch.setenv("RLBUS_STORE__URL", f"chdb://{root}")
    patch.delenv("RLBUS_ENVS_DIR", raising=False)
    try:
        try:
            installed = install_env(root, TEXTARENA, say=lambda line: None)
        except EnvInstallError as exc:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI installs {TEXTARENA} from the registry, and here: {exc}")
            pytest.skip(f"{TEXTARENA} cannot be installed here: {exc}")
        yield venv_python(Path(installed.path))
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def settings(
    broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    root = tmp_path_factory.mktemp("textarena-store")
    settings = isolated_settings(broker, root, flush_interval_s=0.1)
    with running_sink(settings, root / "logs"):
        yield settings


def _load(game: str, url: str = "http://127.0.0.1:9/v1", **overrides: Any) -> Environment:
    return load_environment(
        f"textarena:{game}", {"model": {"name": "scripted", "base_url": url}, **overrides}
    )


def _moves(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(the model's move, the game's answer to it) for each move so far."""
    turns = [(m["role"], text_of(m.get("content"))) for m in messages[2:]]
    return [(move, answer) for (_, move), (_, answer) in zip(turns[::2], turns[1::2], strict=False)]


def bisect(messages: list[dict[str, Any]], tools: Any) -> dict[str, str]:
    """Guess The Number by binary search, from the range in the rules and the hints."""
    low, high = map(int, re.findall(r"between (\d+) and (\d+)", text_of(messages[1]["content"]))[0])
    for move, answer in _moves(messages):
        guess = int(re.findall(r"\[(\d+)\]", move)[0])
        if "higher" in answer:
            low = guess + 1
        elif "lower" in answer:
            high = guess - 1
    return {"content": f"Halving the range: [{(low + high) // 2}]"}


def stubborn(messages: list[dict[str, Any]], tools: Any) -> dict[str, str]:
    """The same invalid move, whatever the game says."""
    return {"content": "I guess [twelve]"}


def one_guess(messages: list[dict[str, Any]], tools: Any) -> dict[str, str]:
    """Guesses 10, then a number out of range until the game ends: TextArena's reward is then
    how near 10 was (or 1 when it was the number)."""
    return {"content": "[10]" if len(messages) == 2 else "[99]"}


def sweeper(messages: list[dict[str, Any]], tools: Any) -> dict[str, str]:
    """Minesweeper: the centre, then the first hidden cell of the latest board. Where the mines
    are is drawn at the first move, from the rollout's own generator."""
    if len(messages) == 2:
        return {"content": "[2 2]"}
    board = next(
        text_of(m["content"]) for m in reversed(messages) if "Board" in text_of(m["content"])
    )
    rows = [line.split() for line in board.splitlines() if re.match(r"^\s*\d+\s+\S", line)]
    width = len(rows[0])  # the column header
    cells = [(int(r[0]), c) for r in rows[1:] if len(r) == width + 1 for c in range(width)]
    row, col = next(((r, c) for r, c in cells if rows[r + 1][c + 1] == "."), (0, 0))
    return {"content": f"[{row} {col}]"}


def stored(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    """Each rollout of the run: its task's seed, the moves, what the environment reported, the
    reward scored, the tokens counted."""
    with open_store(settings.store.url, read_only=True) as store:
        rows = store.query(
            "SELECT r.task_id, r.info, r.completion, s.reward, r.num_turns, r.prompt_tokens, "
            "r.completion_tokens, r.status, r.error FROM rollouts AS r FINAL INNER JOIN "
            "(SELECT * FROM scored FINAL WHERE run_id = {run:String}) AS s USING rollout_id "
            "WHERE r.run_id = {run:String} ORDER BY r.task_id, r.sample_index",
            {"run": run_id},
        ).rows
    out = []
    for task_id, info, completion, reward, turns, prompt_tokens, completion_tokens, *status in rows:
        info = json.loads(info) if isinstance(info, str) else info
        completion = json.loads(completion) if isinstance(completion, str) else completion
        out.append(
            {
                "task_id": task_id,
                "seed": info["hosted"]["seed"],
                "game": info["hosted"]["game"],
                "reported": info["state"]["hosted"],
                "actions": [text_of(m["content"]) for m in completion if m["role"] == "assistant"],
                "answers": [text_of(m["content"]) for m in completion if m["role"] == "user"],
                "reward": reward,
                "num_turns": turns,
                "tokens": (prompt_tokens, completion_tokens),
                "status": tuple(status),
            }
        )
    return out


def sampled_nodes(settings: Settings, run_id: str) -> int:
    with open_store(settings.store.url, read_only=True) as store:
        return store.query(
            "SELECT count() FROM trace_nodes FINAL WHERE run_id = {run:String} AND sampled",
            {"run": run_id},
        ).rows[0][0]


def evaluate(
    settings: Settings, game: str, player: Any, n: int, **overrides: Any
) -> list[dict[str, Any]]:
    with ScriptedServer(ScriptedModel(chat=player)) as server:
        env = _load(game, f"{server.url}/v1", **overrides)
        run_id = f"ta-{uuid.uuid4().hex[:8]}"
        try:
            result = run_eval(env, settings, n=n, run_id=run_id, show_progress=False)
        finally:
            env.taskset.worker.close()
    rollouts = stored(settings, run_id)
    assert result.tally.errors == 0, [r["status"] for r in rollouts]
    assert len(rollouts) == result.tally.rollouts == n * env.config.group_size
    assert sampled_nodes(settings, run_id) == sum(r["num_turns"] for r in rollouts)
    return rollouts


def replay(python: Path, rollouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    games = [{k: r[k] for k in ("game", "seed", "actions")} for r in rollouts]
    done = subprocess.run(
        [str(python), "-c", REPLAY],
        input=json.dumps(games),
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("REPLAYED ")]
    return json.loads(line.removeprefix("REPLAYED "))


def test_binary_search_wins_every_game_with_tokens_stored(python: Path, settings: Settings) -> None:
    rollouts = evaluate(settings, "GuessTheNumber-v0", bisect, n=8)
    # Eval games: the eval seeds, one task each (every prompt is the same rules).
    assert sorted(r["seed"] for r in rollouts) == list(range(EVAL_SEEDS, EVAL_SEEDS + 8))
    assert len({r["task_id"] for r in rollouts}) == 8
    assert [r["reward"] for r in rollouts] == [1.0] * 8
    for r in rollouts:
        assert r["reported"]["stop"] == WON
        assert r["reported"]["rewards"] == {"game_reward": 1.0}
        assert r["reported"]["metrics"]["turns"] == r["num_turns"] == len(r["actions"]) <= 5
        assert r["tokens"][0] > 0 and r["tokens"][1] > 0
    # Some games take several guesses: the hints reached the player, each the game's latest
    # answer alone (not the history again), and nothing after the winning guess.
    assert max(r["num_turns"] for r in rollouts) > 1
    hints = {"The target number is higher.", "The target number is lower."}
    assert all(set(r["answers"]) <= hints for r in rollouts)
    assert all(len(r["answers"]) == r["num_turns"] - 1 for r in rollouts)
    assert [g["reward"] for g in replay(python, rollouts)] == [1] * 8


def test_a_player_that_repeats_an_invalid_move_loses(python: Path, settings: Settings) -> None:
    rollouts = evaluate(settings, "GuessTheNumber-v0", stubborn, n=3)
    for r in rollouts:
        # TextArena warns once, then ends the game; no guess was ever valid: reward 0.
        assert r["reward"] == 0.0 and r["num_turns"] == 2
        assert r["reported"]["stop"].startswith("Invalid Move")
        assert r["reported"]["metrics"] == {"turns": 2, "invalid_move": 1.0}
    theirs = replay(python, rollouts)
    assert [(g["reward"], g["reason"]) for g in theirs] == [
        (r["reward"], r["reported"]["stop"]) for r in rollouts
    ]


@pytest.mark.parametrize(
    ("game", "player", "overrides"),
    [
        ("GuessTheNumber-v0", one_guess, {}),
        # Two samples per game, all run at once in the one worker: Minesweeper draws its mines
        # at the first move, so each rollout must keep its own generator.
        ("Minesweeper-v0-small", sweeper, {"group_size": 2, "harness": {"max_turns": 6}}),
    ],
)
def test_rewards_are_what_textarena_gives_for_the_same_moves(
    python: Path, settings: Settings, game: str, player: Any, overrides: dict[str, Any]
) -> None:
    rollouts = evaluate(settings, game, player, n=8, **overrides)
    theirs = replay(python, rollouts)
    ours = [
        (r["reward"], r["reported"]["stop"] if r["reported"]["stop"] != "max_turns" else None)
        for r in rollouts
    ]
    assert ours == [(g["reward"] if g["done"] else 0.0, g["reason"]) for g in theirs]
    assert len({reward for reward, _ in ours}) > 2, ours  # rewards that differ by game
    if game.startswith("Minesweeper"):
        # The two samples of a game, played the same way, are the same game.
        assert ours[::2] == ours[1::2]


def test_tasks_are_seeded_games_and_eval_games_are_not_training_games(python: Path) -> None:
    env = _load("2048-v0", args={"n": 6})
    other = _load("2048-v0", args={"n": 3, "seed": 2})
    try:
        train, evals = list(env.tasks()), list(env.eval_tasks())
        again = list(other.tasks())  # another worker process
    finally:
        env.taskset.worker.close()
        other.taskset.worker.close()
    assert [t.info["hosted"]["seed"] for t in train] == list(range(6))
    assert [t.info["hosted"]["seed"] for t in evals] == list(range(EVAL_SEEDS, EVAL_SEEDS + 6))
    assert not {t.task_id for t in train} & {t.task_id for t in evals}
    assert len({json.dumps(t.prompt) for t in train + evals}) == 12  # 2048 boards differ
    # The same seed is the same task, whoever asks.
    assert [(t.task_id, t.prompt) for t in again] == [(t.task_id, t.prompt) for t in train[2:5]]
    system, user = train[0].prompt
    assert system["role"] == "system" and "square brackets" in system["content"]
    assert user["role"] == "user" and "2048" in user["content"]


def test_a_game_that_does_not_exist_or_cannot_be_played_is_an_error_naming_it(
    python: Path,
) -> None:
    for game, why in [
        ("GuessTheNumbr-v0", r"has no game 'GuessTheNumbr-v0' \(did you mean GuessTheNumber-v0"),
        ("TicTacToe-v0", r"'TicTacToe-v0' cannot be played here: .*number of players has to be 2"),
    ]:
        env = _load(game)
        try:
            with pytest.raises(ConfigError, match=rf"textarena:{game}(.|\n)*{why}"):
                list(env.tasks())
        finally:
            env.taskset.worker.close()
