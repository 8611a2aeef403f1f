"""Scoring rollouts with a task set's rules: rewards and metrics per rollout, group rewards over
a complete group. A rule that raises or runs past its time limit marks the rollouts it was
scoring errored, with the rule's name and the reason; the others are scored as usual."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlbus.producers.environment.loader import Environment
from rlbus.producers.environment.rules import Rule
from rlbus.schemas import Event, RolloutCompleted, RolloutScored, TaskPublished, derived_id
from rlbus.schemas.events import RolloutEvent
from rlbus.schemas.messages import text_of

IDENTITY = tuple(f for f in RolloutEvent.__struct_fields__ if f not in Event.__struct_fields__)
"""The fields placing an event in its rollout, group and task: a score carries its rollout's."""


class RuleFailed(Exception):
    pass


def _final_text(completion: list[dict[str, Any]]) -> str:
    return next(
        (text_of(m.get("content")) for m in reversed(completion) if m.get("role") == "assistant"),
        "",
    )


def rollout_arguments(rollout: RolloutCompleted) -> dict[str, Any]:
    """What a reward or metric may ask for by name (see rules.ROLLOUT_ARGS)."""
    info = {k: v for k, v in rollout.info.items() if k != "state"}
    task = TaskPublished(
        event_id=rollout.task_id,
        run_id=rollout.run_id,
        task_id=rollout.task_id,
        env=rollout.env,
        prompt=rollout.prompt,
        answer=rollout.answer,
        info=info,
        group_size=rollout.group_size,
    )
    return {
        "task": task,
        "prompt": rollout.prompt,
        "completion": rollout.completion,
        "text": _final_text(rollout.completion),
        "answer": rollout.answer,
        "info": info,
        "state": rollout.info.get("state", {}),
        "rollout": rollout,
    }


def finite(rule: Rule, value: Any) -> float:
    """A rule's value as a float; NaN and infinities are errors, never data (one NaN reward
    in a group poisons every advantage of it, and from there every weight)."""
    number = float(value)
    if not math.isfinite(number):
        raise RuleFailed(f"{rule.kind} {rule.name!r} returned {number} (not finite)")
    return number


@dataclass
class _Card:
    """One rollout's scores while they are being computed."""

    rollout: RolloutCompleted
    args: dict[str, Any]
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""


class Scorer:
    def __init__(self, env: Environment):
        self.env = env
        self.rules = env.rules
        self.weights = env.rules.weights
        self.timeout_s = env.config.reward_timeout_s

    @property
    def needs_group(self) -> bool:
        return bool(self.rules.group_rewards)

    async def _apply(self, rule: Rule, args: dict[str, Any]) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await rule(args)
        except TimeoutError as exc:
            raise RuleFailed(
                f"{rule.kind} {rule.name!r} timed out after {self.timeout_s:g}s"
            ) from exc
        except Exception as exc:
            raise RuleFailed(
                f"{rule.kind} {rule.name!r} raised {type(exc).__name__}: {exc}"
            ) from exc

    async def _score_one(self, card: _Card) -> None:
        for rule in (*self.rules.rewards, *self.rules.metrics):
            try:
                value = finite(rule, await self._apply(rule, card.args))
            except (RuleFailed, TypeError, ValueError) as exc:
                card.error = card.error or str(exc)
                continue
            (card.rewards if rule.kind == "reward" else card.metrics)[rule.name] = value

    async def _score_group(self, cards: list[_Card]) -> None:
        ok = [c for c in cards if not c.error]
        if not ok:
            return
        first = ok[0].args
        group_args = {
            "task": first["task"],
            "prompt": first["prompt"],
            "answer": first["answer"],
            "info": first["info"],
            "group": [c.rollout for c in ok],
            "completions": [c.args["completion"] for c in ok],
            "texts": [c.args["text"] for c in ok],
            "states": [c.args["state"] for c in ok],
            "rewards": [dict(c.rewards) for c in ok],
        }
        for rule in self.rules.group_rewards:
            try:
                values = [finite(rule, v) for v in await self._apply(rule, group_args)]
                if len(values) != len(ok):
                    raise RuleFailed(
                        f"group_reward {rule.name!r} returned {len(values)} scores for a group of "
                        f"{len(ok)} scored rollouts"
                    )
            except (RuleFailed, TypeError, ValueError) as exc:
                for card in ok:
                    card.error = card.error or str(exc)
                continue
            for card, value in zip(ok, values, strict=True):
                card.rewards[rule.name] = value

    async def score(
        self, rollouts: Sequence[RolloutCompleted], failed: str = ""
    ) -> list[RolloutScored]:
        """Score rollouts of one group (all of it when the task set has group rewards).
        `failed`: score them as errors with this reason instead (a group that never completed)."""
        ordered = sorted(rollouts, key=lambda r: r.sample_index)
        cards = [
            _Card(r, rollout_arguments(r), error=failed or r.error or f"rollout {r.status}")
            if failed or r.status != "ok"
            else _Card(r, rollout_arguments(r))
            for r in ordered
        ]
        await asyncio.gather(*(self._score_one(c) for c in cards if not c.error))
        if self.needs_group:
            await self._score_group(cards)
        return [self._event(c) for c in cards]

    def _event(self, card: _Card) -> RolloutScored:
        r = card.rollout
        return RolloutScored(
            event_id=derived_id(r.rollout_id, "scored"),
            run_id=r.run_id,
            **{f: getattr(r, f) for f in IDENTITY},
            reward=0.0
            if card.error
            else sum(self.weights.get(k, 1.0) * v for k, v in card.rewards.items()),
            rewards=card.rewards,
            metrics=card.metrics,
            status="error" if card.error else "ok",
            error=card.error,
            policy_version=r.max_policy_version,
            completion_tokens=r.completion_tokens,
        )
