"""Simulated fleets: what one node's GPUs look like, one YAML file per fleet.

A fleet names a GPU model per slot (see ``profiles/``) plus the facts that
differ per board: PCI bus id, PCIe root, NUMA node, IOMMU group, minor number,
and for GPUs that boot in MIG mode the static MIG layout (``profile@start``).
"""

from __future__ import annotations

import functools
import re
from importlib import resources

import msgspec
import yaml

from services.discovery.models import GpuModel, ModelError, get_model

FLEETS_PACKAGE = "services.discovery.fleets"
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_VERSION = re.compile(r"^\d+\.\d+$")


class FleetError(ValueError):
    """A fleet that does not exist or does not describe a valid node."""


class FleetGpu(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str
    pci_bus_id: str
    pcie_root: str | None = None
    numa_node: int = -1
    iommu_group: int
    minor: int | None = None  # default: the GPU's position in the list
    mig: list[str] | None = None  # MIG mode on, with these "profile@start" devices


class FleetFabric(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every GPU of the node sits in one multi-node NVLink clique (GB200 NVL72).

    The cluster UUID is derived from (fleet, seed): the nodes started with one
    seed are one rack, so they share it and the clique id.
    """

    clique_id: int


class Fleet(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    description: str
    driver_version: str
    cuda_driver_version: str  # "12.8"
    iommu_fd: bool = False
    nvlink_fabric: FleetFabric | None = None  # None: GetGpuFabricInfo is NOT_SUPPORTED
    gpus: list[FleetGpu]

    def cuda_driver_version_int(self) -> int:
        """NVML's integer form: 12.8 -> 12080."""
        major, minor = self.cuda_driver_version.split(".")
        return int(major) * 1000 + int(minor) * 10


def fleet_names() -> list[str]:
    return sorted(_all_fleets())


def get_fleet(name: str) -> Fleet:
    fleets = _all_fleets()
    if name not in fleets:
        raise FleetError(f"unknown fleet {name!r}; valid fleets: {', '.join(sorted(fleets))}")
    return fleets[name]


@functools.cache
def _all_fleets() -> dict[str, Fleet]:
    out: dict[str, Fleet] = {}
    for entry in resources.files(FLEETS_PACKAGE).iterdir():
        if entry.name.endswith(".yaml"):
            fleet = parse_fleet(entry.name, entry.read_text())
            out[fleet.name] = fleet
    return out


def parse_mig_layout(item: str) -> tuple[str, int]:
    """``"3g.20gb@4"`` -> ("3g.20gb", 4)."""
    profile, sep, start = item.partition("@")
    if not sep or not start.isdigit():
        raise FleetError(f"MIG device {item!r}: expected profile@start, e.g. 3g.20gb@4")
    return profile, int(start)


def parse_fleet(source: str, text: str) -> Fleet:
    """Decode and check one fleet file; errors name the file and the field."""
    try:
        fleet = msgspec.convert(yaml.safe_load(text), Fleet)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise FleetError(f"{source}: {exc}") from exc
    if not _VERSION.match(fleet.cuda_driver_version):
        raise FleetError(f"{source}: cuda_driver_version {fleet.cuda_driver_version!r}: want N.M")
    if not fleet.gpus:
        raise FleetError(f"{source}: no gpus")
    if fleet.nvlink_fabric is not None and not 0 <= fleet.nvlink_fabric.clique_id < 2**32:
        raise FleetError(f"{source}: nvlink_fabric.clique_id: want a uint32")
    seen: set[str] = set()
    minors: set[int] = set()
    for i, gpu in enumerate(fleet.gpus):
        where = f"{source}: gpus[{i}]"
        if not _BDF.match(gpu.pci_bus_id) or gpu.pci_bus_id in seen:
            raise FleetError(f"{where}: pci_bus_id {gpu.pci_bus_id!r} invalid or repeated")
        seen.add(gpu.pci_bus_id)
        minor = i if gpu.minor is None else gpu.minor
        if minor in minors:
            raise FleetError(f"{where}: minor {minor} repeated")
        minors.add(minor)
        try:
            model = get_model(gpu.model)
        except ModelError as exc:
            raise FleetError(f"{where}: {exc}") from exc
        if gpu.mig is not None:
            _check_layout(where, model, gpu.mig)
    return fleet


def _check_layout(where: str, model: GpuModel, layout: list[str]) -> None:
    if model.mig is None:
        raise FleetError(f"{where}: {model.model} is not MIG capable")
    used: set[int] = set()
    compute = 0
    for item in layout:
        name, start = parse_mig_layout(item)
        profile = model.mig.by_name(name)
        if profile is None:
            valid = ", ".join(p.name for p in model.mig.profiles)
            raise FleetError(f"{where}: {model.model} has no MIG profile {name!r} ({valid})")
        if start not in profile.starts:
            raise FleetError(f"{where}: {item}: valid starts are {profile.starts}")
        slots = set(range(start, start + profile.size))
        if slots & used:
            raise FleetError(f"{where}: {item} overlaps another MIG device")
        used |= slots
        compute += profile.slices
    if compute > model.mig.compute_slices:
        raise FleetError(
            f"{where}: layout needs {compute} compute slices, "
            f"{model.model} has {model.mig.compute_slices}"
        )
