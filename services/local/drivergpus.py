"""The GPUs of a fake driver installation (:mod:`services.local.driverroot`) and what
NVML says about them; they are described in :mod:`services.local.driverlayout`.

They are the simulated fleet's GPUs (:mod:`services.discovery.sim`), booted with the
node's name and seed, so that the files on disk and the facts the reference
generator's mock NVML reads (``facts.json``) describe the same node.
"""

from __future__ import annotations

import msgspec

from services.discovery.fleet import Fleet
from services.discovery.models import get_model
from services.discovery.sim import SimNvml
from services.local.driverlayout import DriverLayout, FakeGpu, FakeMig


def gpus(fleet: Fleet, node: str, seed: int, mig: bool) -> tuple[FakeGpu, ...]:
    if not mig:
        fleet = msgspec.structs.replace(
            fleet, gpus=[msgspec.structs.replace(g, mig=None) for g in fleet.gpus]
        )
    sim = SimNvml.boot(node, fleet, seed)
    out = []
    for i, g in enumerate(sim.state.gpus):
        migs = []
        spec = get_model(g.model).mig
        profiles = {p.id: p.name for p in spec.profiles} if spec else {}
        for gi in sorted(g.gpu_instances, key=lambda x: x.start):
            for ci in gi.compute_instances:
                gi_minor, ci_minor = mig_cap_minors(g.minor, gi.id, ci.id)
                migs.append(
                    FakeMig(
                        uuid=ci.uuid,
                        parent_uuid=g.uuid,
                        parent_minor=g.minor,
                        profile=profiles[gi.profile_id],
                        gi_profile_id=gi.profile_id,
                        placement_start=gi.start,
                        placement_size=gi.size,
                        gi_id=gi.id,
                        ci_id=ci.id,
                        gi_cap_minor=gi_minor,
                        ci_cap_minor=ci_minor,
                    )
                )
        out.append(
            FakeGpu(
                index=i,
                uuid=g.uuid,
                minor=g.minor,
                pci_bus_id=g.pci_bus_id,
                model=g.model,
                iommu_group=g.iommu_group,
                vfio_dev=f"vfio{i}",
                migs=tuple(migs),
            )
        )
    return tuple(out)


def mig_cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """The nvidia module's capability minors (nv-caps.c's static table), written out
    here on their own so that the reference sees the kernel's numbers, not ours."""
    per_gi, per_gpu = 9, 15 * 9  # an "access" node + 8 compute instances per GI
    gi_minor = 3 + gpu_minor * per_gpu + gi_id * per_gi
    return gi_minor, gi_minor + 1 + ci_id


def facts(root: DriverLayout) -> dict[str, object]:
    """What NVML says about this node, for the reference generator's mock NVML."""
    gpus = []
    for g in root.gpus:
        model = get_model(g.model)
        gpus.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "minor": g.minor,
                "pciBusId": g.pci_bus_id,
                "pciDeviceId": model.pci_device_id,
                "name": model.product_name,
                "brand": model.brand,
                "architecture": model.architecture,
                "cudaComputeCapability": list(model.cuda_compute_capability),
                "memoryMiB": model.memory_mib,
                "migEnabled": bool(g.migs),
                "migDevices": [
                    {
                        "uuid": m.uuid,
                        "giId": m.gi_id,
                        "ciId": m.ci_id,
                        "profile": m.profile,
                        "giProfileId": m.gi_profile_id,
                        "placementStart": m.placement_start,
                        "placementSize": m.placement_size,
                    }
                    for m in g.migs
                ],
            }
        )
    return {"driverVersion": root.version, "cudaDriverVersion": root.cuda_version, "gpus": gpus}
