"""An OTLP/gRPC receiver that counts spans and drops them, for ``bench/prepare.py
--otlp-endpoint`` on a host without the Jaeger build (``--sink`` needs it).

    python bench/otlp_sink.py [--port 4317]

It prints the spans received every 10 s. Pin it to other CPUs than the node's
processes (``taskset``) so that it costs the measured side nothing.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self.names: Counter[str] = Counter()

    async def Export(self, request: Any, context: Any) -> Any:  # the gRPC method's name
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes
                 if a.key == "service.name"), "?",
            )  # fmt: skip
            for scope_spans in resource_spans.scope_spans:
                self.spans += len(scope_spans.spans)
                self.names.update(f"{service}: {s.name}" for s in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


async def serve(port: int) -> None:
    sink = Sink()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"OTLP/gRPC sink on 127.0.0.1:{port}", flush=True)
    while True:
        await asyncio.sleep(10)
        print(f"spans received: {sink.spans}", flush=True)
        for name, count in sorted(sink.names.items()):
            print(f"  {count:8d}  {name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=4317)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
