"""resource.k8s.io/v1 objects (and the bits of core/v1 they use) as msgspec Structs.

Field names are the API's camelCase on the wire; absent optional fields are
omitted, so an object we render is byte-for-byte what ``kubectl get -o json``
would show for the same content. Unknown fields are ignored when reading.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

API_VERSION = "resource.k8s.io/v1"


class _Obj(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    pass


# ------------------------------------------------------------------ meta


class OwnerReference(_Obj, kw_only=True):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(_Obj, kw_only=True):
    name: str = ""
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None


class NodeSelectorRequirement(_Obj, kw_only=True):
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: list[str] | None = None


class NodeSelectorTerm(_Obj, kw_only=True):
    match_expressions: list[NodeSelectorRequirement] | None = None
    match_fields: list[NodeSelectorRequirement] | None = None


class NodeSelector(_Obj, kw_only=True):
    node_selector_terms: list[NodeSelectorTerm]


class Toleration(_Obj, kw_only=True):
    key: str | None = None
    operator: str | None = None  # Exists or Equal (default)
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


# ------------------------------------------------------------------ slices


AttributeValue = int | bool | str | list[int] | list[bool] | list[str]


class DeviceAttribute(_Obj, kw_only=True):
    """Exactly one of the eight values is set (the four lists from Kubernetes 1.36,
    gate DRAListTypeAttributes, at most 48 values a device)."""

    int_: int | None = msgspec.field(default=None, name="int")
    bool_: bool | None = msgspec.field(default=None, name="bool")
    string: str | None = None
    version: str | None = None
    ints: list[int] | None = None
    bools: list[bool] | None = None
    strings: list[str] | None = None
    versions: list[str] | None = None

    def value(self) -> AttributeValue:
        for v in (self.int_, self.bool_, self.string, self.version):
            if v is not None:
                return v
        for values in (self.ints, self.bools, self.strings, self.versions):
            if values is not None:
                return values
        raise ValueError("device attribute has no value")

    @property
    def is_list(self) -> bool:
        return any(v is not None for v in (self.ints, self.bools, self.strings, self.versions))


class CapacityRequestPolicyRange(_Obj, kw_only=True):
    min: str
    max: str | None = None
    step: str | None = None


class CapacityRequestPolicy(_Obj, kw_only=True):
    default: str | None = None
    valid_values: list[str] | None = None
    valid_range: CapacityRequestPolicyRange | None = None


class DeviceCapacity(_Obj, kw_only=True):
    value: str  # a resource.Quantity in canonical form
    request_policy: CapacityRequestPolicy | None = None


class Counter(_Obj, kw_only=True):
    value: str


class CounterSet(_Obj, kw_only=True):
    name: str
    counters: dict[str, Counter]


class DeviceCounterConsumption(_Obj, kw_only=True):
    counter_set: str
    counters: dict[str, Counter]
    compatibility_groups: list[str] | None = None  # 1.37, DRADeviceCompatibilityGroups; at most 2


TaintEffect = Literal["None", "NoSchedule", "NoExecute"]


class DeviceTaint(_Obj, kw_only=True):
    key: str
    value: str | None = None
    effect: TaintEffect
    time_added: str | None = None


class DeviceTaintSelector(_Obj, kw_only=True):
    """Which devices a DeviceTaintRule taints: every field given must match."""

    driver: str | None = None
    pool: str | None = None
    device: str | None = None


class DeviceTaintRuleSpec(_Obj, kw_only=True):
    device_selector: DeviceTaintSelector | None = None
    taint: DeviceTaint


class DeviceTaintRule(_Obj, kw_only=True, omit_defaults=False):  # keeps apiVersion/kind
    """Taints devices from outside their slices (resource.k8s.io/v1 from Kubernetes 1.37,
    v1alpha3/v1beta2 before; gate DRADeviceTaintRules)."""

    api_version: str = API_VERSION
    kind: str = "DeviceTaintRule"
    metadata: ObjectMeta
    spec: DeviceTaintRuleSpec
    status: dict[str, Any] | None = None


class Device(_Obj, kw_only=True):
    name: str
    attributes: dict[str, DeviceAttribute] | None = None
    capacity: dict[str, DeviceCapacity] | None = None
    consumes_counters: list[DeviceCounterConsumption] | None = None
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool | None = None
    taints: list[DeviceTaint] | None = None
    binds_to_node: bool | None = None
    binding_conditions: list[str] | None = None
    binding_failure_conditions: list[str] | None = None
    allow_multiple_allocations: bool | None = None
    # 1.36, DRANodeAllocatableResources: resource name -> {mapping, overhead}, kept as given.
    node_allocatable_resources: dict[str, dict[str, Any]] | None = None


class ResourcePool(_Obj, kw_only=True):
    name: str
    generation: int
    resource_slice_count: int


class ResourceSliceSpec(_Obj, kw_only=True):
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    node_selector: NodeSelector | None = None
    all_nodes: bool | None = None
    per_device_node_selection: bool | None = None
    devices: list[Device] | None = None
    shared_counters: list[CounterSet] | None = None
    partition_type_attribute: str | None = None  # 1.37, DRAPartitionableDevicesType
    # 1.37, DRAOptionalNodeOperations: NodePrepareResources, NodeUnprepareResources or "*".
    skip_node_operations: list[str] | None = None


class ResourceSlice(_Obj, kw_only=True, omit_defaults=False):  # keeps apiVersion/kind
    api_version: str = API_VERSION
    kind: str = "ResourceSlice"
    metadata: ObjectMeta
    spec: ResourceSliceSpec


# ------------------------------------------------------------------ classes and claims


class CELDeviceSelector(_Obj, kw_only=True):
    expression: str


class DeviceSelector(_Obj, kw_only=True):
    cel: CELDeviceSelector | None = None


class OpaqueDeviceConfiguration(_Obj, kw_only=True):
    driver: str
    parameters: Any


class DeviceClassConfiguration(_Obj, kw_only=True):
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClassSpec(_Obj, kw_only=True):
    selectors: list[DeviceSelector] | None = None
    config: list[DeviceClassConfiguration] | None = None
    extended_resource_name: str | None = None


class DeviceClass(_Obj, kw_only=True, omit_defaults=False):  # keeps apiVersion/kind
    api_version: str = API_VERSION
    kind: str = "DeviceClass"
    metadata: ObjectMeta
    spec: DeviceClassSpec


class CapacityRequirements(_Obj, kw_only=True):
    requests: dict[str, str] | None = None


class DeviceDerivedAttribute(_Obj, kw_only=True):
    """1.37, DRADerivedAttributes: an attribute computed by CEL for this request's devices."""

    name: str
    expression: str


class DeviceSubRequest(_Obj, kw_only=True):
    name: str
    device_class_name: str
    selectors: list[DeviceSelector] | None = None
    allocation_mode: str | None = None  # ExactCount (default) or All
    count: int | None = None
    tolerations: list[Toleration] | None = None
    capacity: CapacityRequirements | None = None
    derived_attributes: list[DeviceDerivedAttribute] | None = None


class ExactDeviceRequest(_Obj, kw_only=True):
    device_class_name: str
    selectors: list[DeviceSelector] | None = None
    allocation_mode: str | None = None
    count: int | None = None
    admin_access: bool | None = None
    tolerations: list[Toleration] | None = None
    capacity: CapacityRequirements | None = None
    derived_attributes: list[DeviceDerivedAttribute] | None = None


class DeviceRequest(_Obj, kw_only=True):
    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: list[DeviceSubRequest] | None = None


class DeviceConstraint(_Obj, kw_only=True):
    requests: list[str] | None = None
    match_attribute: str | None = None
    distinct_attribute: str | None = None


class DeviceClaimConfiguration(_Obj, kw_only=True):
    requests: list[str] | None = None
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClaim(_Obj, kw_only=True):
    requests: list[DeviceRequest] | None = None
    constraints: list[DeviceConstraint] | None = None
    config: list[DeviceClaimConfiguration] | None = None


class ResourceClaimSpec(_Obj, kw_only=True):
    devices: DeviceClaim | None = None


class DeviceRequestAllocationResult(_Obj, kw_only=True):
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: list[Toleration] | None = None
    binding_conditions: list[str] | None = None
    binding_failure_conditions: list[str] | None = None
    share_id: str | None = msgspec.field(default=None, name="shareID")
    consumed_capacity: dict[str, str] | None = None
    skip_node_operations: list[str] | None = None  # 1.37, copied from the device's slice


class DeviceAllocationConfiguration(_Obj, kw_only=True):
    source: Literal["FromClass", "FromClaim"]
    requests: list[str] | None = None
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceAllocationResult(_Obj, kw_only=True):
    results: list[DeviceRequestAllocationResult] | None = None
    config: list[DeviceAllocationConfiguration] | None = None


class AllocationResult(_Obj, kw_only=True):
    devices: DeviceAllocationResult | None = None
    node_selector: NodeSelector | None = None
    allocation_timestamp: str | None = None


class ResourceClaimConsumerReference(_Obj, kw_only=True):
    api_group: str | None = None
    resource: str
    name: str
    uid: str


class ResourceClaimStatus(_Obj, kw_only=True):
    allocation: AllocationResult | None = None
    reserved_for: list[ResourceClaimConsumerReference] | None = None
    devices: list[dict[str, Any]] | None = None


class ResourceClaim(_Obj, kw_only=True, omit_defaults=False):  # keeps apiVersion/kind
    api_version: str = API_VERSION
    kind: str = "ResourceClaim"
    metadata: ObjectMeta
    spec: ResourceClaimSpec
    status: ResourceClaimStatus | None = None


# ------------------------------------------------------------------ helpers


def to_builtins(obj: msgspec.Struct) -> dict[str, Any]:
    """The object as plain JSON-ready data (what the API server receives)."""
    out = msgspec.to_builtins(obj)
    assert isinstance(out, dict)
    return out


def from_builtins(data: Any, kind: type[msgspec.Struct]) -> Any:
    return msgspec.convert(data, kind)
