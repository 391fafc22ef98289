"""Spans recorded in memory, with the id generator the services install (claim traces)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.core.telemetry import tracing


def recording() -> tuple[trace.Tracer, InMemorySpanExporter]:
    """A tracer whose finished spans the exporter holds."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=tracing.ClaimIdGenerator())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def named(spans: Iterable[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def attr(span: ReadableSpan, key: str) -> object:
    return (span.attributes or {}).get(key)


def children(spans: Iterable[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
