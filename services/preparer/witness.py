"""What one claim operation tells the world, said in one place on its way in and out.

Each claim of a kubelet call is answered inside one SERVER span in the claim's
own trace: the NATS hop's other half (its parent is the front's CLIENT span) and
the parent of the engine's steps. One span, not two: each span costs about 30 us
of this process's CPU. Around the engine's work, in this order:

- on the way in (:meth:`Witness.watching`): the span opened, ``<op>.requested``
  emitted, what the claim held read (an unprepare takes it away);
- on the way out (:meth:`Witness.told`): the duration and outcome metrics, one log
  line, what the claim holds as span attributes (read from its checkpoint entry,
  the record of what preparing did, so the span says what the node set up, not
  what was asked for), the span's outcome, and the ``prepared``/``unprepared`` or
  ``*.failed`` event.

Events go to the :class:`~services.preparer.eventsink.EventSink`, which stores them
after the reply is on its way: auditing never adds to the kubelet's latency.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue
from prometheus_client import Counter, Histogram

from services.core.bus import subjects
from services.core.bus.claimtrail import instance_name
from services.core.model.schemas import (
    ClaimEvent,
    ClaimEventName,
    ClaimRef,
    ClaimResult,
    DeviceRef,
    PreparedDevice,
)
from services.core.telemetry import metrics, tracing
from services.preparer.checkpoint import ClaimEntry, GroupState
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.eventsink import EventSink

log = logging.getLogger(__name__)
ACTOR = "preparer"
INSTANCE = instance_name()

OPERATIONS = Counter(
    "gpudra_preparer_claims_total", "Claim operations by kind and outcome.", ["op", "outcome"]
)
DURATION = Histogram(
    "gpudra_preparer_claim_seconds",
    "Time to prepare or unprepare one claim (exemplars: the operation's trace id).",
    ["op"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

EXCLUSIVE = "Exclusive"
PASSTHROUGH = "Passthrough"
ADMIN = "AdminAccess"

Op = Literal["prepare", "unprepare"]


@dataclass
class Outcome:
    """What one claim's prepare or unprepare produced, for the reply and the event."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""

    def refs(self) -> list[DeviceRef]:
        return [
            DeviceRef(
                request=",".join(d.request_names),
                pool=d.pool_name,
                device=d.device_name,
                cdi_device_ids=d.cdi_device_ids,
            )
            for d in self.devices
        ]


@dataclass(frozen=True)
class Watch:
    """One claim operation under way: its span and what the way out needs of the way in."""

    op: Op
    ref: ClaimRef
    span: Span
    trace_id: str
    headers: dict[str, str]  # the span's trace context, carried by the events
    held: list[DeviceRef]  # before the operation: what an unprepare's event names
    before: ClaimEntry | None
    started: float = field(default_factory=time.perf_counter)


class Witness:
    """Opens each claim operation's span and tells its outcome (see the module's docstring)."""

    def __init__(
        self,
        tracer: trace.Tracer,
        node: str,
        driver: str,
        events: EventSink,
        store: CheckpointStore,
    ) -> None:
        """``store``: the engine's checkpoint, which says what a claim holds."""
        self.tracer = tracer
        self.node = node
        self.events = events
        self.store = store
        self._names: dict[Op, _Names] = {
            op: _Names.of(op, node, driver) for op in ("prepare", "unprepare")
        }

    @contextlib.contextmanager
    def watching(self, op: Op, ref: ClaimRef, traceparent: str) -> Iterator[Watch]:
        """The claim's SERVER span, current while the block runs (and its steps recorded);
        ``traceparent``: the front's CLIENT span, its parent when it is of this trace."""
        names = self._names[op]
        with tracing.claim_span(
            self.tracer, names.process, ref.uid, kind=SpanKind.SERVER,
            attributes={**names.process_attributes, **tracing.claim_attributes(ref, self.node)},
            parent=tracing.remote_parent(traceparent),
        ) as span, tracing.operation(span):  # fmt: skip
            trace_id = tracing.current_trace_id()
            headers = tracing.headers_of(span)
            self.events.emit(self._event(names.requested, ref, trace_id, headers), headers)
            before = self.store.claims.get(ref.uid)  # what an unprepare undoes
            held = held_devices(before) if before is not None else []  # gone after unprepare
            yield Watch(op, ref, span, trace_id, headers, held, before)

    def told(self, watch: Watch, outcome: Outcome) -> ClaimResult:
        """The outcome told, all on the way out: metrics, log line, span, event; the reply."""
        elapsed = time.perf_counter() - watch.started
        DURATION.labels(watch.op).observe(elapsed, metrics.trace_exemplar(watch.trace_id))
        OPERATIONS.labels(watch.op, "error" if outcome.error else "ok").inc()
        now = self.store.claims.get(watch.ref.uid)
        facts = claim_facts(now or watch.before)
        _log(watch.op, watch.ref, outcome, elapsed, facts)
        names = self._names[watch.op]
        event = self._event(
            names.failed if outcome.error else names.succeeded,
            watch.ref,
            watch.trace_id,
            watch.headers,
            outcome=outcome,
            devices=_event_devices(watch, now, outcome),
            duration_ms=elapsed * 1000,
        )
        if facts:
            watch.span.set_attributes(facts)
        tracing.finish(watch.span, outcome.error)
        self.events.emit(event, watch.headers)
        return ClaimResult(devices=outcome.devices, error=outcome.error)

    def _event(
        self,
        event: ClaimEventName,
        ref: ClaimRef,
        trace_id: str,
        headers: dict[str, str],
        *,
        outcome: Outcome | None = None,
        devices: list[DeviceRef] | None = None,
        duration_ms: float | None = None,
    ) -> ClaimEvent:
        """The claim event, in the claim span's trace (``headers``: its context)."""
        return ClaimEvent(
            event=event,
            claim=ref,
            node=self.node,
            actor=ACTOR,
            instance=INSTANCE,
            devices=devices or [],
            outcome="error" if outcome is not None and outcome.error else "ok",
            error=outcome.error if outcome else "",
            duration_ms=duration_ms,
            trace_id=trace_id,
            traceparent=headers.get("traceparent", ""),
        )


def _event_devices(watch: Watch, now: ClaimEntry | None, outcome: Outcome) -> list[DeviceRef]:
    """An unprepare names what the claim held; a prepare what it holds now, with the
    hardware (or, without an entry, what the engine answered)."""
    if watch.op == "unprepare":
        return watch.held
    return (held_devices(now) if now is not None else []) or outcome.refs()


def _log(
    op: str, ref: ClaimRef, outcome: Outcome, elapsed: float, facts: Mapping[str, Any]
) -> None:
    """One line per claim operation, in the claim's trace (the log carries its id)."""
    where = {"uid": ref.uid, "claim": f"{ref.namespace}/{ref.name}", "ms": round(elapsed * 1000, 2)}
    if outcome.error:
        log.info(f"{op} failed", extra={**where, "error": outcome.error})
    else:
        devices = facts.get(tracing.ATTR_DEVICES, [])
        log.info(f"{op} done", extra={**where, "devices": devices})


@dataclass(frozen=True)
class _Names:
    """Span name, messaging attributes and events of one operation on one node, built once."""

    process: str
    process_attributes: dict[str, AttributeValue]
    requested: ClaimEventName
    succeeded: ClaimEventName
    failed: ClaimEventName

    @classmethod
    def of(cls, op: Op, node: str, driver: str) -> _Names:
        subject = (subjects.node_prepare if op == "prepare" else subjects.node_unprepare)(
            node, driver
        )
        template = subjects.node_operation_template(op, driver)
        prepare = op == "prepare"
        return cls(
            process=tracing.messaging_span_name("process", template),
            process_attributes=tracing.messaging_attributes("process", subject, template),
            requested="prepare.requested" if prepare else "unprepare.requested",
            succeeded="prepared" if prepare else "unprepared",
            failed="prepare.failed" if prepare else "unprepare.failed",
        )


def held_devices(entry: ClaimEntry) -> list[DeviceRef]:
    """A checkpoint entry's devices as an event names them: CDI ids, GPU UUID, PCI address."""
    return [
        DeviceRef(
            request=",".join(d.requests),
            pool=d.pool,
            device=d.name,
            cdi_device_ids=d.cdi_device_ids,
            gpu_uuid=d.gpu_uuid,
            pci_bus_id=d.pci_bus_id or (d.vfio.pci_bus_id if d.vfio else ""),
            uuid=d.mig.uuid if d.mig is not None else "",
        )
        for d in entry.devices
    ]


def claim_facts(entry: ClaimEntry | None) -> dict[str, AttributeValue]:
    """What a prepared claim holds, as span attributes searchable in a trace backend:
    devices, GPU UUIDs (MIG devices add their own), CDI ids and sharing mode."""
    if entry is None or not entry.devices:
        return {}
    uuids: list[str] = []
    for d in entry.devices:
        for uuid in (d.gpu_uuid, d.mig.uuid if d.mig else ""):
            if uuid and uuid not in uuids:
                uuids.append(uuid)
    modes = sorted({_sharing(g) for g in entry.groups} or {EXCLUSIVE})
    if any(d.admin_access for d in entry.devices):
        modes.append(ADMIN)
    return {
        tracing.ATTR_DEVICES: [d.name for d in entry.devices],
        tracing.ATTR_GPU_UUIDS: uuids,
        tracing.ATTR_CDI_IDS: [i for d in entry.devices for i in d.cdi_device_ids],
        tracing.ATTR_SHARING: ",".join(modes),
    }


def _sharing(group: GroupState) -> str:
    if group.kind == "VfioDeviceConfig":
        return PASSTHROUGH
    sharing = group.config.get("sharing")
    strategy = sharing.get("strategy") if isinstance(sharing, dict) else None
    return str(strategy) if strategy else EXCLUSIVE
