"""``status.devices`` of this node's GPU claims (KEP-4817), written after their prepares.

What it gives users: ``kubectl get resourceclaim -o yaml`` (and whatever watches
claims: a monitoring agent mapping pods to GPUs, a job framework) shows for each
device the claim got on this node a ``Ready`` condition, True once the device is
prepared (CDI spec written, sharing applied, MIG device made), and ``data``:

``uuid``
    the GPU's UUID, or the MIG device's (what ``nvidia-smi -L`` and
    ``NVIDIA_VISIBLE_DEVICES`` name; a dynamic MIG device's exists only once the
    prepare made it, so no slice attribute can say it);
``pciBusID``
    the GPU's PCI address (the VFIO device's for passthrough);
``parentUUID``, ``migProfile``
    for a MIG device: its GPU and its profile;
``sharing``
    ``TimeSlicing`` or ``MPS`` when the claim's config shares the device, ``Shares``
    for a consumable share (with ``memoryLimitMiB`` and ``threadPercentage``);
``pinnedMemoryLimitMiB``
    under MPS, the pinned-memory limit the device's daemon was given: the config's,
    or the device's memory where the config asked for more (configs.capped);
``cdiDeviceIDs``
    what the container runtime was given.

The preparer writes them because it alone knows them, and it runs on the claim's
node, where the API server lets it write only its own driver's entries of claims
allocated to this node (``associated-node:patch`` on ``resourceclaims/driver``,
Kubernetes 1.36+: a node cannot touch another node's claims). The writes stay off
the kubelet's path: they start :data:`SETTLE_S` after the last prepare or
unprepare (a pod's claims, a job's pods, and a claim unprepared meanwhile costs
nothing), and each claim's write waits until no kubelet call is being answered
(at most :data:`QUIET_MAX_S`, so a node that is never idle still gets them). What
they say is a function of the checkpoint (the condition's time is the prepare's
completion), so a restarted preparer writes nothing that is already there. An
unprepared claim's entries are removed (deallocation removes them too). A write
starts from the claim as the preparer last saw it (the copy it checked at the prepare,
then what its own last write returned), so it is one patch; a claim that changed
meanwhile answers 409 and is read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from prometheus_client import Counter

from services.core.kit import supervisor
from services.core.kube import claimstatus
from services.core.kube.client import ApiError, KubeApi
from services.core.kube.resource import ResourceClaim, ResourceClaimStatus
from services.core.model import nvidia
from services.preparer.checkpoint import (
    GPU_KINDS,
    PREPARE_COMPLETED,
    ClaimEntry,
    PreparedDeviceState,
)
from services.preparer.checkpointstore import CheckpointStore

log = logging.getLogger(__name__)
DRIVER = nvidia.DRIVER_NAME
READY = "Ready"
CONCURRENCY = 8  # claims written at once
SETTLE_S = 0.5  # after the last prepare or unprepare, before the writes start
QUIET_MAX_S = 5.0  # the longest a write waits for no kubelet call in flight
TRIES = 5  # reads and writes of one claim before the next round
RETRY_S = 2.0

Wanted = tuple[str, str, tuple[claimstatus.Entry, ...]]  # namespace, name, our entries
Seen = tuple[str, list[dict[str, Any]] | None]  # a claim's resourceVersion and status.devices
CopyOf = Callable[[str, str, str], ResourceClaim | None]  # (namespace, name, uid) -> claim

WRITES = Counter(
    "gpudra_preparer_claim_status_writes_total",
    "Claims' status.devices writes: written (entries set), removed (after an unprepare), "
    "error (tried again later), refused (this claim's write refused for good).",
    ["result"],
)


class _Meta(msgspec.Struct, rename="camel", kw_only=True):
    uid: str = ""
    resource_version: str = ""


class _Claim(msgspec.Struct, kw_only=True):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: ResourceClaimStatus | None = None


def _sharing(entry: ClaimEntry, device: PreparedDeviceState) -> dict[str, Any]:
    if device.share is not None:
        share = device.share
        out: dict[str, Any] = {"sharing": "Shares", "threadPercentage": share.thread_percentage}
        if share.memory_limit_mib is not None:
            out["memoryLimitMiB"] = share.memory_limit_mib
        return out
    group = entry.groups[device.group] if 0 <= device.group < len(entry.groups) else None
    sharing = (group.config.get("sharing") if group is not None else None) or {}
    strategy = sharing.get("strategy") if isinstance(sharing, dict) else None
    out = {"sharing": strategy} if isinstance(strategy, str) and strategy else {}
    uuid = device.mig.uuid if device.mig is not None else device.gpu_uuid
    limit = group.mps.pinned_memory_limits_mib.get(uuid) if group and group.mps else None
    if limit is not None:  # what MPS enforces, which a capped limit makes differ from the config
        out["pinnedMemoryLimitMiB"] = limit
    return out


def device_data(entry: ClaimEntry, device: PreparedDeviceState) -> dict[str, Any]:
    """What the status says of one prepared device (see the module's docstring)."""
    data: dict[str, Any] = {}
    if device.mig is not None:
        data.update(uuid=device.mig.uuid, parentUUID=device.mig.parent_uuid,
                    migProfile=device.mig.profile)  # fmt: skip
    elif device.gpu_uuid:
        data["uuid"] = device.gpu_uuid
    pci = device.pci_bus_id or (device.vfio.pci_bus_id if device.vfio is not None else "")
    if pci:
        data["pciBusID"] = pci
    data.update(_sharing(entry, device))
    if device.cdi_device_ids:
        data["cdiDeviceIDs"] = list(device.cdi_device_ids)
    return data


def entries(entry: ClaimEntry) -> tuple[claimstatus.Entry, ...]:
    """The status.devices entries of one prepared claim: one per allocated device."""
    since = claimstatus.stamp(entry.completed_at or entry.started_at)
    out: dict[claimstatus.Key, claimstatus.Entry] = {}
    for device in entry.devices:
        if device.kind not in GPU_KINDS:
            continue
        ready = claimstatus.condition(READY, True, "Prepared", "", since)
        share = device.share.share_id if device.share is not None else None
        one = claimstatus.entry(DRIVER, device.pool, device.name, [ready], share_id=share,
                                data=device_data(entry, device))  # fmt: skip
        out.setdefault(claimstatus.key(one), one)
    return tuple(out[k] for k in sorted(out))


def wanted(store: CheckpointStore) -> dict[str, Wanted]:
    return {
        uid: (entry.namespace, entry.name, entries(entry))
        for uid, entry in store.claims.items()
        if entry.state == PREPARE_COMPLETED
    }


class Refused(Exception):
    """The API server will not take our writes (no permission, field dropped)."""


class DeviceStatusWriter:
    """Keeps each prepared claim's status.devices entries of ours as the checkpoint says."""

    def __init__(
        self,
        api: KubeApi,
        store: CheckpointStore,
        mode: str = "auto",
        retry_s: float = RETRY_S,
        *,
        idle: asyncio.Event | None = None,
        settle_s: float = SETTLE_S,
        copy_of: CopyOf | None = None,
    ) -> None:
        """``mode``: on, off, or auto (Kubernetes 1.36+: see services.core.kube.claimstatus);
        ``idle``: set while the preparer answers no kubelet call (the service's)."""
        self.api = api
        self.store = store
        self.mode = mode
        self.retry_s = retry_s
        self.idle = idle
        self.settle_s = settle_s
        self.copy_of = copy_of
        self.seen: dict[str, Seen] = {}  # uid -> the claim as our last write left it
        self.written: dict[str, Wanted] = {}  # uid -> what the claim's status says of ours
        self.off = ""  # why writing stopped ("" while it goes on)
        self._dirty = asyncio.Event()
        self._limit = asyncio.Semaphore(CONCURRENCY)

    def start(self) -> None:
        self._dirty.set()  # what the checkpoint holds at start-up
        supervisor.current().spawn("device status", self._write_changes)

    def changed(self) -> None:
        self._dirty.set()

    async def close(self) -> None:
        await supervisor.current().cancel("device status")

    async def decide(self) -> bool:
        """Whether to write at all: asked of the API server's version once, in the
        background (a preparer starts and serves while the API server is away)."""
        return await claimstatus.decide(self.api, self.mode)

    async def _write_changes(self) -> None:
        on = await self.decide()
        log.info("claim device status", extra={"on": on, "mode": self.mode})
        if not on:
            self.off = f"--claim-device-status={self.mode}"
            return
        while not self.off:
            await self._dirty.wait()
            since = time.monotonic()
            while self._dirty.is_set() and time.monotonic() - since < QUIET_MAX_S:
                self._dirty.clear()  # until SETTLE_S without a change (at most QUIET_MAX_S)
                await asyncio.sleep(self.settle_s)
            if not await self.sync():
                asyncio.get_running_loop().call_later(self.retry_s, self._dirty.set)

    async def sync(self) -> bool:
        """One round: every claim whose entries differ from the checkpoint's; True if done."""
        desired = wanted(self.store)
        work: list[tuple[str, Wanted | None]] = [
            (uid, w) for uid, w in desired.items() if self.written.get(uid) != w
        ]
        work += [(uid, None) for uid in self.written if uid not in desired]
        if not work:
            return True
        results = await asyncio.gather(*(self._write_claim(uid, w) for uid, w in work))
        return all(results)

    async def _write_claim(self, uid: str, want: Wanted | None) -> bool:
        """Write one claim's entries (``want`` None: remove them); False to try again."""
        namespace, name, ours = want or (*self.written[uid][:2], ())
        extra = {"claim": f"{namespace}/{name}", "uid": uid}
        async with self._limit:
            await self._quiet()
            try:
                await self._put(uid, namespace, name, list(ours))
            except Refused as exc:
                self.off = str(exc)
                log.error(f"claim device status not written from now on: {exc}", extra=extra)
                return True
            except ApiError as exc:
                WRITES.labels("error" if exc.retryable else "refused").inc()
                if exc.retryable:
                    log.warning("claim device status not written; trying again",
                                extra={**extra, "error": str(exc)})  # fmt: skip
                    return False
                log.error("claim device status refused for this claim",
                          extra={**extra, "error": str(exc)})  # fmt: skip
        if want is None:
            self.written.pop(uid, None)
            self.seen.pop(uid, None)
        else:
            self.written[uid] = want
        return True

    async def _quiet(self) -> None:
        """Until no kubelet call is in flight (at most QUIET_MAX_S)."""
        if self.idle is not None and not self.idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), QUIET_MAX_S)

    def _known(self, uid: str, namespace: str, name: str) -> Seen | None:
        """The claim as last seen: after our own write, or the copy checked at its prepare."""
        if uid in self.seen:
            return self.seen[uid]
        copy = self.copy_of(namespace, name, uid) if self.copy_of is not None else None
        if copy is None or copy.metadata.resource_version is None:
            return None
        return copy.metadata.resource_version, copy.status.devices if copy.status else None

    async def _read(self, uid: str, namespace: str, name: str) -> Seen | None:
        """The claim now (None: deleted, replaced under its name, or deallocated)."""
        path = claimstatus.CLAIMS.format(ns=namespace, name=name)
        try:
            claim = msgspec.json.decode(await self.api.get(path), type=_Claim)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        status = claim.status
        if claim.metadata.uid != uid or status is None or status.allocation is None:
            return None  # another claim of that name, or deallocated (entries dropped with it)
        return claim.metadata.resource_version, status.devices

    async def _put(
        self, uid: str, namespace: str, name: str, ours: list[claimstatus.Entry]
    ) -> None:
        known = self._known(uid, namespace, name)
        for _ in range(TRIES):
            if known is None:
                known = await self._read(uid, namespace, name)
                if known is None:
                    return  # no claim (or allocation) to keep a status in
            version, current = known
            want = claimstatus.merged(current, DRIVER, ours)
            if claimstatus.same(current, want):
                return
            try:
                body = await claimstatus.write(self.api, namespace, name, uid=uid,
                                               resource_version=version,
                                               devices=want)  # fmt: skip
            except ApiError as exc:
                if exc.conflict:
                    known = None  # changed meanwhile (or gone): read it again
                    continue
                if exc.not_found:
                    return
                if exc.status == 403:  # no grant at all (a 422 "Forbidden" is this claim's)
                    raise Refused(f"the API server refused it: {exc}") from exc
                raise
            written = msgspec.json.decode(body, type=_Claim)
            stored = written.status
            self.seen[uid] = (written.metadata.resource_version, stored.devices if stored else None)
            if ours and not claimstatus.ours(stored.devices if stored else None, DRIVER):
                raise Refused(
                    "the API server dropped status.devices (its DRAResourceClaimDeviceStatus "
                    "gate is off)"
                )
            WRITES.labels("written" if ours else "removed").inc()
            return
        raise ApiError(409, f"claim {namespace}/{name} kept changing")
