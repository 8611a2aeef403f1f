"""TextArena (0.7): one single-player game, `textarena:GAME` (e.g. GuessTheNumber-v0), played by
rlbus's chat loop: each model reply is the move, the game's answer the next user turn.

Each task is the game reset with a seed: train seeds are `seed` (args, default 0) upward, eval
seeds the same from `seed + EVAL_OFFSET`, so no eval game is a training game; `n` (default 1000)
tasks per split. The prompt is a system message (how to give a move) and the seeded initial
observation; a rollout's reset with the task's seed must reproduce it, or it fails saying so.

TextArena draws from the process-global `random` (and numpy's, for the games that use it) in
reset and in some steps (Minesweeper lays its mines on the first move, 2048 spawns tiles). Many
rollouts share this process, so each keeps its own generator state, swapped in around its reset
and each step (with no await in between): a rollout plays exactly the game a solo replay of its
seed and moves plays, whatever else runs beside it.

Observations are the game's own messages, only the new ones each turn (TextArena's observation
wrappers repeat the whole history every turn); the player's move, echoed back, is left out. Its
action wrappers still apply (a move without brackets is bracketed)."""

from __future__ import annotations

import difflib
import random
import sys
from dataclasses import dataclass
from typing import Any

import textarena as ta
from textarena.envs.registration import ENV_REGISTRY

VERSION = getattr(ta, "__version__", "?")
EVAL_OFFSET = 1_000_000
"""Where eval seeds start, above the train seeds."""
SYSTEM_PROMPT = (
    "You are playing a text game. The user's messages are the game: its rules first, then its "
    "answer to each of your moves. Reply with one move in the exact format the rules ask for, "
    "usually in square brackets such as [5]; the game reads the first bracketed token, so put "
    "nothing else in brackets."
)

RandomState = tuple[Any, Any]
"""The global `random` state and numpy's (None where numpy is not loaded)."""


def _rng_state() -> RandomState:
    numpy = sys.modules.get("numpy")
    return random.getstate(), numpy.random.get_state() if numpy is not None else None


def _set_rng_state(state: RandomState) -> None:
    random.setstate(state[0])
    numpy = sys.modules.get("numpy")
    if numpy is not None and state[1] is not None:
        numpy.random.set_state(state[1])


def _seed_rng(seed: int) -> None:
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def _render(messages: list[Any]) -> str:
    """The game's messages to the player as one text, without the player's own move echoed."""
    return "\n\n".join(
        str(text).strip("\n")
        for _, text, kind in messages
        if kind != ta.ObservationType.PLAYER_ACTION and str(text).strip()
    )


@dataclass
class Game:
    """One rollout's game."""

    env: Any
    """The wrapped environment `ta.make` gave (its action wrappers apply to each move)."""
    base: Any
    """The unwrapped one: its get_observation gives the new messages, unrendered."""
    rng: RandomState
    turns: int = 0
    done: bool = False
    reward: float = 0.0
    """The player's reward, once the game is over (TextArena gives none before)."""
    outcome: str = ""
    """Why the game ended (TextArena's game_info reason)."""
    invalid_move: bool = False


def _unwrapped(env: Any) -> Any:
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


class Adapter:
    def __init__(self, target: str, args: dict[str, Any]):
        if target not in ENV_REGISTRY:
            near = difflib.get_close_matches(target, list(ENV_REGISTRY), n=5)
            raise ValueError(
                f"TextArena {VERSION} has no game {target!r}"
                + (f" (did you mean {', '.join(near)}?)" if near else "")
            )
        self.game_id = target
        self.seed = int(args.get("seed", 0))
        self.n = int(args.get("n", 1000))
        if not 0 <= self.n <= EVAL_OFFSET:
            raise ValueError(f"textarena:{target}: n must be within 0..{EVAL_OFFSET}, not {self.n}")
        self.games: dict[str, Game] = {}
        # A game that cannot be played here (it needs nltk data, an API key, more players, a
        # module that is not installed) fails now, naming itself, not in every rollout.
        try:
            # Made once first, so that the game's modules (numpy, for some) are imported before
            # any seeding: the first game is seeded as every later one.
            ta.make(env_id=target)
            game, observation = self._new_game(self.seed)
        except Exception as exc:
            raise RuntimeError(
                f"TextArena game {target!r} cannot be played here: {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(game.base.state, ta.SinglePlayerState):
            raise ValueError(
                f"TextArena game {target!r} is a game for several players "
                f"({type(game.base.state).__name__}); rlbus plays single-player games"
            )
        if not observation:
            raise ValueError(f"TextArena game {target!r} shows the player nothing at reset")

    def _new_game(self, seed: int) -> tuple[Game, str]:
        """A game reset with `seed`, and its initial observation. Synchronous: nothing else
        draws from the global generators between the seeding and the reset."""
        _seed_rng(seed)
        env = ta.make(env_id=self.game_id)
        env.reset(num_players=1, seed=seed)
        base = _unwrapped(env)
        _, messages = base.get_observation()
        return Game(env=env, base=base, rng=_rng_state()), _render(messages)

    async def describe(self) -> dict[str, Any]:
        return {"mode": "steps", "framework": f"textarena {VERSION}"}

    async def tasks(self, split: str, start: int, count: int) -> list[dict[str, Any]]:
        if split not in ("train", "eval"):
            raise ValueError(f"no split {split!r} (train, eval)")
        first = self.seed + (EVAL_OFFSET if split == "eval" else 0)
        rows = []
        for index in range(max(start, 0), min(start + count, self.n)):
            seed = first + index
            _, observation = self._new_game(seed)
            rows.append(
                {
                    # Many games' first observation does not show what the seed chose (Guess
                    # The Number's secret), so rlbus's id from the prompt would make every
                    # task one: the id names the game and its seed.
                    "task_id": f"textarena:{self.game_id}:{seed}",
                    "prompt": [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": observation},
                    ],
                    "answer": "",
                    "info": {"hosted": {"game": self.game_id, "seed": seed}},
                }
            )
        return rows

    async def reset(self, session: str, task: dict[str, Any]) -> dict[str, Any]:
        hosted = task["info"]["hosted"]
        if hosted.get("game") != self.game_id:
            raise ValueError(f"the task is a game of {hosted.get('game')!r}, not {self.game_id!r}")
        game, observation = self._new_game(int(hosted["seed"]))
        shown = [m.get("content") for m in task.get("prompt") or [] if m.get("role") == "user"]
        if shown and shown[-1] != observation:
            raise RuntimeError(
                f"TextArena game {self.game_id!r} reset with seed {hosted['seed']} is not the "
                "game its task showed: the game is not reproducible from its seed"
            )
        self.games[session] = game
        return {"observation": observation}

    async def step(self, session: str, action: str) -> dict[str, Any]:
        game = self.games[session]
        if game.done:
            return {"observation": None, "reward": 0.0, "done": True}
        _set_rng_state(game.rng)
        done, _ = game.env.step(action)
        game.rng = _rng_state()
        game.turns += 1
        _, messages = game.base.get_observation()
        if not done:
            return {"observation": _render(messages), "reward": 0.0, "done": False}
        rewards, info = game.env.close()
        player = (info or {}).get(0, {})
        reward = (rewards or {}).get(0, 0.0)
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            # TextArena 0.7.4's Countdown, Cryptarithm and Slitherlink pass set_invalid_move
            # its arguments swapped: a game they end on an invalid move has its reason for
            # reward. Scoring that would be a guess.
            raise ValueError(
                f"TextArena game {self.game_id!r} ended with a reward that is not a number "
                f"({reward!r}; its reason: {player.get('reason')!r})"
            )
        game.done, game.reward = True, float(reward)
        game.outcome = str(player.get("reason", "done"))
        game.invalid_move = bool(player.get("invalid_move"))
        return {"observation": None, "reward": game.reward, "done": True}

    async def close(self, session: str) -> dict[str, Any]:
        game = self.games.pop(session, None)
        if game is None:
            raise KeyError(f"no game for rollout session {session!r}")
        # A game the chat loop ended first (its max_turns) has no reward: TextArena gives
        # none mid-game.
        return {
            "reward": game.reward,
            "rewards": {"game_reward": game.reward},
            "metrics": {"turns": game.turns, "invalid_move": float(game.invalid_move)},
            "stop": game.outcome if game.done else "max_turns",
        }

    async def aclose(self) -> None:
        self.games.clear()
