"""The real device backend against stand-ins for the host: fake tools, a fake sysfs tree.

No GPU here, so the NVIDIA tools are shell scripts that log how they were
called (arguments, stdin, the MPS environment) and behave like the real ones
where it matters (``nvidia-cuda-mps-control -d`` leaves a daemon and its pid
file; ``quit`` on stdin stops it). sysfs is a directory tree with the same
symlinks the kernel keeps.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.core.model.schemas import Gpu
from services.local import driverkernel, driverroot
from services.preparer.cdigen import caps
from services.preparer.checkpoint import VfioState
from services.preparer.devices import real
from services.preparer.devices.base import DeviceOpError, MpsRequest
from services.preparer.devices.mps import MpsDaemons, _alive
from services.preparer.devices.vfio import VfioSysfs

BDF = "0000:3b:00.0"

FAKE_SMI = """#!/bin/sh
echo "nvidia-smi $*" >> "$FAKE_LOG"
"""

FAKE_MPS = """#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "start $* visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY" \\
    "log=$CUDA_MPS_LOG_DIRECTORY" >> "$FAKE_LOG"
  sleep 300 </dev/null >/dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  exit 0
fi
read -r command
echo "command $command pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_LOG"
if [ "$command" = "quit" ]; then
  kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"
fi
"""


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def driver_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "driver"
    script(root / "usr/bin/nvidia-smi", FAKE_SMI)
    script(root / "usr/bin/nvidia-cuda-mps-control", FAKE_MPS)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    return root


def exists(path: str) -> bool:
    return Path(path).exists()


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


# ------------------------------------------------------------------ driver files and caps


def test_the_real_backend_generates_from_its_driver_root(tmp_path: Path) -> None:
    """RealOps wires the generator to the driver root, the dev root and /proc."""
    reason = driverroot.unavailable()
    if reason:
        pytest.skip(reason)
    root = driverroot.build(tmp_path / "node", fleet="dgx-a100")
    ops = real.RealOps(
        tmp_path / "plugin",
        driver_root=root.driver_root,
        host_driver_root="/",
        dev_root=str(root.dev_root),
        hook_path="/usr/bin/nvidia-cdi-hook",
        sysfs=root.sysfs,
        proc=root.proc,
    )
    gen = ops.cdigen()
    common = gen.common_edits(root.version)
    mounted = {m["containerPath"] for m in common["mounts"]}
    inside = {"/" + str(p.relative_to(root.driver_root)) for p in root.libraries()}
    assert inside <= mounted  # every library of the version, not a fixed list
    assert all(m["hostPath"].startswith(str(root.driver_root)) for m in common["mounts"])
    mig = root.migs()[0]
    caps = gen.caps(mig.parent_minor, mig.gi_id, mig.ci_id)
    assert [c["minor"] for c in caps] == [mig.gi_cap_minor, mig.ci_cap_minor]
    assert {c["major"] for c in caps} == {driverkernel.CAPS_MAJOR}


def test_the_nvidia_caps_major_comes_from_proc_devices(tmp_path: Path) -> None:
    (tmp_path / "devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-caps\n510 nvidia-uvm\n"
        "\nBlock devices:\n  8 sd\n"
    )
    assert caps.caps_major(str(tmp_path)) == 508
    (tmp_path / "devices").write_text("Character devices:\n  1 mem\n\nBlock devices:\n")
    assert caps.caps_major(str(tmp_path)) is None
    assert caps.caps_major(str(tmp_path / "missing")) is None


# ------------------------------------------------------------------ nvidia-smi


async def test_time_slicing_sets_compute_mode_then_the_interval(
    driver_root: Path, tmp_path: Path
) -> None:
    ops = real.RealOps(tmp_path / "plugin", driver_root=driver_root, proc=tmp_path)
    await ops.set_time_slice(["GPU-a", "GPU-b"], "Long")
    await ops.set_time_slice(["GPU-a"], "Default")
    assert calls(tmp_path) == [
        "nvidia-smi -i GPU-a -c DEFAULT",
        "nvidia-smi -i GPU-b -c DEFAULT",
        "nvidia-smi compute-policy -i GPU-a --set-timeslice 3",
        "nvidia-smi compute-policy -i GPU-b --set-timeslice 3",
        "nvidia-smi -i GPU-a -c DEFAULT",
        "nvidia-smi compute-policy -i GPU-a --set-timeslice 0",
    ]


async def test_a_failing_tool_is_an_error_with_its_output(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    script(
        root / "usr/bin/nvidia-smi",
        "#!/bin/sh\necho 'Unable to set the compute mode' >&2\nexit 3\n",
    )
    ops = real.RealOps(tmp_path / "plugin", driver_root=root, proc=tmp_path)
    with pytest.raises(DeviceOpError) as err:
        await ops.set_time_slice(["GPU-a"], "Short")
    assert "GPU GPU-a: compute mode DEFAULT" in str(err.value)
    assert "exited 3: Unable to set the compute mode" in str(err.value)


# ------------------------------------------------------------------ MPS


async def test_an_mps_daemon_is_a_process_with_its_limits_and_is_stopped(
    driver_root: Path, tmp_path: Path
) -> None:
    ops = real.RealOps(tmp_path / "plugin", driver_root=driver_root, proc=tmp_path, mount_shm=False)
    request = MpsRequest(
        daemon_id="uid-1-abcde",
        claim_uid="uid-1",
        device_uuids=["GPU-a", "GPU-b"],
        gpu_uuids=["GPU-a", "GPU-b"],
        active_thread_percentage=40,
        pinned_memory_limits_mib={"GPU-a": 1024, "GPU-b": 2048},
    )
    state = await ops.start_mps(request)
    assert state.pid is not None and _alive(state.pid)
    pipe = str(tmp_path / "plugin/mps/uid-1-abcde/pipe")
    assert state.pipe_dir == pipe
    assert calls(tmp_path) == [
        "nvidia-smi -i GPU-a -c EXCLUSIVE_PROCESS",
        "nvidia-smi -i GPU-b -c EXCLUSIVE_PROCESS",
        f"start -d visible=GPU-a,GPU-b pipe={pipe} log={state.log_dir}",
        f"command set_default_active_thread_percentage 40 pipe={pipe}",
        f"command set_default_device_pinned_mem_limit GPU-a 1024M pipe={pipe}",
        f"command set_default_device_pinned_mem_limit GPU-b 2048M pipe={pipe}",
    ]
    assert [d.daemon_id for d in await ops.mps_daemons()] == ["uid-1-abcde"]
    assert await ops.start_mps(request) == state  # running already: the same daemon

    await ops.stop_mps(state)
    assert not _alive(state.pid)
    assert not exists(state.root_dir)
    assert calls(tmp_path)[-3:] == [
        f"command quit pipe={pipe}",
        "nvidia-smi -i GPU-a -c DEFAULT",
        "nvidia-smi -i GPU-b -c DEFAULT",
    ]
    assert await ops.mps_daemons() == []


async def test_a_daemon_that_never_comes_up_is_reported(tmp_path: Path) -> None:
    control = script(tmp_path / "bin/nvidia-cuda-mps-control", "#!/bin/sh\nexit 0\n")
    daemons = MpsDaemons(tmp_path / "mps", str(control), mount_shm=False, ready_timeout=0.3)
    request = MpsRequest(
        daemon_id="u-1", claim_uid="u", device_uuids=["GPU-a"], gpu_uuids=["GPU-a"],
        active_thread_percentage=None, pinned_memory_limits_mib={},
    )  # fmt: skip
    with pytest.raises(
        DeviceOpError, match=r"MPS daemon u-1 did not come up within 0s \(see .*/log/control.log\)"
    ):
        await daemons.start(request)
    # Its record was written before the process: a clean-up can still find and remove it.
    [found] = daemons.list()
    await daemons.stop(found)
    assert daemons.list() == []


# ------------------------------------------------------------------ VFIO through sysfs


def fake_sysfs(tmp_path: Path, driver: str | None = "nvidia", group: int | None = 42) -> Path:
    sysfs = tmp_path / "sys"
    drivers = sysfs / "bus/pci/drivers"
    for name in ("nvidia", "vfio-pci"):
        (drivers / name).mkdir(parents=True)
        (drivers / name / "bind").write_text("")
        (drivers / name / "unbind").write_text("")
    (sysfs / "bus/pci/drivers_probe").write_text("")
    device = sysfs / "bus/pci/devices" / BDF
    device.mkdir(parents=True)
    (device / "driver_override").write_text("(null)\n")
    if driver:
        (device / "driver").symlink_to(os.path.relpath(drivers / driver, device))
    if group is not None:
        (sysfs / "kernel/iommu_groups" / str(group)).mkdir(parents=True)
        (device / "iommu_group").symlink_to(
            os.path.relpath(sysfs / f"kernel/iommu_groups/{group}", device)
        )
    return sysfs


def rebind(sysfs: Path, driver: str) -> None:
    """What the kernel does after the writes: the device's driver link moves."""
    device = sysfs / "bus/pci/devices" / BDF
    (device / "driver").unlink()
    (device / "driver").symlink_to(os.path.relpath(sysfs / "bus/pci/drivers" / driver, device))


def test_vfio_bind_pins_the_override_unbinds_nvidia_and_binds_vfio(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path)
    vfio = VfioSysfs(sysfs)
    state = vfio.bind(BDF)
    assert state == VfioState(pci_bus_id=BDF, iommu_group=42, previous_driver="nvidia")
    device = sysfs / "bus/pci/devices" / BDF
    assert (device / "driver_override").read_text() == "vfio-pci"
    assert (sysfs / "bus/pci/drivers/nvidia/unbind").read_text() == BDF
    assert (sysfs / "bus/pci/drivers/vfio-pci/bind").read_text() == BDF

    rebind(sysfs, "vfio-pci")
    assert vfio.bind(BDF) == state  # already bound: nothing written again
    vfio.unbind(state)
    assert (device / "driver_override").read_text() == "\n"
    assert (sysfs / "bus/pci/drivers/vfio-pci/unbind").read_text() == BDF
    assert (sysfs / "bus/pci/drivers_probe").read_text() == BDF
    rebind(sysfs, "nvidia")
    (sysfs / "bus/pci/drivers_probe").write_text("")
    vfio.unbind(state)  # back on nvidia already: a no-op
    assert (sysfs / "bus/pci/drivers_probe").read_text() == ""


def test_vfio_refuses_foreign_drivers_and_missing_iommu(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    foreign = fake_sysfs(tmp_path / "a", driver=None)
    device = foreign / "bus/pci/devices" / BDF
    (foreign / "bus/pci/drivers/nouveau").mkdir()
    (device / "driver").symlink_to(os.path.relpath(foreign / "bus/pci/drivers/nouveau", device))
    with pytest.raises(
        DeviceOpError, match=r"GPU 0000:3b:00.0 is bound to 'nouveau'; expected nvidia or vfio-pci"
    ):
        VfioSysfs(foreign).bind(BDF)
    with pytest.raises(DeviceOpError, match=r"no IOMMU group \(is the IOMMU enabled\?\)"):
        VfioSysfs(fake_sysfs(tmp_path / "b", group=None)).bind(BDF)
    with pytest.raises(DeviceOpError, match="no such PCI device"):
        VfioSysfs(fake_sysfs(tmp_path / "c")).bind("0000:ff:00.0")


async def test_real_ops_bind_vfio_uses_the_gpu_bus_id(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path)
    ops = real.RealOps(
        tmp_path / "plugin", driver_root=tmp_path / "none", sysfs=sysfs, proc=tmp_path
    )
    gpu = Gpu(
        index=0, minor=0, uuid="GPU-a", product_name="H100", brand="Nvidia", architecture="Hopper",
        cuda_compute_capability="9.0", memory_bytes=1, pci_bus_id=BDF,
    )  # fmt: skip
    state = await ops.bind_vfio(gpu)
    assert state.iommu_group == 42
