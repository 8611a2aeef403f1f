"""One trace per rollout, across processes: `rlbus tasks publish`, an env producer worker and a
judge worker export to a real OTLP/HTTP receiver on loopback, and a rollout's spans (the task's
publish, the rollout, its model calls, its scoring and the publishes between them) form one tree
with one trace id, named by OpenTelemetry's GenAI conventions."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from support import ScriptedModel, ScriptedServer
from support.in_process import run_in_process
from support.runs import run_config

from rlbus.bus import Bus, Delivery, telemetry
from rlbus.bus.server_thread import ServerThread
from rlbus.bus.waiting import wait_for
from rlbus.config import Settings, settings_variables
from rlbus.config.settings import TelemetryConfig
from rlbus.consumers.inference.model_init import init_model
from rlbus.consumers.inference.service import build_app, build_backend
from rlbus.environment import ModelConfig, load_environment
from rlbus.launch.processes import RoleProcess, alive
from rlbus.producers.interception import EvalBackend, InterceptionServer
from rlbus.schemas import TaskPublished

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _value(v: object) -> object:
    kind = v.WhichOneof("value")  # type: ignore[attr-defined]
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)  # type: ignore[attr-defined]
    return getattr(v, kind) if kind else None


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, object]
    links: list[tuple[str, str]]
    events: list[tuple[str, dict[str, object]]] = field(default_factory=list)


class Receiver:
    """An OTLP/HTTP traces endpoint: decodes each ExportTraceServiceRequest it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/v1/traces", self._export, methods=["POST"])])
        self.server = ServerThread(app, name="otlp-receiver")

    async def _export(self, request: Request) -> Response:
        export = ExportTraceServiceRequest.FromString(await request.body())
        got = []
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    got.append(
                        Span(
                            str(resource["service.name"]),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in s.attributes},
                            [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            [
                                (e.name, {a.key: _value(a.value) for a in e.attributes})
                                for e in s.events
                            ],
                        )
                    )
        with self._lock:
            self.spans += got
        return Response(b"", media_type="application/x-protobuf")

    def named(self, name: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.name == name]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    with r.server:
        yield r


def test_one_rollouts_spans_form_one_tree_across_processes(
    settings: Settings, receiver: Receiver, tmp_path: Path
) -> None:
    telemetry = TelemetryConfig(exporter="otlp", otlp_endpoint=f"{receiver.server.url}/v1/traces")
    settings = settings.model_copy(update={"telemetry": telemetry})
    env = load_environment(str(EXAMPLES / "reverse_text"))
    task = next(iter(env.tasks(settings.run_id).take(1)))
    source = tmp_path / "task.jsonl"
    row = {"prompt": task.prompt, "answer": task.answer, "info": task.info, "env": env.id}
    source.write_text(json.dumps(row) + "\n")

    def reverse(messages: list[dict], tools: object) -> dict:
        return {"content": messages[-1]["content"].split()[-1][::-1]}

    logs = tmp_path / "logs"
    with ScriptedServer(ScriptedModel(chat=reverse)) as upstream:
        model = ["--model", "scripted", "--base-url", f"{upstream.url}/v1"]
        workers = [
            RoleProcess("env", settings, logs, [str(EXAMPLES / "reverse_text"), *model]),
            RoleProcess("judge", settings, logs, [str(EXAMPLES / "reverse_text")]),
        ]
        try:
            publish = [sys.executable, "-m", "rlbus", "tasks", "publish", str(source)]
            done = subprocess.run(
                publish,
                env=settings_variables(settings) | _path_variables(),
                capture_output=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            size = env.config.group_size
            wait_for(
                lambda: len(receiver.named("publish scored")) >= size,
                120,
                "the judge's score spans at the receiver",
                check=alive(*workers),
            )
        finally:
            for worker in workers:
                assert worker.stop() == 0, worker.log_tail()

    (root,) = receiver.named("publish tasks")
    assert root.service == "rlbus.tasks.publish" and root.parent == ""
    spans = [s for s in receiver.spans if s.trace_id == root.trace_id]
    rollouts = {s.attributes["rlbus.rollout_id"] for s in receiver.named(f"invoke_agent {env.id}")}
    assert len(rollouts) == env.config.group_size
    # Every span about these rollouts is in this one trace, whichever process made it.
    about = [s for s in receiver.spans if s.attributes.get("rlbus.rollout_id") in rollouts]
    assert {s.trace_id for s in about} == {root.trace_id}
    assert {s.service for s in spans} == {"rlbus.tasks.publish", "rlbus.env", "rlbus.judge"}
    # One tree: one root, every other span's parent in the trace.
    ids = {s.span_id for s in spans}
    assert [s for s in spans if s.parent not in ids] == [root]
    by_id = {s.span_id: s for s in spans}

    def path(span: Span) -> list[str]:
        out = []
        while span.parent:
            span = by_id[span.parent]
            out.append(span.name)
        return out

    calls = [s for s in spans if s.name == "chat scripted"]
    assert len(calls) == env.config.group_size
    for call in calls:
        assert path(call) == [f"invoke_agent {env.id}", "process tasks", "publish tasks"]
        attrs = call.attributes
        assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"]
        assert attrs["gen_ai.usage.input_tokens"] > 0  # type: ignore[operator]
        assert attrs["gen_ai.usage.output_tokens"] > 0  # type: ignore[operator]
        assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    (agent,) = [s for s in spans if s.name == f"invoke_agent {env.id}"][:1]
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.name"] == env.id
    for published in (s for s in spans if s.name == "publish rollouts"):
        assert path(published)[0] == f"invoke_agent {env.id}"  # in its own rollout's span
    scoring = [s for s in spans if s.name == f"score {env.id}"]
    assert scoring and all(s.service == "rlbus.judge" for s in scoring)
    for score in scoring:
        # The judge consumes in batches: its scoring continues the first rollout's publish.
        assert path(score)[:2] == ["publish rollouts", f"invoke_agent {env.id}"]
        linked = {by_id[span_id].name for _, span_id in score.links}
        assert linked == {"publish rollouts"}
        results = [e for name, e in score.events if name == "gen_ai.evaluation.result"]
        assert {e["rlbus.rollout_id"] for e in results} <= rollouts
        assert all(e["gen_ai.evaluation.name"] == "reward" for e in results)
    scored = {e["rlbus.rollout_id"] for s in scoring for _, e in s.events}
    assert scored == rollouts
    for published in receiver.named("publish scored"):
        assert path(published)[0] == f"score {env.id}"


def _path_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RLBUS_")}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer(provider.get_tracer("rlbus-test"))
    try:
        yield exporter
    finally:
        telemetry.use_tracer(None)


@pytest.mark.slow
async def test_batches_and_steps_continue_their_rollouts_traces(
    settings: Settings, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A whole run in this process (every role, the real broker, the built-in inference
    engine): the orchestrator's batch is a child of its first rollout's trace and links to
    every rollout's score; the trainer's step is a child of the batch; inference's sampling
    continues the model call that asked for it."""
    model = tmp_path / "tiny"
    init_model(model, seed=0)
    cfg = run_config(settings, model, tmp_path, tasks_per_step=2, eval_every=10, eval_tasks=1)
    cfg = cfg.model_copy(update={"max_steps": 1})
    await run_in_process(cfg, EXAMPLES / "reverse_text", timeout_s=240)
    finished = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished}

    def parent(span: ReadableSpan) -> ReadableSpan:
        assert span.parent is not None, span.name
        return by_id[span.parent.span_id]

    (batch,) = [s for s in finished if s.name == "batch 1"]
    scored = {s.context.span_id: s for s in finished if s.name == "publish scored"}
    linked = [scored[link.context.span_id] for link in batch.links]
    # Every rollout of the batch's groups (2 tasks x group_size 4), each a score in its trace.
    assert len(linked) == 8 and len({s.context.trace_id for s in linked}) == 2
    assert parent(batch) is linked[0]
    (step,) = [s for s in finished if s.name == "train step 1"]
    assert parent(parent(step)).name == "batch 1"  # through the batch's publish
    assert step.context.trace_id == linked[0].context.trace_id
    # The step's trace starts at the orchestrator's publish of the task.
    root = step
    while root.parent is not None:
        root = parent(root)
    assert root.name == "publish tasks"
    served = [s for s in finished if s.kind == SpanKind.SERVER and s.name.endswith(" tiny")]
    assert served, sorted({s.name for s in finished})
    for span in served:
        call = parent(span)
        assert call.name.startswith("chat ") and call.kind == SpanKind.CLIENT
        # Train mode: the call's exact tokens are recorded, and the span says so (rlbus.*).
        assert call.attributes["rlbus.tokens.completion_ids"] > 0
        assert call.attributes["rlbus.tokens.prompt_ids"] > 0
        assert call.attributes["rlbus.tokens.logprob_sum"] < 0
        assert span.attributes["gen_ai.operation.name"] in ("chat", "text_completion")
        assert "rlbus.policy_version" in span.attributes


def test_rlbus_eval_traces_each_task_as_one_tree(
    settings: Settings, receiver: Receiver, tmp_path: Path
) -> None:
    """`rlbus eval` (a sink process beside it) exports a task's rollouts, model calls, scoring
    and publishes as one tree per task."""
    telemetry_env = {
        "RLBUS_TELEMETRY__EXPORTER": "otlp",
        "RLBUS_TELEMETRY__OTLP_ENDPOINT": f"{receiver.server.url}/v1/traces",
    }

    def reverse(messages: list[dict], tools: object) -> dict:
        return {"content": messages[-1]["content"].split()[-1][::-1]}

    with ScriptedServer(ScriptedModel(chat=reverse)) as upstream:
        command = [sys.executable, "-m", "rlbus", "eval", str(EXAMPLES / "reverse_text")]
        command += ["-m", "scripted", "--base-url", f"{upstream.url}/v1", "-n", "2"]
        environment = _path_variables() | settings_variables(settings) | telemetry_env
        done = subprocess.run(command, env=environment, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    env = load_environment(str(EXAMPLES / "reverse_text"))
    roots = receiver.named(f"evaluate {env.id}")
    assert len(roots) == 2 and {s.service for s in receiver.spans} == {"rlbus.eval"}
    assert all(root.parent == "" for root in roots)
    for root in roots:
        spans = [s for s in receiver.spans if s.trace_id == root.trace_id]
        by_id = {s.span_id: s for s in spans}
        assert [s for s in spans if s.parent not in by_id] == [root]
        names = [(s.name, by_id[s.parent].name) for s in spans if s is not root]
        size = env.config.group_size
        assert names.count((f"invoke_agent {env.id}", root.name)) == size
        assert names.count(("chat scripted", f"invoke_agent {env.id}")) == size
        assert names.count(("publish rollouts", f"invoke_agent {env.id}")) == size
        assert names.count(("publish tasks", root.name)) == 1
        assert names.count((f"score {env.id}", root.name)) == 1
        assert names.count(("publish scored", f"score {env.id}")) == size
        (score,) = [s for s in spans if s.name == f"score {env.id}"]
        assert {by_id[span_id].name for _, span_id in score.links} == {f"invoke_agent {env.id}"}


async def test_publishing_with_telemetry_off_makes_no_spans_and_no_trace_headers(
    settings: Settings,
) -> None:
    """Off (the default): no span is made and no trace context is written, even inside an
    application's own active span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer(None)
    async with Bus.of(settings) as bus:
        with provider.get_tracer("app").start_as_current_span("the app's own"):
            await bus.publish_many(
                [TaskPublished(task_id=f"t{i}", env="e", prompt="p") for i in range(3)]
            )
        stop = asyncio.Event()
        headers: list[dict[str, bytes]] = []

        async def on_event(d: Delivery) -> None:
            headers.append(dict(d.headers))
            if len(headers) == 3:
                stop.set()

        await asyncio.wait_for(bus.subscriber("tasks", group="off")(on_event).run(stop), 30)
    assert [s.name for s in exporter.get_finished_spans()] == ["the app's own"]
    assert all(set(h) == {"content-type", "rlbus-kind"} for h in headers), headers


async def test_rlbus_inference_continues_an_eval_mode_model_call(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """An eval-mode call (OpenAI chat) to rlbus's own inference server: the server's span is a
    child of the interception server's model call."""
    model_dir = tmp_path / "tiny"
    init_model(model_dir)
    app = build_app(build_backend(model_dir), model_dir, model_name="tiny", renderer="template")
    with ServerThread(app, lifespan="on") as engine:
        config = ModelConfig(name="tiny", base_url=f"{engine.url}/v1")
        async with InterceptionServer(EvalBackend(config)) as server:
            with server.session("r-eval") as session:
                for _ in range(2):  # the first call finds out who serves
                    await session.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    finished = spans.get_finished_spans()
    calls = {s.context.span_id: s for s in finished if s.kind == SpanKind.CLIENT}
    served = [s for s in finished if s.kind == SpanKind.SERVER]
    assert len(calls) == 2 and len(served) == 2, [s.name for s in finished]
    for span in served:
        assert span.name == "chat tiny" and span.parent is not None
        assert calls[span.parent.span_id].attributes["rlbus.rollout_id"] == "r-eval"
        assert span.attributes["gen_ai.operation.name"] == "chat"
