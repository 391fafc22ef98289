"""What the API server does to an object on create when a DRA feature gate is off.

A cluster never stores fields of a disabled feature: kube-apiserver drops them
on create (the registry strategies' dropDisabledFields, pkg/registry/resource
and pkg/api/resourceclaimspec of Kubernetes 1.34-1.37), so
kube-scheduler never sees them. ``gpudra allocate`` reads objects as written
(rendered slices, claims from a repository), so it drops the same fields
before allocating; objects read back from a cluster are unchanged by this.

* DRAPartitionableDevices off: a slice loses ``sharedCounters`` and
  ``perDeviceNodeSelection``, its devices ``consumesCounters`` and per-device
  node fields (so partitions become plain devices: exactly what a cluster with
  the gate off would schedule);
* DRADeviceTaints off: device ``taints`` and (1.35+) request ``tolerations``;
* DRAAdminAccess off: ``adminAccess`` in requests and allocation results;
* DRAResourceClaimDeviceStatus off: the claim's ``status.devices``;
* DRAPrioritizedList off: ``firstAvailable``;
* DRAConsumableCapacity off: ``allowMultipleAllocations``, capacity
  ``requestPolicy``, request ``capacity``, ``distinctAttribute`` (1.35+: 1.34's
  strategy clears a copy of each constraint and keeps the field), and
  ``shareID`` / ``consumedCapacity`` in results;
* DRADeviceBindingConditions or DRAResourceClaimDeviceStatus off: binding
  conditions of devices and results (from 1.35 the first needs the second);
* 1.36+: DRAListTypeAttributes off: list attribute values (``ints``, ``bools``,
  ``strings``, ``versions``; the attribute is then left without a value, which
  validation refuses); DRANodeAllocatableResources off:
  ``nodeAllocatableResources``;
* 1.37: DRADeviceCompatibilityGroups off: counter ``compatibilityGroups``;
  DRAPartitionableDevicesType off: ``partitionTypeAttribute``;
  DRAOptionalNodeOperations off: ``skipNodeOperations`` of slices and results;
  DRADerivedAttributes off: request ``derivedAttributes``.

A gate a release does not have counts as off (the field does not exist there).

When a drop leaves an object the API server then refuses (a request with
neither ``exactly`` nor ``firstAvailable``, an empty constraint, a slice with no
node selection), validation (services/offline/validation/) refuses it next,
in the API server's words, as kube-apiserver's Validate does after
PrepareForCreate.
"""

from __future__ import annotations

from services.allocator.structured.features import Features
from services.core.kube.resource import (
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
    ResourceSlice,
)


def admit_slice(slice_: ResourceSlice, features: Features) -> None:
    """Drop disabled fields in place."""
    spec = slice_.spec
    if not features.partitionable_devices:
        spec.shared_counters = None
        spec.per_device_node_selection = None
    if not features.partitionable_devices_type:
        spec.partition_type_attribute = None
    if not features.optional_node_operations:
        spec.skip_node_operations = None
    for device in spec.devices or []:
        if not features.partitionable_devices:
            device.consumes_counters = None
            device.node_name = device.node_selector = device.all_nodes = None
        if not features.compatibility_groups:
            for consumption in device.consumes_counters or []:
                consumption.compatibility_groups = None
        if not features.device_taints:
            device.taints = None
        if not features.binding_and_status:
            device.binding_conditions = device.binding_failure_conditions = None
            device.binds_to_node = None
        if not features.consumable_capacity:
            device.allow_multiple_allocations = None
            for capacity in (device.capacity or {}).values():
                capacity.request_policy = None
        if not features.node_allocatable_resources:
            device.node_allocatable_resources = None
        if not features.list_type_attributes:
            for attribute in (device.attributes or {}).values():
                attribute.ints = attribute.bools = attribute.strings = attribute.versions = None


def admit_claim(claim: ResourceClaim, features: Features) -> None:
    """Drop disabled fields in place (spec as on create, status as the scheduler's update)."""
    devices = claim.spec.devices
    for request in (devices.requests if devices else None) or []:
        if not features.prioritized_list and request.first_available:
            request.first_available = None
        bodies: list[ExactDeviceRequest | DeviceSubRequest] = list(request.first_available or [])
        if request.exactly is not None:
            bodies.append(request.exactly)
        for body in bodies:
            if not features.device_taints and features.minor >= 35:
                # 1.34's claim strategy has no dropDisabledDRADeviceTaintsFields.
                body.tolerations = None
            if not features.consumable_capacity:
                body.capacity = None
            if not features.derived_attributes:
                body.derived_attributes = None
        if request.exactly is not None and not features.admin_access:
            request.exactly.admin_access = None
    for constraint in (devices.constraints if devices else None) or []:
        if not features.consumable_capacity and features.minor >= 35:
            constraint.distinct_attribute = None
    if claim.status is not None and not features.device_status:
        claim.status.devices = None  # dropDisabledDRAResourceClaimDeviceStatusFields
    allocation = claim.status.allocation if claim.status else None
    results = allocation.devices.results if allocation and allocation.devices else None
    for result in results or []:
        if not features.admin_access:
            result.admin_access = None
        if not features.consumable_capacity:
            result.share_id = result.consumed_capacity = None
        if not features.binding_and_status:  # 1.34: either gate off drops them
            result.binding_conditions = result.binding_failure_conditions = None
        if not features.optional_node_operations:
            result.skip_node_operations = None
