"""Dynamic MIG (KEP-4815): a GPU's shared counter set and the abstract MIG devices
(partitions) that consume it, as the reference publishes them with DynamicMIG on."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from services.core.kube.resource import Counter, CounterSet, Device, DeviceCounterConsumption
from services.core.model.deviceattrs import gpu_attributes, mig_attributes, profile_capacities
from services.core.model.devicevalues import capacity_values, counter_value
from services.core.model.gpudevices import gpu_device
from services.core.model.nvidia import gpu_device_name, mig_device_name, rfc1123
from services.core.model.schemas import Gpu, MigPlacement, MigProfile, NodeInventory

# ------------------------------------------------------------------ NVML facts
# CI profile 1_SLICE_REV1: the reference skips it when enumerating partitions.
CI_PROFILE_1_SLICE_REV1 = 7
# Architectures at or after Hopper toggle MIG mode without a GPU reset
# (nvml.DEVICE_ARCH_UNKNOWN is numerically above Hopper, so it counts too).
_MIG_TOGGLE_ARCHITECTURES = frozenset({"Hopper", "Blackwell", "Rubin", "Unknown"})


# ------------------------------------------------------------------ counter names


@functools.lru_cache(maxsize=256)
def memory_slice_counter(index: int) -> str:
    """Counter name of one memory slice in a GPU's counter set (``memory-slice-<i>``)."""
    return f"memory-slice-{index}"


@functools.lru_cache(maxsize=256)
def counter_name(capacity_name: str) -> str:
    """The counter a capacity becomes (``copyEngines`` -> ``copy-engines``), as camelToDNSName."""
    hyphenated = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", capacity_name)
    hyphenated = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1-\2", hyphenated)
    return rfc1123(hyphenated)


def counter_set_name(minor: int) -> str:
    return rfc1123(f"{gpu_device_name(minor)}-counter-set")


# ------------------------------------------------------------------ partitions


def dynamic_mig_capable(gpu: Gpu) -> bool:
    """Whether DynamicMIG manages this GPU (isDynamicMIGCapable; vGPU guests are not modelled)."""
    return gpu.mig_capable and (supports_mig_toggle(gpu) or gpu.mig_enabled)


def supports_mig_toggle(gpu: Gpu) -> bool:
    """Hopper and newer switch MIG mode without a reset; Ampere does not."""
    return gpu.architecture in _MIG_TOGGLE_ARCHITECTURES


def partition_profiles(gpu: Gpu) -> list[MigProfile]:
    """The profiles DynamicMIG offers (inspectMigProfilesAndPlacements skips CI 1_SLICE_REV1)."""
    return [p for p in gpu.mig_profiles if p.ci_profile_id != CI_PROFILE_1_SLICE_REV1]


@dataclass(frozen=True)
class PartitionModel:
    """A GPU's counter-set facts: per-capacity maxima over every profile, and its memory slices."""

    max_capacities: dict[str, int]
    memory_slices: int

    @classmethod
    def of(cls, gpu: Gpu) -> PartitionModel:
        maxima: dict[str, int] = {}
        slices = 0
        for profile in partition_profiles(gpu):
            if not profile.placements:  # the reference only sees profiles through placements
                continue
            slices = max(slices, *(p.size for p in profile.placements))
            for name, value in profile_capacities(profile).items():
                maxima[name] = max(maxima.get(name, value), value)
        return cls(maxima, slices)

    def all_counters(self) -> dict[str, Counter]:
        """Every counter of the set: what the full GPU has, and consumes."""
        return consumed_counters(self.max_capacities, 0, self.memory_slices)


def consumed_counters(values: dict[str, int], start: int, size: int) -> dict[str, Counter]:
    """One counter per capacity (addCountersForMemSlices), plus ``memory-slice-<i>``=1 per slice."""
    return dict(_consumed_counters(tuple(values.items()), start, size))


@functools.lru_cache(maxsize=4096)
def _consumed_counters(
    values: tuple[tuple[str, int], ...], start: int, size: int
) -> dict[str, Counter]:
    out = {counter_name(name): counter_value(v) for name, v in values}
    for i in range(start, start + size):
        out[memory_slice_counter(i)] = counter_value(1)
    return out


def counter_sets(gpu: Gpu, model: PartitionModel) -> list[CounterSet]:
    """The GPU's one counter set (PartSharedCounterSets); none without MIG profile data."""
    if not model.max_capacities:
        return []
    return [CounterSet(name=counter_set_name(gpu.minor), counters=model.all_counters())]


def partitionable_gpu_device(gpu: Gpu, inv: NodeInventory, model: PartitionModel) -> Device:
    """The full GPU under DynamicMIG (PartGetDevice): max capacities, consumes every counter."""
    if not model.max_capacities:
        return gpu_device(gpu, inv)
    consumes = DeviceCounterConsumption(
        counter_set=counter_set_name(gpu.minor),
        counters=model.all_counters(),
    )
    return Device(
        name=gpu_device_name(gpu.minor),
        attributes=gpu_attributes(gpu, inv),
        capacity=capacity_values(model.max_capacities),
        consumes_counters=[consumes],
    )


def partition_device(
    gpu: Gpu, profile: MigProfile, placement: MigPlacement, inv: NodeInventory
) -> Device:
    """An abstract MIG device (MigSpec.PartGetDevice): no uuid, no memory-slice capacities."""
    return partition_devices(gpu, inv, [(profile, [placement])])[0]


def partition_devices(
    gpu: Gpu,
    inv: NodeInventory,
    offers: Iterable[tuple[MigProfile, Iterable[MigPlacement]]] | None = None,
) -> list[Device]:
    """Every abstract MIG device of a GPU (default: each partition profile x placement).

    A rendered pool is a value: attribute, capacity and counter maps are built
    once per profile (counters once per profile and placement, across GPUs and
    nodes) and shared by the devices that have them, so nothing may change a
    rendered device's maps in place (replace them instead).
    """
    if offers is None:
        offers = [(p, p.placements) for p in partition_profiles(gpu)]
    set_name = counter_set_name(gpu.minor)
    devices = []
    for profile, placements in offers:
        values = profile_capacities(profile)
        key = tuple(values.items())
        attrs = mig_attributes(gpu, profile.name, inv)
        capacity = capacity_values(values)
        for placement in placements:
            consumes = DeviceCounterConsumption(
                counter_set=set_name,
                counters=_consumed_counters(key, placement.start, placement.size),
            )
            name = mig_device_name(gpu.minor, profile.name, profile.gi_profile_id, placement.start)
            devices.append(
                Device(name=name, attributes=attrs, capacity=capacity, consumes_counters=[consumes])
            )
    return devices
