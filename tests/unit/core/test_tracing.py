"""services/core/telemetry/tracing.py: claim trace ids, the SDK's sampler settings, log lines."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.core.telemetry import logs, tracing
from tests.helpers.tracing import recording


def test_the_claim_trace_id_is_the_start_of_sha256_of_the_uid() -> None:
    uid = "6f1b7c0e-2d4a-4e8b-9c3f-0a1b2c3d4e5f"
    assert tracing.claim_trace_hex(uid) == hashlib.sha256(uid.encode()).hexdigest()[:32]


def test_a_claim_span_is_a_root_of_its_trace_unless_its_parent_is_in_that_trace() -> None:
    tracer, exporter = recording()
    with tracing.claim_span(tracer, "first", "u1") as first:
        pass
    mine = tracing.remote_parent(tracing.traceparent(first))
    foreign = tracing.remote_parent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    with tracing.claim_span(tracer, "child", "u1", parent=mine):
        pass
    with tracing.claim_span(tracer, "grafted", "u1", parent=foreign):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {s.context.trace_id for s in spans.values()} == {tracing.claim_trace_id("u1")}
    assert spans["first"].parent is None and spans["grafted"].parent is None
    assert spans["child"].parent is not None
    assert spans["child"].parent.span_id == first.get_span_context().span_id


def test_traceidratio_keeps_or_drops_a_claims_whole_life_in_every_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each service samples on its own; the derived trace id makes them agree."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    exporters = [InMemorySpanExporter(), InMemorySpanExporter()]
    tracers = [
        tracing.make_provider(name, SimpleSpanProcessor(exporter)).get_tracer(name)
        for name, exporter in zip(("allocator", "preparer"), exporters, strict=True)
    ]
    uids = [f"claim-{i}" for i in range(200)]
    for tracer in tracers:
        for uid in uids:
            with tracing.claim_span(tracer, "op", uid):
                pass
    kept = [{s.context.trace_id for s in e.get_finished_spans()} for e in exporters]
    assert kept[0] == kept[1]
    assert 40 < len(kept[0]) < 160  # sampled, not all or nothing


def test_an_unknown_protocol_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(tracing.TracingConfigError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        tracing.otlp_exporter()


def test_disabled_or_no_endpoint_means_no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.setup("x") is False
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.setup("x", processor=SimpleSpanProcessor(InMemorySpanExporter())) is False


def test_a_log_line_about_a_claim_carries_its_trace_id() -> None:
    formatter = logs.JsonFormatter("allocator")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "claim event", (), None)
    record.uid = "u1"
    assert json.loads(formatter.format(record))["trace_id"] == tracing.claim_trace_hex("u1")
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "started", (), None)
    assert "trace_id" not in json.loads(formatter.format(plain))
