"""OpenTelemetry: spans around publish and handle, W3C trace context in Kafka headers, so one
rollout's path across roles and processes is one trace: the task's publish, the env producer's
rollout (`invoke_agent`) and its model calls, the judge's scoring, then the orchestrator's batch
(a child of its first rollout, linked to all of them) and the trainer's step. Off by default:
when no exporter is configured nothing is created on the hot path.

Attribute names follow OpenTelemetry's GenAI conventions (gen_ai.*); what they have no name for
(ids, policy versions, token-level fields) is under rlbus.*."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from rlbus.config import TelemetryConfig

_tracer: trace.Tracer | None = None
_installed = False
"""A process installs one tracer provider (OpenTelemetry refuses a second); a command that
also starts a role keeps its first one."""


def setup_telemetry(config: TelemetryConfig, role: str) -> None:
    """Install a tracer provider for this process when an exporter is configured; spans are
    flushed when the process exits."""
    global _tracer, _installed
    if config.exporter == "none":
        _tracer = None
        return
    if _installed:
        _tracer = trace.get_tracer("rlbus")
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if config.exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint)
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"{config.service_name}.{role}"})
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _installed = True
    _tracer = trace.get_tracer("rlbus")


def use_tracer(tracer_: trace.Tracer | None) -> None:
    """Route rlbus spans to a given tracer (tests, embedding apps); None turns them off."""
    global _tracer
    _tracer = tracer_


def enabled() -> bool:
    return _tracer is not None


def tracer() -> trace.Tracer:
    return _tracer or trace.get_tracer("rlbus")


def inject_headers(headers: list[tuple[str, bytes]]) -> None:
    """Append `traceparent`/`tracestate` for the current span to Kafka headers."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    headers.extend((k, v.encode()) for k, v in carrier.items())


def extract_context(headers: Sequence[tuple[str, bytes]]) -> otel_context.Context:
    carrier = {
        k: v.decode(errors="replace") for k, v in headers if k in ("traceparent", "tracestate")
    }
    return propagate.extract(carrier)


def current() -> otel_context.Context | None:
    """This task's context, to carry where a task boundary would lose it (an HTTP handler
    serving a rollout, a publish after the fact); None when telemetry is off."""
    return otel_context.get_current() if _tracer is not None else None


def links(contexts: Iterable[otel_context.Context | None]) -> list[trace.Link]:
    """Links to the spans that `contexts` hold (a batch's many parents); none when off."""
    out = []
    for context in contexts:
        if context is None:
            continue
        span_context = trace.get_current_span(context).get_span_context()
        if span_context.is_valid:
            out.append(trace.Link(span_context))
    return out


def joining(headers: Iterable[Sequence[tuple[str, bytes]]]) -> dict[str, Any]:
    """`span` arguments for work on many messages (a group's scoring, a batch): a child of the
    first message's trace, linked to every message's; none when telemetry is off."""
    if _tracer is None:
        return {}
    contexts = [extract_context(h) for h in headers]
    return {"parent": contexts[0] if contexts else None, "linked": links(contexts)}


@contextmanager
def span(
    name: str,
    kind: trace.SpanKind,
    parent: otel_context.Context | None = None,
    attributes: dict[str, Any] | None = None,
    linked: Sequence[trace.Link] = (),
) -> Iterator[trace.Span | None]:
    """A span when telemetry is on; a no-op otherwise. `parent`: the context to start it in
    (default: the current one)."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes, links=linked
    ) as s:
        yield s
