"""Which upstream allocator a Kubernetes release runs for a set of gates, and how it behaves.

k8s.io/dynamic-resource-allocation/structured (allocator.go, ``NewAllocator``)
holds three implementations, ``stable``, ``incubating`` and ``experimental``
(structured/internal/<name>), and picks the first whose supported features
cover the features kube-scheduler derives from its gates
(dynamicresources.go ``AllocatorFeatures``; 1.34 builds the struct inline).
The implementations differ between releases and from each other; every
difference that changes an outcome is a property of :class:`Variant`, named
for what it does, with the release and file it comes from. The engine asks
these properties, never the minor itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.allocator.structured.features import Features

Channel = Literal["stable", "incubating", "experimental"]

_BASE = frozenset({"admin", "prioritized", "partitionable", "taints"})
# minor -> (channel, the allocator features it supports), most stable first
# (structured/internal/*/allocator_*.go SupportedFeatures).
_SUPPORTED: dict[int, tuple[tuple[Channel, frozenset[str]], ...]] = {
    34: (
        ("stable", frozenset()),
        ("incubating", _BASE),
        ("experimental", _BASE | {"binding", "status", "consumable"}),
    ),
    35: (
        ("stable", frozenset()),
        ("incubating", _BASE),
        ("experimental", _BASE | {"binding+status", "consumable"}),
    ),
    36: (
        ("stable", _BASE),
        ("incubating", _BASE | {"binding+status", "consumable"}),
        ("experimental", _BASE | {"binding+status", "consumable", "list"}),
    ),
    37: (
        ("stable", _BASE),
        ("incubating", _BASE | {"binding+status", "consumable", "fractional"}),
        (
            "experimental",
            _BASE
            | {"binding+status", "consumable", "fractional"}
            | {"list", "nodeops", "derived", "compat"},
        ),
    ),
}


def allocator_features(features: Features) -> frozenset[str]:
    """The allocator's features as kube-scheduler of that minor derives them from its gates.

    1.36's AllocatorFeatures has no ListTypeAttributes (its CEL environment reads
    the gate itself), so a 1.36 scheduler never runs the experimental allocator.
    """
    f = features
    out: set[str] = set()
    for flag, name in (
        (f.admin_access, "admin"),
        (f.prioritized_list, "prioritized"),
        (f.partitionable_devices, "partitionable"),
        (f.device_taints, "taints"),
        (f.consumable_capacity, "consumable"),
    ):
        if flag:
            out.add(name)
    if f.minor == 34:
        out |= {n for flag, n in ((f.binding_conditions, "binding"), (f.device_status, "status"))
                if flag}  # fmt: skip
    elif f.binding_and_status:
        out.add("binding+status")
    if f.minor >= 37:
        for flag, name in (
            (f.fractional_capacity_range, "fractional"),
            (f.list_type_attributes, "list"),
            (f.optional_node_operations, "nodeops"),
            (f.derived_attributes, "derived"),
            (f.compatibility_groups, "compat"),
        ):
            if flag:
                out.add(name)
    return frozenset(out)


def channel(features: Features) -> Channel:
    wanted = allocator_features(features)
    for name, supported in _SUPPORTED[features.minor]:
        if wanted <= supported:
            return name
    raise ValueError(f"no allocator of Kubernetes {features.version} supports {sorted(wanted)}")


@dataclass(frozen=True, slots=True)
class Variant:
    """One upstream allocator of one release."""

    minor: int
    channel: Channel

    @classmethod
    def of(cls, features: Features) -> Variant:
        return cls(features.minor, channel(features))

    @property
    def label(self) -> str:
        return f"1.{self.minor} {self.channel}"

    @property
    def _new(self) -> bool:
        """incubating or experimental from 1.36 on (stable keeps the older code)."""
        return self.minor >= 36 and self.channel != "stable"

    # ---------------------------------------------------------------- search

    @property
    def combinations(self) -> bool:
        """The devices of one request are tried as sets in pool/slice/device order, not as
        orderings (allocateOne's startLocation: 1.36+ incubating and experimental)."""
        return self._new

    @property
    def rejected_device_keeps_counters(self) -> bool:
        """Counters taken for a device stay taken when a taint or constraint then rejects
        it (allocateDevice before 1.36; deviceRollbackState from 1.36)."""
        return self.minor <= 35

    @property
    def shared_device_keeps_counters_on_backtrack(self) -> bool:
        """1.35 experimental's deallocate closure releases counters only for devices
        without allowMultipleAllocations."""
        return self.minor <= 35 and self.channel == "experimental"

    @property
    def later_subrequest_uses_first_data(self) -> bool:
        """Before 1.36 the next device of an "All" subrequest is looked up with
        subrequest index 0 (documented deviation: gpudra never does this)."""
        return self.minor <= 35

    # ---------------------------------------------------------------- pools

    @property
    def pools_sorted(self) -> bool:
        """Pools by (driver, pool) and a pool's slices by name (sortPoolsByID,
        sortSlicesByName: 1.36+ incubating and experimental); before, Go map order
        (gpudra: first appearance) and input order."""
        return self._new

    @property
    def binding_slices_last(self) -> bool:
        """Slices with binding-condition devices are added after the others of their
        pool (GatherPools, 1.34/1.35 experimental)."""
        return self.minor <= 35 and self.channel == "experimental"

    @property
    def binding_pools_last(self) -> bool:
        return self.channel == "experimental" or self._new

    @property
    def counter_slices_everywhere(self) -> bool:
        """A slice with sharedCounters belongs to every node's pools (1.35, 1.36 and 1.37
        stable); 1.34 and 1.37 incubating/experimental match it to the node like any
        slice."""
        return self.minor >= 35 and not (self.minor >= 37 and self.channel != "stable")

    @property
    def ignores_compatibility_group_slices(self) -> bool:
        """1.37: with DRADeviceCompatibilityGroups off, slices using compatibility groups
        are ignored, so their pool is incomplete."""
        return self.minor >= 37

    @property
    def pools_by_node_slices(self) -> bool:
        """1.34: a pool is the node's slices of its newest generation (incomplete when
        fewer than resourceSliceCount, other nodes' slices not looked at); its devices
        are used even then, a pool with duplicate device names stops the claim when the
        search reaches it, and counters come from the device's own slice."""
        return self.minor <= 34

    # ---------------------------------------------------------------- constraints

    @property
    def distinct_constraints(self) -> bool:
        """Whether this allocator knows ``distinctAttribute`` (those that support
        ConsumableCapacity); the others fail a claim with one ("empty constraint").
        Offline that shows only on 1.34, whose API server keeps the field with
        DRAConsumableCapacity off (admission.py): experimental (DRAResourceClaimDeviceStatus
        on, the default) applies it, incubating and stable fail the claim."""
        return "consumable" in dict(_SUPPORTED[self.minor])[self.channel]

    @property
    def distinct_per_request(self) -> bool:
        """distinctAttribute remembers one value per request name (up to 1.36); 1.37
        keeps every device's value."""
        return self.minor <= 36

    @property
    def list_constraints(self) -> bool:
        """matchAttribute/distinctAttribute compare values as sets (experimental with
        DRAListTypeAttributes)."""
        return self.channel == "experimental" and self.minor >= 36

    # ---------------------------------------------------------------- capacity

    @property
    def capacity_errors_abort(self) -> bool:
        """1.37: a capacity request that cannot be represented, or a negative consumed
        capacity, aborts the claim instead of skipping the device."""
        return self.minor >= 37

    @property
    def all_mode_static_capacity(self) -> bool:
        """1.37: "All" keeps a device whose remaining capacity is short (so the request
        fails); before, such a device was left out of "all"."""
        return self.minor >= 37

    @property
    def shares_use_counters(self) -> bool:
        """A share (allowMultipleAllocations) counts against counters in the allocated
        state (IsDeviceAllocated) from 1.36; 1.35 counts exclusive use only (documented
        deviation: gpudra always counts shares)."""
        return self.minor >= 36

    @property
    def every_taint_blocks(self) -> bool:
        """1.34 (allTaintsTolerated): a taint of any effect, None too, must be tolerated."""
        return self.minor <= 34

    # ---------------------------------------------------------------- result

    @property
    def tolerations_in_results(self) -> bool:
        """The request's tolerations are copied into each result from 1.35."""
        return self.minor >= 35

    @property
    def claim_config_once(self) -> bool:
        """1.37: a claim config naming several requests is added once, and a config that
        applies to every request has ``requests`` emptied ("empty means all")."""
        return self.minor >= 37

    @property
    def counters_keyed_by_pool_name(self) -> bool:
        """Up to 1.36 counters are keyed by pool name alone (documented deviation:
        gpudra keys them by driver and pool, as 1.37 does)."""
        return self.minor <= 36

    @property
    def per_request_limit_message(self) -> bool:
        """1.37 checks the 32-device limit request by request (its own message)."""
        return self.minor >= 37

    @property
    def cel_error_names_device(self) -> bool:
        """A CEL runtime error names the device from 1.37 (and says to use optional
        chaining for "no such key")."""
        return self.minor >= 37
