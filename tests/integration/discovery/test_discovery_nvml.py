"""The discovery service over the pynvml backend (pynvml answered by the sim) and real NATS.

Real NVML has no event for MIG changes, so this is the path where only the
periodic re-scan finds them, while XIDs arrive through nvmlEventSetWait.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import HealthEvent, InventoryChanged
from services.discovery import mig
from services.discovery.fleet import get_fleet
from services.discovery.nvml import NvmlBackend
from services.discovery.service import Discovery
from services.discovery.sim import SimNvml
from tests.helpers.discovery import collect, wait_for, wait_inventory
from tests.helpers.nvml import FakeNvml, fake_sysfs

pytestmark = pytest.mark.integration
NODE = "node.a"


async def test_service_over_pynvml(
    bus: Bus, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sim = SimNvml.boot(NODE, get_fleet("mixed"), 0)
    FakeNvml(sim).install(monkeypatch)
    service = Discovery(bus, NODE, NvmlBackend(*fake_sysfs(tmp_path, sim)), rescan_interval=0.2)
    health = await collect(bus, subjects.health(NODE), HealthEvent)
    changes = await collect(bus, subjects.inventory_changed(NODE), InventoryChanged)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        inv, _ = await wait_inventory(bus, lambda i: i.backend == "nvml" and len(i.gpus) == 4)
        assert [g.product_name for g in inv.gpus] == [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA H200",
            "NVIDIA L4",
        ]
        assert all(g.error is None for g in inv.gpus)

        sim.inject_xid(1, 48, 1, 0)  # on the A100's 3g.40gb
        await wait_for(health, lambda s: len(s) == 1)
        assert (health[0].kind, health[0].xid, health[0].gpu_uuid) == ("xid", 48, inv.gpus[1].uuid)
        after, _ = await wait_inventory(bus, lambda i: bool(i.gpus[1].health.xids))
        assert (after.gpus[1].health.xids[0].gi_id, after.gpus[1].health.xids[0].ci_id) == (1, 0)

        created = mig.create(sim, 0, "7g.80gb", 0)  # found by the periodic re-scan
        await wait_inventory(bus, lambda i: i.gpus[0].mig_devices == [created])
        await wait_for(
            changes, lambda s: any("MIG 7g.80gb created" in c for e in s for c in e.changes)
        )
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    assert task.done() and task.exception() is None
