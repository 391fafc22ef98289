"""The claim watcher: ResourceClaims of our driver -> lifecycle events, the ``claims`` bucket,
and explanations for claims stuck pending.

It keeps informers (list + watch) on ResourceClaims, unscheduled Pods,
DeviceClasses, ResourceSlices and Nodes. For every claim with devices of our
driver it publishes ``allocated`` / ``reserved`` / ``released`` / ``deleted``
ClaimEvents to the CLAIMS stream (subject ``dra.claim.<node>.<event>``) and
keeps the claim, as the API server returned it (a msgpack
``services.core.resource.ResourceClaim``, what the preparer reads), under
``<node>.<uid>`` in the ``claims`` bucket until it is deallocated or deleted.

The bucket doubles as the watcher's memory: on start the stored claims are
what was reported before, so a restart repeats no event and notices claims
deleted meanwhile. Each event carries ``Nats-Msg-Id`` = uid/event/resourceVersion,
so JetStream drops a republished duplicate.

Every ``check_interval`` it looks for claims whose pod has waited longer than
``pending_threshold``, runs our allocator over the caches, publishes a
``pending`` event and writes the explanation on the claim's Kubernetes Event
(at most once per threshold per claim).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.allocator.structured.features import Features
from services.allocator.watcher import lifecycle, metrics, spans
from services.allocator.watcher.events import ClaimEventRecorder
from services.allocator.watcher.kubeobjects import NodeObject, Pod
from services.allocator.watcher.lifecycle import Step, Tracked
from services.allocator.watcher.pending import (
    ClusterAllocator,
    PodClock,
    concerns_driver,
    verdict,
    waiting_claims,
)
from services.core import subjects, tracing
from services.core.bus import Bus
from services.core.informer import Informer
from services.core.kube import KubeApi
from services.core.resource import DeviceClass, ResourceClaim, ResourceSlice
from services.core.schemas import ClaimEvent, ClaimRef, DeviceRef, SchemaError

log = logging.getLogger(__name__)

ACTOR = "allocator"
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
        self.nodes = Informer(api, "nodes", NODES_PATH, NodeObject)
        self.tracked: dict[str, Tracked] = {}  # claim uid -> what was reported
        self.recorder = ClaimEventRecorder(api, self.config.event_rate, self.config.event_burst)
        self.cluster = ClusterAllocator(self.config.features)
        self.clock = PodClock()
        self.explained: dict[str, float] = {}  # claim uid -> when last explained
        self.allocations_version = 0  # bumped when any claim's allocation appears or goes
        self.gpus = spans.GpuIndex()  # for the spans: which GPUs a claim's devices are

    # ------------------------------------------------------------ run

    async def run(self) -> None:
        """Serve until cancelled."""
        await self.load_bucket()
        informers: list[Informer[Any]] = [
            self.claims, self.pods, self.classes, self.slices, self.nodes,
        ]  # fmt: skip
        log.info("claim watcher starting", extra={"tracked": len(self.tracked)})
        async with asyncio.TaskGroup() as group:
            for informer in informers:
                group.create_task(informer.run())
            await self.claims.synced.wait()
            await self.sweep_deleted()
            log.info("claim watcher synced", extra={"claims": len(self.claims.items)})
            group.create_task(self._every(self.config.interval(), self.check_pending))
            group.create_task(self._every(self.config.resync_interval, self.resync))

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
        for key in await self.bus.kv_keys(subjects.CLAIMS_BUCKET):
            try:
                got = await self.bus.kv_get(subjects.CLAIMS_BUCKET, key, ResourceClaim)
            except SchemaError as exc:
                metrics.MALFORMED_OBJECTS.labels(resource="claims-bucket").inc()
                log.warning(
                    "dropping an unreadable claims bucket entry",
                    extra={"key": key, "error": str(exc)},
                )
                await self.bus.kv_delete(subjects.CLAIMS_BUCKET, key)
                continue
            if got is None or not got[0].metadata.uid:
                continue
            claim = got[0]
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
        if new is None:
            return
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
            await self.bus.kv_delete(bucket, subjects.claim_key(previous.node, ref.uid))
        if step.store and claim is not None:
            await self.bus.kv_put(bucket, subjects.claim_key(node, ref.uid), claim)
        version = claim.metadata.resource_version if claim is not None else None
        for event in step.events:
            ending = event in ("released", "deleted") and previous is not None
            source = previous if ending else (step.tracked or previous)
            assert source is not None
            devices = [DeviceRef(request=r, pool=p, device=d) for r, p, d in source.devices]
            await self.publish(event, ref, source.node, devices, version)
        if step.tracked is not None:
            self.tracked[ref.uid] = step.tracked
        elif step.forget:
            self.tracked.pop(ref.uid, None)
        metrics.TRACKED_CLAIMS.set(sum(1 for t in self.tracked.values() if t.devices))

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
    ) -> None:
        gpus = self.gpus.lookup(self.slices.version, self.slices.items.values(), devices)
        with spans.event_span(event, ref, node, devices, gpus) as span:
            message = ClaimEvent(
                event=event,  # type: ignore[arg-type]
                claim=ref,
                node=node,
                actor=ACTOR,
                devices=devices,
                outcome=outcome,  # type: ignore[arg-type]
                error=error,
                trace_id=tracing.current_trace_id(),
            )
            headers = {"Nats-Msg-Id": f"{ref.uid}/{event}/{version or time.time()}"}
            await self.bus.publish(
                subjects.claim_event(node, event), message, tracing.inject(headers)
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
        for item in waiting:
            uid = item.claim.metadata.uid or ""
            last = self.explained.get(uid)
            if last is not None and now - last < threshold:
                continue
            self.explained[uid] = now
            await self.explain(item.claim, item.waited)

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

    async def explain(self, claim: ResourceClaim, waited: float) -> None:
        ref = lifecycle.claim_ref(claim)
        with spans.explain_span(ref, waited) as span:
            version = (
                self.classes.version,
                self.slices.version,
                self.nodes.version,
                self.allocations_version,
            )
            self.cluster.update(
                version,
                self.classes.items.values(),
                self.slices.items.values(),
                self.claims.items.values(),
                self.nodes.items.values(),
            )
            outcome = await asyncio.to_thread(self.cluster.explain, claim)
            result = verdict(outcome)
            spans.pending(span, result.reason, result.status, result.message)
            metrics.EXPLANATIONS.labels(status=result.status).inc()
            await self.publish(
                "pending", ref, "", [], f"{claim.metadata.resource_version}/{time.time():.0f}",
                outcome="error", error=result.message,
            )  # fmt: skip
            await self.recorder.record(claim, result.reason, result.type, result.message)


def _allocation(claim: ResourceClaim | None) -> tuple[str | None, bool]:
    if claim is None or claim.status is None or claim.status.allocation is None:
        return (None, False)
    return (claim.metadata.uid, True)
