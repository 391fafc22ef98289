"""The preparer as a process on a simulated node: every kind of claim, prepared and undone.

Discovery (simulated NVML) and the preparer run as ``gpudra`` subprocesses on a
real nats-server; requests arrive on ``dra.node.<node>.prepare`` as the
kubelet plugin sends them. Every CDI spec written is validated against the
official schema.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model import nvidia
from services.core.model.schemas import ClaimEvent, HeldDevice, NodePreparedDevices
from services.local.natsserver import NatsServer
from services.preparer import cdi
from tests.helpers.preparer import (
    API,
    Dev,
    Node,
    gpu_config,
    make_claim,
    opaque,
    validate_cdi_file,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def h100(tmp_path: Path, nats_server: NatsServer, bus: Bus) -> AsyncIterator[Node]:
    node = Node(tmp_path, nats_server, bus, fleet="dgx-h100")
    await node.start_discovery()
    try:
        yield node
    finally:
        await node.close()


@pytest.fixture
async def a100(tmp_path: Path, nats_server: NatsServer, bus: Bus) -> AsyncIterator[Node]:
    node = Node(tmp_path, nats_server, bus, fleet="dgx-a100")
    await node.start_discovery()
    try:
        yield node
    finally:
        await node.close()


def exists(path: str) -> bool:
    return Path(path).exists()


def read_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


async def wait_held(node: Node, check: Callable[[list[HeldDevice]], bool]) -> list[HeldDevice]:
    """The node's ``prepared`` record once ``check`` holds (it is written in the background)."""
    for _ in range(100):
        got = await node.bus.kv_get(
            subjects.PREPARED_BUCKET, subjects.prepared_key(node.name), NodePreparedDevices
        )
        devices = got[0].devices if got else []
        if got and check(devices):
            return devices
        await asyncio.sleep(0.05)
    raise AssertionError(f"prepared devices never matched; last: {devices}")


def assert_clean(node: Node) -> None:
    assert node.cdi_files() == []
    assert dict(node.checkpoint().claims) == {}


async def claim_events(bus: Bus, node: str, uid: str, want: int) -> list[ClaimEvent]:
    """The claim's lifecycle events from the CLAIMS stream (waits for ``want`` of them)."""
    found: list[ClaimEvent] = []

    async def collect() -> None:
        async for delivery in bus.pull(
            subjects.CLAIMS_STREAM, f"audit-{uid[:8]}", subjects.claim_events_all(), ClaimEvent
        ):
            await delivery.ack()
            if delivery.value.claim.uid == uid:
                found.append(delivery.value)
            if len(found) >= want:
                return

    await asyncio.wait_for(collect(), 15)
    return found


async def test_a_full_gpu_is_prepared_once_and_undone_completely(h100: Node, bus: Bus) -> None:
    await h100.start_preparer()
    claim = await h100.put_claim(make_claim(h100.name, [Dev("gpu", "gpu-3")], name="train"))
    uid = claim.metadata.uid or ""
    reply = await h100.prepare(claim)
    result = reply.claims[uid]
    assert result.error == ""
    [device] = result.devices
    assert (device.request_names, device.pool_name, device.device_name) == (["gpu"], "n1", "gpu-3")
    assert device.cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={uid}-gpu-3"]

    [spec_file] = h100.cdi_files()
    assert spec_file.name == f"k8s.gpu.nvidia.com-claim_{uid}.yaml"
    spec = validate_cdi_file(spec_file)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3, "fileMode": 0o666,
         "permissions": "rwm"}
    ]  # fmt: skip
    entry = h100.checkpoint().claims[uid]
    assert entry.state == "PrepareCompleted" and entry.devices[0].gpu_minor == 3

    again = await h100.prepare(claim)  # idempotent: the stored result, nothing rewritten
    assert again.claims[uid] == result
    assert spec_file.stat().st_mtime_ns == h100.cdi_files()[0].stat().st_mtime_ns

    assert (await h100.unprepare(claim)).claims[uid].error == ""
    assert_clean(h100)
    assert (await h100.unprepare(claim)).claims[uid].error == ""  # unknown now: a no-op

    events = await claim_events(bus, h100.name, uid, want=6)
    names = [e.event for e in events]
    assert names == [
        "prepare.requested", "prepared", "prepare.requested", "prepared",
        "unprepare.requested", "unprepared",
    ]  # fmt: skip
    prepared = events[1]
    assert (prepared.claim.namespace, prepared.claim.name, prepared.actor) == (
        "default",
        "train",
        "preparer",
    )
    assert [d.device for d in prepared.devices] == ["gpu-3"]
    assert prepared.duration_ms is not None and prepared.duration_ms > 0


async def test_a_deleted_or_rewritten_prepared_key_is_put_back_by_the_preparer(
    h100: Node, bus: Bus
) -> None:
    """Only the admin identity (and the node's preparer) may write the node's prepared
    key; deleted or emptied, the publisher would offer the held GPU's VFIO twin. The
    preparer puts its word back within its check interval, logged."""
    preparer = await h100.start_preparer()
    claim = await h100.put_claim(make_claim(h100.name, [Dev("gpu", "gpu-2")], name="held"))
    assert (await h100.prepare(claim)).claims[claim.metadata.uid or ""].error == ""
    held = await wait_held(h100, lambda devices: [d.device for d in devices] == ["gpu-2"])
    key = subjects.prepared_key(h100.name)

    async def back() -> None:
        for _ in range(600):
            got = await bus.kv_get(subjects.PREPARED_BUCKET, key, NodePreparedDevices)
            if got and got[0].devices == held:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the prepared key was not put back:\n{preparer.output()}")

    await bus.kv_delete(subjects.PREPARED_BUCKET, key)
    await back()
    await bus.kv_put(subjects.PREPARED_BUCKET, key, NodePreparedDevices(node=h100.name))
    await back()
    for why in ("deleted", "rewritten"):
        assert f"the prepared key was {why} by someone else; putting it back" in preparer.output()


async def test_dynamic_mig_devices_appear_in_discovery_and_go_away(h100: Node) -> None:
    await h100.start_preparer(gates="DynamicMIG=true")
    name = nvidia.mig_device_name(2, "1g.10gb", 19, 6)
    claim = await h100.put_claim(make_claim(h100.name, [Dev("mig", name)]))
    uid = claim.metadata.uid or ""
    result = (await h100.prepare(claim)).claims[uid]
    assert result.error == "", result.error
    inv = await h100.inventory()
    assert inv is not None
    [live] = [m for g in inv.gpus if g.minor == 2 for m in g.mig_devices]
    assert (live.profile, live.placement.start) == ("1g.10gb", 6)
    entry = h100.checkpoint().claims[uid]
    assert entry.devices[0].mig is not None and entry.devices[0].mig.uuid == live.uuid
    spec = validate_cdi_file(h100.cdi_files()[0])
    gi_minor, ci_minor = cdi.mig_cap_minors(2, live.gi_id, live.ci_id)
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert paths == [
        "/dev/nvidia2",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
    ]

    assert (await h100.unprepare(claim)).claims[uid].error == ""
    assert await h100.mig_uuids() == []
    assert_clean(h100)


async def test_static_mig_devices_are_used_as_they_are(a100: Node) -> None:
    await a100.start_preparer()
    inv = await a100.inventory()
    assert inv is not None
    gpu = next(g for g in inv.gpus if g.mig_devices)
    mig = gpu.mig_devices[0]
    name = nvidia.mig_device_name(gpu.minor, mig.profile, mig.gi_profile_id, mig.placement.start)
    before = await a100.mig_uuids()
    claim = await a100.put_claim(make_claim(a100.name, [Dev("mig", name)]))
    uid = claim.metadata.uid or ""
    assert (await a100.prepare(claim)).claims[uid].error == ""
    validate_cdi_file(a100.cdi_files()[0])
    assert (await a100.unprepare(claim)).claims[uid].error == ""
    assert await a100.mig_uuids() == before  # static devices stay
    assert_clean(a100)


async def test_time_slicing_is_applied_and_reset(h100: Node) -> None:
    await h100.start_preparer(gates="TimeSlicingSettings=true")
    config = gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"})
    claim = await h100.put_claim(
        make_claim(
            h100.name,
            [Dev("a", "gpu-0"), Dev("b", "gpu-1")],
            configs=[opaque(config, requests=["a"])],
        )
    )
    uid = claim.metadata.uid or ""
    assert (await h100.prepare(claim)).claims[uid].error == ""
    inv = await h100.inventory()
    assert inv is not None
    uuids = {g.minor: g.uuid for g in inv.gpus}
    assert h100.sim_host()["time_slice"] == {uuids[0]: "Long"}  # request "b" kept the default
    assert (await h100.unprepare(claim)).claims[uid].error == ""
    assert h100.sim_host()["time_slice"] == {}
    assert_clean(h100)


async def test_two_claims_of_one_gpu_unprepared_at_once_reset_its_time_slice(h100: Node) -> None:
    """Each claim leaves the GPU's setting to the other while the other holds it: when
    both leave together, the last one out still resets it."""
    await h100.start_preparer(gates="TimeSlicingSettings=true")
    config = gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"})
    claims = [
        await h100.put_claim(make_claim(h100.name, [Dev("gpu", "gpu-0", admin=True)],
                                        name=name, configs=[opaque(config)]))
        for name in ("left", "right")
    ]  # fmt: skip
    reply = await h100.prepare(*claims)
    assert all(r.error == "" for r in reply.claims.values())
    assert list(h100.sim_host()["time_slice"].values()) == ["Long"]
    reply = await h100.unprepare(*claims)  # one request: its claims run concurrently
    assert all(r.error == "" for r in reply.claims.values())
    assert h100.sim_host()["time_slice"] == {}
    assert_clean(h100)


async def test_mps_daemon_gets_its_limits_and_the_container_its_pipe(h100: Node) -> None:
    """Per-device limits by index count in the sorted UUIDs, as the reference's do."""
    await h100.start_preparer(gates="MPSSupport=true")
    inv = await h100.inventory()
    assert inv is not None
    uuids = {g.minor: g.uuid for g in inv.gpus}
    # Two GPUs allocated against the sorted order of their UUIDs.
    first, second = sorted([4, 5, 6], key=lambda m: uuids[m], reverse=True)[:2]
    assert uuids[first] > uuids[second]
    config = gpu_config(
        strategy="MPS",
        mpsConfig={
            "defaultActiveThreadPercentage": 40,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
            "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi", "1": "6Gi"},
        },
    )
    devices = [Dev("gpus", f"gpu-{first}"), Dev("gpus", f"gpu-{second}")]
    claim = await h100.put_claim(make_claim(h100.name, devices, configs=[opaque(config)]))
    uid = claim.metadata.uid or ""
    assert (await h100.prepare(claim)).claims[uid].error == ""
    [daemon] = h100.sim_host()["mps"].values()
    assert daemon["daemonId"].startswith(f"{uid}-")
    assert daemon["activeThreadPercentage"] == 40
    # Index 0 is the smaller UUID, allocated second.
    assert daemon["pinnedMemoryLimitsMib"] == {uuids[second]: 5120, uuids[first]: 6144}
    assert daemon["deviceUuids"] == [uuids[second], uuids[first]]  # sorted, as the reference's
    assert h100.sim_host()["compute_mode"] == {
        uuids[first]: "EXCLUSIVE_PROCESS",
        uuids[second]: "EXCLUSIVE_PROCESS",
    }
    spec = validate_cdi_file(h100.cdi_files()[0])
    for device in spec["devices"]:
        edits = device["containerEdits"]
        assert edits["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
        assert [m["hostPath"] for m in edits["mounts"]] == [daemon["shmDir"], daemon["pipeDir"]]
    assert exists(daemon["pipeDir"])
    assert (await h100.unprepare(claim)).claims[uid].error == ""
    assert h100.sim_host()["mps"] == {} and h100.sim_host()["compute_mode"] == {}
    assert not exists(daemon["rootDir"])
    assert_clean(h100)


async def test_vfio_binds_withdraws_the_gpu_twin_and_writes_kep5304_metadata(h100: Node) -> None:
    await h100.start_preparer(gates="PassthroughSupport=true,DeviceMetadata=true")
    vfio_config = {
        "apiVersion": API,
        "kind": "VfioDeviceConfig",
        "iommu": {"enableAPIDevice": True},
    }
    claim = await h100.put_claim(
        make_claim(
            h100.name, [Dev("vm-gpu", "gpu-vfio-1")], name="vm", configs=[opaque(vfio_config)]
        )
    )
    uid = claim.metadata.uid or ""
    assert (await h100.prepare(claim)).claims[uid].error == ""
    assert h100.sim_host()["pci_driver"] == {"0000:2a:00.0": "vfio-pci"}  # second GPU in PCI order

    spec = validate_cdi_file(h100.cdi_files()[0])
    edits = spec["devices"][0]["containerEdits"]
    assert edits["deviceNodes"] == [
        {"path": "/dev/vfio/28", "type": "c", "major": 509, "minor": 28, "fileMode": 0o666,
         "permissions": "rwm"}
    ]  # fmt: skip
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/vfio/vfio", "type": "c", "major": 10, "minor": 196, "fileMode": 0o666,
         "permissions": "rwm"}
    ]  # fmt: skip
    [mount] = edits["mounts"]
    assert mount["containerPath"] == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm/vm-gpu/gpu.nvidia.com-metadata.json"
    )
    objects = [json.loads(line) for line in read_lines(mount["hostPath"])]
    assert [o["apiVersion"] for o in objects] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    device = objects[0]["requests"][0]["devices"][0]
    assert objects[0]["metadata"] == {
        "name": "vm",
        "namespace": "default",
        "uid": uid,
        "generation": 1,
    }
    assert (device["driver"], device["pool"], device["name"]) == (
        "gpu.nvidia.com",
        "n1",
        "gpu-vfio-1",
    )
    assert device["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:2a:00.0"}

    # The GPU twin of a passed-through GPU cannot be prepared for someone else.
    inv = await h100.inventory()
    assert inv is not None
    twin = next(g for g in inv.gpus if g.pci_bus_id == "0000:2a:00.0")
    other = await h100.put_claim(make_claim(h100.name, [Dev("g", f"gpu-{twin.minor}")]))
    refused = (await h100.prepare(other)).claims[other.metadata.uid or ""].error
    assert f"device 'gpu-{twin.minor}' is held by claim default/vm ({uid}, prepared)" in refused

    held = await wait_held(h100, lambda devices: len(devices) == 1)
    assert [(d.device, d.kind, d.pci_bus_id, d.claim_uid) for d in held] == [
        ("gpu-vfio-1", "vfio", "0000:2a:00.0", uid)
    ]  # the publisher withdraws the GPU twin from this

    assert (await h100.unprepare(claim)).claims[uid].error == ""
    assert await wait_held(h100, lambda devices: devices == []) == []
    assert h100.sim_host()["pci_driver"] == {}
    assert not exists(mount["hostPath"])
    assert_clean(h100)
    assert (await h100.prepare(other)).claims[other.metadata.uid or ""].error == ""


async def test_a_gpu_in_mig_mode_is_passed_through_only_while_no_mig_device_is_used(
    a100: Node,
) -> None:
    """The twin of a GPU in MIG mode is published (as the reference does); preparing it
    binds the GPU to vfio-pci, so it is refused while a MIG device of that GPU is
    prepared, and a MIG device is refused while the twin is (the reference checks
    neither: its WaitForGPUFree skips a twin without a full-GPU parent)."""
    await a100.start_preparer(gates="PassthroughSupport=true")
    inv = await a100.inventory()
    assert inv is not None
    gpu = next(g for g in inv.gpus if len(g.mig_devices) > 1)
    twin = nvidia.vfio_device_name(nvidia.vfio_order(inv.gpus).index(gpu))
    first, second = (
        nvidia.mig_device_name(gpu.minor, m.profile, m.gi_profile_id, m.placement.start)
        for m in gpu.mig_devices[:2]
    )
    vfio = opaque({"apiVersion": API, "kind": "VfioDeviceConfig"})
    mig = await a100.put_claim(make_claim(a100.name, [Dev("mig", first)], name="mig"))
    vm = await a100.put_claim(make_claim(a100.name, [Dev("vm", twin)], name="vm", configs=[vfio]))
    mig_uid, vm_uid = mig.metadata.uid or "", vm.metadata.uid or ""

    assert (await a100.prepare(mig)).claims[mig_uid].error == ""
    refused = (await a100.prepare(vm)).claims[vm_uid].error
    assert f"device '{twin}' is held by claim default/mig ({mig_uid}, prepared)" in refused
    assert a100.sim_host().get("pci_driver", {}) == {}  # never bound under a MIG workload
    held = await wait_held(a100, lambda devices: len(devices) == 1)
    assert [(d.device, d.kind, d.pci_bus_id) for d in held] == [(first, "mig", gpu.pci_bus_id)]

    assert (await a100.unprepare(mig)).claims[mig_uid].error == ""
    assert (await a100.prepare(vm)).claims[vm_uid].error == ""
    assert a100.sim_host()["pci_driver"] == {gpu.pci_bus_id: "vfio-pci"}
    other = await a100.put_claim(make_claim(a100.name, [Dev("mig", second)], name="other"))
    refused = (await a100.prepare(other)).claims[other.metadata.uid or ""].error
    assert f"device '{second}' is held by claim default/vm ({vm_uid}, prepared)" in refused
    held = await wait_held(a100, lambda devices: [d.kind for d in devices] == ["vfio"])
    assert [(d.device, d.pci_bus_id) for d in held] == [(twin, gpu.pci_bus_id)]

    assert (await a100.unprepare(vm)).claims[vm_uid].error == ""
    assert a100.sim_host()["pci_driver"] == {}
    assert (await a100.prepare(other)).claims[other.metadata.uid or ""].error == ""
    assert (await a100.unprepare(other)).claims[other.metadata.uid or ""].error == ""
    assert_clean(a100)


async def test_admin_access_may_share_what_is_otherwise_exclusive(h100: Node) -> None:
    await h100.start_preparer()
    owner = await h100.put_claim(make_claim(h100.name, [Dev("g", "gpu-6")], name="owner"))
    monitor = await h100.put_claim(
        make_claim(h100.name, [Dev("g", "gpu-6", admin=True)], name="monitor")
    )
    thief = await h100.put_claim(make_claim(h100.name, [Dev("g", "gpu-6")], name="thief"))
    reply = await h100.prepare(owner, monitor, thief)
    errors = {uid: r.error for uid, r in reply.claims.items()}
    assert errors[monitor.metadata.uid or ""] == ""
    # The claims of one request are prepared concurrently: either exclusive claim
    # may get there first, and exactly one does.
    exclusive = {"owner": owner.metadata.uid or "", "thief": thief.metadata.uid or ""}
    winners = [name for name, uid in exclusive.items() if errors[uid] == ""]
    assert len(winners) == 1, errors
    (loser,) = set(exclusive) - set(winners)
    assert f"device 'gpu-6' is held by claim default/{winners[0]}" in errors[exclusive[loser]]
    assert len(h100.cdi_files()) == 2


async def test_many_claims_prepare_concurrently_and_one_claim_serially(h100: Node) -> None:
    await h100.start_preparer()
    claims = [
        await h100.put_claim(make_claim(h100.name, [Dev("g", f"gpu-{i}")], name=f"c{i}"))
        for i in range(8)
    ]
    first, *_ = claims
    replies = await asyncio.gather(h100.prepare(*claims), h100.prepare(first), h100.prepare(first))
    results = [r.claims[first.metadata.uid or ""] for r in replies]
    assert results[0] == results[1] == results[2] and results[0].error == ""
    assert all(r.error == "" for r in replies[0].claims.values())
    assert len(h100.cdi_files()) == 8
    for path in h100.cdi_files():
        validate_cdi_file(path)
    assert len(h100.checkpoint().claims) == 8
    reply = await h100.unprepare(*claims)
    assert all(r.error == "" for r in reply.claims.values())
    assert_clean(h100)


async def test_a_restart_keeps_completed_claims_and_removes_orphans(h100: Node) -> None:
    proc = await h100.start_preparer()
    claim = await h100.put_claim(make_claim(h100.name, [Dev("g", "gpu-7")]))
    uid = claim.metadata.uid or ""
    before = (await h100.prepare(claim)).claims[uid]
    orphan = (
        h100.paths.cdi_root / "k8s.gpu.nvidia.com-claim_0b0e0d0c-0000-4000-8000-000000000000.yaml"
    )
    orphan.write_text("cdiVersion: 0.3.0\nkind: k8s.gpu.nvidia.com/claim\ndevices: []\n")
    proc.stop()
    await h100.start_preparer()
    assert not orphan.exists()
    assert (await h100.prepare(claim)).claims[uid] == before
    h100.boot_id_file.write_text("another-boot\n")  # after a reboot nothing is prepared
    h100.procs[-1].stop()
    await h100.start_preparer()
    assert dict(h100.checkpoint().claims) == {}
    assert h100.cdi_files() == []
