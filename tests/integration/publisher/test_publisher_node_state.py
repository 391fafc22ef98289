"""The publisher following node state other services keep: real NATS, recording Kubernetes API.

* A lost GPU, end to end with the discovery process: ``gpudra sim lose`` makes
  the simulated NVML answer GPU_IS_LOST for one GPU; discovery keeps the GPU's
  last identity and marks it lost; the publisher must keep its devices
  published, each tainted ``gpu.nvidia.com/gpu-lost``, and drop the taint once
  the GPU answers again.
* Prepared devices (KV ``prepared``, written by the preparer): the twin of a
  prepared GPU or VFIO device is withdrawn and comes back after unprepare,
  without writes when nothing about the held GPUs changed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.kube.resource import Device
from services.core.model import deviceattrs, gpuhealth, nvidia
from services.core.model.schemas import HeldDevice, NodePreparedDevices, PluginPresence
from services.local.natsserver import NatsServer
from services.publisher.memoryapi import MemorySliceApi
from tests.helpers.discovery import gpudra, stop, wait_inventory
from tests.helpers.inventories import h100, node
from tests.helpers.publisher import FakeKube, publisher, put_inventory, until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
NODE = "node.a"  # the name test_discovery's helpers watch
GATES = "NVMLDeviceHealthCheck=true"  # PassthroughSupport excludes it


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    fake = FakeKube(MemorySliceApi(history_size=1000))
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def discovery(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[None]:
    log = (tmp_path / "discovery.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.cli", "discovery"),
        *nats_server.client_argv(Role.DISCOVERY, NODE),
        *("--node-name", NODE, "--fleet", "dgx-h100", "--rescan-interval", "300"),
        cwd=ROOT,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        yield
    finally:
        await stop(proc)
    assert proc.returncode == 0, (tmp_path / "discovery.log").read_text()


def _devices(kube: FakeKube) -> dict[str, Device]:
    return {d.name: d for s in kube.api.stored() for d in s.spec.devices or []}


def _taint_keys(kube: FakeKube) -> dict[str, list[str]]:
    return {n: [t.key for t in d.taints or []] for n, d in _devices(kube).items()}


async def test_a_lost_gpu_stays_published_with_the_gpu_lost_taint_until_it_recovers(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path, discovery: None
) -> None:
    sim = nats_server.client_argv(Role.SIM)
    inv, _ = await wait_inventory(bus, lambda i: len(i.gpus) == 8)
    names = {f"gpu-{i}" for i in range(8)}
    with publisher(
        nats_server, kube, tmp_path, "--force-registered", "--feature-gates", GATES
    ) as proc:
        await until(lambda: set(_devices(kube)) == names, "8 untainted devices", proc)
        assert all(keys == [] for keys in _taint_keys(kube).values())

        rc, out = await gpudra("sim", "lose", *sim, "--node", NODE, "--gpu", "3")
        assert rc == 0, out
        lost = {"gpu-3"}
        await until(
            lambda: {n for n, k in _taint_keys(kube).items() if k} == lost, "gpu-lost taints", proc
        )
        devices = _devices(kube)
        assert set(devices) == names  # nothing withdrawn
        for name in lost:
            (taint,) = devices[name].taints or []
            assert (taint.key, taint.value, taint.effect) == (
                gpuhealth.TAINT_GPU_LOST,
                None,
                "NoSchedule",
            )
        uuid = devices["gpu-3"].attributes or {}
        assert uuid[deviceattrs.ATTR_UUID].value() == inv.gpus[3].uuid  # the last identity

        rc, out = await gpudra("sim", "recover", *sim, "--node", NODE, "--gpu", "3")
        assert rc == 0, out
        await until(
            lambda: all(k == [] for k in _taint_keys(kube).values()), "taints cleared", proc
        )
        assert set(_devices(kube)) == names


async def test_a_prepared_device_withdraws_its_twin_until_unprepare_without_churn(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    name = "twins.node"  # a dot: the KV key is escaped
    await put_inventory(bus, node(name, [h100(i) for i in range(4)]))
    presence = PluginPresence(node=name, driver=nvidia.DRIVER_NAME, endpoint="/x")
    await bus.kv_put(
        subjects.PRESENCE_BUCKET, subjects.presence_key(name, nvidia.DRIVER_NAME), presence
    )
    everything = {f"gpu-{i}" for i in range(4)} | {f"gpu-vfio-{i}" for i in range(4)}
    key = subjects.prepared_key(name)

    def holding(*items: tuple[str, nvidia.DeviceType, int, str]) -> NodePreparedDevices:
        devices = [
            HeldDevice(device=dev, kind=kind, pci_bus_id=h100(i).pci_bus_id, claim_uid=uid)
            for dev, kind, i, uid in items
        ]
        return NodePreparedDevices(node=name, devices=devices)

    extra = ("--feature-gates", "PassthroughSupport=true")
    with publisher(nats_server, kube, tmp_path, *extra) as proc:
        await until(lambda: set(_devices(kube)) == everything, "all 8 devices", proc)
        # A full GPU and a VFIO twin prepared: gpu-vfio-1 and gpu-3 are withdrawn.
        held = holding(("gpu-1", "gpu", 1, "claim-a"), ("gpu-vfio-3", "vfio", 3, "claim-b"))
        await bus.kv_put(subjects.PREPARED_BUCKET, key, held)
        withdrawn = everything - {"gpu-vfio-1", "gpu-3"}
        await until(lambda: set(_devices(kube)) == withdrawn, "the twins withdrawn", proc)
        writes = len(kube.api.writes)

        # The same GPUs held again (a new updated_at) and by one more claim on gpu-1
        # (admin access): nothing to publish differently, so nothing is written.
        await bus.kv_put(subjects.PREPARED_BUCKET, key, held)
        more = holding(
            ("gpu-1", "gpu", 1, "claim-a"),
            ("gpu-1", "gpu", 1, "claim-admin"),
            ("gpu-vfio-3", "vfio", 3, "claim-b"),
        )
        await bus.kv_put(subjects.PREPARED_BUCKET, key, more)

        # A value under another node's key is skipped, counted, and changes nothing. Once it
        # is counted, the two values above have been taken as well (one watch, in order).
        await bus.kv_put(subjects.PREPARED_BUCKET, subjects.prepared_key("other"), held)
        await until(
            lambda: (
                proc.metric(
                    "gpudra_publisher_invalid_inventories_total",
                    '{reason="prepared-node-mismatch"}',
                )
                == 1
            ),
            "the misfiled value to be counted",
            proc,
        )
        assert len(kube.api.writes) == writes and set(_devices(kube)) == withdrawn

        # Unprepare of everything: the twins come back.
        await bus.kv_delete(subjects.PREPARED_BUCKET, key)
        await until(lambda: set(_devices(kube)) == everything, "the twins restored", proc)

    # A restart with holdings in the bucket withdraws the twin from the first sync on.
    await bus.kv_put(subjects.PREPARED_BUCKET, key, holding(("gpu-0", "gpu", 0, "claim-c")))
    writes = len(kube.api.writes)
    with publisher(nats_server, kube, tmp_path, *extra) as proc:
        await until(lambda: "gpu-vfio-0" not in _devices(kube), "gpu-vfio-0 withdrawn", proc)
        await until(lambda: proc.metric("gpudra_publisher_published_nodes") == 1, "synced", proc)
        assert len(kube.api.writes) == writes + 1  # one update of the node's one slice
        assert set(_devices(kube)) == everything - {"gpu-vfio-0"}


async def test_slices_follow_a_mig_device_created_and_an_xid_injected_in_the_simulated_nvml(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path, discovery: None
) -> None:
    """Discovery and publisher as separate processes keep the slices in sync with NVML."""
    sim = nats_server.client_argv(Role.SIM)
    await wait_inventory(bus, lambda i: len(i.gpus) == 8)
    gates = "NVMLDeviceHealthCheck=true"
    with publisher(
        nats_server, kube, tmp_path, "--force-registered", "--feature-gates", gates
    ) as p:
        await until(lambda: set(_devices(kube)) == {f"gpu-{i}" for i in range(8)}, "8 GPUs", p)

        rc, out = await gpudra(
            "sim", "mig", "create", *sim, "--node", NODE,
            "--gpu", "2", "--profile", "1g.10gb", "--placement", "0",
        )  # fmt: skip
        assert rc == 0, out
        mig = "gpu-2-mig-1g10gb-19-0"
        await until(lambda: mig in _devices(kube), f"{mig} published", p)
        devices = _devices(kube)
        assert "gpu-2" not in devices  # a GPU in MIG mode is not a full GPU any more
        attrs = devices[mig].attributes or {}
        assert attrs[deviceattrs.ATTR_UUID].value().startswith("MIG-")  # type: ignore[union-attr]

        rc, out = await gpudra("sim", "xid", *sim, "--node", NODE, "--gpu", "5", "--xid", "79")
        assert rc == 0, out
        await until(lambda: _taint_keys(kube).get("gpu-5") == [gpuhealth.TAINT_XID], "xid taint", p)
        (taint,) = _devices(kube)["gpu-5"].taints or []
        assert (taint.value, taint.effect) == ("79", "NoSchedule")
        assert all(k == [] for n, k in _taint_keys(kube).items() if n != "gpu-5")
