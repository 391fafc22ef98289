"""Seeded breakages of generated scenarios: inputs the API server refuses.

Each mutation takes a generated scenario's objects (tests/helpers/scenarios.py)
and breaks one of them the way a hand-written manifest can be broken: a field
rule, a CEL selector, an unknown field, an attribute. Both ``gpudra allocate``
and ``reference-allocator`` must then refuse the input (exit 2) at the same
document, naming the same field with the same kind of error
(tests/e2e/allocator/test_differential_refusals.py), for each release the test runs
(:func:`for_release`: a few rules exist only in some releases).

There is one mutation per rule of pkg/apis/resource/validation that a manifest
can break (services/offline/validation/ lists them), plus CEL selectors the
API server refuses (cost, string.format types, mixed literals, Go regexes) and
fields of 1.37 (list attributes, derivedAttributes, skipNodeOperations,
partitionTypeAttribute, nodeAllocatableResources). :data:`NEEDS` names the gates
under which the API server keeps the field a mutation breaks (with the gate off
it is dropped on create; a list attribute left with no value is a mutation of
its own); a gate the release does not have is left out: 1.35 refuses a 1.37
field as unknown.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

Objects = list[dict[str, Any]]
Mutation = Callable[[random.Random, Objects], bool]  # False: nothing to break here


def _of(objects: Objects, kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _exact_bodies(objects: Objects) -> list[dict[str, Any]]:
    return [
        r["exactly"]
        for c in _of(objects, "ResourceClaim")
        if "status" not in c
        for r in c["spec"]["devices"]["requests"]
        if "exactly" in r
    ]


def _devices(objects: Objects) -> list[dict[str, Any]]:
    return [d for s in _of(objects, "ResourceSlice") for d in s["spec"].get("devices") or []]


def _pick(rng: random.Random, items: list[Any]) -> Any | None:
    return rng.choice(items) if items else None


def negative_count(rng: random.Random, objects: Objects) -> bool:
    body = _pick(rng, [b for b in _exact_bodies(objects) if b.get("allocationMode") != "All"])
    if body is None:
        return False
    body["count"] = -rng.randint(1, 3)
    return True


def count_with_all(rng: random.Random, objects: Objects) -> bool:
    body = _pick(rng, _exact_bodies(objects))
    if body is None:
        return False
    body["allocationMode"], body["count"] = "All", rng.randint(1, 3)
    return True


def unknown_field(rng: random.Random, objects: Objects) -> bool:
    places = [*_exact_bodies(objects), *_devices(objects)]
    target = _pick(rng, places)
    if target is None:
        return False
    target[rng.choice(["bogus", "deviceClass", "Count", "attribute"])] = 1
    return True


_BAD_CEL = (
    "device.driver ==",
    "device.driver",
    "nodevice.driver == 'x'",
    "device.driver in ['a', 1]",
    "int('abc') == 1",
    "device.driver.matches('[')",
)


def bad_selector(rng: random.Random, objects: Objects) -> bool:
    holders = [b for b in _exact_bodies(objects)] + [c["spec"] for c in _of(objects, "DeviceClass")]
    target = _pick(rng, holders)
    if target is None:
        return False
    selectors = target.setdefault("selectors", [])
    selectors.insert(rng.randint(0, len(selectors)), {"cel": {"expression": rng.choice(_BAD_CEL)}})
    return True


def constraint_unknown_request(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, [c for c in _of(objects, "ResourceClaim") if "status" not in c])
    if claim is None:
        return False
    attribute = claim["spec"]["devices"]["requests"][0]["name"]
    claim["spec"]["devices"].setdefault("constraints", []).append(
        {"requests": [f"{attribute}-nope"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    )
    return True


def unqualified_match(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, [c for c in _of(objects, "ResourceClaim") if "status" not in c])
    if claim is None:
        return False
    claim["spec"]["devices"].setdefault("constraints", []).append({"matchAttribute": "pcieRoot"})
    return True


def two_values(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, [d for d in _devices(objects) if d.get("attributes")])
    if device is None:
        return False
    name = rng.choice(sorted(device["attributes"]))
    value = device["attributes"][name]
    value.update({"int": 7} if "int" not in value else {"string": "x"})
    return True


def bad_version(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device.setdefault("attributes", {})["firmware"] = {
        "version": rng.choice(["1.2", "v1.2.3", "01.2.3"])
    }
    return True


def too_many_subrequests(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, [c for c in _of(objects, "ResourceClaim") if "status" not in c])
    if claim is None:
        return False
    request = claim["spec"]["devices"]["requests"][0]
    first = request.pop("exactly", None) or request["firstAvailable"][0]
    cls = first["deviceClassName"]
    request["firstAvailable"] = [{"name": f"s{i}", "deviceClassName": cls} for i in range(9)]
    return True


def bad_device_name(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device["name"] = device["name"].upper()
    return True


def _claims(objects: Objects, allocated: bool = False) -> list[dict[str, Any]]:
    return [c for c in _of(objects, "ResourceClaim") if ("status" in c) == allocated]


def _slices_with_devices(objects: Objects) -> list[dict[str, Any]]:
    return [s for s in _of(objects, "ResourceSlice") if s["spec"].get("devices")]


def _selector(rng: random.Random, objects: Objects, expression: str) -> bool:
    body = _pick(rng, _exact_bodies(objects))
    if body is None:
        return False
    body.setdefault("selectors", []).append({"cel": {"expression": expression}})
    return True


def over_cost_limit(rng: random.Random, objects: Objects) -> bool:
    words = "device.driver.split('.')"
    return _selector(
        rng, objects, f"{words}.all(a, {words}.all(b, {words}.all(c, a + b + c != '')))"
    )


def format_argument_type(rng: random.Random, objects: Objects) -> bool:
    return _selector(
        rng,
        objects,
        rng.choice(
            [
                "'%d'.format([device.driver]) == ''",
                "'%b'.format([1.5]) == ''",
                "'%x'.format([true]) == ''",
                "'%e'.format([1]) == ''",
                "'%s'.format([quantity('1')]) == ''",
                "'%s %s'.format([1]) == ''",
                "'%s'.format([1, 2]) == ''",
                "'%q'.format([1]) == ''",
            ]
        ),
    )


def mixed_list_literal(rng: random.Random, objects: Objects) -> bool:
    return _selector(rng, objects, rng.choice(["device.driver in ['a', 1]", "[1, 2u].size() == 2"]))


def go_invalid_regex(rng: random.Random, objects: Objects) -> bool:
    pattern = rng.choice(["\\\\C", "(?=x)", "(a)\\\\1", "\\\\Z", "a**", "a{1001}", "(?P<>x)"])
    return _selector(rng, objects, f"device.driver.matches('{pattern}')")


def devices_and_counters(rng: random.Random, objects: Objects) -> bool:
    slice_ = _pick(rng, _slices_with_devices(objects))
    if slice_ is None:
        return False
    slice_["spec"]["sharedCounters"] = [{"name": "cs", "counters": {"c": {"value": "1"}}}]
    return True


def _node_selected(rng: random.Random, objects: Objects, terms: list[Any]) -> bool:
    slice_ = _pick(rng, _of(objects, "ResourceSlice"))
    if slice_ is None:
        return False
    spec = slice_["spec"]
    for key in ("nodeName", "allNodes", "perDeviceNodeSelection"):
        spec.pop(key, None)
    for device in spec.get("devices") or []:
        for key in ("nodeName", "nodeSelector", "allNodes"):
            device.pop(key, None)
    spec["nodeSelector"] = {"nodeSelectorTerms": terms}
    return True


def two_node_selector_terms(rng: random.Random, objects: Objects) -> bool:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}
    return _node_selected(rng, objects, [term, term])


def match_fields_two_values(rng: random.Random, objects: Objects) -> bool:
    requirement = {"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}
    return _node_selected(rng, objects, [{"matchFields": [requirement]}])


def bad_node_selector(rng: random.Random, objects: Objects) -> bool:
    requirement = rng.choice(
        [
            {"key": "a", "operator": "Exists", "values": ["x"]},
            {"key": "a", "operator": "In"},
            {"key": "a", "operator": "Gt", "values": ["1", "2"]},
            {"key": "-a", "operator": "Exists"},
            {"key": "a", "operator": "In", "values": ["bad value"]},
        ]
    )
    return _node_selected(rng, objects, rng.choice([[], [{"matchExpressions": [requirement]}]]))


def duplicate_device_name(rng: random.Random, objects: Objects) -> bool:
    slice_ = _pick(rng, [s for s in _slices_with_devices(objects) if len(s["spec"]["devices"]) > 1])
    if slice_ is None:
        return False
    devices = slice_["spec"]["devices"]
    devices[-1]["name"] = devices[0]["name"]
    return True


def _toleration(rng: random.Random, objects: Objects, toleration: dict[str, Any]) -> bool:
    body = _pick(rng, _exact_bodies(objects))
    if body is None:
        return False
    body.setdefault("tolerations", []).append(toleration)
    return True


def toleration_exists_with_value(rng: random.Random, objects: Objects) -> bool:
    return _toleration(rng, objects, {"key": "k", "operator": "Exists", "value": "v"})


def bad_toleration(rng: random.Random, objects: Objects) -> bool:
    return _toleration(
        rng,
        objects,
        rng.choice(
            [
                {"key": "k", "operator": "Maybe"},
                {"key": "k", "operator": "Exists", "effect": "Sometimes"},
                {"key": "-k", "operator": "Exists"},
                {"key": "k", "operator": "Equal", "value": "bad value"},
            ]
        ),
    )


def too_many_tainted_devices(rng: random.Random, objects: Objects) -> bool:
    slice_ = _pick(rng, _slices_with_devices(objects))
    if slice_ is None:
        return False
    devices = slice_["spec"]["devices"]
    template = devices[0]
    for i in range(65 - len(devices)):
        copy = json.loads(json.dumps(template))
        copy["name"] = f"extra-{i}"
        copy.pop("consumesCounters", None)
        devices.append(copy)
    devices[-1]["taints"] = [{"key": "example.com/t", "effect": "NoSchedule"}]
    return True


def bad_taint(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device["taints"] = rng.choice(
        [
            [{"key": "-bad", "effect": "NoSchedule"}],
            [{"key": "k", "value": "bad value", "effect": "NoSchedule"}],
            [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)],
        ]
    )
    return True


def _result(claim: dict[str, Any], **fields: Any) -> dict[str, Any]:
    request = claim["spec"]["devices"]["requests"][0]["name"]
    result = {"request": request, "driver": "example.com", "pool": "p", "device": "d", **fields}
    claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    return result


def result_unknown_request(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, _claims(objects))
    if claim is None:
        return False
    _result(claim)["request"] = "nope"
    return True


def result_bad_share_id(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, _claims(objects))
    if claim is None:
        return False
    share = rng.choice(["share-1", "ABCDEF00-0000-0000-0000-000000000000", "0" * 32])
    _result(claim, shareID=share)
    return True


def result_bad_fields(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, _claims(objects))
    if claim is None:
        return False
    field, value = rng.choice(
        [("pool", "Bad Pool"), ("device", "Bad_Device"), ("driver", "Bad Driver")]
    )
    _result(claim)[field] = value
    return True


def bad_claim_status(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, _claims(objects))
    if claim is None:
        return False
    pod = {"resource": "pods", "name": "p", "uid": "u1"}
    choice = rng.choice(["unallocated", "uid", "duplicate", "device"])
    if choice == "unallocated":
        claim["status"] = {"reservedFor": [pod]}
        return True
    result = _result(claim)
    status = claim["status"]
    if choice == "uid":
        status["reservedFor"] = [{**pod, "uid": ""}]
    elif choice == "duplicate":
        status["reservedFor"] = [pod, {**pod, "name": "q"}]
    else:
        status["devices"] = [{"driver": result["driver"], "pool": "p", "device": "other"}]
    return True


def duplicate_request_name(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, _claims(objects))
    if claim is None:
        return False
    requests = claim["spec"]["devices"]["requests"]
    requests.append(json.loads(json.dumps(requests[0])))
    return True


def too_many_entries(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device.setdefault("attributes", {}).update({f"extra{i}": {"int": i} for i in range(33)})
    return True


def long_string(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device.setdefault("attributes", {})["long"] = {"string": "x" * 65}
    return True


def bad_slice_names(rng: random.Random, objects: Objects) -> bool:
    slice_ = _pick(rng, _of(objects, "ResourceSlice"))
    if slice_ is None:
        return False
    spec = slice_["spec"]
    field = rng.choice(["driver", "pool", "nodeName"])
    if field == "driver":
        spec["driver"] = "Bad_Driver"
    elif field == "pool":
        spec["pool"]["name"] = "bad pool"
    elif "nodeName" in spec:
        spec["nodeName"] = "bad node"
    else:
        spec["pool"]["name"] = ""
    return True


def bad_config_driver(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, _claims(objects))
    if claim is None:
        return False
    claim["spec"]["devices"]["config"] = [
        rng.choice(
            [
                {"opaque": {"driver": "Bad Driver", "parameters": {}}},
                {"opaque": {"driver": "example.com", "parameters": rng.choice([[1], "x", 3])}},
                {"opaque": {"driver": "example.com", "parameters": None}},
            ]
        )
    ]
    return True


def duplicate_constraint_request(rng: random.Random, objects: Objects) -> bool:
    claim = _pick(rng, _claims(objects))
    if claim is None:
        return False
    name = claim["spec"]["devices"]["requests"][0]["name"]
    claim["spec"]["devices"]["constraints"] = [
        {"requests": [name, name], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    ]
    return True


def too_many_consumptions(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device["consumesCounters"] = [
        {"counterSet": f"cs{i}", "counters": {"c": {"value": "1"}}} for i in range(3)
    ]
    return True


def binding_failure_only(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device.pop("bindingConditions", None)
    device["bindingFailureConditions"] = ["example.com/failed"]
    return True


def per_device_node_without_flag(rng: random.Random, objects: Objects) -> bool:
    slice_ = _pick(rng, [s for s in _slices_with_devices(objects)
                         if not s["spec"].get("perDeviceNodeSelection")])  # fmt: skip
    if slice_ is None:
        return False
    slice_["spec"]["devices"][0]["allNodes"] = True
    return True


def too_many_counter_sets(rng: random.Random, objects: Objects) -> bool:
    slice_ = _pick(rng, _of(objects, "ResourceSlice"))
    if slice_ is None:
        return False
    slice_["spec"].pop("devices", None)
    slice_["spec"]["sharedCounters"] = [
        {"name": f"cs{i}", "counters": {"c": {"value": "1"}}} for i in range(9)
    ]
    return True


def bad_request_policy(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, [d for d in _devices(objects) if d.get("capacity")])
    if device is None:
        return False
    name = sorted(device["capacity"])[0]
    device["allowMultipleAllocations"] = True
    device["capacity"][name]["requestPolicy"] = rng.choice(
        [
            {"default": "0", "validRange": {"min": "1"}},
            # (not -1: every value is a multiple of it, which 1.34-1.36 accept)
            {"default": "2", "validRange": {"min": "1", "step": "-2"}},
            {"default": "1", "validRange": {"min": "-2", "step": "1"}},
            {"default": "1", "validValues": ["1", "1"]},
            {"default": "1", "validValues": [str(i) for i in range(1, 12)]},
            {"default": "2", "validValues": ["2", "1"]},
            {"default": "1", "validValues": ["1"], "validRange": {"min": "1"}},
            {"validValues": ["1"]},
        ]
    )
    return True


def bad_metadata(rng: random.Random, objects: Objects) -> bool:
    obj = _pick(rng, objects)
    if obj is None or obj["kind"] not in ("DeviceClass", "ResourceSlice", "ResourceClaim"):
        return False
    meta = obj["metadata"]
    choice = rng.choice(["name", "labels", "annotations", "namespace"])
    if choice == "name":
        meta["name"] = meta["name"].upper() + "_x"
    elif choice == "labels":
        meta["labels"] = {"-bad": "x"} if rng.random() < 0.5 else {"ok": "bad value"}
    elif choice == "annotations":
        meta["annotations"] = {"bad key!": "x"}
    elif obj["kind"] == "ResourceClaim":
        meta["namespace"] = "Bad_NS"
    else:
        meta.pop("name")
    return True


def bad_extended_resource_name(rng: random.Random, objects: Objects) -> bool:
    cls = _pick(rng, _of(objects, "DeviceClass"))
    if cls is None:
        return False
    cls["spec"]["extendedResourceName"] = rng.choice(["bad name", "memory", "kubernetes.io/x"])
    return True


# 1.37 fields: NEEDS names the gates under which 1.37 keeps them (1.35 does not know them).


def list_attribute_values(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device.setdefault("attributes", {})["many"] = rng.choice(
        [
            {"ints": list(range(49))},
            {"ints": []},
            {"strings": ["x" * 65]},
            {"versions": ["1.2"]},
            {"ints": [1], "bools": [True]},
        ]
    )
    return True


def list_attribute_gate_off(rng: random.Random, objects: Objects) -> bool:
    """With DRAListTypeAttributes off 1.37 drops the list, leaving the attribute empty."""
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device.setdefault("attributes", {})["numa"] = {"ints": [0, 1]}
    return True


def list_attributes_too_many_devices(rng: random.Random, objects: Objects) -> bool:
    slice_ = _pick(rng, _slices_with_devices(objects))
    if slice_ is None:
        return False
    devices = slice_["spec"]["devices"]
    for i in range(65 - len(devices)):
        copy = json.loads(json.dumps(devices[0]))
        copy["name"] = f"extra-{i}"
        devices.append(copy)
    devices[-1].setdefault("attributes", {})["numa"] = {"ints": [0]}
    return True


def derived_attribute_unreferenced(rng: random.Random, objects: Objects) -> bool:
    body = _pick(rng, _exact_bodies(objects))
    if body is None:
        return False
    body["derivedAttributes"] = [{"name": "example.com/x", "expression": "device.driver"}]
    return True


def skip_prepare_only(rng: random.Random, objects: Objects) -> bool:
    slice_ = _pick(rng, _of(objects, "ResourceSlice"))
    if slice_ is None:
        return False
    slice_["spec"]["skipNodeOperations"] = ["NodePrepareResources"]
    return True


def partition_type_without_counters(rng: random.Random, objects: Objects) -> bool:
    plain = [
        s
        for s in _slices_with_devices(objects)
        if not any(d.get("consumesCounters") for d in s["spec"]["devices"])
    ]
    slice_ = _pick(rng, plain)
    if slice_ is None:
        return False
    slice_["spec"]["partitionTypeAttribute"] = "example.com/type"
    return True


def bad_node_allocatable(rng: random.Random, objects: Objects) -> bool:
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device["nodeAllocatableResources"] = rng.choice(
        [
            {"gpus": {"overhead": {"perPod": "1"}}},
            {"memory": {}},
            {"memory": {"mapping": {"capacityKey": "nope", "capacityMultiplier": "1"}}},
            {"memory": {"overhead": {}}},
        ]
    )
    return True


# Rules only Kubernetes 1.34 has (services/offline/validation/, CelEnvironment).


def taint_effect_none(rng: random.Random, objects: Objects) -> bool:
    """The effect ``None`` came in 1.35 (validDeviceTaintEffects)."""
    if rng.random() < 0.5:
        return _toleration(rng, objects, {"key": "k", "operator": "Exists", "effect": "None"})
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device["taints"] = [{"key": "example.com/t", "effect": "None"}]
    return True


def lists_extension_selector(rng: random.Random, objects: Objects) -> bool:
    """cel-go's lists extension is not in kube-apiserver 1.34's NewExpressions environment."""
    words = "device.driver.split('.')"
    return _selector(
        rng,
        objects,
        rng.choice(
            [
                f"{words}.sort().size() > 0",
                f"{words}.distinct().size() > 0",
                f"{words}.reverse()[0] != ''",
                f"{words}.slice(0, 1).size() == 1",
                f"[{words}].flatten().size() > 0",
                "lists.range(2).size() == 2",
            ]
        ),
    )


def too_many_shared_counters(rng: random.Random, objects: Objects) -> bool:
    """1.34: at most 32 counters in all the counter sets of a slice."""
    slice_ = _pick(rng, _slices_with_devices(objects))
    if slice_ is None:
        return False
    counters = {f"c{i}": {"value": "1"} for i in range(17)}
    extra = [{"name": f"extra{i}", "counters": counters} for i in range(2)]
    slice_["spec"].setdefault("sharedCounters", []).extend(extra)
    return True


def counter_set_elsewhere(rng: random.Random, objects: Objects) -> bool:
    """1.34: a device consumes counters of its own slice's sets only."""
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device["consumesCounters"] = [{"counterSet": "elsewhere", "counters": {"c": {"value": "1"}}}]
    return True


def five_taints(rng: random.Random, objects: Objects) -> bool:
    """1.34: at most 4 taints a device."""
    device = _pick(rng, _devices(objects))
    if device is None:
        return False
    device["taints"] = [{"key": f"example.com/t{i}", "effect": "NoSchedule"} for i in range(5)]
    return True


_TAINTS = "DRADeviceTaints=true"
_PARTITIONS = "DRAPartitionableDevices=true"
NEEDS: dict[str, str] = {
    "too_many_tainted_devices": _TAINTS,
    "bad_taint": _TAINTS,
    "toleration_exists_with_value": _TAINTS,
    "bad_toleration": _TAINTS,
    "devices_and_counters": _PARTITIONS,
    "too_many_consumptions": _PARTITIONS,
    "per_device_node_without_flag": _PARTITIONS,
    "too_many_counter_sets": _PARTITIONS,
    # (1.34 keeps a device's binding conditions only with both gates on)
    "binding_failure_only": "DRADeviceBindingConditions=true,DRAResourceClaimDeviceStatus=true",
    "result_bad_share_id": "DRAConsumableCapacity=true",
    "bad_claim_status": "DRAResourceClaimDeviceStatus=true",  # keeps status.devices
    "bad_extended_resource_name": "DRAExtendedResource=true",
    "bad_request_policy": "DRAConsumableCapacity=true",
    "list_attribute_values": "DRAListTypeAttributes=true",
    "list_attributes_too_many_devices": "DRAListTypeAttributes=true",
    "list_attribute_gate_off": "DRAListTypeAttributes=false",
    "derived_attribute_unreferenced": "DRADerivedAttributes=true",
    "skip_prepare_only": "DRAOptionalNodeOperations=true",
    "partition_type_without_counters": (
        "DRAPartitionableDevices=true,DRAResourcePoolStatus=true,DRAPartitionableDevicesType=true"
    ),
    "bad_node_allocatable": "DRANodeAllocatableResources=true",
    "taint_effect_none": _TAINTS,
    "too_many_shared_counters": _PARTITIONS,
    "counter_set_elsewhere": _PARTITIONS,
    "five_taints": _TAINTS,
}

_FROM_1_35 = (35, 36, 37)
#: Mutations that break an input only in some releases (every other one: in all of
#: them). Kubernetes 1.34 lets devices and counter sets share a slice, limits counters
#: per slice instead of counter sets, allows 128 devices with taints, and lacks what
#: the 1.34-only mutations break on.
RELEASES: dict[str, tuple[int, ...]] = {
    "devices_and_counters": _FROM_1_35,
    "too_many_counter_sets": _FROM_1_35,
    "too_many_tainted_devices": _FROM_1_35,
    "taint_effect_none": (34,),
    "lists_extension_selector": (34,),
    "too_many_shared_counters": (34,),
    "counter_set_elsewhere": (34,),
    "five_taints": (34,),
}


MUTATIONS: tuple[Mutation, ...] = (
    negative_count,
    count_with_all,
    unknown_field,
    bad_selector,
    constraint_unknown_request,
    unqualified_match,
    two_values,
    bad_version,
    too_many_subrequests,
    bad_device_name,
    over_cost_limit,
    format_argument_type,
    mixed_list_literal,
    go_invalid_regex,
    devices_and_counters,
    two_node_selector_terms,
    match_fields_two_values,
    bad_node_selector,
    duplicate_device_name,
    toleration_exists_with_value,
    bad_toleration,
    too_many_tainted_devices,
    bad_taint,
    result_unknown_request,
    result_bad_share_id,
    result_bad_fields,
    bad_claim_status,
    duplicate_request_name,
    too_many_entries,
    long_string,
    bad_slice_names,
    bad_config_driver,
    duplicate_constraint_request,
    too_many_consumptions,
    binding_failure_only,
    per_device_node_without_flag,
    too_many_counter_sets,
    bad_request_policy,
    bad_metadata,
    bad_extended_resource_name,
    list_attribute_values,
    list_attribute_gate_off,
    list_attributes_too_many_devices,
    derived_attribute_unreferenced,
    skip_prepare_only,
    partition_type_without_counters,
    bad_node_allocatable,
    taint_effect_none,
    lists_extension_selector,
    too_many_shared_counters,
    counter_set_elsewhere,
    five_taints,
)


def for_release(minor: int) -> tuple[Mutation, ...]:
    """The mutations that break an input in Kubernetes 1.<minor>, in order."""
    return tuple(m for m in MUTATIONS if minor in RELEASES.get(m.__name__, (minor,)))
