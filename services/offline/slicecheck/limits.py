"""The numbers that differ between Kubernetes releases in what a slice may hold."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """The numbers that differ between API versions."""

    max_devices: int = 128
    max_devices_advanced: int = 64  # with taints or consumesCounters (1.35+)
    max_taints: int = 16
    split_counters: bool = True  # devices and sharedCounters never in one slice
    max_counter_sets: int = 8
    max_counters_per_set: int = 32
    max_shared_counters_total: int | None = None
    max_consumptions_per_device: int = 2
    max_counters_per_consumption: int = 32
    max_counters_per_device: int | None = None
    max_device_counters_per_slice: int | None = None
    list_attributes: bool = True  # 1.36+: ints, bools, strings, versions
    max_attribute_values: int = 48  # per device, a list's values counted one by one (1.36+)

    @classmethod
    def for_minor(cls, minor: int) -> Limits:
        if minor >= 36:
            return cls()
        if minor == 35:
            return cls(list_attributes=False)
        return cls(
            list_attributes=False,
            max_devices_advanced=128,
            max_taints=4,
            split_counters=False,
            max_counter_sets=32,
            max_shared_counters_total=32,
            max_consumptions_per_device=32,
            max_counters_per_device=32,
            max_device_counters_per_slice=1024,
        )
