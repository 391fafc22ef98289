"""Make a node's ResourceSlices in the API server equal the rendered ones, in few writes.

The rules are those of the Kubernetes resourceslice controller
(k8s.io/dynamic-resource-allocation/resourceslice) that the reference driver uses,
with deterministic slice names (``<node>-gpu.nvidia.com-<i>``) instead of
generated ones:

* slices are compared semantically: taint ``timeAdded`` (set by the server) and
  the spelling of quantities do not count as differences, so a restart writes
  nothing;
* the pool generation stays when at most one existing slice changes and none is
  added (one write is atomic), and goes up by one otherwise, so consumers never
  mix old and new slices of one pool;
* obsolete slices are deleted first, with UID and resourceVersion preconditions;
  changed ones are replaced in place (keeping resourceVersion, so a concurrent
  writer makes us re-read rather than overwrite); missing ones are created,
  owned by their Node;
* conflicts, expired watches, throttling and server errors are retried with
  exponential backoff from a fresh list;
* fields the API server does not store (a Kubernetes feature gate is off) are left
  out of the comparison, so a server that cannot store them is not rewritten forever;
  list-type attributes (DRAListTypeAttributes) are more: a server that cannot store
  them refuses the whole slice (the field dropped, the attribute is left without a
  value: 422), so from then on the int is written instead, logged and counted, and
  the lists are tried again at the next full resync.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import random
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from services.core.kube import quantity
from services.core.kube.client import ApiError
from services.core.kube.resource import (
    Counter,
    CounterSet,
    Device,
    DeviceTaint,
    OwnerReference,
    ResourceSlice,
)
from services.core.model import nvidia
from services.publisher import metrics
from services.publisher.render import SliceContent, build_slices, node_owner, slice_name
from services.publisher.sliceapi import SliceApi

log = logging.getLogger(__name__)


class NodeNotFound(Exception):
    """The Node object does not exist (yet): slices owned by it would be garbage-collected."""


class SyncFailed(Exception):
    """A sync that kept failing after every retry, or failed in a way retries cannot fix."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    initial_s: float = 0.05
    factor: float = 2.0
    max_s: float = 5.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        base = min(self.max_s, self.initial_s * self.factor**attempt)
        return base * (1 + random.uniform(-self.jitter, self.jitter))


@dataclass
class SyncResult:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    generation: int | None = None

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


@dataclass
class PoolPlan:
    """The writes that take a node's actual slices to the desired ones."""

    delete: list[ResourceSlice] = field(default_factory=list)
    update: list[ResourceSlice] = field(default_factory=list)
    create: list[ResourceSlice] = field(default_factory=list)
    generation: int = 0

    @property
    def empty(self) -> bool:
        return not (self.delete or self.update or self.create)


# ------------------------------------------------------------------ planning (pure)


DropKind = str  # "sharedCounters" | "consumesCounters" | "taints" | "allowMultipleAllocations"
# allowMultipleAllocations stands for it and the capacities' requestPolicy: an API server
# without DRAConsumableCapacity drops both (consumable shares, services/core/model/shares.py).
# listTypeAttributes: attributes written as lists (ints, bools, strings, versions); an
# API server without DRAListTypeAttributes (or older than 1.36) keeps none of them, and
# they are then written as the scalar they stand for (nvidia.scalar_attributes).
LIST_ATTRIBUTES: DropKind = "listTypeAttributes"
DROPPABLE: tuple[DropKind, ...] = (
    "sharedCounters",
    "consumesCounters",
    "taints",
    "allowMultipleAllocations",
    LIST_ATTRIBUTES,
)


def plan_pool(
    node: str,
    desired: Sequence[SliceContent] | None,
    actual: Sequence[ResourceSlice],
    owner: OwnerReference | None,
    dropped: frozenset[DropKind] = frozenset(),
    driver: str = nvidia.DRIVER_NAME,
) -> PoolPlan:
    """What to delete, replace and create; ``desired`` None removes the node's pool.

    ``dropped`` names fields the API server is known to drop (its
    DRAPartitionableDevices or DRADeviceTaints gate is off): they are left out
    of the comparison, as the resourceslice controller does after a
    DroppedFieldsError, so a server that cannot store them is not rewritten forever.
    List-type attributes the server refuses are not even sent: their scalar form is.
    """
    if desired is None:
        return PoolPlan(delete=list(actual))
    if LIST_ATTRIBUTES in dropped:
        desired = [_scalar(c) for c in desired]
    names = [slice_name(node, i, driver) for i in range(len(desired))]
    by_name: dict[str, ResourceSlice] = {}
    obsolete: list[ResourceSlice] = []
    for s in actual:
        if s.metadata.name in names and s.metadata.name not in by_name:
            by_name[s.metadata.name] = s
        else:
            obsolete.append(s)
    generation = max((s.spec.pool.generation for s in actual), default=0)
    wanted = build_slices(node, desired, generation=generation, owner=owner, driver=driver)
    new = [w for w in wanted if w.metadata.name not in by_name]
    changed = [
        w
        for w in wanted
        if w.metadata.name in by_name
        and not same_slice(by_name[w.metadata.name], without(w, dropped))
    ]
    bump = bool(new) or len(changed) > 1
    if bump:
        generation += 1
        wanted = build_slices(node, desired, generation=generation, owner=owner, driver=driver)
    to_update = wanted if bump else changed
    return PoolPlan(
        delete=obsolete,
        update=[
            _as_update(by_name[w.metadata.name], w) for w in to_update if w.metadata.name in by_name
        ],
        create=[w for w in wanted if w.metadata.name not in by_name],
        generation=generation,
    )


def _scalar(content: SliceContent) -> SliceContent:
    if not content.devices:
        return content
    return SliceContent(nvidia.scalar_attributes(content.devices), content.shared_counters)


def without(obj: ResourceSlice, dropped: frozenset[DropKind]) -> ResourceSlice:
    """``obj`` as a server that drops ``dropped`` stores it."""
    if not dropped:
        return obj
    spec = obj.spec
    devices = spec.devices
    if devices and LIST_ATTRIBUTES in dropped:
        devices = nvidia.scalar_attributes(devices)
    if devices and dropped & {"consumesCounters", "taints"}:
        devices = [
            msgspec.structs.replace(
                d,
                consumes_counters=None if "consumesCounters" in dropped else d.consumes_counters,
                taints=None if "taints" in dropped else d.taints,
            )
            for d in devices
        ]
    if devices and "allowMultipleAllocations" in dropped:
        devices = [_unshared(d) for d in devices]
    counters = None if "sharedCounters" in dropped else spec.shared_counters
    spec = msgspec.structs.replace(spec, devices=devices, shared_counters=counters)
    return msgspec.structs.replace(obj, spec=spec)


def _unshared(device: Device) -> Device:
    """The device as a server without DRAConsumableCapacity stores it."""
    if not device.allow_multiple_allocations:
        return device
    capacity = {
        name: msgspec.structs.replace(cap, request_policy=None)
        for name, cap in (device.capacity or {}).items()
    }
    return msgspec.structs.replace(
        device, allow_multiple_allocations=None, capacity=capacity or None
    )


def dropped_fields(sent: ResourceSlice, stored: ResourceSlice) -> set[DropKind]:
    """Which droppable fields the server did not keep (compare with :func:`without`)."""
    out = set()
    if sent.spec.shared_counters and not stored.spec.shared_counters:
        out.add("sharedCounters")
    sent_devices = sent.spec.devices or []
    stored_devices = stored.spec.devices or []
    if any(d.consumes_counters for d in sent_devices) and not any(
        d.consumes_counters for d in stored_devices
    ):
        out.add("consumesCounters")
    if any(d.taints for d in sent_devices) and not any(d.taints for d in stored_devices):
        out.add("taints")
    if any(d.allow_multiple_allocations for d in sent_devices) and not any(
        d.allow_multiple_allocations for d in stored_devices
    ):
        out.add("allowMultipleAllocations")
    if _has_lists(sent_devices) and not _has_lists(stored_devices):
        out.add(LIST_ATTRIBUTES)
    return out


def _has_lists(devices: Sequence[Device]) -> bool:
    return any(map(nvidia.has_list_attributes, devices))


def refuses_lists(sent: ResourceSlice, exc: ApiError) -> bool:
    """Whether the API server refused ``sent`` for one of its list-type attributes.

    A server without DRAListTypeAttributes drops ``ints`` (and the other lists) on
    create and update, as any field of a gate that is off, and its validation then
    finds the attribute with no value: ``spec.devices[i].attributes[NAME]: Invalid
    value: ...: exactly one value must be specified`` (a 422 naming the attribute)."""
    if exc.status != 422:
        return False
    names = {
        name
        for d in sent.spec.devices or []
        for name, attr in (d.attributes or {}).items()
        if attr.is_list
    }
    return any(f"attributes[{name}]" in exc.message for name in names)


class ListsRefused(Exception):
    """A write that the API server refused for its list-type attributes."""


def same_slice(actual: ResourceSlice, wanted: ResourceSlice) -> bool:
    """Equal as the resourceslice controller compares them (and owned as we want)."""
    a, w = actual.spec, wanted.spec
    if (a.driver, a.node_name, a.node_selector, a.all_nodes, a.per_device_node_selection) != (
        w.driver,
        w.node_name,
        w.node_selector,
        w.all_nodes,
        w.per_device_node_selection,
    ):
        return False
    # Someone else's skipNodeOperations on our slice would have the kubelet start
    # containers without their devices' CDI specs: never ours (docs/architecture.md).
    if (a.skip_node_operations or None) != (w.skip_node_operations or None):
        return False
    if a.pool != w.pool or not _owned(actual, wanted):
        return False
    return _same_counter_sets(a.shared_counters, w.shared_counters) and _same_devices(
        a.devices, w.devices
    )


def _owned(actual: ResourceSlice, wanted: ResourceSlice) -> bool:
    want = wanted.metadata.owner_references or []
    have = actual.metadata.owner_references or []
    return all(any(o.uid == h.uid and o.kind == h.kind for h in have) for o in want)


def _same_devices(a: list[Device] | None, b: list[Device] | None) -> bool:
    if a == b:
        return True
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x == y or _comparable(x) == _comparable(y) for x, y in zip(a, b, strict=True))


def _same_counter_sets(a: list[CounterSet] | None, b: list[CounterSet] | None) -> bool:
    if a == b:
        return True
    if a is None or b is None or len(a) != len(b):
        return False
    return all(
        x.name == y.name and _counters(x.counters) == _counters(y.counters)
        for x, y in zip(a, b, strict=True)
    )


def _comparable(device: Device) -> Device:
    """The device with server-set taint times dropped and quantities spelled one way."""
    capacity = {
        name: msgspec.structs.replace(cap, value=_normal_quantity(cap.value))
        for name, cap in (device.capacity or {}).items()
    }
    consumes = [
        msgspec.structs.replace(c, counters=_counters(c.counters))
        for c in device.consumes_counters or []
    ]
    return msgspec.structs.replace(
        device,
        capacity=capacity or None,
        consumes_counters=consumes or None,
        taints=[_untimed(t) for t in device.taints or []] or None,
    )


def _counters(counters: dict[str, Counter]) -> dict[str, Counter]:
    return {name: Counter(value=_normal_quantity(c.value)) for name, c in counters.items()}


@functools.lru_cache(maxsize=4096)
def _normal_quantity(text: str) -> str:
    try:
        value = quantity.parse(text)
    except quantity.QuantityError:
        return text
    return quantity.format_int(value.numerator) if value.denominator == 1 else str(value)


def _untimed(taint: DeviceTaint) -> DeviceTaint:
    return msgspec.structs.replace(taint, time_added=None) if taint.time_added else taint


def _as_update(current: ResourceSlice, wanted: ResourceSlice) -> ResourceSlice:
    """The wanted content on the current object: same resourceVersion, kept taint times."""
    # Our Node owner replaces any older one (a Node re-created under the same
    # name has a new UID; only one owner may be the controller).
    wanted_owners = wanted.metadata.owner_references or []
    kinds = {o.kind for o in wanted_owners}
    owners = [o for o in current.metadata.owner_references or [] if o.kind not in kinds]
    owners += wanted_owners
    meta = msgspec.structs.replace(current.metadata, owner_references=owners or None)
    devices = _keep_taint_times(current.spec.devices or [], wanted.spec.devices)
    spec = msgspec.structs.replace(wanted.spec, devices=devices)
    return ResourceSlice(metadata=meta, spec=spec)


def _keep_taint_times(old: list[Device], new: list[Device] | None) -> list[Device] | None:
    """copyTaintTimeAdded: an unchanged taint keeps the time the server gave it."""
    if not new:
        return new
    old_by_name = {d.name: d for d in old if d.taints}
    out = []
    for device in new:
        before = old_by_name.get(device.name)
        if before is None or not device.taints:
            out.append(device)
            continue
        taints = []
        for taint in device.taints:
            match = next(
                (
                    t
                    for t in before.taints or []
                    if (t.key, t.value, t.effect) == (taint.key, taint.value, taint.effect)
                ),
                None,
            )
            keep = match.time_added if match and not taint.time_added else taint.time_added
            taints.append(msgspec.structs.replace(taint, time_added=keep))
        out.append(msgspec.structs.replace(device, taints=taints))
    return out


def fingerprint(contents: Sequence[SliceContent] | None) -> str:
    """A digest of what a node should have, to skip syncs that cannot change anything."""
    if contents is None:
        return "absent"
    data = msgspec.msgpack.encode([(c.devices, c.shared_counters) for c in contents])
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# ------------------------------------------------------------------ executing


class Reconciler:
    """Syncs one node's pool at a time against a :class:`SliceApi`.

    It remembers, per node, the fingerprint of the contents it last made the API
    server agree with, and the resourceVersion of every slice it wrote, so that
    the service can skip no-op syncs and tell its own writes from others' in the
    watch stream.
    """

    def __init__(
        self, api: SliceApi, retry: RetryPolicy | None = None, driver: str = nvidia.DRIVER_NAME
    ) -> None:
        """``driver``: whose pools (its slices' names and spec.driver)."""
        self.api = api
        self.driver = driver
        self.retry = retry or RetryPolicy()
        self.synced: dict[str, str] = {}  # node -> fingerprint in effect
        self.written: dict[str, str] = {}  # slice name -> resourceVersion we wrote
        self.deleted: set[str] = set()  # slice names we deleted, until the watch reports it
        self.dropped: frozenset[DropKind] = frozenset()  # fields the server does not store
        self._owners: dict[str, OwnerReference] = {}

    def forget(self, node: str) -> None:
        """Someone else touched the node's slices: the next sync must look, and re-read the Node."""
        self.synced.pop(node, None)
        self._owners.pop(node, None)

    def is_current(self, node: str, contents: Sequence[SliceContent] | None) -> bool:
        return self.synced.get(node) == fingerprint(contents)

    async def sync(
        self,
        node: str,
        desired: Sequence[SliceContent] | None,
        actual: Sequence[ResourceSlice] | None = None,
    ) -> SyncResult:
        """Make the API server hold ``desired`` for ``node``; retry what can succeed later."""
        for attempt in range(self.retry.attempts):
            try:
                result = await self._sync_once(node, desired, actual)
            except ListsRefused as exc:
                # Not a failure to back off from: the same sync again, with the ints.
                self._refuse_lists(str(exc.__cause__), node)
                actual = None
                continue
            except ApiError as exc:
                if not exc.retryable or attempt == self.retry.attempts - 1:
                    raise SyncFailed(f"node {node!r}: {exc}") from exc
                metrics.API_RETRIES.labels(reason=str(exc.status)).inc()
                self._owners.pop(node, None)
                actual = None  # re-read before the next try
                await asyncio.sleep(self.retry.delay(attempt))
                continue
            self.synced[node] = fingerprint(desired)
            return result
        raise AssertionError("unreachable")

    async def _sync_once(
        self,
        node: str,
        desired: Sequence[SliceContent] | None,
        actual: Sequence[ResourceSlice] | None,
    ) -> SyncResult:
        if actual is None:
            actual = (await self.api.list_slices(node)).items
        owner = await self._owner(node) if desired is not None else None
        plan = plan_pool(node, desired, actual, owner, self.dropped, self.driver)
        result = SyncResult(generation=plan.generation if desired is not None else None)
        # Each kind of write goes out at once (the client's budget paces them);
        # deletes first, then updates, then creates, as one at a time did.
        await _all(self._delete(obj) for obj in plan.delete)
        result.deleted += len(plan.delete)
        await _all(self._write(obj, self.api.replace(obj)) for obj in plan.update)
        result.updated += len(plan.update)
        await _all(self._write(obj, self.api.create(obj)) for obj in plan.create)
        result.created += len(plan.create)
        metrics.record_writes(result.created, result.updated, result.deleted)
        return result

    async def _delete(self, obj: ResourceSlice) -> None:
        name = obj.metadata.name
        self.written.pop(name, None)
        self.deleted.add(name)
        try:
            await self.api.delete(
                name, uid=obj.metadata.uid, resource_version=obj.metadata.resource_version
            )
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def _write(self, sent: ResourceSlice, call: Awaitable[ResourceSlice]) -> None:
        try:
            stored = await call
        except ApiError as exc:
            if refuses_lists(sent, exc):
                raise ListsRefused(sent.metadata.name) from exc
            raise
        self._record(sent, stored)

    def retry_list_attributes(self) -> None:
        """Send list-type attributes again (the next full resync): the API server may
        have been given its gate since; if not, one write is refused and the ints stay."""
        self.dropped -= {LIST_ATTRIBUTES}

    def _refuse_lists(self, error: str, node: str) -> None:
        metrics.LIST_ATTRIBUTES_REFUSED.set(1)
        if LIST_ATTRIBUTES in self.dropped:
            return  # another sync learnt it meanwhile
        self.dropped |= {LIST_ATTRIBUTES}
        metrics.DROPPED_FIELDS.labels(field=LIST_ATTRIBUTES).inc()
        log.error(
            "the API server refuses list-type attributes (its feature gate DRAListTypeAttributes "
            "is off, or it is older than 1.36): numaNode is published as an int, as with the "
            "driver's DRAListTypeAttributes off, until the server accepts lists (tried again at "
            "each full resync); turn the gate on in kube-apiserver and kube-scheduler, or off here",
            extra={"node": node, "error": error},
        )

    def _record(self, sent: ResourceSlice, stored: ResourceSlice) -> None:
        if stored.metadata.resource_version:
            self.written[stored.metadata.name] = stored.metadata.resource_version
        lost = dropped_fields(sent, stored) - self.dropped
        if _has_lists(stored.spec.devices or []):
            metrics.LIST_ATTRIBUTES_REFUSED.set(0)
        if LIST_ATTRIBUTES in lost:  # dropped without a word: as refused
            lost.discard(LIST_ATTRIBUTES)
            self._refuse_lists("the stored slice has none of them", sent.spec.pool.name)
        if lost:
            self.dropped |= lost
            for field_name in lost:
                metrics.DROPPED_FIELDS.labels(field=field_name).inc()
            log.error(
                "the API server dropped fields of our slices; enable its feature gates "
                "DRAPartitionableDevices (counters), DRADeviceTaints (taints) and "
                "DRAConsumableCapacity (allowMultipleAllocations), or turn off DynamicMIG / "
                "NVMLDeviceHealthCheck / ConsumableShares here; comparing without them meanwhile",
                extra={"fields": sorted(lost), "slice": sent.metadata.name},
            )

    async def _owner(self, node: str) -> OwnerReference:
        if node not in self._owners:
            uid = await self.api.node_uid(node)
            if uid is None:
                raise NodeNotFound(f"node {node!r} has no Node object; not publishing its slices")
            self._owners[node] = node_owner(node, uid)
        return self._owners[node]


async def _all(calls: Iterable[Awaitable[None]]) -> None:
    """Run ``calls`` together; every one finishes, then the first failure is raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


__all__ = [
    "NodeNotFound",
    "PoolPlan",
    "Reconciler",
    "RetryPolicy",
    "SyncFailed",
    "SyncResult",
    "fingerprint",
    "plan_pool",
    "same_slice",
]
