"""A real OTLP/gRPC trace receiver on 127.0.0.1 that keeps what it receives.

For integration tests of a service process's spans without a Jaeger build:
the process exports with the SDK's own OTLP exporter, as in production.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span


@dataclass
class Received:
    """One span as received: ids in hex, attributes as Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)

    @classmethod
    def of(cls, span: Span) -> Received:
        return cls(
            name=span.name,
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_span_id=span.parent_span_id.hex(),
            kind=span.kind,
            attributes={a.key: _value(a.value) for a in span.attributes},
            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        )


def _value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


@dataclass
class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    spans: list[Received] = field(default_factory=list)
    port: int = 0
    _server: Any = None

    async def Export(self, request: Any, context: Any) -> Any:  # the gRPC method's name
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(Received.of(s) for s in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    async def start(self) -> OtlpReceiver:
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_for(self, name: str, count: int, timeout: float = 20) -> list[Received]:
        """The spans called ``name`` once ``count`` of them arrived."""
        deadline = time.monotonic() + timeout
        while True:
            found = [s for s in self.spans if s.name == name]
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} of {count} {name!r} spans within {timeout}s")
            await asyncio.sleep(0.05)
