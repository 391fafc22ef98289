"""``gpudra publisher --compute-domains`` against a real kube-apiserver and nats-server.

The compute-domain.nvidia.com pool of a node (``channel-0`` and ``daemon-0``,
attributes ``type`` and ``id``, as the reference publishes them) exists exactly
while that driver's kubelet plugin is registered there, beside and independent of
the GPU driver's pool. Skipped where the control plane cannot be built.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kube.client import http_api
from services.core.kube.resource import ResourceSlice
from services.core.model import computedomain as cd
from services.core.model import nvidia
from services.core.model.schemas import NodeInventory, PluginPresence
from services.local.cluster import ControlPlane
from services.local.natsserver import NatsServer
from services.offline.slices import fleet_inventory
from services.publisher.kubeapi import KubeSliceApi
from tests.helpers.publisher import PublisherProcess, put_inventory

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
FABRIC, PLAIN, SICK = "cd-node-gb200", "cd-node-h100", "cd-node-gb200-sick"


@pytest.fixture(scope="module")
def apiserver(controlplane_binary: Path) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, nodes=[FABRIC, PLAIN, SICK]) as cp:
        yield cp


async def present(bus: Bus, node: str, driver: str) -> None:
    record = PluginPresence(node=node, driver=driver, endpoint=f"/plugins/{driver}/dra.sock")
    await bus.kv_put(subjects.PRESENCE_BUCKET, subjects.presence_key(node, driver), record)


async def until(check: Callable[[], Awaitable[bool]], what: str, proc: PublisherProcess) -> None:
    deadline = time.monotonic() + 60
    while not await check():
        assert proc.alive(), proc.log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_the_domain_pool_follows_its_own_plugins_presence(
    apiserver: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    gpus = KubeSliceApi(await http_api(str(apiserver.kubeconfig)))
    domains = KubeSliceApi(gpus.api, driver=cd.CD_DRIVER)

    async def domain_pools() -> dict[str, list[ResourceSlice]]:
        out: dict[str, list[ResourceSlice]] = {}
        for s in (await domains.list_slices()).items:
            out.setdefault(s.spec.node_name or "", []).append(s)
        return out

    proc = PublisherProcess(
        nats_server, apiserver.kubeconfig, tmp_path / "publisher.log", "--compute-domains"
    )
    try:
        await put_inventory(bus, fleet_inventory("gb200-nvl72", FABRIC))
        await put_inventory(bus, fleet_inventory("dgx-h100", PLAIN))
        for node in (FABRIC, PLAIN):
            await present(bus, node, nvidia.DRIVER_NAME)
        await present(bus, FABRIC, cd.CD_DRIVER)

        async def fabric_only() -> bool:
            return set(await domain_pools()) == {FABRIC}

        await until(fabric_only, "the domain pool of the registered node", proc)
        [pool] = (await domain_pools())[FABRIC]
        assert pool.spec.driver == cd.CD_DRIVER and pool.spec.pool.name == FABRIC
        assert pool.metadata.name == f"{FABRIC}-{cd.CD_DRIVER}-0"
        found = {
            d.name: {k: (a.string, a.int_) for k, a in (d.attributes or {}).items()}
            for d in pool.spec.devices or []
        }
        assert found == {
            "channel-0": {"type": ("channel", None), "id": (None, 0)},
            "daemon-0": {"type": ("daemon", None), "id": (None, 0)},
        }
        assert all(d.capacity is None for d in pool.spec.devices or [])

        # A node outside a fabric publishes it too, once its plugin registers (its daemon idles).
        await present(bus, PLAIN, cd.CD_DRIVER)

        async def both() -> bool:
            return set(await domain_pools()) == {FABRIC, PLAIN}

        await until(both, "the domain pool of the non-fabric node", proc)

        # The plugin goes: its pool goes; the GPU driver's pools are untouched.
        await bus.kv_delete(subjects.PRESENCE_BUCKET, subjects.presence_key(FABRIC, cd.CD_DRIVER))

        async def plain_only() -> bool:
            return set(await domain_pools()) == {PLAIN}

        await until(plain_only, "the withdrawn pool removed", proc)
        gpu_nodes = {s.spec.node_name for s in (await gpus.list_slices()).items}
        assert gpu_nodes == {FABRIC, PLAIN}
        assert all(s.spec.driver == nvidia.DRIVER_NAME for s in (await gpus.list_slices()).items)
    finally:
        proc.stop()
        await gpus.close()


def _unregistered(inv: NodeInventory, index: int) -> NodeInventory:
    """GPU ``index``'s NVLink fabric registration still in progress (NVML state 2)."""
    gpus = list(inv.gpus)
    fabric = gpus[index].fabric
    assert fabric is not None
    gpus[index] = msgspec.structs.replace(
        gpus[index], fabric=msgspec.structs.replace(fabric, state=2)
    )
    return msgspec.structs.replace(inv, gpus=gpus)


async def test_a_fabric_in_error_has_no_domain_pool_unless_crash_on_fabric_errors_is_off(
    apiserver: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    """CrashOnNVLinkFabricErrors (on by default): the reference's plugin refuses to start
    on a node whose fabric did not register, so no channel claim can land there; gpudra
    withdraws that node's compute-domain pool until the fabric registers. Off: the GPU
    counts as outside the fabric and the pool stays."""
    gpus = KubeSliceApi(await http_api(str(apiserver.kubeconfig)))
    domains = KubeSliceApi(gpus.api, driver=cd.CD_DRIVER)

    async def pools(api: KubeSliceApi) -> set[str]:
        return {s.spec.node_name or "" for s in (await api.list_slices()).items}

    healthy = fleet_inventory("gb200-nvl72", SICK)
    sick = _unregistered(healthy, 1)
    await put_inventory(bus, sick)
    await present(bus, SICK, nvidia.DRIVER_NAME)
    await present(bus, SICK, cd.CD_DRIVER)
    proc = PublisherProcess(
        nats_server, apiserver.kubeconfig, tmp_path / "publisher.log", "--compute-domains"
    )
    try:

        async def gpu_pool_only() -> bool:  # the node was seen: its GPU pool is there
            return SICK in await pools(gpus) and SICK not in await pools(domains)

        await until(gpu_pool_only, "the GPU pool without a domain pool", proc)
        assert "NVLink fabric state IN_PROGRESS" in proc.log.read_text()
        await put_inventory(bus, healthy)  # the fabric registers

        async def domain_pool() -> bool:
            return SICK in await pools(domains)

        await until(domain_pool, "the domain pool once the fabric registered", proc)
        await put_inventory(bus, sick)

        async def withdrawn() -> bool:
            return SICK not in await pools(domains)

        await until(withdrawn, "the domain pool withdrawn on a fabric error", proc)
        assert SICK in await pools(gpus)
    finally:
        proc.stop()
    off = PublisherProcess(
        nats_server, apiserver.kubeconfig, tmp_path / "publisher-off.log", "--compute-domains",
        "--feature-gates", "CrashOnNVLinkFabricErrors=false",
    )  # fmt: skip
    try:
        await until(domain_pool, "the domain pool with the gate off", off)
    finally:
        off.stop()
        await gpus.close()
