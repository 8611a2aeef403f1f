"""LLM judges: rewards that ask a model at any OpenAI-compatible endpoint to grade a rollout.

A judge is used like any other reward, as a tagged class attribute or called from a reward:

    class Quiz(TaskSet):
        correct = reward(ReferenceJudge(model="m", base_url="http://127.0.0.1:8000/v1"))

        @reward(weight=0.5)
        async def style(self, prompt, text, info) -> float:
            return await self.rubric(prompt, text, info)

Calls run at most `max_concurrency` at once per judge, and an attempt that fails (the endpoint's
error, or an answer the parser cannot read) is retried up to `retries` times. While the scorer
runs a rule, every answered call is recorded; the scorer stores them as trace nodes of the
scoring (`scoring_trace`): rollout_id is the scoring's id (the RolloutScored event_id, derived
from the rollout id and the scorer version), branch "judge", one root per call (its system and
user messages, then the answer, which carries the grade, latency, attempts and token counts; the
ids are on the nodes when the endpoint returns them, as rlbus's own inference server does).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import SpanKind

from rlbus.bus import telemetry
from rlbus.clients.chat_client import ChatAnswer, ChatClient, ChatError
from rlbus.schemas import RolloutScored, TraceNode, derived_id
from rlbus.schemas.chat import text_of
from rlbus.schemas.packed import pack_tokens

JUDGE_BRANCH = "judge"
"""The branch of a scoring's trace nodes: never part of a policy's trace (nor trained on)."""

Grade = Callable[[str], float]
"""Reads the grade out of the judge model's answer; raises ValueError when there is none."""


@dataclass
class JudgeCall:
    """One answered attempt of a judge, as the scorer records it."""

    judge: str
    messages: list[dict[str, Any]]
    answer: ChatAnswer
    attempt: int
    """1 for the first try."""
    ended_at: float
    grade: float | None = None
    error: str = ""
    """Why the answer could not be read, when it could not."""


RECORDING: contextvars.ContextVar[list[JudgeCall] | None] = contextvars.ContextVar(
    "rlbus_judge_calls", default=None
)
"""Where the scorer collects the calls of the rule it is running (None: nothing records)."""


class JudgeError(RuntimeError):
    """A judge that got no usable grade in all its attempts; says why the last one failed."""


def yes_no(answer: str) -> float:
    """1.0 for an answer starting with yes, 0.0 for no (case and punctuation aside)."""
    word = re.match(r"\W*(\w+)", answer)
    verdict = word.group(1).lower() if word else ""
    if verdict not in ("yes", "no"):
        raise ValueError(f"expected yes or no, got {answer[:200]!r}")
    return float(verdict == "yes")


def number(scale: float = 1.0) -> Grade:
    """The last number in the answer, over `scale` (a grade out of 10: number(10))."""

    def read(answer: str) -> float:
        found = re.findall(r"-?\d+(?:\.\d+)?", answer)
        if not found:
            raise ValueError(f"expected a number, got {answer[:200]!r}")
        return float(found[-1]) / scale

    read.__qualname__ = f"number({scale:g})"
    return read


def question_of(prompt: Any) -> str:
    """The task's question: the last user message of its prompt (or the prompt string)."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if m.get("role") == "user"]
    return text_of(users[-1].get("content")) if users else ""


class LLMJudge:
    """Asks a model to grade, with `prompt` filled from the rollout (`question`, `response`,
    `reference`, and the task's `info` keys) and `parse` reading the grade from the answer."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str,
        prompt: str,
        parse: Grade = yes_no,
        system: str = "You are a careful, impartial grader.",
        name: str = "",
        max_concurrency: int = 8,
        retries: int = 2,
        timeout_s: float = 120,
        temperature: float = 0.0,
        max_tokens: int = 512,
        api_key_env: str = "OPENAI_API_KEY",
    ):
        if max_concurrency < 1 or retries < 0:
            raise ValueError("an LLM judge needs max_concurrency >= 1 and retries >= 0")
        self.model = model
        self.base_url = base_url
        self.prompt = prompt
        self.parse = parse
        self.system = system
        self.name = name or type(self).__name__
        self.max_concurrency = max_concurrency
        self.retries = retries
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.api_key_env = api_key_env
        # aiohttp sessions and semaphores belong to one event loop: one of each per loop.
        self._per_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[ChatClient, asyncio.Semaphore]
        ] = weakref.WeakKeyDictionary()

    def fingerprint(self) -> str:
        """What decides its grades (not where it is served): part of the scorer version."""
        return json.dumps(
            [
                type(self).__qualname__,
                self.model,
                self.system,
                self.prompt,
                getattr(self.parse, "__qualname__", repr(self.parse)),
                self.temperature,
                self.max_tokens,
            ]
        )

    def _client(self) -> tuple[ChatClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            # Retries are this judge's own (an unreadable answer is retried too).
            client = ChatClient(
                self.base_url,
                self.model,
                timeout_s=self.timeout_s,
                api_key_env=self.api_key_env,
                max_retries=0,
            )
            state = self._per_loop[loop] = (client, asyncio.Semaphore(self.max_concurrency))
        return state

    def messages(self, **fields: Any) -> list[dict[str, Any]]:
        try:
            text = self.prompt.format_map(fields)
        except KeyError as exc:
            raise ValueError(
                f"{self.name}'s prompt names {exc}, which is not among {sorted(fields)}"
            ) from None
        return [{"role": "system", "content": self.system}, {"role": "user", "content": text}]

    async def ask(self, messages: list[dict[str, Any]], read: Grade) -> float:
        """`read(answer text)` of the first attempt whose answer it can read."""
        client, slots = self._client()
        problem = ""
        for attempt in range(1, self.retries + 2):
            try:
                async with slots:
                    answer = await self._complete(client, messages, attempt)
            except ChatError as exc:
                problem = str(exc)
                if 400 <= exc.status < 500 and exc.status not in (408, 429):
                    break  # the request itself is wrong: asking again changes nothing
                continue
            call = JudgeCall(self.name, messages, answer, attempt, time.time())
            if (recorded := RECORDING.get()) is not None:
                recorded.append(call)
            try:
                call.grade = float(read(text_of(answer.message.get("content"))))
            except ValueError as exc:
                call.error = problem = f"unreadable answer: {exc}"
                continue
            return call.grade
        tries = "1 attempt" if attempt == 1 else f"{attempt} attempts"
        raise JudgeError(f"{self.name} ({self.model} at {self.base_url}), {tries}: {problem}")

    async def _complete(
        self, client: ChatClient, messages: list[dict[str, Any]], attempt: int
    ) -> ChatAnswer:
        """One call, in a GenAI chat span of the scoring when telemetry is on."""
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",  # any OpenAI-compatible endpoint
            "gen_ai.request.model": self.model,
            "gen_ai.request.temperature": self.temperature,
            "gen_ai.request.max_tokens": self.max_tokens,
            "server.address": self.base_url,
            "rlbus.judge": self.name,
            "rlbus.attempt": attempt,
        }
        with telemetry.span(f"chat {self.model}", SpanKind.CLIENT, attributes=attributes) as span:
            answer = await client.complete(
                messages, temperature=self.temperature, max_tokens=self.max_tokens
            )
            if span is not None:
                span.set_attributes(
                    {
                        "gen_ai.response.model": answer.model,
                        "gen_ai.response.finish_reasons": [answer.finish_reason],
                        "gen_ai.usage.input_tokens": answer.prompt_tokens,
                        "gen_ai.usage.output_tokens": answer.completion_tokens,
                        "rlbus.policy_version": answer.policy_version,
                    }
                )
        return answer

    async def grade(self, **fields: Any) -> float:
        """Ask with the prompt filled from `fields`; the parsed grade."""
        return await self.ask(self.messages(**fields), self.parse)

    async def __call__(self, prompt: Any, text: str, answer: str, info: dict[str, Any]) -> float:
        asked = {"question": question_of(prompt), "response": text, "reference": answer}
        return await self.grade(**{**info, **asked})

    async def aclose(self) -> None:
        for client, _ in list(self._per_loop.values()):
            await client.close()
        self._per_loop.clear()


REFERENCE_PROMPT = """\
Grade a response to a question against the reference answer.

Question:
{question}

Reference answer:
{reference}

Response:
{response}

Does the response reach the same final answer as the reference (wording, format and working
aside)? Answer with one word: yes or no."""


class ReferenceJudge(LLMJudge):
    """1.0 when the model finds the response's answer the same as the task's reference answer."""

    def __init__(
        self, *, model: str, base_url: str, prompt: str = REFERENCE_PROMPT, **options: Any
    ):
        super().__init__(model=model, base_url=base_url, prompt=prompt, **options)


RUBRIC_PROMPT = """\
Grade a response to a question against each item of a rubric.

Question:
{question}

Response:
{response}

Rubric:
{rubric}

For each item, answer on its own line with its number and yes or no: "1: yes" when the response
meets it, "1: no" when it does not. Nothing else."""

Rubric = Sequence[tuple[str, float]]


class RubricJudge(LLMJudge):
    """The weights of the rubric items the response meets, over the sum of the positive weights
    (a negative weight is a pitfall: meeting it costs). Items are given here, or per task as
    `info["rubric"]`: [[item, weight], ...] or [{"item": ..., "weight": ...}, ...]."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str,
        items: Rubric | dict[str, float] | None = None,
        prompt: str = RUBRIC_PROMPT,
        **options: Any,
    ):
        super().__init__(model=model, base_url=base_url, prompt=prompt, **options)
        self.items = list(items.items()) if isinstance(items, dict) else items

    def fingerprint(self) -> str:
        return json.dumps([super().fingerprint(), self.items])

    def rubric(self, info: dict[str, Any]) -> list[tuple[str, float]]:
        raw = self.items if self.items is not None else info.get("rubric")
        if not raw:
            raise ValueError(f"{self.name} has no rubric items, and the task's info has no rubric")
        items = [
            (str(i["item"]), float(i.get("weight", 1.0)))
            if isinstance(i, dict)
            else (str(i[0]), float(i[1]))
            for i in raw
        ]
        if not any(w > 0 for _, w in items):
            raise ValueError(f"{self.name}: a rubric needs at least one positive weight")
        return items

    @staticmethod
    def verdicts(answer: str, count: int) -> list[bool]:
        """Item n's verdict from a line "n: yes" or "n: no"."""
        found = {
            int(n): verdict.lower() == "yes"
            for n, verdict in re.findall(r"(\d+)\s*[:.)-]\s*(yes|no)\b", answer, re.IGNORECASE)
        }
        missing = [n for n in range(1, count + 1) if n not in found]
        if missing:
            raise ValueError(f"no verdict for items {missing} in {answer[:300]!r}")
        return [found[n] for n in range(1, count + 1)]

    async def grade(self, **fields: Any) -> float:
        """`fields`: question, response and the task's info (for its rubric)."""
        items = self.rubric(fields.get("info") or {})
        listed = "\n".join(f"{n}. {item}" for n, (item, _) in enumerate(items, 1))
        positive = sum(w for _, w in items if w > 0)

        def read(answer: str) -> float:
            met = self.verdicts(answer, len(items))
            return sum(w for (_, w), ok in zip(items, met, strict=True) if ok) / positive

        return await self.ask(self.messages(**fields, rubric=listed), read)

    async def __call__(self, prompt: Any, text: str, answer: str, info: dict[str, Any]) -> float:
        return await self.grade(
            info=info, question=question_of(prompt), response=text, reference=answer
        )


def scoring_trace(scored: RolloutScored, calls: list[JudgeCall]) -> list[TraceNode]:
    """A scoring's judge calls as trace nodes (see the module docstring for their identity)."""
    nodes: list[TraceNode] = []
    for number, call in enumerate(calls):
        answer = call.answer
        said: dict[str, object] = {
            "role": "assistant",
            "content": text_of(answer.message.get("content")),
        }
        said[JUDGE_BRANCH] = {
            "name": call.judge,
            "model": answer.model,
            "grade": call.grade,
            "error": call.error,
            "attempt": call.attempt,
            "latency_s": answer.seconds,
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "policy_version": answer.policy_version,
        }
        # As in a rollout's trace, the last context message carries the rendered prompt's ids.
        shown = [(m, []) for m in call.messages[:-1]]
        shown += [(call.messages[-1], answer.prompt_ids), (said, answer.completion_ids)]
        parent = ""
        for message, ids in shown:
            node_id = derived_id(scored.event_id, JUDGE_BRANCH, len(nodes))
            nodes.append(
                TraceNode(
                    event_id=derived_id(node_id, "event"),
                    run_id=scored.run_id,
                    ts=call.ended_at,
                    node_id=node_id,
                    rollout_id=scored.event_id,
                    parent_id=parent,
                    branch_id=JUDGE_BRANCH,
                    index=len(nodes),
                    role=message["role"],
                    message=message,
                    token_ids=pack_tokens(ids),
                    call_index=number,
                )
            )
            parent = node_id
    return nodes
