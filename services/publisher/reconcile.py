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

The plan is :mod:`.poolplan` (pure), the comparison :mod:`.slicecompare`, the fields
a server drops :mod:`.droppedfields`; here the plan is carried out: the writes, their
retries, and what the server taught us.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from services.core.kube.client import ApiError
from services.core.kube.resource import OwnerReference, ResourceSlice
from services.core.model import nvidia
from services.publisher import metrics
from services.publisher.droppedfields import (
    LIST_ATTRIBUTES,
    DropKind,
    dropped_fields,
    has_lists,
    refuses_lists,
)
from services.publisher.poolplan import fingerprint, plan_pool
from services.publisher.render import SliceContent, node_owner
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


class ListsRefused(Exception):
    """A write that the API server refused for its list-type attributes."""


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
        # Nodes the last full listing found without slices of ours: their first sync
        # creates without listing them again (a first publish is one write per slice).
        self.unsliced: set[str] = set()

    def forget(self, node: str) -> None:
        """Someone else touched the node's slices: the next sync must look, and re-read the Node."""
        self.synced.pop(node, None)
        self._owners.pop(node, None)
        self.unsliced.discard(node)

    def learn(self, unsliced: set[str], uids: Mapping[str, str]) -> None:
        """What a full listing showed: nodes with no slices of ours, and Node UIDs (one
        list instead of a list and a GET per node). A node changed since is forgotten by
        the watch; a write on a stale view fails (409, a dangling owner) and is re-read."""
        self.unsliced = set(unsliced)
        for node, uid in uids.items():
            self._owners.setdefault(node, node_owner(node, uid))

    def is_current(self, node: str, digest: str) -> bool:
        """Whether ``node`` holds the contents of ``digest`` (:func:`fingerprint`)."""
        return self.synced.get(node) == digest

    async def sync(
        self,
        node: str,
        desired: Sequence[SliceContent] | None,
        actual: Sequence[ResourceSlice] | None = None,
        digest: str | None = None,
    ) -> SyncResult:
        """Make the API server hold ``desired`` for ``node``; retry what can succeed later.
        ``digest``: ``fingerprint(desired)`` when the caller has it already."""
        if actual is None and node in self.unsliced:
            actual = []
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
            self.synced[node] = digest or fingerprint(desired)
            self.unsliced.discard(node)
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
        if has_lists(stored.spec.devices or []):
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
    "Reconciler",
    "RetryPolicy",
    "SyncFailed",
    "SyncResult",
]
