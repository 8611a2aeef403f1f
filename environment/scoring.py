"""Scoring rollouts with a task set's rules: rewards and metrics per rollout, group rewards over
a complete group. A rule that raises or runs past its time limit marks the rollouts it was
scoring errored, with the rule's name and the reason; the others are scored as usual.

Every score carries its scorer version, and its id comes from the rollout and that version: a
rollout scored again by the same rules gets the same id (the store keeps one), by other rules
(or under another name, `rlbus rescore --as`) a new one, and both stay queryable. The default
version is a digest of the rules themselves, so it changes exactly when they do."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import itertools
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind

from rlbus.bus import telemetry
from rlbus.environment.judges import RECORDING, JudgeCall, scoring_trace
from rlbus.environment.loader import Environment
from rlbus.environment.rules import Rule, threads
from rlbus.schemas import (
    Event,
    RolloutCompleted,
    RolloutScored,
    TaskPublished,
    TraceNode,
    derived_id,
)
from rlbus.schemas.chat import text_of
from rlbus.schemas.events import RolloutEvent

IDENTITY = tuple(f for f in RolloutEvent.__struct_fields__ if f not in Event.__struct_fields__)
"""The fields placing an event in its rollout, group and task: a score carries its rollout's."""


VERSION_FORMAT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,63}")
"""A scorer version a user names: a letter or digit, then up to 63 of these characters."""


class RuleFailed(Exception):
    pass


def _source(fn: Any) -> str:
    """What decides a rule's values: an LLM judge's fingerprint, else the function's source."""
    fingerprint = getattr(fn, "fingerprint", None)
    if callable(fingerprint):
        return str(fingerprint())
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):  # defined where no source is kept (a REPL)
        return getattr(fn, "__qualname__", repr(fn))


def rules_version(env: Environment) -> str:
    """`rules-` and 8 hex digits: a digest of each reward's, metric's and group reward's kind,
    name, weight and source (an LLM judge's model, prompt and parser), and the task set's args.
    A change outside them (a helper a reward calls, a data file) needs a name: --as."""
    rules = env.rules
    h = hashlib.blake2b(digest_size=4)
    h.update(json.dumps(env.config.args, sort_keys=True, default=repr).encode())
    for rule in (*rules.rewards, *rules.metrics, *rules.group_rewards):
        h.update(f"\x1e{rule.kind}\x1f{rule.name}\x1f{rule.weight!r}\x1f".encode())
        h.update(_source(rule.fn).encode())
    return f"rules-{h.hexdigest()}"


def checked_version(version: str) -> str:
    if not VERSION_FORMAT.fullmatch(version):
        raise ValueError(
            f"scorer version {version!r}: use up to 64 letters, digits and . _ : + - "
            "(starting with a letter or digit)"
        )
    return version


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


class _Together:
    """A job of synchronous rules for one thread: each rule's value or exception, in order, and
    when the rule running now started (read by the event loop for its time limit). A rule's
    outcome is appended before the next one's start is set, so a reader that takes the count
    first and the start second never pairs a finished rule with a fresh start."""

    def __init__(self, rules: Sequence[Rule], args: dict[str, Any]):
        self.rules = rules
        self.args = args
        self.outcomes: list[Any] = []
        self.started = time.monotonic()
        self._given_up = False

    def give_up(self) -> None:
        """Stop before the next rule: the rule running now is past its time."""
        self._given_up = True

    def __call__(self) -> list[Any]:
        for rule in self.rules:
            if self._given_up:
                break
            self.started = time.monotonic()
            try:
                outcome = rule.call(self.args)
            except Exception as exc:
                outcome = exc
            self.outcomes.append(outcome)
        return self.outcomes


@dataclass
class _Card:
    """One rollout's scores while they are being computed."""

    rollout: RolloutCompleted
    args: dict[str, Any]
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""
    calls: list[JudgeCall] = field(default_factory=list)
    """LLM judge calls its rules made."""


@dataclass
class Scoring:
    """A group's scores and the trace nodes of the judge calls behind them."""

    scored: list[RolloutScored]
    trace: list[TraceNode]
    context: Context | None = None
    """The scoring span's trace context (telemetry on): its events are published in it."""

    def events(self) -> list[Event]:
        return [*self.trace, *self.scored]

    def parents(self) -> dict[str, Context | None]:
        """Its events by id, with its trace context (Bus.publish_many)."""
        return {e.event_id: self.context for e in self.events()}


class Scorer:
    def __init__(self, env: Environment, version: str | None = None):
        """`version`: the scorer version stamped on every score (default: rules_version)."""
        self.env = env
        self.rules = env.rules
        self.weights = env.rules.weights
        self.timeout_s = env.config.reward_timeout_s
        self.version = rules_version(env) if version is None else checked_version(version)

    @property
    def needs_group(self) -> bool:
        return bool(self.rules.group_rewards)

    async def _apply(self, rule: Rule, args: dict[str, Any]) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await rule(args)
        except Exception as exc:
            raise self._failed(rule, exc) from exc

    def _failed(self, rule: Rule, exc: BaseException) -> RuleFailed:
        if isinstance(exc, TimeoutError):
            return RuleFailed(f"{rule.kind} {rule.name!r} timed out after {self.timeout_s:g}s")
        return RuleFailed(f"{rule.kind} {rule.name!r} raised {type(exc).__name__}: {exc}")

    async def _apply_together(self, rules: Sequence[Rule], args: dict[str, Any]) -> list[Any]:
        """Synchronous rules run one after another in a single job of the rules' threads (one
        hand-over per rollout, not one per rule), each still under its own time limit: a rule
        past it is given up (its thread keeps it until it returns) and the rules after it go
        on in a new job. Each rule's value, or the RuleFailed it ended in."""
        run = _Together(rules, args)
        job = asyncio.get_running_loop().run_in_executor(threads(), run)
        while True:
            ended, started = len(run.outcomes), run.started  # in this order: see _Together
            left = started + self.timeout_s - time.monotonic()
            if left > 0:
                if (await asyncio.wait({job}, timeout=left))[0]:
                    break
                continue  # the rule running now started later: it has time left
            if job.done():
                break
            run.give_up()
            rest = rules[ended + 1 :]
            later = await self._apply_together(rest, args) if rest else []
            timed_out = self._failed(rules[ended], TimeoutError())
            return [*await self._settled(rules, run.outcomes[:ended]), timed_out, *later]
        return await self._settled(rules, job.result())

    async def _settled(self, rules: Sequence[Rule], outcomes: list[Any]) -> list[Any]:
        """Outcomes of a job as values or RuleFailed; a synchronous rule that handed back an
        awaitable is awaited here, under its time limit."""
        settled = []
        for rule, outcome in zip(rules, outcomes, strict=False):
            if inspect.isawaitable(outcome):
                try:
                    async with asyncio.timeout(self.timeout_s):
                        outcome = await outcome
                except Exception as exc:
                    outcome = exc
            settled.append(
                self._failed(rule, outcome) if isinstance(outcome, Exception) else outcome
            )
        return settled

    async def _score_one(self, card: _Card) -> None:
        RECORDING.set(card.calls)  # this task's own context: its rules' judge calls
        rules = (*self.rules.rewards, *self.rules.metrics)
        outcomes: list[Any] = []
        for is_async, run in itertools.groupby(rules, key=lambda r: r.is_async):
            together = list(run)
            if is_async:
                for rule in together:
                    try:
                        outcomes.append(await self._apply(rule, card.args))
                    except RuleFailed as exc:
                        outcomes.append(exc)
            else:
                outcomes += await self._apply_together(together, card.args)
        for rule, outcome in zip(rules, outcomes, strict=True):
            try:
                if isinstance(outcome, RuleFailed):
                    raise outcome
                value = finite(rule, outcome)
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
            calls: list[JudgeCall] = []
            recording = RECORDING.set(calls)
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
            finally:
                RECORDING.reset(recording)
                for card in ok:  # a group's judge calls stand behind each of its scores
                    card.calls += calls
            for card, value in zip(ok, values, strict=True):
                card.rewards[rule.name] = value

    async def score(
        self, rollouts: Sequence[RolloutCompleted], failed: str = ""
    ) -> list[RolloutScored]:
        """Score rollouts of one group (all of it when the task set has group rewards).
        `failed`: score them as errors with this reason instead (a group that never completed)."""
        return (await self.scoring(rollouts, failed)).scored

    async def scoring(
        self,
        rollouts: Sequence[RolloutCompleted],
        failed: str = "",
        only: set[str] | None = None,
        parent: Context | None = None,
        linked: Sequence[Link] = (),
    ) -> Scoring:
        """`score`, with the trace of the judge calls behind the scores. `only`: the rollout
        ids to publish scores of (group rewards still see every rollout given). With telemetry
        on it runs in a span (child of `parent`, the current context by default; linked to
        the rollouts it scores) holding a gen_ai.evaluation.result event per score."""
        first = rollouts[0] if rollouts else None
        attributes = {
            "rlbus.env": self.env.id,
            "rlbus.group_id": first.group_id if first else "",
            "rlbus.scorer_version": self.version,
            "rlbus.rollouts": len(rollouts),
        }
        name = f"score {self.env.id}"
        with telemetry.span(name, SpanKind.INTERNAL, parent, attributes, linked) as span:
            scoring = await self._scoring(rollouts, failed, only)
            if span is not None:
                for scored in scoring.scored:
                    span.add_event(
                        "gen_ai.evaluation.result",
                        {
                            "gen_ai.evaluation.name": "reward",
                            "gen_ai.evaluation.score.value": scored.reward,
                            "rlbus.rollout_id": scored.rollout_id,
                            "rlbus.status": scored.status,
                        },
                    )
                scoring.context = telemetry.current()
        return scoring

    async def _scoring(
        self, rollouts: Sequence[RolloutCompleted], failed: str, only: set[str] | None
    ) -> Scoring:
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
        kept = [c for c in cards if only is None or c.rollout.rollout_id in only]
        scored = [self._event(c) for c in kept]
        trace = [n for c, s in zip(kept, scored, strict=True) for n in scoring_trace(s, c.calls)]
        return Scoring(scored, trace)

    async def aclose(self) -> None:
        """Close what its rules hold open (an LLM judge's HTTP sessions)."""
        for rule in (*self.rules.rewards, *self.rules.metrics, *self.rules.group_rewards):
            if callable(close := getattr(rule.fn, "aclose", None)):
                await cast("Callable[[], Awaitable[None]]", close)()

    def _event(self, card: _Card) -> RolloutScored:
        r = card.rollout
        return RolloutScored(
            event_id=derived_id(r.rollout_id, "scored", self.version),
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
            scorer_version=self.version,
        )
