"""Every kind of claim through the kubelet's socket, over DRA v1 and v1beta1.

The fake kubelet (generated stubs) registers with ``gpudra kubeletplugin`` and
prepares full GPUs, static MIG, time-sliced, MPS and VFIO claims on a
simulated dgx-a100, and dynamic MIG on a simulated dgx-h100, with each API
version; every CDI spec validates against the official schema and every
unprepare leaves the node as it found it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from services.core.bus.client import Bus
from services.core.kube.resource import ResourceClaim
from services.core.model import nvidia
from services.local.kubelet import Claim, FakeKubelet
from services.local.natsserver import NatsServer
from tests.helpers.preparer import (
    API,
    Dev,
    Node,
    gpu_config,
    make_claim,
    opaque,
    ref,
    validate_cdi_file,
)

pytestmark = pytest.mark.integration

VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


async def start(node: Node, gates: str) -> FakeKubelet:
    await node.start_discovery()
    await node.start_preparer(gates=gates)
    node.start_front()
    kubelet = FakeKubelet(node.paths.kubelet_root)
    await kubelet.wait_for_registration_socket(timeout=20)
    await kubelet.register()
    assert kubelet.version == "v1.DRAPlugin"  # the kubelet's first choice
    return kubelet


@pytest.fixture
async def a100(
    short_root: Path, nats_server: NatsServer, bus: Bus
) -> AsyncIterator[tuple[Node, FakeKubelet]]:
    node = Node(short_root, nats_server, bus, fleet="dgx-a100")
    try:
        kubelet = await start(
            node,
            "TimeSlicingSettings=true,MPSSupport=true,PassthroughSupport=true,DeviceMetadata=true",
        )
        async with kubelet:
            yield node, kubelet
    finally:
        await node.close()


@pytest.fixture
async def h100(
    short_root: Path, nats_server: NatsServer, bus: Bus
) -> AsyncIterator[tuple[Node, FakeKubelet]]:
    node = Node(short_root, nats_server, bus, fleet="dgx-h100")
    try:
        kubelet = await start(node, "DynamicMIG=true")
        async with kubelet:
            yield node, kubelet
    finally:
        await node.close()


async def round_trip(
    node: Node,
    kubelet: FakeKubelet,
    claims: list[ResourceClaim],
    version: str,
    while_prepared: Callable[[], Awaitable[None]] | None = None,
) -> None:
    for claim in claims:
        await node.put_claim(claim)
    wire = [Claim(ref(c).uid, ref(c).namespace, ref(c).name) for c in claims]
    results = await kubelet.prepare(wire, version=version)
    for claim in claims:
        result = results[ref(claim).uid]
        assert result.error == "", (claim.metadata.name, result.error)
        allocated = (
            claim.status.allocation.devices.results
            if claim.status and claim.status.allocation and claim.status.allocation.devices
            else []
        )
        assert [d.device_name for d in result.devices] == [r.device for r in allocated or []]
        for device in result.devices:
            assert device.cdi_device_ids == [
                f"k8s.gpu.nvidia.com/claim={ref(claim).uid}-{device.device_name}"
            ]
    assert len(node.cdi_files()) == len(claims)
    for path in node.cdi_files():
        validate_cdi_file(path)
    if while_prepared is not None:
        await while_prepared()
    assert await kubelet.unprepare(wire, version=version) == {c.uid: "" for c in wire}
    assert node.cdi_files() == []
    assert dict(node.checkpoint().claims) == {}


@pytest.mark.parametrize("version", VERSIONS)
async def test_every_claim_kind_on_a_dgx_a100(a100: tuple[Node, FakeKubelet], version: str) -> None:
    node, kubelet = a100
    inv = await node.inventory()
    assert inv is not None
    mig_gpu = next(g for g in inv.gpus if g.mig_devices)
    mig = mig_gpu.mig_devices[0]
    static_mig = nvidia.mig_device_name(
        mig_gpu.minor, mig.profile, mig.gi_profile_id, mig.placement.start
    )
    mps = gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 50})
    ts = gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Medium"})
    vfio = {"apiVersion": API, "kind": "VfioDeviceConfig"}
    claims = [
        make_claim(node.name, [Dev("gpu", "gpu-0")], name="full"),
        make_claim(node.name, [Dev("mig", static_mig)], name="static-mig"),
        make_claim(node.name, [Dev("gpu", "gpu-1")], name="timesliced", configs=[opaque(ts)]),
        make_claim(node.name, [Dev("gpu", "gpu-2")], name="mps", configs=[opaque(mps)]),
        make_claim(node.name, [Dev("vm", "gpu-vfio-3")], name="vfio", configs=[opaque(vfio)]),
    ]
    migs_before = await node.mig_uuids()
    await round_trip(node, kubelet, claims, version)
    assert await node.mig_uuids() == migs_before
    host = node.sim_host()
    assert host["time_slice"] == {} and host["mps"] == {} and host["pci_driver"] == {}


@pytest.mark.parametrize("version", VERSIONS)
async def test_dynamic_mig_on_a_dgx_h100(h100: tuple[Node, FakeKubelet], version: str) -> None:
    node, kubelet = h100
    small = nvidia.mig_device_name(0, "1g.10gb", 19, 0)
    half = nvidia.mig_device_name(0, "3g.40gb", 9, 4)
    whole = nvidia.mig_device_name(5, "7g.80gb", 0, 0)
    claims = [
        make_claim(node.name, [Dev("a", small), Dev("b", half)], name="two-slices"),
        make_claim(node.name, [Dev("c", whole)], name="whole"),
    ]

    async def three_live_mig_devices() -> None:
        inv = await node.wait_for(
            lambda inv: sum(len(g.mig_devices) for g in inv.gpus) == 3, "three MIG devices"
        )
        assert sorted((g.minor, m.profile) for g in inv.gpus for m in g.mig_devices) == [
            (0, "1g.10gb"), (0, "3g.40gb"), (5, "7g.80gb"),
        ]  # fmt: skip

    await round_trip(node, kubelet, claims, version, three_live_mig_devices)
    assert await node.mig_uuids() == []
