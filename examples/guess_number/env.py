"""A word game with a scripted user: guess the secret number; the user answers "higher" or
"lower" until the guess is right. Rewarded for finding it, more for finding it in fewer turns."""

from __future__ import annotations

import random
import re

from rlbus.environment import TaskSet, metric, reward, user
from rlbus.schemas import derived_id

NUMBER = re.compile(r"-?\d+")


def last_guess(content: str | None) -> int | None:
    found = NUMBER.findall(content or "")
    return int(found[-1]) if found else None


class GuessNumber(TaskSet):
    name = "guess_number"
    system_prompt = "Guess the secret integer. Reply with one number per turn."
    defaults = {"harness": {"max_turns": 8}}

    def rows(self):
        rng = random.Random(self.args.get("seed", 0))
        high = self.args.get("high", 100)
        for i in range(self.args.get("n", 1000)):
            secret = rng.randint(1, high)
            yield {
                "task_id": derived_id(self.name, self.args.get("seed", 0), i),
                "answer": str(secret),
                "prompt": f"I am thinking of an integer from 1 to {high}. Guess it.",
            }

    @user
    def referee(self, task, messages: list[dict], state: dict) -> str | None:
        guess = last_guess(messages[-1].get("content"))
        state["guesses"] = state.get("guesses", 0) + 1
        secret = int(task.answer)
        if guess == secret:
            state["solved"] = True
            return None
        if guess is None:
            return "Please reply with a number."
        return "Higher." if guess < secret else "Lower."

    @reward
    def solved(self, state: dict) -> float:
        return float(state.get("solved", False))

    @reward(weight=0.5)
    def quick(self, state: dict) -> float:
        return 1.0 / state["guesses"] if state.get("solved") else 0.0

    @metric
    def guesses(self, state: dict) -> float:
        return float(state.get("guesses", 0))
