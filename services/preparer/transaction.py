"""A claim's prepare recorded as a transaction, the same for both drivers' engines.

``PrepareStarted`` (with the allocation, so a crash can be undone) before any side
effect, ``PrepareCompleted`` (with everything done) after the last, its CDI spec put
in place by the checkpoint writer right before that entry is written; the kubelet's
answer is read from that record. An expected failure is a :class:`PrepareError` (a
:class:`ClaimRefused`): the service makes it the claim's error, named by the claim.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from services.core.kube.resource import AllocationResult
from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import ClaimRef, PreparedDevice
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    ClaimEntry,
    GroupState,
    PreparedDeviceState,
)
from services.preparer.checkpointstore import CheckpointStore


class PrepareError(ClaimRefused, ValueError):
    """A claim-level refusal (conflicts, empty allocations) with its reason."""


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
