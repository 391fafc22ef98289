"""Device health as the front streams it to the kubelet, from inventory facts and events."""

from __future__ import annotations

import asyncio
from typing import Any

from services.core.schemas import (
    Gpu,
    GpuHealth,
    HealthEvent,
    MigDevice,
    MigPlacement,
    NodeInventory,
    Xid,
)
from services.kubeletplugin.health import Health, HealthBoard, device_health

H, U, X = Health.HEALTHY, Health.UNHEALTHY, Health.UNKNOWN


def gpu(minor: int = 0, **kw: Any) -> Gpu:
    return Gpu(
        index=minor,
        minor=minor,
        uuid=f"GPU-{minor}",
        product_name="NVIDIA A100-SXM4-40GB",
        brand="Nvidia",
        architecture="Ampere",
        cuda_compute_capability="8.0",
        memory_bytes=40 << 30,
        pci_bus_id=f"0000:0{minor}:00.0",
        **kw,
    )


def mig(gi: int, start: int) -> MigDevice:
    return MigDevice(
        uuid=f"MIG-{gi}",
        profile="1g.5gb",
        gi_profile_id=19,
        gi_id=gi,
        ci_id=0,
        placement=MigPlacement(start=start, size=1),
    )


MIG_GPU: dict[str, Any] = {"mig_enabled": True, "mig_devices": [mig(1, 0), mig(2, 1)]}
MIG_NAMES = ("gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1")


def test_full_gpu_is_healthy_by_default() -> None:
    assert device_health(gpu(3)) == {"gpu-3": H}


def test_mig_mode_gpu_reports_its_mig_devices_not_itself() -> None:
    assert device_health(gpu(**MIG_GPU)) == dict.fromkeys(MIG_NAMES, H)


def test_fatal_xid_marks_every_device_of_the_gpu() -> None:
    xids = GpuHealth(xids=[Xid(13, 1.0), Xid(79, 2.0)])
    assert device_health(gpu(health=xids)) == {"gpu-0": U}
    assert device_health(gpu(health=xids, **MIG_GPU)) == dict.fromkeys(MIG_NAMES, U)


def test_latest_application_xid_is_not_a_fault() -> None:
    xids = GpuHealth(xids=[Xid(79, 1.0), Xid(13, 2.0)])  # the latest one counts
    assert device_health(gpu(health=xids)) == {"gpu-0": H}


def test_xid_attributed_to_a_mig_device_marks_only_that_device() -> None:
    xids = GpuHealth(xids=[Xid(94, 1.0, gi_id=2, ci_id=0)])
    assert device_health(gpu(health=xids, **MIG_GPU)) == {MIG_NAMES[0]: H, MIG_NAMES[1]: U}


def test_lost_gpu_and_nvml_error() -> None:
    assert device_health(gpu(health=GpuHealth(lost=True), **MIG_GPU)) == dict.fromkeys(MIG_NAMES, U)
    assert device_health(gpu(error="NVML_ERROR_UNKNOWN")) == {"gpu-0": X}


def inventory(*gpus: Gpu) -> NodeInventory:
    return NodeInventory(
        node="n1", driver_version="570.1", cuda_driver_version="12.8", gpus=list(gpus)
    )


def event(kind: str, uuid: str = "GPU-0") -> HealthEvent:
    return HealthEvent(node="n1", gpu_uuid=uuid, gpu_index=0, kind=kind)  # type: ignore[arg-type]


def health_of(board: HealthBoard) -> dict[str, Health]:
    return {s.device: s.health for s in board.states()}


async def test_events_apply_on_top_of_the_inventory_until_recovered() -> None:
    board = HealthBoard("n1")
    await board.set_inventory(inventory(gpu(0), gpu(1)))
    assert health_of(board) == {"gpu-0": H, "gpu-1": H}
    await board.apply_event(event("xid"))
    assert health_of(board) == {"gpu-0": U, "gpu-1": H}
    await board.apply_event(event("nvml-error", "GPU-1"))
    assert health_of(board) == {"gpu-0": U, "gpu-1": X}
    await board.apply_event(event("recovered"))
    assert health_of(board) == {"gpu-0": H, "gpu-1": X}
    # A GPU that left the inventory takes its event state with it.
    await board.set_inventory(inventory(gpu(0)))
    await board.set_inventory(inventory(gpu(0), gpu(1)))
    assert health_of(board) == {"gpu-0": H, "gpu-1": H}
    assert board.pool == "n1"


async def test_watch_sends_the_full_list_on_change_and_periodically() -> None:
    board = HealthBoard("n1")
    stream = board.watch(resend=0.2)
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.3)
    assert not first.done()  # nothing to say before an inventory is known
    await board.set_inventory(inventory(gpu(0)))
    assert [(s.device, s.health) for s in await asyncio.wait_for(first, 1)] == [("gpu-0", H)]
    await board.apply_event(event("gpu-lost"))
    assert [s.health for s in await asyncio.wait_for(anext(stream), 1)] == [U]
    since = board.states()[0].since
    again = await asyncio.wait_for(anext(stream), 1)  # unchanged: re-sent after `resend`
    assert [(s.health, s.since) for s in again] == [(U, since)]
    await stream.aclose()
