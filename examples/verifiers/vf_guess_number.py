"""A multi-turn verifiers environment (vf.MultiTurnEnv): guess a secret number; env_response
says "Higher." or "Lower." until the guess is right (its final response), a stop condition ends
the game after `patience` wrong guesses, and the state it keeps is what the rewards read."""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset


class GuessNumber(vf.MultiTurnEnv):
    def __init__(self, patience: int, **kwargs):
        super().__init__(**kwargs)
        self.patience = patience

    async def setup_state(self, state: vf.State) -> None:
        state["guesses"] = 0
        state["solved"] = False

    @vf.stop
    async def out_of_patience(self, state: vf.State) -> bool:
        return state.get("guesses", 0) >= self.patience

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        found = re.findall(r"-?\d+", messages[-1].content or "")
        state["guesses"] += 1
        secret = int(state["answer"])
        if found and int(found[-1]) == secret:
            state["solved"] = True
            state["final_env_response"] = [vf.UserMessage(content="Correct!")]
            return state["final_env_response"]
        if not found:
            return [vf.UserMessage(content="Please reply with a number.")]
        return [vf.UserMessage(content="Higher." if int(found[-1]) < secret else "Lower.")]


def solved(state) -> float:
    return float(state.get("solved", False))


def quick(state) -> float:
    return 1.0 / max(1, state.get("guesses", 0)) if state.get("solved") else 0.0


def load_environment(
    n: int = 20, high: int = 8, patience: int = 5, seed: int = 0
) -> vf.Environment:
    rng = random.Random(seed)
    rows = [
        {
            "question": f"I am thinking of an integer from 1 to {high}. Guess it.",
            "answer": str(rng.randint(1, high)),
        }
        for _ in range(n)
    ]
    return GuessNumber(
        patience,
        eval_dataset=Dataset.from_list(rows),
        system_prompt="Guess the secret integer. Reply with one number per turn.",
        max_turns=high + 1,
        rubric=vf.Rubric(funcs=[solved, quick], weights=[1.0, 0.5]),
    )
