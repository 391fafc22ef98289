"""The writes that take a node's slices in the API server to the rendered ones (pure).

Slice names are deterministic (``<node>-gpu.nvidia.com-<i>``) instead of generated;
otherwise the rules are the resourceslice controller's: the pool generation stays
when at most one existing slice changes and none is added (one write is atomic), and
goes up by one otherwise, so consumers never mix old and new slices of one pool;
obsolete slices are deleted; changed ones are replaced in place, keeping their
resourceVersion and the times the server gave their taints; missing ones are created,
owned by their Node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from services.core.kube.resource import Device, OwnerReference, ResourceSlice
from services.core.model import deviceattrs, nvidia
from services.publisher.droppedfields import LIST_ATTRIBUTES, DropKind, without
from services.publisher.render import SliceContent, build_slices, slice_name
from services.publisher.slicecompare import same_slice


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
    return SliceContent(deviceattrs.scalar_attributes(content.devices), content.shared_counters)


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
