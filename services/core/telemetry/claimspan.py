"""Claim spans at a fraction of the SDK span's cost.

The SDK's span validates every attribute value element by element through
``BoundedAttributes`` (with a lock per span), copies itself into a
``ReadableSpan`` when it ends, and builds event and link containers it rarely
needs: about 45 us of CPU per claim span, on the path that answers the
kubelet. :class:`ClaimSpan` is a recording span with the same behaviour where
it shows (the tracer's sampler, span processors, resource, scope and limits;
OK status is final; an ended span ignores changes; the same exception
events), built for the values claim spans carry: strings, numbers, booleans
and tuples of those are taken as they are, anything else goes through the
SDK's own attribute check. It is its own ``ReadableSpan`` for processors and
exporters (the same properties), so batch processors, in-memory exporters and
:mod:`services.core.telemetry.otlp` take it like any SDK span.

Other spans (publisher, discovery, steps in ``spans`` mode) stay SDK spans.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import (  # the SDK's checks, for links and the rare values
    BoundedAttributes,
    _clean_attribute_value,
)
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

log = logging.getLogger(__name__)

_SCALARS = (str, bool, int, float)
_UNSET = Status(StatusCode.UNSET)


class Event:
    """A span event, as the SDK's ``Event`` shows it to exporters."""

    __slots__ = ("attributes", "dropped_attributes", "name", "timestamp")

    def __init__(
        self, name: str, timestamp: int, attributes: Mapping[str, Any], dropped: int
    ) -> None:
        self.name = name
        self.timestamp = timestamp
        self.attributes = attributes
        self.dropped_attributes = dropped


class ClaimSpan(ReadableSpan, trace.Span):
    """A recording span that is also the ``ReadableSpan`` processors receive.

    ``ReadableSpan.__init__`` is not called: its fields are this class's own,
    read through the same properties.
    """

    def __init__(
        self,
        tracer: SdkTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: Sequence[Link],
        start: Context | None,
    ) -> None:
        limits = tracer._span_limits
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._limits = limits
        self._attrs: dict[str, Any] = {}
        self._dropped_attributes = 0
        self._event_list: list[Event] = []
        self._dropped_events = 0
        self._link_list: list[Link] = []
        self._dropped_links = 0
        for link in links:
            self._append_link(link.context, link.attributes)
        self._status = _UNSET
        self._resource = tracer.resource
        self._instrumentation_scope = tracer._instrumentation_scope
        self._instrumentation_info = tracer.instrumentation_info
        self._processor = tracer.span_processor
        self._start_time = time.time_ns()
        self._end_time: int | None = None
        if attributes:
            self._put(attributes)
        self._processor.on_start(self, parent_context=start)  # type: ignore[arg-type]

    # --------------------------------------------------- ReadableSpan's view

    @property
    def attributes(self) -> Mapping[str, Any]:
        return MappingProxyType(self._attrs)

    @property
    def events(self) -> Sequence[Event]:  # type: ignore[override]
        return tuple(self._event_list)

    @property
    def links(self) -> Sequence[Link]:
        return tuple(self._link_list)

    @property
    def dropped_attributes(self) -> int:
        return self._dropped_attributes

    @property
    def dropped_events(self) -> int:
        return self._dropped_events

    @property
    def dropped_links(self) -> int:
        return self._dropped_links

    # --------------------------------------------------- the API span

    def get_span_context(self) -> SpanContext:
        return self._context  # type: ignore[return-value]  # set at creation, never None

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self._ended("set attributes"):
            return
        self._put(attributes)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if self._ended("set an attribute"):
            return
        self._put({key: value})

    def add_event(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        timestamp: int | None = None,
    ) -> None:
        if self._ended("add an event"):
            return
        limit = self._limits.max_events
        if limit is not None and len(self._event_list) >= limit:
            self._dropped_events += 1  # the oldest goes, as in the SDK's bounded list
            if not limit:
                return
            del self._event_list[0]
        kept, dropped = _clean(
            attributes or {}, self._limits.max_event_attributes, self._limits.max_attribute_length
        )
        self._event_list.append(
            Event(name, timestamp or time.time_ns(), MappingProxyType(kept), dropped)
        )

    def add_link(
        self, context: SpanContext, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        if not self._ended("add a link"):
            self._append_link(context, attributes)

    def update_name(self, name: str) -> None:
        if not self._ended("rename"):
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """As the SDK: OK is final, UNSET is ignored, a description only with a code."""
        if self._ended("set the status"):
            return
        new = status if isinstance(status, Status) else Status(status, description)
        if self._status.status_code is StatusCode.OK or new.status_code is StatusCode.UNSET:
            return
        self._status = new

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, AttributeValue] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        event: dict[str, AttributeValue] = {
            "exception.type": f"{module}.{qualname}" if module != "builtins" else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        event.update(attributes or {})
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended("end it again"):
            return
        self._end_time = end_time or time.time_ns()
        on_ending = getattr(self._processor, "_on_ending", None)
        if on_ending is not None:
            on_ending(self)
        self._processor.on_end(self)

    def __repr__(self) -> str:
        return f"ClaimSpan(name={self._name!r}, context={self._context!r})"

    # --------------------------------------------------- helpers

    def _ended(self, what: str) -> bool:
        if self._end_time is None:
            return False
        log.warning("span %r has ended: cannot %s", self._name, what)
        return True

    def _append_link(self, context: SpanContext, attributes: Any) -> None:
        """As the SDK: a link needs a valid context (or attributes or trace state); its
        attributes are bounded; the oldest link goes when the limit is reached."""
        if not (context and (context.is_valid or attributes or context.trace_state)):
            return
        limits = self._limits
        bounded = BoundedAttributes(
            limits.max_link_attributes,
            attributes,
            max_value_len=limits.max_attribute_length,
            immutable=True,
        )
        if limits.max_links is not None and len(self._link_list) >= limits.max_links:
            self._dropped_links += 1
            if not limits.max_links:
                return
            del self._link_list[0]
        self._link_list.append(Link(context, bounded))

    def _put(self, attributes: Mapping[str, Any]) -> None:
        limits = self._limits
        _, dropped = _clean(
            attributes,
            limits.max_span_attributes,
            limits.max_span_attribute_length,
            self._attrs,
        )
        self._dropped_attributes += dropped


def _clean(
    attributes: Mapping[str, Any],
    limit: int | None,
    max_length: int | None,
    into: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], int]:
    """``attributes`` added to ``into`` (a new dict by default) as the SDK's
    ``BoundedAttributes`` would: values checked (and strings cut to ``max_length``),
    empty keys left out, the oldest pair dropped when ``limit`` is reached.
    Returns the dict and how many pairs were dropped."""
    out: dict[str, Any] = {} if into is None else into
    dropped = 0
    for key, value in attributes.items():
        if not key or type(key) is not str:
            log.warning("span attribute key %r left out: want a non-empty string", key)
            dropped += 1
            continue
        kind = type(value)
        if max_length is None and (kind in _SCALARS or (kind is tuple and _plain_tuple(value))):
            cleaned = value
        else:
            cleaned = _clean_attribute_value(value, max_length)
        if key in out:
            del out[key]
        elif limit is not None and len(out) >= limit:
            if limit == 0:
                dropped += 1
                continue
            del out[next(iter(out))]
            dropped += 1
        out[key] = cleaned
    return out, dropped


def _plain_tuple(value: tuple[Any, ...]) -> bool:
    """A tuple of one scalar type (what the SDK accepts as a sequence attribute)."""
    if not value:
        return True
    first = type(value[0])
    return first in _SCALARS and all(type(v) is first for v in value)


def sdk_tracer(tracer: trace.Tracer) -> SdkTracer | None:
    """The SDK tracer behind ``tracer`` (a proxy resolves to the installed one)."""
    if isinstance(tracer, SdkTracer):
        return tracer
    if isinstance(tracer, trace.ProxyTracer):
        real = tracer._tracer
        return real if isinstance(real, SdkTracer) else None
    return None


def start(
    tracer: SdkTracer,
    name: str,
    trace_id: int,
    parent: SpanContext | None,
    context: Context,
    kind: SpanKind,
    attributes: Mapping[str, AttributeValue] | None,
    links: Sequence[Link],
) -> trace.Span:
    """A started span in trace ``trace_id`` (``parent`` in the same trace, or a root),
    sampled by ``tracer``'s sampler exactly as the SDK's ``start_span`` would."""
    if not tracer._is_enabled():
        return trace.NonRecordingSpan(parent or trace.INVALID_SPAN_CONTEXT)
    sampling = tracer.sampler.should_sample(context, trace_id, name, kind, attributes, links)
    sampled: bool = sampling.decision.is_sampled()  # type: ignore[no-untyped-call]
    flags = TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT
    random_id = (
        parent.trace_flags.random_trace_id
        if parent is not None
        else tracer.id_generator.is_trace_id_random()
    )
    if random_id:
        flags |= TraceFlags.RANDOM_TRACE_ID
    span_context = SpanContext(
        trace_id,
        random.getrandbits(64) or 1,
        is_remote=False,
        trace_flags=TraceFlags(flags),
        trace_state=sampling.trace_state,
    )
    if not sampling.decision.is_recording():  # type: ignore[no-untyped-call]
        return trace.NonRecordingSpan(span_context)
    return ClaimSpan(
        tracer,
        name,
        span_context,
        parent,
        kind,
        dict(sampling.attributes or {}),
        links,
        context,
    )
