"""gpudra's side of the differential CDI test: the spec the preparer writes for a claim.

ONE function, :func:`gpudra_spec`, so that a change of the generator's API
changes one place. It goes through the preparer's real code: the CDI
generator ``RealOps`` builds over the driver root, the dev root, ``/proc``
and ``/sys`` (with the host driver root and hook path the reference is
given), and ``cdi.render``, with the claim's devices and config groups as the
engine records them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from services.local.driverroot import DriverRoot
from services.preparer import cdi
from services.preparer.checkpoint import (
    GroupState,
    MigState,
    MpsState,
    PreparedDeviceState,
    VfioState,
)
from services.preparer.devices.real import RealOps
from tests.helpers.cdicompare import ClaimCase


def gpudra_spec(
    root: DriverRoot,
    case: ClaimCase,
    *,
    uid: str,
    plugin_dir: Path,
    host_driver_root: str,
    hook_path: str,
) -> dict[str, Any]:
    """The claim's spec as the preparer renders it for ``case`` on ``root``.

    ``host_driver_root`` (where the driver root is on the host) and
    ``hook_path`` (nvidia-cdi-hook on the host) are the preparer's
    ``--host-driver-root`` and ``--nvidia-cdi-hook-path``.
    """
    _install_hook(root, host_driver_root, hook_path)
    ops = RealOps(
        plugin_dir,
        driver_root=root.driver_root,
        host_driver_root=host_driver_root,
        dev_root=str(root.dev_root),
        hook_path=hook_path,
        sysfs=root.sysfs,
        proc=root.proc,
    )
    device, group = _prepared(root, case)
    facts = json.loads(root.facts_file.read_text())  # what discovery's NVML reports
    return cdi.render(uid, [device], [group], ops.cdigen(), facts["driverVersion"])


def _install_hook(root: DriverRoot, host_driver_root: str, hook_path: str) -> None:
    """Put the hook where the host has it: when the host's driver root is its /, a file
    the host has at ``hook_path`` is in the driver root the preparer sees (the
    preparer checks it there)."""
    if host_driver_root != "/":
        return
    where = root.driver_root / hook_path.lstrip("/")
    if not where.exists() and Path(root.hook_path).exists():
        where.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root.hook_path, where)


def _prepared(root: DriverRoot, case: ClaimCase) -> tuple[PreparedDeviceState, GroupState]:
    """The device and its config group, as the engine records them after preparing."""
    gpu = root.gpu(case.gpu)
    if case.kind == "vfio":
        device = PreparedDeviceState(
            name=case.device_name(root), kind="vfio", requests=["r"], pool="node-1",
            gpu_uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id,
            vfio=VfioState(
                pci_bus_id=gpu.pci_bus_id, iommu_group=gpu.iommu_group, iommufd_dev=gpu.vfio_dev
            ),
        )  # fmt: skip
        # engine.py: the VfioDeviceConfig's iommu settings, as given.
        group = GroupState(
            kind="VfioDeviceConfig", origin="claim",
            vfio_api_device=case.vfio_api_device, vfio_iommufd=case.vfio_prefer_iommufd,
        )  # fmt: skip
        return device, group
    mig_state = None
    if case.kind == "mig":
        m = gpu.migs[case.mig]
        mig_state = MigState(
            uuid=m.uuid, parent_uuid=m.parent_uuid, parent_minor=m.parent_minor,
            profile=m.profile, gi_profile_id=m.gi_profile_id,
            placement_start=m.placement_start, placement_size=m.placement_size,
            gi_id=m.gi_id, ci_id=m.ci_id,
        )  # fmt: skip
    device = PreparedDeviceState(
        name=case.device_name(root), kind="mig" if mig_state else "gpu", requests=["r"],
        pool="node-1", gpu_uuid=gpu.uuid, gpu_minor=gpu.minor, pci_bus_id=gpu.pci_bus_id,
        mig=mig_state,
    )  # fmt: skip
    mps = None
    if case.mps is not None:
        mps = MpsState(
            daemon_id="mps-test", root_dir=str(case.mps), pipe_dir=str(case.mps / "pipe"),
            shm_dir=str(case.mps / "shm"), log_dir=str(case.mps / "log"),
            device_uuids=[gpu.uuid], gpu_uuids=[gpu.uuid],
        )  # fmt: skip
    kind = "MigDeviceConfig" if mig_state else "GpuConfig"
    return device, GroupState(kind=kind, origin="default", mps=mps)
