"""services/core/telemetry/claimspan.py: a ClaimSpan behaves as the SDK's span where it shows.

Each test runs the same operations on an SDK span and on a ClaimSpan of the
same tracer settings and compares what a processor receives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.core.telemetry import claimspan, tracing

Operations = Callable[[trace.Span], None]


def recorder(**provider: Any) -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(id_generator=tracing.ClaimIdGenerator(), **provider)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider.get_tracer("test", "1.2"), exporter


def view(span: ReadableSpan) -> dict[str, Any]:
    """What an exporter reads of a span, ids aside."""
    return {
        "name": span.name,
        "kind": span.kind,
        "trace_id": span.context.trace_id if span.context else None,
        "flags": span.context.trace_flags if span.context else None,
        "parent": span.parent.span_id if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "dropped_attributes": span.dropped_attributes,
        "events": [(e.name, dict(e.attributes or {})) for e in span.events],
        "dropped_events": span.dropped_events,
        "links": [(link.context.span_id, dict(link.attributes or {})) for link in span.links],
        "dropped_links": span.dropped_links,
        "status": (span.status.status_code, span.status.description),
        "scope": span.instrumentation_scope,
        "resource": span.resource.attributes,
        "ended": span.end_time is not None and span.start_time is not None,
    }


def both(operations: Operations, **provider: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``operations`` on an SDK span and on a ClaimSpan; the views of each."""
    tracer, exporter = recorder(**provider)
    uid = "uid-1"
    trace_id = tracing.claim_trace_id(uid)
    parent = SpanContext(trace_id, 0xABC, is_remote=True, trace_flags=TraceFlags(1))
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    links = [Link(SpanContext(7, 8, is_remote=True), {"why": "kubelet"})]
    attributes = {"k8s.node.name": "n1", "gpudra.devices": ("gpu-0", "gpu-1")}
    sdk_span = tracer.start_span("op", context, SpanKind.SERVER, attributes, links)
    assert not isinstance(sdk_span, claimspan.ClaimSpan)
    lean = tracing.start_claim_span(
        tracer, "op", uid, kind=SpanKind.SERVER, attributes=attributes, links=links,
        parent=context,
    )  # fmt: skip
    assert isinstance(lean, claimspan.ClaimSpan)
    for span in (sdk_span, lean):
        operations(span)
        span.end()
    sdk_view, lean_view = (view(s) for s in exporter.get_finished_spans())
    return sdk_view, lean_view


def attributes_of_every_kind(span: trace.Span) -> None:
    span.set_attributes(
        {
            "s": "text",
            "b": False,
            "i": -3,
            "f": 1.5,
            "t": ("a", "b"),
            "list": ["x", "y"],  # a list becomes a tuple
            "mixed": (1, "a"),
            "bytes": b"\x00\x01",
            "nested": {"a": 1, "b": ("c",)},
            "object": object(),  # type: ignore[dict-item]  # dropped (no str of its own)
            "": "empty key",
        }
    )
    span.set_attribute("s", "replaced")
    span.add_event("pending", {"reason": "no GPU free", "count": 2})
    span.add_link(SpanContext(9, 10, is_remote=False), {"n": 1})
    span.set_status(Status(StatusCode.ERROR, "failed"))


def status_rules(span: trace.Span) -> None:
    span.set_status(StatusCode.UNSET)  # ignored
    span.set_status(StatusCode.ERROR, "first")
    span.set_status(Status(StatusCode.OK))
    span.set_status(Status(StatusCode.ERROR, "after OK"))  # OK is final
    span.update_name("renamed")


def an_exception(span: trace.Span) -> None:
    try:
        raise ValueError("bad config: field 'sharing'")
    except ValueError as exc:
        span.record_exception(exc, {"extra": 1}, escaped=True)


@pytest.mark.parametrize("operations", [attributes_of_every_kind, status_rules, an_exception])
def test_a_claim_span_records_what_the_sdk_span_records(operations: Operations) -> None:
    sdk_view, lean_view = both(operations)
    if operations is an_exception:  # the stack traces differ by the line that recorded
        for v in (sdk_view, lean_view):
            v["events"] = [(n, {k: a for k, a in e.items() if k != "exception.stacktrace"})
                           for n, e in v["events"]]  # fmt: skip
    assert lean_view == sdk_view


def test_the_span_limits_apply_as_in_the_sdk() -> None:
    def many(span: trace.Span) -> None:
        span.set_attributes({f"a{i}": "0123456789" for i in range(6)})
        for i in range(4):
            span.add_event(f"e{i}", {f"x{j}": j for j in range(5)})
        span.add_link(SpanContext(11, 12, is_remote=False))

    limits = SpanLimits(
        max_span_attributes=4,
        max_events=2,
        max_links=1,
        max_event_attributes=2,
        max_attribute_length=4,
    )
    sdk_view, lean_view = both(many, span_limits=limits)
    assert lean_view == sdk_view
    assert lean_view["dropped_attributes"] > 0 and lean_view["dropped_events"] == 2


def test_an_ended_span_changes_no_more(caplog: pytest.LogCaptureFixture) -> None:
    def end_then_touch(span: trace.Span) -> None:
        span.end()
        span.set_attribute("late", 1)
        span.add_event("late")
        span.set_status(StatusCode.ERROR, "late")

    sdk_view, lean_view = both(end_then_touch)
    assert lean_view == sdk_view
    assert "late" not in lean_view["attributes"]
    assert "has ended" in caplog.text


@pytest.mark.parametrize(
    "sampler", [ALWAYS_OFF, TraceIdRatioBased(0.0), ParentBased(TraceIdRatioBased(1.0))]
)
def test_the_tracers_sampler_decides(sampler: Any) -> None:
    tracer, exporter = recorder(sampler=sampler)
    unsampled = SpanContext(tracing.claim_trace_id("u"), 5, is_remote=True)  # flags 0
    parent = trace.set_span_in_context(trace.NonRecordingSpan(unsampled))
    span = tracing.start_claim_span(tracer, "op", "u", parent=parent)
    span.end()
    assert not span.is_recording() and exporter.get_finished_spans() == ()
    assert span.get_span_context().trace_id == tracing.claim_trace_id("u")


def test_without_an_sdk_tracer_nothing_is_recorded() -> None:
    span = tracing.start_claim_span(trace.NoOpTracer(), "op", "u")
    assert not span.is_recording()
    assert claimspan.sdk_tracer(trace.NoOpTracer()) is None


W3C_CASES = [
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
    "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future",  # a later version
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",  # 00 has no more
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
    "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
    "not a traceparent",
    "",
]


@pytest.mark.parametrize("value", W3C_CASES)
def test_remote_parent_reads_traceparent_as_the_sdk_propagator_does(value: str) -> None:
    ours = tracing.span_context_of(tracing.remote_parent(value))
    theirs = tracing.span_context_of(
        TraceContextTextMapPropagator().extract({"traceparent": value})
    )
    assert (ours.trace_id, ours.span_id, ours.trace_flags, ours.is_valid) == (
        theirs.trace_id,
        theirs.span_id,
        theirs.trace_flags,
        theirs.is_valid,
    )
    assert ours.is_remote == theirs.is_remote or not ours.is_valid
