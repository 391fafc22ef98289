"""Strict decoding of input documents, as kube-apiserver decodes a create request.

The shared resource.k8s.io models ignore unknown fields (objects read back from
a newer cluster must still load), but an object written by hand with a
misspelt field is one the API server refuses: ``strict decoding error: unknown
field "spec.devices.requests[0].exactly.bogus"``. :func:`strict` walks a
document against the model's fields and says the same. It also reads a
quantity written as a YAML or JSON number (``value: 80``) as the API server
does (``resource.Quantity`` accepts a JSON number), by turning it into its
string before the model decodes it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi

# Every field of metav1.ObjectMeta (our model keeps only the ones we use).
_OBJECT_META = frozenset(
    (
        "name generateName namespace selfLink uid resourceVersion generation "
        "creationTimestamp deletionTimestamp deletionGracePeriodSeconds labels annotations "
        "ownerReferences finalizers managedFields"
    ).split()
)

# Fields (by encoded name, on the struct that holds them) whose strings are quantities.
_QUANTITY_FIELDS = frozenset(
    {
        ("DeviceCapacity", "value"),
        ("Counter", "value"),
        ("CapacityRequestPolicy", "default"),
        ("CapacityRequestPolicy", "validValues"),
        ("CapacityRequestPolicyRange", "min"),
        ("CapacityRequestPolicyRange", "max"),
        ("CapacityRequestPolicyRange", "step"),
        ("CapacityRequirements", "requests"),
        ("DeviceRequestAllocationResult", "consumedCapacity"),
    }
)


# Fields (by encoded name, on the struct that holds them) and the Kubernetes minor
# whose resource.k8s.io/v1 first has them: an older API server does not know them.
_SINCE = {
    ("DeviceAttribute", "ints"): 36,
    ("DeviceAttribute", "bools"): 36,
    ("DeviceAttribute", "strings"): 36,
    ("DeviceAttribute", "versions"): 36,
    ("Device", "nodeAllocatableResources"): 37,  # 1.36 had another shape under another name
    ("DeviceCounterConsumption", "compatibilityGroups"): 37,
    ("ResourceSliceSpec", "partitionTypeAttribute"): 37,
    ("ResourceSliceSpec", "skipNodeOperations"): 37,
    ("ExactDeviceRequest", "derivedAttributes"): 37,
    ("DeviceSubRequest", "derivedAttributes"): 37,
    ("DeviceRequestAllocationResult", "skipNodeOperations"): 37,
}


class StrictError(ValueError):
    """A field the API server does not know."""


def strict(doc: dict[str, Any], model: type[msgspec.Struct], minor: int = 99) -> None:
    """Raise :class:`StrictError` naming every unknown field (of Kubernetes 1.<minor>'s
    API); numeric quantities become strings in place."""
    walker = _Walker(minor)
    walker.walk(doc, mi.type_info(model), "", False)
    if walker.unknown:
        # As sigs.k8s.io/json reports them: every unknown field, sorted.
        fields = ", ".join(f'unknown field "{f}"' for f in sorted(walker.unknown))
        raise StrictError(f"strict decoding error: {fields}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Walker:
    def __init__(self, minor: int) -> None:
        self.minor = minor
        self.unknown: list[str] = []

    def walk(self, value: Any, info: mi.Type, path: str, quantity: bool) -> Any:
        """The value to keep (a numeric quantity comes back as its string)."""
        if isinstance(info, mi.UnionType):
            for option in info.types:
                if not isinstance(option, mi.NoneType):
                    return self.walk(value, option, path, quantity) if value is not None else value
            return value
        if isinstance(info, mi.StructType) and isinstance(value, dict):
            self._struct(value, info, path)
        elif isinstance(info, mi.ListType) and isinstance(value, list):
            for i, item in enumerate(value):
                value[i] = self.walk(item, info.item_type, f"{path}[{i}]", quantity)
        elif isinstance(info, mi.DictType) and isinstance(value, dict):
            for key in list(value):
                value[key] = self.walk(value[key], info.value_type, f"{path}.{key}", quantity)
        elif quantity and isinstance(value, (int, float)) and not isinstance(value, bool):
            return _number_text(value)
        return value

    def _struct(self, value: dict[str, Any], info: mi.StructType, path: str) -> None:
        name = info.cls.__name__
        if name == "ObjectMeta":
            self.unknown += [_join(path, key) for key in value if key not in _OBJECT_META]
            return
        fields = {f.encode_name: f for f in info.fields}
        for key in list(value):
            found = fields.get(key)
            if found is None or _SINCE.get((name, key), 0) > self.minor:
                self.unknown.append(_join(path, key))
                continue
            quantity = (name, key) in _QUANTITY_FIELDS
            value[key] = self.walk(value[key], found.type, _join(path, key), quantity)


def _number_text(value: float) -> str:
    """A JSON number as resource.Quantity reads it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)
