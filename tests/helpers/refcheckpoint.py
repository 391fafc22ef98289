"""Checkpoint files as the reference driver writes them, for switch-over tests.

The layout is the Go JSON of the reference's Checkpoint (cmd/gpu-kubelet-plugin:
checkpoint.go, checkpointv.go, prepared.go, deviceinfo.go, mig.go,
device_state.go): members in struct order, maps with sorted keys, no blanks,
``omitempty`` where the Go tags say so; both checksums as its MarshalCheckpoint
sets them. A file built here was checked once with a Go program using the
kubelet's checkpointmanager/checksum and these struct tags: it re-marshals to
the same bytes and both checksums verify (see tests/unit/preparer/test_refcheckpoint.py
for the numbers pinned from that run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from services.preparer.refcheckpoint import kubelet_checksum

DRIVER = "gpu.nvidia.com"


@dataclass
class RefDevice:
    kind: Literal["gpu", "mig", "vfio"]
    name: str
    request: str
    pool: str
    uuid: str = ""  # gpu: the GPU; vfio: the twin's uuid
    pci_bus_id: str = ""  # vfio (and a MIG device's parent)
    mig: dict[str, Any] | None = None  # parentMinor, giId, ciId, migUUID, parentUUID


@dataclass
class RefGroup:
    devices: list[RefDevice]
    mps_daemon_id: str = ""
    time_slice_applied: bool | None = None


@dataclass
class RefClaim:
    uid: str
    groups: list[RefGroup]
    state: str = "PrepareCompleted"
    name: str = ""
    namespace: str = ""
    allocated: list[tuple[str, str, str]] = field(default_factory=list)  # request, pool, device


def dumps(value: Any) -> str:
    """encoding/json's output for plain values: compact, HTML characters escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _checkpointed(uid: str, d: RefDevice) -> dict[str, Any]:
    return {
        "Requests": [d.request],
        "PoolName": d.pool,
        "DeviceName": d.name,
        "CDIDeviceIDs": [f"k8s.gpu.nvidia.com/claim={uid}-{d.name}"],
    }


def _device(uid: str, d: RefDevice) -> dict[str, Any]:
    device = _checkpointed(uid, d)
    if d.kind == "gpu":
        return {"gpu": {"info": {"uuid": d.uuid}, "device": device}, "mig": None}
    if d.kind == "mig":
        assert d.mig is not None
        concrete = {
            "parentMinor": d.mig["parentMinor"],
            "giId": d.mig["giId"],
            "ciId": d.mig["ciId"],
            "migUUID": d.mig["migUUID"],
            "parentUUID": d.mig["parentUUID"],
        }
        if d.pci_bus_id:
            concrete["parentPCIBusID"] = d.pci_bus_id
        return {"gpu": None, "mig": {"concrete": concrete, "device": device}}
    info = {"uuid": d.uuid}
    if d.pci_bus_id:
        info["pciBusID"] = d.pci_bus_id
    return {"gpu": None, "mig": None, "vfio": {"info": info, "device": device}}


def _group(uid: str, g: RefGroup) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if g.mps_daemon_id:
        state["mpsControlDaemonID"] = g.mps_daemon_id
        state["mpsApplied"] = True
    if g.time_slice_applied is not None:
        state["timeSliceApplied"] = g.time_slice_applied
    return {"devices": [_device(uid, d) for d in g.devices], "configState": state}


def _status(c: RefClaim) -> dict[str, Any]:
    if not c.allocated:
        return {}
    results = [
        {"request": request, "driver": DRIVER, "pool": pool, "device": device}
        for request, pool, device in c.allocated
    ]
    return {"allocation": {"devices": {"results": results}}}


def _v1_claim(c: RefClaim) -> dict[str, Any]:
    out: dict[str, Any] = {"status": _status(c)}
    if c.groups:
        out["preparedDevices"] = [_group(c.uid, g) for g in c.groups]
    return out


def _v2_claim(c: RefClaim) -> dict[str, Any]:
    out = {"checkpointState": c.state, **_v1_claim(c)}
    if c.name:
        out["name"] = c.name
    if c.namespace:
        out["namespace"] = c.namespace
    return out


def checkpoint_bytes(claims: list[RefClaim], boot_id: str = "", *, v2: bool = True) -> bytes:
    """The file MarshalCheckpoint writes (``v2=False``: an older release, v1 only)."""
    ordered = sorted(claims, key=lambda c: c.uid)
    v1: dict[str, Any] = {}
    completed = {c.uid: _v1_claim(c) for c in ordered if c.state == "PrepareCompleted"}
    if completed:
        v1["preparedClaims"] = completed
    v1_text = dumps(v1)
    top = kubelet_checksum(('{"checksum":0,"v1":' + v1_text + "}").encode())
    if not v2:
        return ('{"checksum":' + str(top) + ',"v1":' + v1_text + "}").encode()
    body: dict[str, Any] = {"checksum": 0}
    if ordered:
        body["preparedClaims"] = {c.uid: _v2_claim(c) for c in ordered}
    if boot_id:
        body["nodeBootID"] = boot_id
    body["checksum"] = kubelet_checksum(dumps(body).encode())
    return ('{"checksum":' + str(top) + ',"v1":' + v1_text + ',"v2":' + dumps(body) + "}").encode()


def cdi_spec(uid: str, names: list[str]) -> str:
    """A claim spec as the reference leaves it (device names ``<uid>-<device>``)."""
    devices = "".join(
        f"- name: {uid}-{n}\n  containerEdits:\n    env:\n    - NVIDIA_VISIBLE_DEVICES=void\n"
        for n in names
    )
    return f"cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n{devices}"
