"""A lost GPU end to end: discovery and publisher processes, real NATS, recording Kubernetes API.

``gpudra sim lose`` makes the simulated NVML answer GPU_IS_LOST for one GPU;
discovery keeps the GPU's last identity and marks it lost; the publisher must
keep its devices published, each tainted ``gpu.nvidia.com/gpu-lost``, and drop
the taint once the GPU answers again.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.core import nvidia
from services.core.bus import Bus
from services.core.natsserver import NatsServer
from services.core.resource import Device
from services.publisher.memoryapi import MemorySliceApi
from tests.integration.test_discovery import gpudra, stop, wait_inventory
from tests.integration.test_publisher import FakeKube, _publisher, _until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NODE = "node.a"  # the name test_discovery's helpers watch
GATES = "NVMLDeviceHealthCheck=true,PassthroughSupport=true"


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
        *(sys.executable, "-m", "services.cli", "discovery", "--nats-url", nats_server.url),
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
    url = nats_server.url
    inv, _ = await wait_inventory(bus, lambda i: len(i.gpus) == 8)
    names = {f"gpu-{i}" for i in range(8)} | {f"gpu-vfio-{i}" for i in range(8)}
    with _publisher(
        nats_server, kube, tmp_path, "--force-registered", "--feature-gates", GATES
    ) as proc:
        await _until(lambda: set(_devices(kube)) == names, "16 untainted devices", proc)
        assert all(keys == [] for keys in _taint_keys(kube).values())

        rc, out = await gpudra("sim", "lose", "--nats-url", url, "--node", NODE, "--gpu", "3")
        assert rc == 0, out
        lost = {"gpu-3", "gpu-vfio-3"}  # dgx-h100 lists its GPUs in PCI order
        await _until(
            lambda: {n for n, k in _taint_keys(kube).items() if k} == lost, "gpu-lost taints", proc
        )
        devices = _devices(kube)
        assert set(devices) == names  # nothing withdrawn
        for name in lost:
            (taint,) = devices[name].taints or []
            assert (taint.key, taint.value, taint.effect) == (
                nvidia.TAINT_GPU_LOST,
                None,
                "NoSchedule",
            )
        uuid = devices["gpu-3"].attributes or {}
        assert uuid[nvidia.ATTR_UUID].value() == inv.gpus[3].uuid  # the last identity

        rc, out = await gpudra("sim", "recover", "--nats-url", url, "--node", NODE, "--gpu", "3")
        assert rc == 0, out
        await _until(
            lambda: all(k == [] for k in _taint_keys(kube).values()), "taints cleared", proc
        )
        assert set(_devices(kube)) == names
