"""services/core/telemetry/otlp.py: the hand-written OTLP encoding equals the SDK's, on the wire.

The encoder is checked message by message against the SDK's ``encode_spans``
(both parsed by the official protobuf classes); the exporters are checked
against real gRPC and HTTP receivers on 127.0.0.1, with the standard
``OTEL_EXPORTER_OTLP_*`` settings.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from services.core.model.schemas import ClaimRef
from services.core.telemetry import otlp, tracing

Request = trace_service_pb2.ExportTraceServiceRequest


def spans_of_every_shape() -> list[ReadableSpan]:
    """SDK spans and claim spans from two resources and three scopes."""
    finished: list[ReadableSpan] = []
    for service in ("preparer", "front"):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(
            resource=Resource.create({"service.name": f"gpudra-{service}", "n": 3}),
            id_generator=tracing.ClaimIdGenerator(),
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        plain = provider.get_tracer("plain")
        scoped = provider.get_tracer("scoped", "1.0", "https://schema", {"scope.attr": True})
        ref = ClaimRef(uid=f"uid-{service}", namespace="ns-é", name="claim")
        remote = SpanContext(
            tracing.claim_trace_id(ref.uid), 0x1234, is_remote=True,
            trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "v1"), ("x", "y")]),
        )  # fmt: skip
        parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        links = [Link(SpanContext(5, 6, is_remote=True), {"gpudra.link": "kubelet"})]
        with tracing.claim_span(
            plain, "process dra.node.{node}.prepare", ref.uid, kind=SpanKind.SERVER,
            attributes=tracing.claim_attributes(ref, "node-1"), links=links, parent=parent,
        ) as span:  # fmt: skip
            span.set_attributes(
                {
                    "gpudra.devices": ("gpu-0", "gpu-1"),
                    "count": -7,
                    "big": 2**62,
                    "ratio": 0.25,
                    "ok": True,
                    "no": False,
                    "empty": "",
                    "raw": b"\x00\xff",
                    "nested": {"a": ("b",), "c": {"d": 1}},
                    "mixed": (1, "a", 2.5),
                }
            )
            span.add_event("pending", {"reason": "no GPU"}, timestamp=123)
            span.add_event("bare")
            tracing.finish(span, "prepare failed: CDI write")
        with scoped.start_as_current_span("discovery.scan", kind=SpanKind.INTERNAL) as sdk:
            sdk.set_status(Status(StatusCode.OK))
            sdk.add_link(SpanContext(9, 10, is_remote=False))
        with tracing.claim_span(plain, "send", ref.uid, kind=SpanKind.CLIENT):
            pass  # no attributes, unset status
        finished += exporter.get_finished_spans()
    return finished


def test_the_encoding_parses_to_the_sdks_request() -> None:
    spans = spans_of_every_shape()
    ours = Request.FromString(otlp.Encoder().request(spans))
    assert ours == encode_spans(spans)
    assert len(ours.resource_spans) == 2
    assert sum(len(s.spans) for r in ours.resource_spans for s in r.scope_spans) == len(spans)


def test_cached_pairs_do_not_leak_between_spans() -> None:
    """The same encoder over many batches: every batch still equals the SDK's."""
    encoder = otlp.Encoder()
    for _ in range(3):
        spans = spans_of_every_shape()
        for one in spans:
            assert Request.FromString(encoder.request([one])) == encode_spans([one])


def test_an_unencodable_attribute_is_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Odd:
        pass

    span = spans_of_every_shape()[0]
    span._attrs["odd"] = Odd()  # type: ignore[attr-defined]  # past the span's own checks
    decoded = Request.FromString(otlp.Encoder().request([span]))
    keys = [kv.key for kv in decoded.resource_spans[0].scope_spans[0].spans[0].attributes]
    assert "odd" not in keys and "k8s.resourceclaim.uid" in keys
    assert "span attribute odd not exported" in caplog.text


# ------------------------------------------------------------ real receivers


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.metadata: list[dict[str, str]] = []

    def Export(self, request: Request, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_collector() -> Iterator[tuple[str, Collector]]:
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", collector
    server.stop(None)


def test_the_grpc_exporter_sends_the_encoding_with_the_standard_settings(
    grpc_collector: tuple[str, Collector], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, collector = grpc_collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k,x-tenant=gpu")
    exporter = tracing.otlp_exporter()
    assert isinstance(exporter, otlp.GrpcSpanExporter)
    spans = spans_of_every_shape()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert collector.requests == [encode_spans(spans)]
    assert collector.metadata[0]["authorization"] == "Bearer t0k"
    assert collector.metadata[0]["x-tenant"] == "gpu"


def test_the_grpc_exporter_reports_a_collector_that_is_not_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # discard port
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    exporter = tracing.otlp_exporter()
    assert exporter.export(spans_of_every_shape()) is SpanExportResult.FAILURE
    exporter.shutdown()


class HttpCollector(BaseHTTPRequestHandler):
    bodies: list[tuple[str, dict[str, str], bytes]] = []
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        HttpCollector.bodies.append(
            (self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        self.send_response(HttpCollector.status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_collector() -> Iterator[str]:
    HttpCollector.bodies = []
    HttpCollector.status = 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), HttpCollector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_http_exporter_posts_the_encoding(
    http_collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", http_collector)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=gpu")
    exporter = tracing.otlp_exporter()
    assert isinstance(exporter, otlp.HttpSpanExporter)
    spans = spans_of_every_shape()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    path, headers, body = HttpCollector.bodies[0]
    assert path == "/v1/traces"
    assert headers["x-tenant"] == "gpu"
    assert headers["content-type"] == "application/x-protobuf"
    assert Request.FromString(body) == encode_spans(spans)
    HttpCollector.status = 400  # refused, not retried
    assert exporter.export(spans) is SpanExportResult.FAILURE
    exporter.shutdown()  # type: ignore[no-untyped-call]
    assert exporter.export(spans) is SpanExportResult.FAILURE
