"""OTLP trace export without building protobuf objects.

The SDK's exporters turn every span into protobuf message objects and then
serialise them: about 57 us of CPU per span, plus the gRPC call, in the
process that answers the kubelet. Claim spans are small and repetitive (the
same dozen attribute keys, node and subject values on every span), so this
module writes the OTLP wire format directly, caching the bytes of repeated
key/value pairs, resources and instrumentation scopes: a few microseconds per
span. The output parses to the same ``ExportTraceServiceRequest`` as the SDK's
``encode_spans`` (tests/unit/core/test_otlp.py compares them message by message).

:class:`GrpcSpanExporter` and :class:`HttpSpanExporter` are the SDK's OTLP
exporters (so every ``OTEL_EXPORTER_OTLP_*`` setting, retry and TLS option
stays theirs) with only the encoding replaced.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as SdkGrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as SdkHttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, Status

log = logging.getLogger(__name__)

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
CACHE_LIMIT = 4096  # cached key/value encodings before the cache starts over

# OTLP's SpanKind numbers (the API's enum starts at 0 for INTERNAL).
_KIND = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
_DOUBLE = struct.Struct("<d")
_EMPTY_STATUS = b"\x7a\x00"  # Span.status, an empty Status (the SDK always sends one)


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64: two's complement, ten bytes
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field; ``tag`` is (number << 3) | 2, below 128."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _text(tag: int, value: str) -> bytes:
    return _field(tag, value.encode("utf-8", "surrogatepass"))


def _any_value(value: Any) -> bytes:
    """An AnyValue message (the payload, without its own tag)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _text(0x0A, value)
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(0x3A, value)
    if isinstance(value, Sequence):
        return _field(0x2A, b"".join(_field(0x0A, _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(0x32, b"".join(_field(0x0A, _key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"cannot encode an attribute value of type {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    return _text(0x0A, key) + _field(0x12, _any_value(value))


class Encoder:
    """Encodes batches of finished spans as an ExportTraceServiceRequest.

    Key/value pairs with hashable values are cached by (key, value): on claim
    spans most of them repeat (subject, node, messaging attributes, outcome).
    """

    def __init__(self) -> None:
        self._pairs: dict[tuple[str, Any], bytes] = {}
        # Resources and scopes by value (both hash their contents): an id() could be
        # reused by a later provider's resource once the first is gone.
        self._headers: dict[Any, bytes] = {}

    def request(self, spans: Sequence[ReadableSpan]) -> bytes:
        groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
        for span in spans:
            resource = span.resource
            scope = span.instrumentation_scope
            scopes = groups.setdefault(id(resource), (resource, {}))[1]
            scopes.setdefault(id(scope), (scope, []))[1].append(self.span(span))
        out = []
        for resource, scopes in groups.values():
            body = [self._resource(resource)]
            for scope, encoded in scopes.values():
                body.append(_field(0x12, self._scope(scope) + b"".join(encoded)))
            if resource.schema_url:
                body.append(_text(0x1A, resource.schema_url))
            out.append(_field(0x0A, b"".join(body)))
        return b"".join(out)

    def span(self, span: ReadableSpan) -> bytes:
        """One Span, with its own tag (ScopeSpans.spans)."""
        context = span.context
        assert context is not None
        parent = span.parent
        parts = [
            b"\x0a\x10",
            context.trace_id.to_bytes(16, "big"),
            b"\x12\x08",
            context.span_id.to_bytes(8, "big"),
        ]
        if context.trace_state:
            parts.append(_text(0x1A, _trace_state(context)))
        if parent is not None:
            parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        parts += (
            _text(0x2A, span.name),
            bytes((0x30, _KIND[span.kind])),
            b"\x39",
            _FIXED64.pack(span.start_time or 0),
            b"\x41",
            _FIXED64.pack(span.end_time or 0),
        )
        if span.attributes:
            parts.append(self._attributes(0x4A, span.attributes))
        if span.dropped_attributes:
            parts.append(b"\x50" + _varint(span.dropped_attributes))
        for event in span.events:
            body = b"\x09" + _FIXED64.pack(event.timestamp) + _text(0x12, event.name)
            if event.attributes:
                body += self._attributes(0x1A, event.attributes)
            if event.dropped_attributes:
                body += b"\x20" + _varint(event.dropped_attributes)
            parts.append(_field(0x5A, body))
        if span.dropped_events:
            parts.append(b"\x60" + _varint(span.dropped_events))
        for link in span.links:
            linked = link.context
            body = b"\x0a\x10" + linked.trace_id.to_bytes(16, "big")
            body += b"\x12\x08" + linked.span_id.to_bytes(8, "big")
            if link.attributes:
                body += self._attributes(0x22, link.attributes)
            if link.dropped_attributes:
                body += b"\x28" + _varint(link.dropped_attributes)
            body += b"\x35" + _FIXED32.pack(_flags(linked))
            parts.append(_field(0x6A, body))
        if span.dropped_links:
            parts.append(b"\x70" + _varint(span.dropped_links))
        parts.append(_status(span.status))
        parts += (b"\x85\x01", _FIXED32.pack(_flags(parent)))
        return _field(0x12, b"".join(parts))

    def _attributes(self, tag: int, attributes: Mapping[str, Any]) -> bytes:
        """Each pair as its own repeated field ``tag`` (KeyValue)."""
        pairs = self._pairs
        out = []
        for key, value in attributes.items():
            try:
                encoded = pairs[(key, value)]
            except KeyError:
                encoded = self._encode_pair(tag, key, value)
                if encoded:
                    if len(pairs) >= CACHE_LIMIT:
                        pairs.clear()
                    pairs[(key, value)] = encoded
            except TypeError:  # an unhashable value (a list)
                encoded = self._encode_pair(tag, key, value)
            out.append(encoded)
        return b"".join(out)

    @staticmethod
    def _encode_pair(tag: int, key: str, value: Any) -> bytes:
        try:
            return _field(tag, _key_value(key, value))
        except TypeError as exc:  # the SDK's encoder logs and leaves the attribute out
            log.warning("span attribute %s not exported: %s", key, exc)
            return b""

    def _resource(self, resource: Any) -> bytes:
        """ResourceSpans.resource, field and all."""
        attributes = resource.attributes
        return self._cached(
            ("resource", resource), lambda: _field(0x0A, self._attributes(0x0A, attributes))
        )

    def _scope(self, scope: Any) -> bytes:
        """ScopeSpans.scope (and schema_url), fields and all."""

        def encode() -> bytes:
            if scope is None:
                return _field(0x0A, b"")
            body = _text(0x0A, scope.name) if scope.name else b""
            if scope.version:
                body += _text(0x12, scope.version)
            if scope.attributes:
                body += self._attributes(0x1A, scope.attributes)
            schema = _text(0x1A, scope.schema_url) if scope.schema_url else b""
            return _field(0x0A, body) + schema

        return self._cached(("scope", scope), encode)

    def _cached(self, key: Any, encode: Callable[[], bytes]) -> bytes:
        encoded = self._headers.get(key)
        if encoded is None:
            encoded = encode()
            if len(self._headers) >= 64:  # a few providers per process; never grows
                self._headers.clear()
            self._headers[key] = encoded
        return encoded


def _flags(context: SpanContext | None) -> int:
    if context is not None and context.is_remote:
        return _HAS_IS_REMOTE | _IS_REMOTE
    return _HAS_IS_REMOTE


def _trace_state(context: SpanContext) -> str:
    return ",".join(f"{key}={value}" for key, value in context.trace_state.items())


def _status(status: Status | None) -> bytes:
    if status is None or (not status.status_code.value and not status.description):
        return _EMPTY_STATUS
    body = _text(0x12, status.description) if status.description else b""
    if status.status_code.value:
        body += b"\x18" + _varint(status.status_code.value)
    return _field(0x7A, body)


class _RawStub:
    """The TraceService stub, sending already encoded request bytes."""

    def __init__(self, channel: Any) -> None:
        self.Export = channel.unary_unary(
            EXPORT_METHOD,
            request_serializer=None,  # bytes go out as they are
            response_deserializer=ExportTraceServiceResponse.FromString,
        )


class GrpcSpanExporter(SdkGrpcSpanExporter):
    """The SDK's OTLP/gRPC exporter (settings, retries, TLS) with :class:`Encoder`."""

    def __init__(self, **kwargs: Any) -> None:
        self._encoder = Encoder()
        super().__init__(**kwargs)

    def _initialize_channel_and_stub(self) -> None:
        super()._initialize_channel_and_stub()  # type: ignore[no-untyped-call]
        self._client = _RawStub(self._channel)  # type: ignore[assignment]

    def _translate_data(self, data: Sequence[ReadableSpan]) -> Any:
        return self._encoder.request(data)


class HttpSpanExporter(SdkHttpSpanExporter):
    """The SDK's OTLP/HTTP protobuf exporter with :class:`Encoder`."""

    def __init__(self, **kwargs: Any) -> None:
        self._encoder = Encoder()
        super().__init__(**kwargs)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            log.warning("exporter already shut down: %d spans dropped", len(spans))
            return SpanExportResult.FAILURE
        result = self._client.export(self._encoder.request(spans))
        if not result.success:
            log.warning("OTLP/HTTP export failed: %s", result.error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
