"""Device health as the front streams it to the kubelet, from inventory facts and events,
with the message that says why a device is not healthy."""

from __future__ import annotations

import asyncio
from typing import Any

from services.core.model.schemas import (
    Gpu,
    GpuHealth,
    HealthEvent,
    MigDevice,
    MigPlacement,
    NodeInventory,
    Xid,
)
from services.kubeletplugin.health import (
    MESSAGE_MAX,
    Health,
    HealthBoard,
    Verdict,
    device_health,
    device_reports,
    fit,
)

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


def test_xid_for_a_whole_gpu_instance_marks_its_mig_devices_only() -> None:
    whole_gi = GpuHealth(xids=[Xid(94, 1.0, gi_id=2)])  # CI 0xFFFFFFFF: no CI
    assert device_health(gpu(health=whole_gi, **MIG_GPU)) == {MIG_NAMES[0]: H, MIG_NAMES[1]: U}
    unpublished = GpuHealth(xids=[Xid(94, 1.0, gi_id=7, ci_id=0)])
    assert device_health(gpu(health=unpublished, **MIG_GPU)) == dict.fromkeys(MIG_NAMES, H)


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


# ---------------------------------------------------------------- messages

LOST = "GPU is lost: NVML cannot reach it (NVML_ERROR_GPU_IS_LOST)"


def test_a_fatal_xid_says_its_number_and_what_it_means() -> None:
    xids = GpuHealth(xids=[Xid(79, 1.0)])
    assert device_reports(gpu(health=xids)) == {
        "gpu-0": Verdict(U, "XID 79: GPU has fallen off the bus")
    }
    # An XID NVIDIA's catalog table here does not describe: its number alone.
    assert device_reports(gpu(health=GpuHealth(xids=[Xid(150, 1.0)]))) == {
        "gpu-0": Verdict(U, "XID 150")
    }


def test_a_healthy_device_has_no_message() -> None:
    assert device_reports(gpu()) == {"gpu-0": Verdict(H, "")}
    after_app_error = GpuHealth(xids=[Xid(79, 1.0), Xid(13, 2.0)])
    assert device_reports(gpu(health=after_app_error)) == {"gpu-0": Verdict(H, "")}


def test_a_mig_xid_message_is_on_its_mig_device_only() -> None:
    xids = GpuHealth(xids=[Xid(94, 1.0, gi_id=2, ci_id=0)])
    assert device_reports(gpu(health=xids, **MIG_GPU)) == {
        MIG_NAMES[0]: Verdict(H, ""),
        MIG_NAMES[1]: Verdict(U, "XID 94: Contained ECC error"),
    }


def test_lost_and_nvml_error_messages() -> None:
    lost = device_reports(gpu(health=GpuHealth(lost=True), error="GPU is lost", **MIG_GPU))
    assert lost == dict.fromkeys(MIG_NAMES, Verdict(U, LOST))
    assert device_reports(gpu(error="memory: NVML_ERROR_UNKNOWN")) == {
        "gpu-0": Verdict(X, "NVML error: memory: NVML_ERROR_UNKNOWN")
    }


def test_a_long_message_is_cut_as_the_kubelet_cuts_it_on_a_character() -> None:
    assert fit("short") == "short"
    exact = "x" * MESSAGE_MAX
    assert fit(exact) == exact
    cut = fit("é" * MESSAGE_MAX)  # two bytes each: the cut falls inside one
    assert cut.endswith("...") and len(cut.encode()) <= MESSAGE_MAX
    assert set(cut[:-3]) == {"é"}
    long_error = device_reports(gpu(error="memory: " + "NVML_ERROR_UNKNOWN; " * 100))
    assert len(long_error["gpu-0"].message.encode()) == MESSAGE_MAX


def verdicts(board: HealthBoard) -> dict[str, tuple[Health, str]]:
    return {s.device: (s.health, s.message) for s in board.states()}


def xid_event(xid: int, reason: str = "", **kw: Any) -> HealthEvent:
    return HealthEvent(
        node="n1", gpu_uuid="GPU-0", gpu_index=0, kind="xid", xid=xid, reason=reason, **kw
    )


async def test_an_xid_event_gives_its_reason_before_the_inventory_has_it() -> None:
    board = HealthBoard("n1")
    await board.set_inventory(inventory(gpu(0), gpu(1)))
    await board.apply_event(xid_event(79, "XID 79: GPU has fallen off the bus"))
    assert verdicts(board) == {
        "gpu-0": (U, "XID 79: GPU has fallen off the bus"),
        "gpu-1": (H, ""),
    }
    since = board.states()[0].since
    # The inventory catches up: the same words, the same since.
    await board.set_inventory(inventory(gpu(0, health=GpuHealth(xids=[Xid(79, 1.0)])), gpu(1)))
    assert verdicts(board)["gpu-0"] == (U, "XID 79: GPU has fallen off the bus")
    assert board.states()[0].since == since


async def test_an_event_from_an_older_discovery_gets_the_same_words() -> None:
    board = HealthBoard("n1")
    await board.set_inventory(inventory(gpu(0)))
    await board.apply_event(xid_event(48))  # no reason: a discovery from before it
    assert verdicts(board) == {"gpu-0": (U, "XID 48: Double Bit ECC Error")}
    lost = HealthEvent(node="n1", gpu_uuid="GPU-0", gpu_index=0, kind="gpu-lost")
    await board.apply_event(lost)
    assert verdicts(board) == {"gpu-0": (U, LOST)}


async def test_a_mig_xid_event_lands_on_its_mig_device() -> None:
    board = HealthBoard("n1")
    await board.set_inventory(inventory(gpu(0, **MIG_GPU)))
    await board.apply_event(xid_event(94, "XID 94: Contained ECC error", gi_id=1, ci_id=0))
    assert verdicts(board) == {
        MIG_NAMES[0]: (U, "XID 94: Contained ECC error"),
        MIG_NAMES[1]: (H, ""),
    }


async def test_an_application_xid_event_is_no_fault_and_ends_an_earlier_one() -> None:
    board = HealthBoard("n1")
    await board.set_inventory(inventory(gpu(0)))
    await board.apply_event(xid_event(13, "XID 13: Graphics Engine Exception"))
    assert verdicts(board) == {"gpu-0": (H, "")}
    await board.apply_event(xid_event(79, "XID 79: GPU has fallen off the bus"))
    assert verdicts(board) == {"gpu-0": (U, "XID 79: GPU has fallen off the bus")}
    await board.apply_event(xid_event(43, "XID 43: GPU stopped processing"))
    assert verdicts(board) == {"gpu-0": (H, "")}  # the latest XID counts, as in the inventory
