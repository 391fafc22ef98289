"""OpenTelemetry tracing: one trace per claim life, W3C context across NATS.

Every span about one ResourceClaim, in every service, lives in the same trace,
whose id is derived from the claim UID (:func:`claim_trace_id`): the
allocator's allocated/reserved/released/deleted/pending spans, each kubelet
call the front answers, each prepare and unprepare of the preparer, retries
included. No service has to find or hold an "owning" span to join the trace,
nothing has to be exported first, and searching Jaeger for the UID (or
opening ``/trace/<claim_trace_id(uid)>``) shows the claim's whole life. Each
operation is a root span of that trace (:func:`claim_span`), so no span points
at a parent nobody exports. A head sampler that decides on the trace id
(``traceidratio``) keeps or drops a claim's whole life together.

Other traces are linked, never joined: the kubelet's own ``traceparent``
becomes a link on the front's span, because one kubelet call may carry
several claims, each with its own trace.

The exporter and sampler come from the SDK's standard environment variables
(``OTEL_EXPORTER_OTLP_*``: endpoint, headers, certificate, protocol ``grpc``
or ``http/protobuf``; ``OTEL_TRACES_SAMPLER``/``_ARG``); ``--otlp-endpoint``
only sets the endpoint. Spans leave through a batch processor.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar

from opentelemetry import propagate, trace
from opentelemetry.context import Context, attach, create_key, detach, get_value, set_value
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_SDK_DISABLED,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

from services.core.model.schemas import ClaimRef
from services.core.telemetry import claimspan

# The claim's identity (OpenTelemetry k8s resource conventions where they exist).
ATTR_UID = "k8s.resourceclaim.uid"
ATTR_NAMESPACE = "k8s.namespace.name"
ATTR_NAME = "k8s.resourceclaim.name"
ATTR_NODE = "k8s.node.name"
# What the claim got, and how the operation ended.
ATTR_DEVICES = "gpudra.devices"  # device names, e.g. gpu-0, gpu-3-mig-1g10gb-0-0
ATTR_GPU_UUIDS = "gpudra.gpu.uuids"  # the physical GPUs (MIG devices: their own UUID too)
ATTR_CDI_IDS = "gpudra.cdi.ids"
ATTR_SHARING = "gpudra.sharing"  # exclusive, TimeSlicing, MPS, adminAccess, vfio
ATTR_OUTCOME = "gpudra.outcome"  # ok, error, pending
ATTR_EVENT = "gpudra.claim.event"  # the lifecycle event an allocator span published
ATTR_LINK = "gpudra.link"  # why a span links another trace (e.g. "kubelet")
ATTR_STEPS = "gpudra.steps"  # the operation's steps and their durations (see Steps)

OK, ERROR, PENDING = "ok", "error", "pending"

PROTOCOLS = ("grpc", "http/protobuf")
EXPORT_BATCH = 64
STEPS_SETTING = "GPUDRA_TRACE_STEPS"

_provider: TracerProvider | None = None
_ROOT = Context()  # no parent: a span started in it is the root of a (claim) trace
_next_trace_id: ContextVar[int] = ContextVar("gpudra_next_trace_id", default=0)


class TracingConfigError(ValueError):
    """An OTEL_* setting the SDK cannot work with (named, with what was expected)."""


class ClaimIdGenerator(RandomIdGenerator):
    """Random ids, except the trace id of a root span started by :func:`claim_span`."""

    def generate_trace_id(self) -> int:
        return _next_trace_id.get() or super().generate_trace_id()


def setup(
    service: str,
    endpoint: str = "",
    exporter: SpanExporter | None = None,
    processor: SpanProcessor | None = None,
) -> bool:
    """Install the tracer provider; True if tracing is on.

    Without an endpoint (``--otlp-endpoint`` or the OTLP endpoint variables),
    exporter or processor, spans stay no-ops: they cost a context lookup.
    """
    global _provider
    if endpoint:
        os.environ[OTEL_EXPORTER_OTLP_ENDPOINT] = endpoint  # the SDK reads it from there
    wanted = exporter is not None or processor is not None or _endpoint_configured()
    if not wanted or os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return False
    _provider = make_provider(service, processor or batch_processor(exporter or otlp_exporter()))
    trace.set_tracer_provider(_provider)
    return True


def batch_processor(exporter: SpanExporter) -> BatchSpanProcessor:
    """Export in batches of 64 unless ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` says otherwise.

    Encoding a batch holds the GIL: with the SDK's encoder 512 spans held it for
    about 10 ms, long enough to show in a prepare's p99. :mod:`otlp` encodes 64
    in well under a millisecond, which stays clear of the interpreter's 5 ms
    switch interval even on a loaded machine (256 measured worse at p99).
    """
    size = None if os.environ.get(OTEL_BSP_MAX_EXPORT_BATCH_SIZE) else EXPORT_BATCH
    return BatchSpanProcessor(exporter, max_export_batch_size=size)


def make_provider(service: str, processor: SpanProcessor) -> TracerProvider:
    """A provider for ``gpudra-<service>`` with claim trace ids; the SDK picks the sampler
    (``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``, default parentbased_always_on)."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"gpudra-{service}"}),
        id_generator=ClaimIdGenerator(),
    )
    provider.add_span_processor(processor)
    return provider


def _endpoint_configured() -> bool:
    return bool(
        os.environ.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
        or os.environ.get(OTEL_EXPORTER_OTLP_ENDPOINT)
    )


def otlp_exporter() -> SpanExporter:
    """The OTLP exporter of ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` (default grpc).

    Each exporter reads its endpoint, headers, certificate, compression and
    timeout from the standard variables itself.
    """
    protocol = (
        os.environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
        or os.environ.get(OTEL_EXPORTER_OTLP_PROTOCOL)
        or "grpc"
    ).strip()
    from services.core.telemetry import otlp  # grpc and HTTP clients: only when exporting

    if protocol == "grpc":
        return otlp.GrpcSpanExporter()
    if protocol == "http/protobuf":
        return otlp.HttpSpanExporter()
    raise TracingConfigError(
        f"{OTEL_EXPORTER_OTLP_TRACES_PROTOCOL} / {OTEL_EXPORTER_OTLP_PROTOCOL}: "
        f"want one of {', '.join(PROTOCOLS)}, got {protocol!r}"
    )


def shutdown() -> None:
    """Export what is still queued (the batch processor's last batch)."""
    if _provider is not None:
        _provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


# ------------------------------------------------------------ claim traces


@functools.lru_cache(maxsize=4096)
def claim_trace_id(uid: str) -> int:
    """The trace id of every span about claim ``uid``: 128 bits of sha256(uid)."""
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:16], "big") or 1


def claim_trace_hex(uid: str) -> str:
    """:func:`claim_trace_id` as Jaeger shows it (32 hex digits)."""
    return f"{claim_trace_id(uid):032x}"


def start_claim_span(
    tracer: trace.Tracer,
    name: str,
    uid: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
    links: Sequence[Link] | None = None,
    parent: Context | None = None,
) -> Span:
    """A started (not current) span in claim ``uid``'s trace; the caller ends it.

    ``parent`` (a remote context) is its parent when it belongs to that trace;
    otherwise, or without one, the span is a root of the claim's trace.
    """
    trace_id = claim_trace_id(uid)
    context = _ROOT
    parent_span = None
    if parent is not None:
        parent_span = span_context_of(parent)
        if parent_span.trace_id == trace_id and parent_span.is_valid:
            context = parent
        else:
            parent_span = None
    sdk = claimspan.sdk_tracer(tracer)
    if sdk is not None:
        return claimspan.start(
            sdk, name, trace_id, parent_span, context, kind, attributes, links or ()
        )
    token = _next_trace_id.set(trace_id)
    try:
        return tracer.start_span(name, context, kind, attributes, links)
    finally:
        _next_trace_id.reset(token)


@contextlib.contextmanager
def claim_span(
    tracer: trace.Tracer,
    name: str,
    uid: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
    links: Sequence[Link] | None = None,
    parent: Context | None = None,
) -> Iterator[Span]:
    """:func:`start_claim_span`, current while the block runs.

    An exception leaving the block marks the span as an error (the SDK's
    default); :func:`finish` records an outcome.
    """
    span = start_claim_span(
        tracer, name, uid, kind=kind, attributes=attributes, links=links, parent=parent
    )
    with trace.use_span(span, end_on_exit=True):
        yield span


def finish(span: Span, error: str = "", outcome: str = "") -> None:
    """Record the outcome (``ok``/``error``/``pending``) and, for an error, the status."""
    span.set_attribute(ATTR_OUTCOME, outcome or (ERROR if error else OK))
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))


def claim_attributes(claim: ClaimRef, node: str) -> dict[str, AttributeValue]:
    """The claim's identity, as every claim span carries it."""
    return {
        ATTR_UID: claim.uid,
        ATTR_NAMESPACE: claim.namespace,
        ATTR_NAME: claim.name,
        ATTR_NODE: node,
    }


# ------------------------------------------------------------ steps of an operation


class Steps:
    """The steps of a claim operation (checkpoint, CDI write, MPS start, ...).

    ``GPUDRA_TRACE_STEPS`` says how a trace shows them:

    - ``summary`` (default): one attribute on the operation's span,
      ``gpudra.steps`` = ``claim.fetch=0.08ms checkpoint.started=2.31ms ...`` (a
      step that raised ends in ``!``). Nothing per step but a clock read and a
      tuple, where a span with its export costs 100 to 300 us of CPU.
    - ``events``: one span event per step (start time, ``duration_ms``, ``error``).
    - ``spans``: one child span per step, the waterfall, at a span's cost each.

    A step records into the operation opened by :func:`operation` (found through
    the OpenTelemetry context, so a step run in another thread with that context
    counts too); outside one, or with tracing off, it records nothing.
    """

    def __init__(self, tracer: trace.Tracer, mode: str | None = None) -> None:
        self.tracer = tracer
        self.mode = mode or step_mode()

    @contextlib.contextmanager
    def step(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        context: Context | None = None,
    ) -> Iterator[None]:
        """``context``: where the operation's span is current (another thread's step)."""
        if self.mode == "spans":
            with self.tracer.start_as_current_span(name, context, attributes=attributes):
                yield
            return
        record: list[tuple[str, int, int, str]] | None = get_value(_STEPS, context)  # type: ignore[assignment]
        if record is None:
            yield
            return
        started = time.time_ns()
        error = ""
        try:
            yield
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            record.append((name, started, time.time_ns(), error))
            if self.mode == "events":
                event: dict[str, AttributeValue] = dict(attributes or {})
                event["duration_ms"] = round((time.time_ns() - started) / 1e6, 3)
                if error:
                    event["error"] = error
                trace.get_current_span(context).add_event(name, event, started)


STEP_MODES = ("summary", "events", "spans")
_STEPS = create_key("gpudra-steps")


def step_mode() -> str:
    """``GPUDRA_TRACE_STEPS`` (summary, events or spans; anything else: summary)."""
    mode = os.environ.get(STEPS_SETTING, "").strip().lower()
    return mode if mode in STEP_MODES else "summary"


@contextlib.contextmanager
def operation(span: Span) -> Iterator[None]:
    """Steps run in this block are recorded for ``span`` (see :class:`Steps`)."""
    if not span.is_recording():
        yield
        return
    record: list[tuple[str, int, int, str]] = []
    token = attach(set_value(_STEPS, record))
    try:
        yield
    finally:
        detach(token)
        if record:
            span.set_attribute(
                ATTR_STEPS,
                " ".join(
                    f"{name}={(end - start) / 1e6:.2f}ms{'!' if error else ''}"
                    for name, start, end, error in record
                ),
            )


# ------------------------------------------------------------ the NATS hop


def messaging_span_name(operation: str, template: str) -> str:
    """``{operation} {destination template}``: OpenTelemetry's messaging span names."""
    return f"{operation} {template}"


def messaging_attributes(operation: str, subject: str, template: str) -> dict[str, AttributeValue]:
    """The messaging convention attributes of one side of a NATS request/reply.

    ``operation`` is ``send`` (the requester's CLIENT span) or ``process``
    (the responder's SERVER span); built once per subject, not per span.
    """
    return {
        "messaging.system": "nats",
        "messaging.operation.type": operation,
        "messaging.operation.name": "request" if operation == "send" else "process",
        "messaging.destination.name": subject,
        "messaging.destination.template": template,
    }


# ------------------------------------------------------------ propagation


def inject(headers: dict[str, str] | None = None) -> dict[str, str]:
    """The current context as NATS headers (``traceparent``, ``tracestate``)."""
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier)
    return carrier


def extract(headers: Mapping[str, str] | None) -> Context:
    return propagate.extract(dict(headers or {}))


def traceparent(span: Span) -> str:
    """``span``'s W3C traceparent ('' when tracing is off), formatted without a Context."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def headers_of(span: Span) -> dict[str, str]:
    """NATS headers carrying ``span``'s context (none when tracing is off)."""
    value = traceparent(span)
    return {"traceparent": value} if value else {}


def remote_parent(value: str) -> Context:
    """A context whose parent is the W3C ``traceparent`` ``value`` (empty if malformed).

    Parsed here rather than by the SDK's propagator (a third of a claim span's
    cost in the preparer): the version-00 form, as the propagator accepts it.
    """
    match = _TRACEPARENT.fullmatch(value) if value else None
    if match is None:
        return _ROOT
    trace_id, span_id = int(match[2], 16), int(match[3], 16)
    if match[1] == "ff" or not trace_id or not span_id or (match[1] == "00" and match[5]):
        return _ROOT
    flags = TraceFlags(int(match[4], 16))
    remote = SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(NonRecordingSpan(remote), _ROOT)


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def link_to(context: Context, why: str) -> list[Link]:
    """A link to the span current in ``context`` (none when there is none)."""
    span_context = trace.get_current_span(context).get_span_context()
    if not span_context.is_valid:
        return []
    return [Link(span_context, {ATTR_LINK: why})]


def span_context_of(context: Context) -> SpanContext:
    return trace.get_current_span(context).get_span_context()


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else ""
