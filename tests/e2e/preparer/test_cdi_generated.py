"""Specs the generator writes from a real driver installation, loaded as a runtime loads them.

The fake installation (services/local/driverroot) sits where the chart mounts
the host's driver root; the specs name host paths (``--host-driver-root /``),
and the official CDI library (``controlplane cdi``) loads and injects each
claim kind into an OCI spec: the driver's libraries as read-only bind mounts,
the ``nvidia-cdi-hook`` calls as createContainer hooks, the env, the nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.local import driverroot
from services.preparer import cdi
from services.preparer.cdigen.caps import ProcCaps
from services.preparer.cdigen.devfs import HostDevFs
from services.preparer.cdigen.generator import Generator, Options
from services.preparer.checkpoint import (
    GroupState,
    MigState,
    MpsState,
    PreparedDeviceState,
    VfioState,
)
from tests.helpers.cdi import inject

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(driverroot.unavailable() is not None, reason=str(driverroot.unavailable())),
]
UID = "a1b2c3d4-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> driverroot.DriverRoot:
    return driverroot.build(tmp_path_factory.mktemp("node") / "r", fleet="dgx-a100")


def generator(root: driverroot.DriverRoot) -> Generator:
    options = Options(
        driver_root=str(root.driver_root),
        host_driver_root="/",
        hook_path=driverroot.HOOK,
        sysfs=str(root.sysfs),
    )
    devs = HostDevFs(str(root.dev_root), str(root.sysfs))
    return Generator(options, devs, ProcCaps(str(root.proc)), lambda: root.iommufd)


def claim(root: driverroot.DriverRoot, kind: str) -> tuple[PreparedDeviceState, GroupState]:
    whole = next(g for g in root.gpus if not g.migs)
    base: dict[str, Any] = {"requests": ["r"], "pool": "n", "gpu_uuid": whole.uuid}
    base |= {"gpu_minor": whole.minor, "pci_bus_id": whole.pci_bus_id}
    if kind == "mig":
        m = root.migs()[0]
        parent = next(g for g in root.gpus if g.uuid == m.parent_uuid)
        state = MigState(
            uuid=m.uuid, parent_uuid=m.parent_uuid, parent_minor=m.parent_minor,
            profile=m.profile, gi_profile_id=m.gi_profile_id,
            placement_start=m.placement_start, gi_id=m.gi_id, ci_id=m.ci_id,
        )  # fmt: skip
        base |= {"gpu_uuid": parent.uuid, "gpu_minor": parent.minor}
        base |= {"pci_bus_id": parent.pci_bus_id}
        device = PreparedDeviceState(name=m.device_name, kind="mig", mig=state, **base)
        return device, GroupState(kind="MigDeviceConfig", origin="d")
    if kind == "vfio":
        vfio = VfioState(pci_bus_id=whole.pci_bus_id, iommu_group=whole.iommu_group)
        device = PreparedDeviceState(name="gpu-vfio-0", kind="vfio", vfio=vfio, **base)
        return device, GroupState(kind="VfioDeviceConfig", origin="d", vfio_api_device=True)
    mps = None
    if kind == "mps":
        mps = MpsState(
            daemon_id="d", root_dir="/m", pipe_dir="/m/pipe", shm_dir="/m/shm",
            log_dir="/m/log", device_uuids=[whole.uuid],
        )  # fmt: skip
    device = PreparedDeviceState(name=f"gpu-{whole.minor}", kind="gpu", **base)
    return device, GroupState(kind="GpuConfig", origin="d", mps=mps)


@pytest.mark.parametrize("kind", ["gpu", "mig", "mps", "vfio"])
def test_each_kind_loads_and_injects_with_the_drivers_files_and_hooks(
    kind: str, root: driverroot.DriverRoot, controlplane_binary: Path, tmp_path: Path
) -> None:
    device, group = claim(root, kind)
    spec = cdi.render(UID, [device], [group], generator(root), root.version)
    cdi.write(tmp_path, UID, spec)
    injected = inject(controlplane_binary, tmp_path, [cdi.device_id(UID, device.name)])
    hooks = injected.oci.get("hooks", {}).get("createContainer", [])
    if kind == "vfio":
        assert injected.device_paths == {f"/dev/vfio/{device.vfio.iommu_group}", "/dev/vfio/vfio"}  # type: ignore[union-attr]
        assert hooks == [] and "NVIDIA_VISIBLE_DEVICES=void" in injected.env
        return
    libcuda = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{root.version}"
    assert injected.mounts[libcuda] == libcuda  # the host's path
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", f"/dev/nvidia{device.gpu_minor}"} <= (
        injected.device_paths
    )
    assert "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu" in injected.env
    names = [h["args"][1] for h in hooks]
    assert {"create-symlinks", "enable-cuda-compat", "update-ldcache"} <= set(names)
    assert {h["path"] for h in hooks} == {driverroot.HOOK}
    if kind == "mig":
        mig = root.migs()[0]
        caps = {f"/dev/nvidia-caps/nvidia-cap{m}" for m in (mig.gi_cap_minor, mig.ci_cap_minor)}
        assert caps <= injected.device_paths
    if kind == "mps":
        assert injected.mounts["/tmp/nvidia-mps"] == "/m/pipe"
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in injected.env
