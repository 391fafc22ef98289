"""One claim's prepare or unprepare as a transaction, the same for both drivers' engines.

Every operation on a claim runs under that claim's lock, after its identity was
checked; an expected failure (:class:`ClaimRefused`) becomes the claim's error,
named by the claim, and nothing else fails. A prepare is recorded in two steps:
``PrepareStarted`` (with the allocation, so a crash can be undone) before any side
effect, ``PrepareCompleted`` (with everything done) after the last, its CDI spec
put in place by the checkpoint writer right before that entry is written.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from services.core.kube.resource import AllocationResult
from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import ClaimRef, DeviceRef, PreparedDevice
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    ClaimEntry,
    GroupState,
    PreparedDeviceState,
)
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.claims import check_identity, describe
from services.preparer.keylocks import KeyedLocks


class PrepareError(ClaimRefused, ValueError):
    """A claim-level refusal (conflicts, empty allocations) with its reason."""


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


Work = Callable[[], Awaitable[list[PreparedDevice] | None]]


async def attempt(locks: KeyedLocks, ref: ClaimRef, work: Work) -> Outcome:
    """``work`` for one claim: identity checked, under the claim's lock; its refusal
    becomes the claim's error."""
    try:
        check_identity(ref)
        async with locks.hold(ref.uid):
            return Outcome(devices=await work() or [])
    except ClaimRefused as exc:
        return Outcome(error=prefixed(ref, str(exc)))


def started(
    ref: ClaimRef, allocation: AllocationResult, groups: Sequence[GroupState] = ()
) -> ClaimEntry:
    """The ``PrepareStarted`` entry of a claim about to be prepared."""
    return ClaimEntry(
        state=PREPARE_STARTED,
        namespace=ref.namespace,
        name=ref.name,
        allocation=allocation,
        started_at=time.time(),
        groups=list(groups),
    )


async def complete(
    store: CheckpointStore,
    uid: str,
    entry: ClaimEntry,
    put_spec_in_place: Callable[[], None],
    **done: object,
) -> ClaimEntry:
    """``entry`` made ``PrepareCompleted`` with what was ``done`` (its devices, groups,
    files), written after ``put_spec_in_place`` ran in the checkpoint writer."""
    completed = msgspec.structs.replace(
        entry, state=PREPARE_COMPLETED, completed_at=time.time(), **done
    )
    await store.put(uid, completed, before=put_spec_in_place)
    return completed


def reply_devices(entry: ClaimEntry) -> list[PreparedDevice]:
    """The kubelet's answer for a prepared claim: its devices, CDI ids and share ids."""
    return [_reply(d) for d in entry.devices]


def _reply(d: PreparedDeviceState) -> PreparedDevice:
    return PreparedDevice(
        request_names=d.requests,
        pool_name=d.pool,
        device_name=d.name,
        cdi_device_ids=d.cdi_device_ids,
        share_id=d.share.share_id if d.share is not None else None,
    )


def prefixed(ref: ClaimRef, message: str) -> str:
    """Every per-claim error starts with the claim it is about."""
    who = f"claim {describe(ref)}"
    return message if message.startswith(who) else f"{who}: {message}"
