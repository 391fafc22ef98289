"""The claim watcher: ResourceClaims of our driver -> lifecycle events, the ``claims`` bucket,
and explanations for claims stuck pending.

It keeps informers (list + watch) on ResourceClaims, unscheduled Pods,
DeviceClasses, ResourceSlices, Nodes and, when the release applies them
(DRADeviceTaintRules), DeviceTaintRules in whichever resource.k8s.io version serves
them. For every claim with devices of our
driver it publishes ``allocated`` / ``reserved`` / ``released`` / ``deleted``
ClaimEvents to the CLAIMS stream (``dra.claim.<ns>.<claim>.<uid>.<node>.<event>``) and
keeps the claim, as the API server returned it (a msgpack
``services.core.kube.resource.ResourceClaim``, what the preparer reads), under
``<node>.<uid>`` in the ``claims`` bucket until it is deallocated or deleted.

The bucket doubles as the watcher's memory: on start the stored claims are
what was reported before, so a restart repeats no event and notices claims
deleted meanwhile. Each event carries ``Nats-Msg-Id`` = uid/event/resourceVersion
and a tag only this process can compute (ClaimTrail), so JetStream drops a
republished duplicate and nobody else can take the id first.

Every ``check_interval`` it looks for claims whose pod has waited longer than
``pending_threshold``, runs our allocator over the caches and writes the
explanation on the claim's Kubernetes Event (at most once per threshold per
claim). It publishes a ``pending`` event only when the explanation differs
from the claim's last one (so a claim pending for a week adds one event, not
one per check), and a ``deleted`` event when a claim it explained goes.

Events go through :class:`~services.core.bus.claimtrail.ClaimTrail` (numbered per
claim). A bus that does not answer (a server restarting, a cluster electing a
leader) is waited for: every write is tried again, with backoff, until it is
taken, and the claims' changes wait meanwhile, so none is lost or reordered.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from services.allocator.structured import taintrules
from services.allocator.structured.features import Features
from services.allocator.structured.snapshot import ClaimOutcome
from services.allocator.watcher import lifecycle, metrics, spans
from services.allocator.watcher.events import ClaimEventRecorder
from services.allocator.watcher.hardware import DeviceIndex
from services.allocator.watcher.kubeobjects import NodeObject, Pod
from services.allocator.watcher.lifecycle import Step, Tracked
from services.allocator.watcher.pending import (
    ClusterAllocator,
    PodClock,
    Reuse,
    Waiting,
    concerns_driver,
    verdict,
    waiting_claims,
    waiting_extended,
)
from services.core.bus import subjects
from services.core.bus.claimtrail import ClaimTrail, instance_name
from services.core.bus.client import Bus
from services.core.bus.failures import unavailable
from services.core.kit import heap
from services.core.kit.backoff import Backoff
from services.core.kube.client import KubeApi
from services.core.kube.informer import Informer
from services.core.kube.resource import DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice
from services.core.kube.resourceapi import served_path
from services.core.model.schemas import (
    ClaimEvent,
    ClaimRef,
    DeviceRef,
    PodRef,
    SchemaError,
    decode,
)
from services.core.telemetry import metrics as core_metrics
from services.core.telemetry import tracing

log = logging.getLogger(__name__)
PODS_PER_EVENT = 64  # at most about 25 KB of consumers in one event

ACTOR = "allocator"
INSTANCE = instance_name()
T = TypeVar("T")
CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
PODS_PATH = "/api/v1/pods"
NODES_PATH = "/api/v1/nodes"


@dataclass(slots=True)
class WatcherConfig:
    pending_threshold: float = 30.0
    check_interval: float | None = None  # default: a third of the threshold, 1..10 s
    resync_interval: float = 300.0  # re-judge every cached claim (retries failed publishes)
    features: Features = field(default_factory=Features)
    event_rate: float = 5.0  # Kubernetes Event writes per second, all claims together
    event_burst: int = 20

    def interval(self) -> float:
        if self.check_interval is not None:
            return self.check_interval
        return min(10.0, max(1.0, self.pending_threshold / 3))


class ClaimWatcher:
    def __init__(self, api: KubeApi, bus: Bus, config: WatcherConfig | None = None) -> None:
        self.api = api
        self.bus = bus
        self.config = config or WatcherConfig()
        self.claims = Informer(
            api,
            "resourceclaims",
            CLAIMS_PATH,
            ResourceClaim,
            on_change=self.on_claim,
            on_unreadable=self.on_unreadable_claim,
        )
        self.pods = Informer(
            api, "pods", PODS_PATH, Pod, params={"fieldSelector": "spec.nodeName="}
        )
        self.classes = Informer(api, "deviceclasses", CLASSES_PATH, DeviceClass)
        self.slices = Informer(api, "resourceslices", SLICES_PATH, ResourceSlice)
        self.nodes = Informer(api, "nodes", NODES_PATH, NodeObject, on_change=self.on_node)
        self.taint_rules: Informer[DeviceTaintRule] | None = None  # set by run() if applied
        self.tracked: dict[str, Tracked] = {}  # claim uid -> what was reported
        self.recorder = ClaimEventRecorder(api, self.config.event_rate, self.config.event_burst)
        self.cluster = ClusterAllocator(self.config.features)
        self.reuse = Reuse()
        self.clock = PodClock()
        self.explained: dict[str, float] = {}  # claim uid -> when last explained
        self.pending: dict[str, tuple[ClaimRef, str]] = {}  # uid -> (claim, last reason published)
        self.trail = ClaimTrail(bus)
        self.hardware = DeviceIndex()
        self.allocations_version = 0  # bumped when any claim's allocation appears or goes
        self.nodes_version = 0  # bumped when what the allocator reads of a Node changes

    # ------------------------------------------------------------ run

    async def run(self) -> None:
        """Serve until cancelled."""
        await self.load_bucket()
        informers: list[Informer[Any]] = [
            self.claims, self.pods, self.classes, self.slices, self.nodes,
        ]  # fmt: skip
        self.taint_rules = await self._taint_rule_informer()
        if self.taint_rules is not None:
            informers.append(self.taint_rules)
        log.info("claim watcher starting", extra={"tracked": len(self.tracked)})
        async with asyncio.TaskGroup() as group:
            for informer in informers:
                group.create_task(informer.run())
            await self.claims.synced.wait()
            await self.sweep_deleted()
            log.info("claim watcher synced", extra={"claims": len(self.claims.items)})
            group.create_task(self._every(self.config.interval(), self.check_pending))
            group.create_task(self._every(self.config.resync_interval, self.resync))
            await asyncio.gather(*(informer.synced.wait() for informer in informers))
            heap.settle("every informer synced")

    async def _taint_rule_informer(self) -> Informer[DeviceTaintRule] | None:
        """DeviceTaintRules, as the scheduler of the release followed sees them: only
        when it applies them, from the version that serves them."""
        if not taintrules.enabled(self.config.features):
            return None
        path = await served_path(self.api, "devicetaintrules")
        if path is None:
            log.warning(
                "DRADeviceTaintRules is on, but the API server serves no DeviceTaintRule: "
                "explanations leave rules out"
            )
            return None
        return Informer(self.api, "devicetaintrules", path, DeviceTaintRule)

    async def _every(self, seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await work()
            except Exception:  # the next round tries again
                log.exception("periodic work failed", extra={"work": work.__name__})

    # ------------------------------------------------------------ claims bucket

    async def load_bucket(self) -> None:
        """What was reported before a restart: every claim in the ``claims`` bucket."""
        for entry in await self.bus.kv_read(subjects.CLAIMS_BUCKET):
            try:
                claim = decode(entry.value or b"", ResourceClaim)
            except SchemaError as exc:
                metrics.MALFORMED_OBJECTS.labels(resource="claims-bucket").inc()
                log.warning(
                    "dropping an unreadable claims bucket entry",
                    extra={"key": entry.key, "error": str(exc)},
                )
                await self.bus.kv_delete(subjects.CLAIMS_BUCKET, entry.key)
                continue
            if not claim.metadata.uid:
                continue
            self.tracked[claim.metadata.uid or ""] = lifecycle.track(
                claim, released=not lifecycle.consumers(claim)
            )
        metrics.TRACKED_CLAIMS.set(len(self.tracked))

    async def sweep_deleted(self) -> None:
        """Claims reported before but absent from the listing were deleted meanwhile."""
        present = {c.metadata.uid for c in self.claims.items.values()}
        for uid, tracked in list(self.tracked.items()):
            if uid not in present:
                await self._apply(
                    tracked.ref, tracked.node, lifecycle.deleted(tracked), None, tracked
                )

    async def resync(self) -> None:
        for claim in list(self.claims.items.values()):
            await self.on_claim(None, claim)

    # ------------------------------------------------------------ node changes

    async def on_node(self, old: NodeObject | None, new: NodeObject | None) -> None:
        """Every Node is rewritten every few minutes (its kubelet's status), about 17 a
        second at 5,000 nodes; only a Node that comes, goes, or changes what the
        allocator reads of it (labels, declared features) makes explanations start over.
        """
        if old is None or new is None or _node_facts(old) != _node_facts(new):
            self.nodes_version += 1

    # ------------------------------------------------------------ claim changes

    async def on_claim(self, old: ResourceClaim | None, new: ResourceClaim | None) -> None:
        if _allocation(old) != _allocation(new):
            self.allocations_version += 1  # what explanations see as in use changed
        if old is not None and (new is None or old.metadata.uid != new.metadata.uid):
            uid = old.metadata.uid or ""
            previous = self.tracked.get(uid)
            self.recorder.forget(uid)
            self.explained.pop(uid, None)
            if previous is not None:
                await self._apply(
                    previous.ref, previous.node, lifecycle.deleted(previous), old, previous
                )
            if previous is None:
                await self._close_unallocated(old)
        if new is None:
            return
        if lifecycle.our_results(new):
            self.pending.pop(new.metadata.uid or "", None)  # allocated: no longer pending
        previous = self.tracked.get(new.metadata.uid or "")
        step = lifecycle.observe(previous, new)
        tracked = step.tracked or previous
        if tracked is None:
            return
        await self._apply(tracked.ref, tracked.node, step, new, previous)

    async def _apply(
        self,
        ref: ClaimRef,
        node: str,
        step: Step,
        claim: ResourceClaim | None,
        previous: Tracked | None,
    ) -> None:
        """Bucket first (a consumer reacting to ``allocated`` finds the claim), then events."""
        bucket = subjects.CLAIMS_BUCKET
        if previous is not None and (
            step.forget or (step.tracked and step.tracked.node != previous.node)
        ):
            key = subjects.claim_key(previous.node, ref.uid)
            await self._until_taken("claims bucket delete", lambda: self.bus.kv_delete(bucket, key))
        if step.store and claim is not None:
            key, stored = subjects.claim_key(node, ref.uid), claim
            await self._until_taken(
                "claims bucket put", lambda: self.bus.kv_put(bucket, key, stored)
            )
        version = claim.metadata.resource_version if claim is not None else None
        self.hardware.update(self.slices.version, self.slices.items.values())
        for event in step.events:
            ending = event in ("released", "deleted") and previous is not None
            source = previous if ending else (step.tracked or previous)
            assert source is not None
            devices = [self.hardware.ref(r, p, d) for r, p, d in source.devices]
            pods = _new_consumers(claim, previous) if event == "reserved" else []
            for some in consumer_batches(pods):
                await self.publish(event, ref, source.node, devices, version, pods=some)
        if step.tracked is not None:
            self.tracked[ref.uid] = step.tracked
        elif step.forget:
            self.tracked.pop(ref.uid, None)
            self.trail.forget(ref.uid)
        metrics.TRACKED_CLAIMS.set(sum(1 for t in self.tracked.values() if t.devices))

    async def _until_taken(self, what: str, write: Callable[[], Awaitable[T]]) -> T:
        """``write``, tried again (with backoff) for as long as the bus is unavailable."""
        backoff = Backoff(first=0.05, limit=2.0)
        while True:
            try:
                return await write()
            except Exception as exc:
                if not unavailable(exc):
                    raise
                metrics.BUS_RETRIES.labels(write=what).inc()
                log.warning(
                    "the bus did not take a write; trying again",
                    extra={"write": what, "error": f"{type(exc).__name__}: {exc}"},
                )
                await backoff.sleep()

    async def publish(
        self,
        event: str,
        ref: ClaimRef,
        node: str,
        devices: list[DeviceRef],
        version: str | None,
        *,
        outcome: str = "ok",
        error: str = "",
        pods: list[PodRef] | None = None,
    ) -> None:
        with spans.event_span(event, ref, node, devices) as span:
            headers = tracing.inject({})  # the span's context: the stored event's traceparent
            message = ClaimEvent(
                event=event,  # type: ignore[arg-type]
                claim=ref,
                node=node,
                actor=ACTOR,
                instance=INSTANCE,
                devices=devices,
                pods=pods or [],
                outcome=outcome,  # type: ignore[arg-type]
                error=error,
                trace_id=tracing.current_trace_id(),
                traceparent=headers.get("traceparent", ""),
            )
            msg_id = f"{ref.uid}/{event}/{version or time.time()}"
            started = time.perf_counter()
            stored = await self._until_taken(
                f"claim event {event}", lambda: self.trail.append(message, msg_id, headers)
            )
            metrics.CLAIM_EVENT_SECONDS.labels(event=event).observe(
                time.perf_counter() - started, core_metrics.trace_exemplar(message.trace_id)
            )
            tracing.finish(span, error, tracing.PENDING if event == "pending" else "")
            metrics.CLAIM_EVENTS.labels(event=event).inc()
            log.info(
                "claim event",
                extra={
                    "event": event,
                    "claim": f"{ref.namespace}/{ref.name}",
                    "uid": ref.uid,
                    "node": node,
                    "seq": stored.seq,
                },
            )

    # ------------------------------------------------------------ pending claims

    async def check_pending(self) -> None:
        if not (self.pods.synced.is_set() and self.classes.synced.is_set()
                and self.slices.synced.is_set() and self.nodes.synced.is_set()):  # fmt: skip
            return
        now = time.time()
        threshold = self.config.pending_threshold
        waiting = waiting_claims(
            self.pods.items.values(),
            self.claims.items,
            self.classes_by_name(),
            self.clock,
            threshold,
            now,
        )
        extended = waiting_extended(
            self.pods.items.values(), self.classes_by_name(), self.clock, threshold, now
        )
        # An extended resource's claim does not exist yet: its uid is the pod's.
        due: list[tuple[Waiting, Pod | None]] = [
            (item, None) for item in waiting if self._due(item.claim, now)
        ]
        due += [(item, item.pod) for item in extended if self._due(item.claim, now)]
        metrics.EXPLANATIONS_DUE.set(len(due))
        for item, pod in due:
            self.explained[item.claim.metadata.uid or ""] = now
            await self.explain(item.claim, item.waited, pod=pod)
            metrics.EXPLANATIONS_DUE.dec()

    def _due(self, claim: ResourceClaim, now: float) -> bool:
        """Whether ``claim``'s explanation is due: none written within the threshold."""
        last = self.explained.get(claim.metadata.uid or "")
        return last is None or now - last >= self.config.pending_threshold

    async def on_unreadable_claim(self, claim: ResourceClaim, reason: str) -> None:
        """A claim of ours gpudra cannot read (its nesting, say): said on the claim itself.

        ``claim`` is what could be read of it (the deepest values dropped); the
        claim is left out of everything else, and every other claim goes on.
        """
        ours = lifecycle.our_results(claim) or concerns_driver(claim, self.classes_by_name())
        if ours:
            message = f"gpudra cannot read this claim: {reason}"
            await self.recorder.record(claim, "UnreadableClaim", "Warning", message)

    def classes_by_name(self) -> dict[str, DeviceClass]:
        return {c.metadata.name: c for c in self.classes.items.values()}

    async def explain(self, claim: ResourceClaim, waited: float, pod: Pod | None = None) -> None:
        """Why ``claim`` stays pending: a span, a ``pending`` event on its trail and an
        Event on it. With ``pod``, ``claim`` is the one the scheduler would create for
        the pod's extended resources (extended.py): it does not exist, so it has no
        trail yet, and the Event is on the pod."""
        ref = lifecycle.claim_ref(claim)
        with spans.explain_span(ref, waited) as span:
            outcome = await self._outcome(claim)
            result = verdict(outcome)
            spans.pending(span, result.reason, result.status, result.message)
            metrics.EXPLANATIONS.labels(status=result.status).inc()
            if pod is not None:
                message = (
                    f"extended resources (as the scheduler's claim {claim.metadata.name} would "
                    f"ask them): {result.message}"
                )
                involved = {
                    "apiVersion": "v1", "kind": "Pod", "namespace": pod.metadata.namespace,
                    "name": pod.metadata.name, "uid": pod.metadata.uid,
                }  # fmt: skip
                await self.recorder.record(claim, result.reason, result.type, message, involved)
                return
            if await self._reason_changed(ref, result.message):
                await self.publish(
                    "pending", ref, subjects.NO_NODE, [], hashlib.sha256(
                        result.message.encode()).hexdigest()[:16] + f"/{time.time():.3f}",
                    outcome="error", error=result.message,
                )  # fmt: skip
                self.pending[ref.uid] = (ref, result.message)
            await self.recorder.record(claim, result.reason, result.type, result.message)

    async def _outcome(self, claim: ResourceClaim) -> ClaimOutcome:
        """Our engine's answer for ``claim``: one given to a claim like it (pending.Reuse),
        or the engine run over a snapshot of the caches."""
        rules = self.taint_rules
        others = (self.classes.version, self.nodes_version, rules.version if rules else 0)
        devices = (*others, self.slices.version)
        now = time.monotonic()
        reused = self.reuse.get(claim, devices, now)
        if reused is not None:
            metrics.EXPLANATIONS_REUSED.inc()
            return reused
        started = time.thread_time()
        self.cluster.update(
            others,
            self.slices.version,
            self.allocations_version,
            self.classes.items.values(),
            self.slices.items.values(),
            self.claims.items.values(),
            self.nodes.items.values(),
            rules.items.values() if rules else (),
        )
        metrics.EXPLAIN_CPU.labels("snapshot").inc(time.thread_time() - started)
        outcome = await asyncio.to_thread(self._explain, claim)
        self.reuse.put(claim, devices, now, outcome)
        return outcome

    def _explain(self, claim: ResourceClaim) -> ClaimOutcome:
        """Our allocator over the snapshot (in a worker thread), its CPU counted."""
        started = time.thread_time()
        try:
            return self.cluster.explain(claim)
        finally:
            metrics.EXPLAIN_CPU.labels("allocate").inc(time.thread_time() - started)

    async def _close_unallocated(self, claim: ResourceClaim) -> None:
        """A deleted claim that was never allocated: if its trail is open (it was
        explained as pending, by this process or before a restart), close it."""
        uid = claim.metadata.uid or ""
        pending = self.pending.pop(uid, None)
        ref = pending[0] if pending is not None else lifecycle.claim_ref(claim)
        if pending is None:
            if not concerns_driver(claim, self.classes_by_name()):
                return
            last = await self._until_taken(
                "claim trail read", lambda: self.trail.last_event(ref.namespace, ref.name, uid)
            )
            if last is None or last.event == "deleted":
                return
        await self.publish("deleted", ref, subjects.NO_NODE, [], claim.metadata.resource_version)
        self.trail.forget(uid)

    async def _reason_changed(self, ref: ClaimRef, reason: str) -> bool:
        """Whether ``reason`` is news for the claim's trail (after a restart, the trail
        itself says what was published last)."""
        known = self.pending.get(ref.uid)
        if known is None:
            last = await self._until_taken(
                "claim trail read", lambda: self.trail.last_event(ref.namespace, ref.name, ref.uid)
            )
            if last is not None and last.event == "pending":
                known = (ref, last.error)
                self.pending[ref.uid] = known
        return known is None or known[1] != reason


def _new_consumers(claim: ResourceClaim | None, previous: Tracked | None) -> list[PodRef]:
    """Who a ``reserved`` event reserves the claim for: consumers not there before."""
    before = previous.consumers if previous is not None else frozenset()
    reserved = (claim.status.reserved_for if claim is not None and claim.status else None) or []
    return [
        PodRef(resource=c.resource, name=c.name, uid=c.uid)
        for c in reserved
        if (c.uid or f"{c.resource}/{c.name}") not in before
    ]


def consumer_batches(pods: list[PodRef]) -> list[list[PodRef]]:
    """The new consumers in as many ``reserved`` events as it takes to keep each
    under ``CLAIMS``' message size: a claim may be reserved for 256 pods, whose
    names may be 253 characters (81 KB in one event, over the 64 KiB limit, which
    the bus refuses). At least one batch, empty when there are no pods."""
    return [pods[i : i + PODS_PER_EVENT] for i in range(0, len(pods), PODS_PER_EVENT)] or [[]]


def _allocation(claim: ResourceClaim | None) -> tuple[str | None, bool]:
    if claim is None or claim.status is None or claim.status.allocation is None:
        return (None, False)
    return (claim.metadata.uid, True)


def _node_facts(node: NodeObject) -> tuple[object, ...]:
    """What the allocator reads of a Node: its labels (node selectors) and the features
    its kubelet declares (1.37 optional node operations)."""
    return (node.metadata.labels or {}, node.declared_features)
