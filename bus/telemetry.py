"""OpenTelemetry: spans around publish and handle, W3C trace context in Kafka headers, so one
rollout's path across roles and processes is one trace. Off by default: when no exporter is
configured nothing is created on the hot path."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from rlbus.config import TelemetryConfig

_tracer: trace.Tracer | None = None


def setup_telemetry(config: TelemetryConfig, role: str) -> None:
    """Install a tracer provider for this process when an exporter is configured."""
    global _tracer
    if config.exporter == "none":
        _tracer = None
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


@contextmanager
def span(
    name: str,
    kind: trace.SpanKind,
    parent: otel_context.Context | None = None,
    attributes: dict[str, Any] | None = None,
) -> Iterator[trace.Span | None]:
    """A span when telemetry is on; a no-op otherwise."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes) as s:
        yield s
