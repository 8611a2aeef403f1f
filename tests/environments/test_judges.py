"""LLM judges: the reference and rubric presets grade through a real OpenAI-compatible server
(the scripted one, and rlbus's own inference server on a tiny model), within their concurrency
limit, retrying what fails; their calls become trace nodes of the scoring, stored through the
real broker and sink by `rlbus eval`."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ScriptedModel, ScriptedServer
from test_eval import rows, settings  # noqa: F401  (test_eval's module store)

from rlbus.bus.server_thread import ServerThread
from rlbus.bus.store import open_store
from rlbus.config import Settings
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.service import build_app, build_backend
from rlbus.environment import (
    EnvConfig,
    Environment,
    Scorer,
    TaskSet,
    discover,
    load_environment,
    reward,
)
from rlbus.environment.judges import (
    JUDGE_BRANCH,
    JudgeError,
    LLMJudge,
    ReferenceJudge,
    RubricJudge,
    number,
    yes_no,
)
from rlbus.environment.scoring import rules_version
from rlbus.launch.eval import run_eval
from rlbus.schemas import RolloutCompleted, TraceNode, derived_id
from rlbus.schemas.packed import tokens

RUBRIC = [("names the city", 2.0), ("answers in one word", 1.0), ("is rude", -1.0)]


class Grader:
    """The scripted judge model: `yes` when the response matches the reference, rubric verdicts
    by item; counts requests in flight, and answers nonsense to the first `unreadable` asks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.unreadable = 0

    def arrive(self) -> float:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        return 0.05

    def chat(self, messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
        with self.lock:
            self.in_flight -= 1
            if self.unreadable:
                self.unreadable -= 1
                return {"content": "hmm, hard to say"}
        prompt = messages[-1]["content"]
        response = re.search(r"Response:\n(.*?)\n", prompt, re.S)
        said = response.group(1).strip() if response else ""
        if "Rubric:" in prompt:
            return {"content": f"1: {'yes' if 'Paris' in said else 'no'}\n2: yes\n3: no"}
        reference = re.search(r"Reference answer:\n(.*?)\n", prompt, re.S)
        same = reference is not None and said.lower() == reference.group(1).strip().lower()
        return {"content": "Yes." if same else "no"}


@pytest.fixture(scope="module")
def grader() -> Iterator[tuple[ScriptedServer, Grader]]:
    g = Grader()
    with ScriptedServer(ScriptedModel(chat=g.chat, delay_s=g.arrive, model="grader")) as server:
        yield server, g


class Quiz(TaskSet):
    """Capitals, graded by a reference judge (a tagged attribute would do as well) and a rubric
    judge, both built from the environment's args."""

    name = "quiz"

    def __init__(self, **args: Any):
        super().__init__(**args)
        where = {"model": args["judge_model"], "base_url": args["judge_url"]}
        self.reference = ReferenceJudge(**where, max_tokens=args.get("judge_tokens", 512))
        self.rubric = RubricJudge(**where, items=RUBRIC)

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"prompt": "What is the capital of France?", "answer": "Paris"},
            {"prompt": "What is the capital of Italy?", "answer": "Rome"},
        ]

    @reward(weight=1.0)
    async def correct(self, prompt: Any, text: str, answer: str, info: dict) -> float:
        return await self.reference(prompt, text, answer, info)

    @reward(weight=0.5)
    async def style(self, prompt: Any, text: str, answer: str, info: dict) -> float:
        return await self.rubric(prompt, text, answer, info)


def quiz(url: str, **args: Any) -> Environment:
    return load_environment(
        f"{__name__}:Quiz", {"args": {"judge_model": "grader", "judge_url": url, **args}}
    )


def rollout(i: int, text: str, answer: str = "Paris") -> RolloutCompleted:
    return RolloutCompleted(
        rollout_id=f"r{i}",
        group_id="g",
        task_id="t",
        env="quiz",
        sample_index=i,
        group_size=2,
        prompt=[{"role": "user", "content": "What is the capital of France?"}],
        answer=answer,
        completion=[{"role": "assistant", "content": text}],
    )


def test_parsers_read_grades_or_say_why_not() -> None:
    assert (yes_no("Yes."), yes_no("  no, because"), number(10)("score: 7/10 -> 7")) == (
        1.0,
        0.0,
        0.7,
    )
    with pytest.raises(ValueError, match="expected yes or no"):
        yes_no("maybe")
    assert RubricJudge.verdicts("1: yes\n2) NO\n3 - yes", 3) == [True, False, True]
    with pytest.raises(ValueError, match=r"no verdict for items \[2\]"):
        RubricJudge.verdicts("1: yes", 2)


async def test_reference_and_rubric_judges_score_and_leave_a_trace(
    grader: tuple[ScriptedServer, Grader],
) -> None:
    server, _ = grader
    env = quiz(f"{server.url}/v1")
    scorer = Scorer(env)
    scoring = await scorer.scoring([rollout(0, "Paris"), rollout(1, "Lyon")])
    await scorer.aclose()
    right, wrong = scoring.scored
    assert right.rewards == {"correct": 1.0, "style": 1.0} and right.reward == 1.5
    assert wrong.rewards == {"correct": 0.0, "style": pytest.approx(1 / 3)}
    # Two calls per scoring, each a root: system, user, then the graded answer.
    for scored in scoring.scored:
        nodes = [n for n in scoring.trace if n.rollout_id == scored.event_id]
        assert scored.event_id == derived_id(scored.rollout_id, "scored", scorer.version)
        assert [(n.role, n.call_index, n.branch_id) for n in nodes] == [
            (role, call, JUDGE_BRANCH)
            for call in (0, 1)
            for role in ("system", "user", "assistant")
        ]
        by_id = {n.node_id: n for n in nodes}
        for n in nodes:
            parent = by_id.get(n.parent_id)
            assert (parent.role if parent else None) == {
                "system": None,
                "user": "system",
                "assistant": "user",
            }[n.role]
            assert not n.sampled and n.run_id == scored.run_id
        answers = {
            n.message[JUDGE_BRANCH]["name"]: n.message for n in nodes if n.role == "assistant"
        }
        assert set(answers) == {"ReferenceJudge", "RubricJudge"}
        verdict = answers["ReferenceJudge"][JUDGE_BRANCH]
        assert verdict["grade"] == scored.rewards["correct"] and verdict["attempt"] == 1
        assert verdict["model"] == "grader" and verdict["latency_s"] >= 0.05
    assert "Lyon" in next(
        n.message["content"]
        for n in scoring.trace
        if n.role == "user" and n.rollout_id == wrong.event_id
    )


async def test_a_judge_stays_within_its_concurrency_and_retries_unreadable_answers(
    grader: tuple[ScriptedServer, Grader],
) -> None:
    server, g = grader
    judge = ReferenceJudge(model="grader", base_url=f"{server.url}/v1", max_concurrency=2)
    g.most = 0
    grades = await asyncio.gather(
        *(judge.grade(question="q", reference="a", response="a") for _ in range(8))
    )
    assert grades == [1.0] * 8 and g.most == 2
    g.unreadable = 1
    assert await judge.grade(question="q", reference="a", response="b") == 0.0
    g.unreadable = 3
    with pytest.raises(JudgeError, match="3 attempts: unreadable answer: expected yes or no"):
        await judge.grade(question="q", reference="a", response="b")
    await judge.aclose()


def test_a_prompt_naming_what_the_rollout_lacks_is_an_error() -> None:
    with pytest.raises(ValueError, match="prompt names 'missing'"):
        LLMJudge(model="m", base_url="u", prompt="{missing}").messages(question="q")


def test_a_judge_as_a_tagged_attribute_and_its_settings_in_the_version(
    grader: tuple[ScriptedServer, Grader],
) -> None:
    server, _ = grader
    url = f"{server.url}/v1"

    class Tagged(TaskSet):
        correct = reward(ReferenceJudge(model="grader", base_url=url), weight=2.0)

    def env(taskset: TaskSet) -> Environment:
        return Environment("quiz", taskset, EnvConfig(taskset="x"), discover(taskset), "x", Path())

    tagged = env(Tagged())
    (scored,) = asyncio.run(Scorer(tagged).score([rollout(0, "paris")]))
    assert scored.rewards == {"correct": 1.0} and scored.reward == 2.0
    # Another model or prompt grades differently: another scorer version; another URL does not.
    judge, before = Tagged.correct, rules_version(tagged)
    judge.model = "other"  # type: ignore[attr-defined]
    assert rules_version(env(Tagged())) != before
    judge.model, judge.base_url = "grader", "http://elsewhere/v1"  # type: ignore[attr-defined]
    assert rules_version(env(Tagged())) == before


def test_eval_stores_the_judge_calls_as_trace_nodes_of_each_scoring(
    settings: Settings,  # noqa: F811
    grader: tuple[ScriptedServer, Grader],
) -> None:
    server, _ = grader
    policy = ScriptedServer(ScriptedModel(chat=lambda messages, tools: {"content": "Paris"}))
    with policy:
        env = load_environment(
            f"{__name__}:Quiz",
            {
                "args": {"judge_model": "grader", "judge_url": f"{server.url}/v1"},
                "group_size": 2,
                "model": {"name": "scripted", "base_url": f"{policy.url}/v1"},
            },
        )
        result = run_eval(
            env, settings, n=2, run_id=f"judged-{uuid.uuid4().hex[:8]}", show_progress=False
        )
    # "Paris" is right for one task of two; the rubric's items all hold for both.
    assert result.report.rewards == {"correct": 0.5, "style": 1.0}
    judged = rows(
        settings,
        "SELECT s.rollout_id, count(), countIf(n.role = 'assistant'), groupUniqArray(n.branch_id) "
        "FROM trace_nodes AS n FINAL INNER JOIN "
        "(SELECT event_id, rollout_id FROM scored FINAL WHERE run_id = {run:String}) AS s "
        "ON n.rollout_id = s.event_id GROUP BY s.rollout_id",
        result.run_id,
    )
    assert len(judged) == 4 and {(n, a, tuple(b)) for _, n, a, b in judged} == {
        (6, 2, (JUDGE_BRANCH,))
    }
    # The policy's own trace is untouched: no judge branch among its rollouts' nodes.
    with open_store(settings.store.url, read_only=True) as store:
        own = store.read_events(
            TraceNode,
            "rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = {run:String})",
            parameters={"run": result.run_id},
        )
    assert own and {n.branch_id for n in own} == {"main"}


async def test_a_judge_served_by_rlbus_inference_records_tokens_and_version(
    tmp_path: Path,
) -> None:
    """A tiny untrained model answers noise, so this judge's grade is the answer's length: what
    is checked is the call and what it records."""
    model_dir = tmp_path / "tiny"
    init_model(model_dir)
    app = build_app(build_backend(model_dir), model_dir, model_name="tiny", renderer="template")
    with ServerThread(app, lifespan="on") as engine:
        judge = LLMJudge(
            model="tiny",
            base_url=f"{engine.url}/v1",
            prompt="Grade: {response}",
            parse=lambda answer: float(len(answer)),
            max_tokens=4,
            temperature=1.0,
        )

        class Graded(TaskSet):
            length = reward(judge)

        taskset = Graded()
        env = Environment("quiz", taskset, EnvConfig(taskset="x"), discover(taskset), "x", Path())
        scorer = Scorer(env)
        scoring = await scorer.scoring([rollout(0, "Paris")])
        await scorer.aclose()
        # A request the endpoint refuses (a model it does not serve) is not asked again.
        unknown = LLMJudge(model="nope", base_url=f"{engine.url}/v1", prompt="{question}")
        with pytest.raises(JudgeError, match="1 attempt: .* answered 404"):
            await unknown.grade(question="q")
        await unknown.aclose()
    (scored,) = scoring.scored
    assert scored.status == "ok", scored.error
    system, user, answer = scoring.trace
    assert len(tokens(system.token_ids)) == 0 and len(tokens(user.token_ids)) > 0
    assert 0 < len(tokens(answer.token_ids)) <= 4
    recorded = answer.message[JUDGE_BRANCH]
    assert recorded["model"] == "tiny" and recorded["policy_version"] == 0
    assert recorded["completion_tokens"] == len(tokens(answer.token_ids))
    assert recorded["prompt_tokens"] == len(tokens(user.token_ids))
    assert recorded["grade"] == scored.rewards["length"] and recorded["latency_s"] > 0


async def test_the_orchestrator_leaves_judge_nodes_alone(settings: Settings) -> None:  # noqa: F811
    """A scoring's trace nodes reach the orchestrator on trace-nodes: it neither holds them for
    a rollout that will never come nor trains on them. Published through the real broker before
    a node of the same key, so once that one is in, the judge's was handled."""
    from rlbus.bus import Bus
    from rlbus.bus.waiting import wait_until
    from rlbus.config.orchestrator import OrchestratorConfig
    from rlbus.consumers.orchestrator.join import Joiner
    from rlbus.consumers.orchestrator.orchestration import Orchestrator, run_orchestrator
    from rlbus.consumers.orchestrator.task_draw import TaskSource

    run = f"orch-{uuid.uuid4().hex[:8]}"
    scoring = derived_id("r0", "scored", "v1")
    judge_node, later = (
        TraceNode(run_id=run, node_id=f"n{i}", rollout_id=scoring, branch_id=branch, index=i)
        for i, branch in enumerate((JUDGE_BRANCH, "main"))
    )
    live = settings.model_copy(update={"run_id": run})
    async with Bus.of(live) as bus:
        o = Orchestrator(
            bus,
            OrchestratorConfig(),
            run,
            max_steps=1,
            tasks=TaskSource([], run, 0.0, 0),
            algorithms={},
            joiner=Joiner(run, set(), lambda env: 1.0),
        )
        stop = asyncio.Event()
        running = asyncio.create_task(run_orchestrator(bus, o, stop))
        await bus.publish_many([judge_node])
        await bus.publish_many([later])
        await wait_until(lambda: scoring in o.joiner.parts, 60, "the later node handled")
        stop.set()
        await running
    assert list(o.joiner.parts[scoring].nodes) == ["n1"]
    assert [d.event.node_id for d in o.held[scoring]] == ["n1"]  # type: ignore[attr-defined]


async def test_judge_calls_are_chat_spans_of_the_scoring(
    grader: tuple[ScriptedServer, Grader],
) -> None:
    """With telemetry on, each judge call is a GenAI chat span inside the scoring's span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from rlbus.bus import telemetry

    server, _ = grader
    scorer = Scorer(quiz(f"{server.url}/v1"))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer(provider.get_tracer("test"))
    try:
        scoring = await scorer.scoring([rollout(0, "Paris"), rollout(1, "Lyon")])
    finally:
        telemetry.use_tracer(None)
        await scorer.aclose()
    spans = exporter.get_finished_spans()
    (score,) = [s for s in spans if s.name == "score quiz"]
    calls = [s for s in spans if s.name == "chat grader"]
    assert len(calls) == 4  # two judges, two rollouts
    for call in calls:
        assert call.parent is not None and call.parent.span_id == score.context.span_id
        attrs = dict(call.attributes or {})
        assert (
            attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "grader"
        )
        assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["rlbus.judge"] in ("ReferenceJudge", "RubricJudge")
    results = {e.attributes["rlbus.rollout_id"]: e.attributes for e in score.events}
    assert {r: a["gen_ai.evaluation.score.value"] for r, a in results.items()} == {
        s.rollout_id: s.reward for s in scoring.scored
    }
