"""``gpudra allocate`` on the hand-written differential cases, without the reference.

tests/e2e/allocator/test_differential_cases.py runs each case through both tools and
asserts they agree; here each runs through ours alone (no control plane
needed), so the API server's validation, the Kubernetes CEL environment and
the outcome rules are checked in every unit run: the exit status, the API
server's words on exit 2, each claim's status on exit 0, and gpudra's side of
each documented deviation.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from services.cli import main as gpudra
from tests.helpers.diffcases import (
    ANY_CLASS,
    CASES,
    DEVIATIONS,
    MINORS,
    Case,
    Deviation,
    base,
    claim,
    exactly,
)


def _run(
    items: list[dict[str, Any]], gates: str, tmp_path: Path, minor: int = 37
) -> tuple[int, str, str]:
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    out, err = io.StringIO(), io.StringIO()
    args = ["allocate", "--kube-version", f"1.{minor}", "-f", str(path), "-o", "json"]
    with redirect_stdout(out), redirect_stderr(err):
        code = gpudra([*args, *(["--feature-gates", gates] if gates else [])])
    return code, out.getvalue(), err.getvalue()


def _statuses(stdout: str) -> dict[str, str]:
    return {c["name"]: c["status"] for c in json.loads(stdout)["claims"]}


_NAMED = [m for c in CASES for m in c.minors] + [m for d in DEVIATIONS for m in d.minors]
RUN_MINORS = sorted({*MINORS, *_NAMED}, reverse=True)
CASE_PARAMS = [(minor, case) for minor in RUN_MINORS for case in CASES if minor in case.minors]
DEVIATION_PARAMS = [(minor, d) for minor in RUN_MINORS for d in DEVIATIONS if minor in d.minors]


@pytest.mark.parametrize(
    ("minor", "case"), CASE_PARAMS, ids=[f"1.{m}-{c.name}" for m, c in CASE_PARAMS]
)
def test_case(minor: int, case: Case, tmp_path: Path) -> None:
    items = (base() if case.base else []) + case.objects
    code, stdout, stderr = _run(items, case.gates_for(minor), tmp_path, minor)
    assert code == case.rc, stderr
    if case.rc == 2:
        assert case.says in stderr and "document 1, item" in stderr, stderr
    else:
        assert _statuses(stdout) == case.statuses_for(minor), stdout


@pytest.mark.parametrize(
    ("minor", "deviation"),
    DEVIATION_PARAMS,
    ids=[f"{d.name}-{m}" for m, d in DEVIATION_PARAMS],
)
def test_deviation_keeps_the_right_outcome(
    minor: int, deviation: Deviation, tmp_path: Path
) -> None:
    items = [ANY_CLASS, *deviation.objects]
    code, stdout, stderr = _run(items, deviation.gates, tmp_path, minor)
    assert code == 0, stderr
    assert _statuses(stdout) == deviation.ours, stdout


def test_a_valid_object_after_an_invalid_one_is_never_reached(tmp_path: Path) -> None:
    """The first refused object stops the run: nothing is allocated from half an input."""
    bad = {**base()[0], "metadata": {"name": "bad"}, "spec": {"selectors": [{"cel": {}}]}}
    code, stdout, stderr = _run([bad, *base()], "", tmp_path)
    assert code == 2 and stdout == ""
    assert "document 1, item 1: invalid DeviceClass" in stderr and "expression" in stderr, stderr


# ---------------------------------------------------------------- the API server's rules
#
# One broken input per rule of pkg/apis/resource/validation, with the first error
# reference-allocator printed for it (kube-apiserver's registry strategies; 1.37.2,
# defaults unless gates are given): the document, the field and the kind of error.
# tests/e2e/allocator/test_differential_refusals.py compares the two tools on seeded breakages
# of the same kinds; these pin the rules in every unit run.

_ALPHA = (
    "DRAListTypeAttributes=true,DRADerivedAttributes=true,DRAOptionalNodeOperations=true,"
    "DRAPartitionableDevicesType=true,DRAResourcePoolStatus=true,DRANodeAllocatableResources=true"
)


def _slice(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = objects[2]["spec"]
    return spec


def _body(objects: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = objects[3]["spec"]["devices"]["requests"][0]["exactly"]
    return body


def _selector(expression: str) -> Any:
    return lambda o: _body(o).update(selectors=[{"cel": {"expression": expression}}])


def _terms(*terms: dict[str, Any]) -> Any:
    def apply(o: list[dict[str, Any]]) -> None:
        del _slice(o)["nodeName"]
        _slice(o)["nodeSelector"] = {"nodeSelectorTerms": list(terms)}

    return apply


def _many(count: int, extra: dict[str, Any]) -> Any:
    def apply(o: list[dict[str, Any]]) -> None:
        first = _slice(o)["devices"][0]
        devices = [json.loads(json.dumps({**first, "name": f"gpu-{i}"})) for i in range(count)]
        devices[0].update(extra)
        _slice(o)["devices"] = devices

    return apply


def _attribute(name: str, value: dict[str, Any]) -> Any:
    return lambda o: _slice(o)["devices"][0]["attributes"].update({name: value})


def _status(**fields: Any) -> Any:
    result = {"request": "r", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}
    return lambda o: o[3].update(
        status={"allocation": {"devices": {"results": [{**result, **fields}]}}}
    )


_COUNTERS = [{"counterSet": "cs", "counters": {"c": {"value": "1"}}}]
_POLICY = "spec.devices[0].capacity[memory].requestPolicy"


def _policy(policy: dict[str, Any]) -> Any:
    def apply(o: list[dict[str, Any]]) -> None:
        device = _slice(o)["devices"][0]
        device["allowMultipleAllocations"] = True
        device["capacity"]["memory"] = {"value": "80Gi", "requestPolicy": policy}

    return apply


_RESULTS = "status.allocation.devices.results[0]"
_REQUEST = "spec.devices.requests[0].exactly"
_SEL = f"{_REQUEST}.selectors[0].cel.expression"

RULES: list[tuple[str, Any, str, str]] = [
    # name, breakage, gates, "item N: field: kind" of the first error (1.37)
    ("cost limit", _selector(
        "device.driver.split('.').all(a, device.driver.split('.').all(b, "
        "device.driver.split('.').all(c, a + b + c != '')))"), "", f"4: {_SEL}: Forbidden"),
    ("format argument type", _selector("'%d'.format([device.driver]) == ''"), "",
     f"4: {_SEL}: Invalid value"),
    ("format on an attribute", _selector(
        "'%s'.format([device.attributes['gpu.example.com'].index]) == '0'"), "",
     f"4: {_SEL}: Invalid value"),
    ("heterogeneous list literal", _selector("device.driver in ['a', 1]"), "",
     f"4: {_SEL}: Invalid value"),
    ("Go-invalid regex", _selector("device.driver.matches('\\\\C')"), "",
     f"4: {_SEL}: Invalid value"),
    ("devices and sharedCounters", lambda o: _slice(o).update(
        sharedCounters=[{"name": "cs", "counters": {"c": {"value": "1"}}}]), "",
     "3: spec: Invalid value"),
    ("two nodeSelector terms", _terms(
        {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "b", "operator": "Exists"}]}), "",
     "3: spec.nodeSelector.nodeSelectorTerms: Invalid value"),
    ("matchFields with two values", _terms({"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]}), "",
     "3: spec.nodeSelector.nodeSelectorTerms[0].matchFields[0].values: Required value"),
    ("no nodeSelector term", _terms(), "",
     "3: spec.nodeSelector.nodeSelectorTerms: Required value"),
    ("Exists with values", _terms({"matchExpressions": [
        {"key": "a", "operator": "Exists", "values": ["x"]}]}), "",
     "3: spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values: Forbidden"),
    ("duplicate device names", lambda o: _slice(o)["devices"][1].update(name="gpu-0"), "",
     "3: spec.devices[1]: Duplicate value"),
    ("toleration Exists with a value", lambda o: _body(o).update(
        tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]), "",
     f"4: {_REQUEST}.tolerations[0].value: Invalid value"),
    ("toleration operator", lambda o: _body(o).update(
        tolerations=[{"key": "k", "operator": "Maybe"}]), "",
     f"4: {_REQUEST}.tolerations[0].operator: Unsupported value"),
    ("too many tainted devices", _many(65, {"taints": [{"key": "k", "effect": "NoSchedule"}]}),
     "", "3: spec.devices: Too many"),
    ("17 taints", _many(1, {"taints": [{"key": f"k{i}", "effect": "NoSchedule"}
                                        for i in range(17)]}), "",
     "3: spec.devices[0].taints: Too many"),
    ("result for an unknown request", _status(request="nope"), "",
     f"4: {_RESULTS}.request: Invalid value"),
    ("shareID not a UUID", _status(shareID="not-a-uuid"), "",
     f"4: {_RESULTS}.shareID: Invalid value"),
    ("shareID not normalized", _status(shareID="ABCDEF00-0000-0000-0000-000000000000"), "",
     f"4: {_RESULTS}.shareID: Invalid value"),
    ("duplicate request names", lambda o: o[3]["spec"]["devices"]["requests"].append(
        json.loads(json.dumps(o[3]["spec"]["devices"]["requests"][0]))), "",
     "4: spec.devices.requests[1]: Duplicate value"),
    ("33 attributes and capacities", lambda o: _slice(o)["devices"][0]["attributes"].update(
        {f"a{i}": {"int": i} for i in range(30)}), "", "3: spec.devices[0]: Invalid value"),
    ("string of 65 bytes", _attribute("long", {"string": "x" * 65}), "",
     "3: spec.devices[0].attributes[long].string: Too long"),
    ("driver name", lambda o: _slice(o).update(driver="Bad_Driver"), "",
     "3: spec.driver: Invalid value"),
    ("three counter consumptions", lambda o: _slice(o)["devices"][0].update(consumesCounters=[
        {"counterSet": f"cs{i}", "counters": {"c": {"value": "1"}}} for i in range(3)]), "",
     "3: spec.devices[0].consumesCounters: Too many"),
    ("binding failure conditions alone", lambda o: _slice(o)["devices"][0].update(
        bindingFailureConditions=["x"]), "", "3: spec.devices[0].bindingConditions: Invalid value"),
    ("per-device node without the flag", lambda o: _slice(o)["devices"][0].update(
        allNodes=True), "", "3: spec.devices[0]: Invalid value"),
    ("list attribute with its gate off", _attribute("numa", {"ints": [0, 1]}), "",
     "3: spec.devices[0].attributes[numa]: Invalid value"),
    ("49 list values", _attribute("many", {"ints": list(range(49))}), _ALPHA,
     "3: spec.devices[0]: Invalid value"),
    ("65 devices, one with a list", _many(65, {"attributes": {"l": {"ints": [1]}}}), _ALPHA,
     "3: spec.devices: Too many"),
    ("derived attribute no constraint uses", lambda o: _body(o).update(
        derivedAttributes=[{"name": "gpu.example.com/x", "expression": "1"}]), _ALPHA,
     f"4: {_REQUEST}.derivedAttributes[0].name: Invalid value"),
    ("skip NodePrepareResources alone", lambda o: _slice(o).update(
        skipNodeOperations=["NodePrepareResources"]), _ALPHA,
     "3: spec.skipNodeOperations: Invalid value"),
    ("partitionTypeAttribute without counters", lambda o: _slice(o).update(
        partitionTypeAttribute="gpu.example.com/type"), _ALPHA,
     "3: spec.partitionTypeAttribute: Invalid value"),
    ("partition type attribute missing", lambda o: (
        _slice(o).update(partitionTypeAttribute="gpu.example.com/ptype"),
        _slice(o)["devices"][0].update(consumesCounters=_COUNTERS)), _ALPHA,
     "3: spec.devices[0].attributes[gpu.example.com/ptype]: Required value"),
    ("node allocatable capacity key", lambda o: _slice(o)["devices"][0].update(
        nodeAllocatableResources={"memory": {"mapping": {
            "capacityKey": "nope", "capacityMultiplier": "1"}}}), _ALPHA,
     "3: spec.devices[0].nodeAllocatableResources[memory].mapping.capacityKey: Not found"),
    ("claim name", lambda o: o[3]["metadata"].update(name="Bad_Name"), "",
     "4: metadata.name: Invalid value"),
    ("slice without a name", lambda o: o[2]["metadata"].pop("name"), "",
     "3: metadata.name: Required value"),
    ("claim namespace", lambda o: o[3]["metadata"].update(namespace="Bad_NS"), "",
     "4: metadata.namespace: Invalid value"),
    ("label key", lambda o: o[3]["metadata"].update(labels={"-bad": "x"}), "",
     "4: metadata.labels: Invalid value"),
    ("annotation key", lambda o: o[2]["metadata"].update(annotations={"bad key!": "x"}), "",
     "3: metadata.annotations: Invalid value"),
    ("extendedResourceName", lambda o: o[0]["spec"].update(extendedResourceName="bad name"), "",
     "1: spec.extendedResourceName: Invalid value"),
    ("request policy default below min", _policy({"default": "1Gi", "validRange": {"min": "2Gi"}}),
     "", f"3: {_POLICY}.validRange.default: Invalid value"),
    ("request policy step zero", _policy(
        {"default": "1Gi", "validRange": {"min": "1Gi", "step": "0"}}), "",
     f"3: {_POLICY}.validRange.step: Invalid value"),
    ("request policy negative min", _policy(
        {"default": "1", "validRange": {"min": "-2", "step": "1"}}), "",
     f"3: {_POLICY}.validRange.min: Invalid value"),
    ("request policy duplicate values", _policy({"default": "1", "validValues": ["1", "1"]}), "",
     f"3: {_POLICY}.validValues[1]: Duplicate value"),
    ("request policy 11 values", _policy(
        {"default": "1", "validValues": [str(i) for i in range(1, 12)]}), "",
     f"3: {_POLICY}.validValues: Too many"),
    ("reservedFor without an allocation", lambda o: o[3].update(
        status={"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}), "",
     "4: status.reservedFor: Forbidden"),
    ("device status of a device not allocated", lambda o: o[3].update(status={
        "allocation": {"devices": {"results": [
            {"request": "r", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]}},
        "devices": [{"driver": "gpu.example.com", "pool": "n1", "device": "gpu-1"}]}), "",
     "4: status.devices[0]: Invalid value"),
    ("opaque parameters not an object", lambda o: o[3]["spec"]["devices"].update(config=[
        {"opaque": {"driver": "gpu.example.com", "parameters": [1]}}]), "",
     "4: spec.devices.config[0].opaque.parameters: Invalid value"),
    ("opaque parameters over 10 KiB", lambda o: o[3]["spec"]["devices"].update(config=[
        {"opaque": {"driver": "gpu.example.com", "parameters": {"a": "x" * 11000}}}]), "",
     "4: spec.devices.config[0].opaque.parameters: Too long"),
]  # fmt: skip

_FIRST = re.compile(r"item (\d+): (?:invalid )?\w+ [^ ]*: (.*?): ([A-Z][a-z]+ [a-z]+|Forbidden)")


@pytest.mark.parametrize(("name", "breakage", "gates", "first"), RULES, ids=[r[0] for r in RULES])
def test_api_server_rule(name: str, breakage: Any, gates: str, first: str, tmp_path: Path) -> None:
    objects = [*base(), claim(exactly())]
    breakage(objects)
    code, _, stderr = _run(objects, gates, tmp_path)
    found = _FIRST.search(stderr)
    assert code == 2 and found, stderr
    assert ": ".join(found.groups()) == first, stderr


@pytest.mark.parametrize(
    ("field", "breakage"),
    [
        ("spec.devices[0].attributes.numa.ints", _attribute("numa", {"ints": [0]})),
        ("spec.skipNodeOperations", lambda o: _slice(o).update(skipNodeOperations=["*"])),
        ("spec.devices.requests[0].exactly.derivedAttributes", lambda o: _body(o).update(
            derivedAttributes=[{"name": "gpu.example.com/x", "expression": "1"}])),
    ],
)  # fmt: skip
def test_fields_1_35_does_not_know(field: str, breakage: Any, tmp_path: Path) -> None:
    objects = [*base(), claim(exactly())]
    breakage(objects)
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = gpudra(["allocate", "--kube-version", "1.35", "-f", str(path)])
    assert code == 2 and f'strict decoding error: unknown field "{field}"' in err.getvalue()


def test_zero_step_1_35_is_refused(tmp_path: Path) -> None:
    """Upstream 1.35 divides by a range step's integer value unchecked: kube-apiserver
    panics on a zero step (HTTP 500, nothing stored; reference-allocator exits 1 with
    'integer divide by zero'); gpudra refuses the slice in words (docs/differences.md)."""
    objects = [*base(), claim(exactly())]
    _policy({"default": "1Gi", "validRange": {"min": "1Gi", "step": "0"}})(objects)
    code, _, stderr = _run(objects, "DRAConsumableCapacity=true", tmp_path, 35)
    assert code == 2, stderr
    assert f"{_POLICY}.validRange.step: Internal error: kube-apiserver 1.35" in stderr


def test_every_unknown_field_sorted(tmp_path: Path) -> None:
    """sigs.k8s.io/json names every unknown field, sorted (measured: 1.35 and 1.37)."""
    objects = [*base(), claim(exactly())]
    _slice(objects)["devices"][0].update(zeta=1, alpha=2)
    _slice(objects)["bogus"] = 1
    code, _, stderr = _run(objects, "", tmp_path)
    assert code == 2
    assert (
        'strict decoding error: unknown field "spec.bogus", unknown field '
        '"spec.devices[0].alpha", unknown field "spec.devices[0].zeta"'
    ) in stderr


# ---------------------------------------------------------------- Kubernetes 1.34
#
# kube-apiserver 1.34's own rules (services/offline/validation/ and the CEL
# environment key each on the minor): one input each, with what reference-allocator
# 1.34.4 says of it, the whole first error (``item: field: ...``) or the claim's
# status, and what 1.35.8 says ("refused" or the status): each rule shows in both.

_TAINTS, _PARTS = "DRADeviceTaints=true", "DRAPartitionableDevices=true"
_SET = [{"name": "cs", "counters": {"c": {"value": "1"}}}]
_NONE = 'Unsupported value: "None": supported values: "NoExecute", "NoSchedule"'
_UNDECLARED = "compilation failed: ERROR: <input>:1:"


def _requests(o: list[dict[str, Any]]) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = o[3]["spec"]["devices"]["requests"]
    return requests


def _both_kinds(o: list[dict[str, Any]]) -> None:
    _requests(o)[0]["firstAvailable"] = [{"name": "a", "deviceClassName": "gpu", "count": -1}]
    _body(o)["count"] = -2


def _nine_subrequests(o: list[dict[str, Any]]) -> None:
    request = _requests(o)[0]
    request.pop("exactly")
    request["firstAvailable"] = [{"name": f"s{i}", "deviceClassName": "gpu"} for i in range(9)]
    request["firstAvailable"][3]["count"] = -1


def _constraints(*constraints: dict[str, Any]) -> Any:
    return lambda o: o[3]["spec"]["devices"].update(constraints=list(constraints))


def _counters(n: int) -> dict[str, Any]:
    return {f"c{i}": {"value": "1"} for i in range(n)}


def _consumes(shared: list[dict[str, Any]] | None, *consumptions: dict[str, Any]) -> Any:
    def apply(o: list[dict[str, Any]]) -> None:
        if shared is not None:
            _slice(o)["sharedCounters"] = shared
        _slice(o)["devices"][0]["consumesCounters"] = list(consumptions)

    return apply


def _reserved_twice(o: list[dict[str, Any]]) -> None:
    _status()(o)
    o[3]["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u"}] * 2


_TWO_SETS = [{"name": f"cs{j}", "counters": _counters(17)} for j in range(2)]

RULES_1_34: list[tuple[str, Any, str, str, str]] = [
    # name, breakage, gates, what 1.34 says, what 1.35 says
    ("taint effect None", lambda o: _slice(o)["devices"][0].update(
        taints=[{"key": "k", "effect": "None"}]), _TAINTS,
     f"3: spec.devices[0].taints[0].effect: {_NONE}", "allocated"),
    ("toleration effect None", lambda o: _body(o).update(
        tolerations=[{"key": "k", "operator": "Exists", "effect": "None"}]), _TAINTS,
     f"4: {_REQUEST}.tolerations[0].effect: {_NONE}", "allocated"),
    ("toleration kept with DRADeviceTaints off", lambda o: _body(o).update(
        tolerations=[{"key": "k", "operator": "Maybe"}]), "",
     f'4: {_REQUEST}.tolerations[0].operator: Unsupported value: "Maybe": supported values: '
     '"Equal", "Exists"', "allocated"),
    ("DeviceTaintRule effect None", lambda o: o.insert(3, {
        "apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule",
        "metadata": {"name": "r"}, "spec": {"taint": {"key": "k", "effect": "None"}}}), _TAINTS,
     f"4: spec.taint.effect: {_NONE}", "allocated"),
    ("sort() in a claim", _selector("[2, 1].sort()[0] == 1"), "",
     f'4: {_SEL}: Invalid value: "[2, 1].sort()[0] == 1": {_UNDECLARED}12: undeclared '
     "reference to 'sort' (in container '')", "allocated"),
    ("lists.range() in a class", lambda o: o[0]["spec"].update(
        selectors=[{"cel": {"expression": "lists.range(2).size() == 2"}}]), "",
     '1: spec.selectors[0].cel.expression: Invalid value: "lists.range(2).size() == 2": '
     f"{_UNDECLARED}1: undeclared reference to 'lists' (in container '')", "allocated"),
    ("5 taints", _many(1, {"taints": [{"key": f"k{i}", "effect": "NoSchedule"}
                                       for i in range(5)]}), _TAINTS,
     "3: spec.devices[0].taints: Too many: 5: must have at most 4 items", "unschedulable"),
    ("65 tainted devices", _many(65, {"taints": [{"key": "k", "effect": "NoSchedule"}]}),
     _TAINTS, "allocated", "refused"),
    ("33 shared counters", lambda o: _slice(o).update(
        sharedCounters=[{"name": "cs", "counters": _counters(33)}]), _PARTS,
     "3: spec.sharedCounters: Invalid value: 33: the total number of shared counters must not "
     "exceed 32", "refused"),
    ("9 counter sets beside devices", lambda o: _slice(o).update(sharedCounters=[
        {"name": f"cs{i}", "counters": {"c": {"value": "1"}}} for i in range(9)]), _PARTS,
     "allocated", "refused"),
    ("counter set of another slice", _consumes(None, *_COUNTERS), _PARTS,
     '3: spec.devices[0].consumesCounters[0].counterSet: Invalid value: "cs": must reference '
     "a counterSet defined in the ResourceSlice sharedCounters", "unschedulable"),
    ("counter its set lacks", _consumes(
        _SET, {"counterSet": "cs", "counters": {"d": {"value": "1"}}}), _PARTS,
     '3: spec.devices[0].consumesCounters[0].counters: Invalid value: "d": must reference a '
     "counter defined in the ResourceSlice sharedCounters", "refused"),
    ("34 counters consumed by a device", _consumes(
        _TWO_SETS, *[{"counterSet": f"cs{j}", "counters": _counters(17)} for j in range(2)]),
     _PARTS, "3: spec.devices[0]: Invalid value: 34: the total number of counters must not "
     "exceed 32", "refused"),
    ("duplicate request, at its name", lambda o: _requests(o).append(
        json.loads(json.dumps(_requests(o)[0]))), "",
     '4: spec.devices.requests[1].name: Duplicate value: "r"', "refused"),
    ("duplicate device, at its name", lambda o: _slice(o)["devices"][1].update(name="gpu-0"),
     "", '3: spec.devices[1].name: Duplicate value: "gpu-0"', "refused"),
    ("duplicate counter set, at its name", lambda o: _slice(o).update(sharedCounters=_SET * 2),
     _PARTS, '3: spec.sharedCounters[1].name: Duplicate value: "cs"', "refused"),
    ("duplicate reservation, at its uid", _reserved_twice, "",
     '4: status.reservedFor[1].uid: Duplicate value: "u"', "refused"),
    ("both exactly and firstAvailable", _both_kinds, "",
     "4: spec.devices.requests[0].firstAvailable[0].count: Invalid value: -1: must be greater "
     "than zero", "refused"),
    ("9 subrequests, one broken", _nine_subrequests, "",
     "4: spec.devices.requests[0].firstAvailable[3].count: Invalid value: -1: must be greater "
     "than zero", "refused"),
    ("attribute without a value", _attribute("x", {}), "",
     "3: spec.devices[0].attributes[x]: Required value: exactly one value must be specified",
     "refused"),
    ("empty matchAttribute", _constraints({"matchAttribute": ""}), "",
     "4: spec.devices.constraints[0].matchAttribute: Required value: name required", "refused"),
    ("matchAttribute without a domain", _constraints({"matchAttribute": "pcieRoot"}), "",
     '4: spec.devices.constraints[0].matchAttribute: Invalid value: "pcieRoot": must include '
     "a domain", "refused"),
    ("attribute name with an empty domain", _attribute("/x", {"int": 1}), "",
     "3: spec.devices[0].attributes[/x]: Required value: the domain must not be empty",
     "refused"),
    ("distinctAttribute kept with DRAConsumableCapacity off", _constraints(
        {"distinctAttribute": "index"}), "",
     '4: spec.devices.constraints[0].distinctAttribute: Invalid value: "index": must include '
     "a domain", "refused"),
]  # fmt: skip

_WHOLE = re.compile(r"item (\d+): (?:invalid )?\w+(?: [^ :]+)?: (.*?)(?:; |$)", re.M)


def _said(minor: int, breakage: Any, gates: str, tmp_path: Path) -> str:
    """What ``gpudra allocate --kube-version 1.<minor>`` says: the first error (item and
    text) when it refuses the input, else the claim's status."""
    objects = [*base(), claim(exactly())]
    breakage(objects)
    code, stdout, stderr = _run(objects, gates, tmp_path, minor)
    if code == 0:
        return _statuses(stdout)["c"]
    found = _WHOLE.search(stderr)
    assert code == 2 and found, stderr
    return ": ".join(found.groups())


@pytest.mark.parametrize(
    ("name", "breakage", "gates", "v134", "v135"), RULES_1_34, ids=[r[0] for r in RULES_1_34]
)
def test_api_server_rule_1_34(
    name: str, breakage: Any, gates: str, v134: str, v135: str, tmp_path: Path
) -> None:
    assert _said(34, breakage, gates, tmp_path) == v134
    said = _said(35, breakage, gates, tmp_path)
    assert ("refused" if ": " in said else said) == v135


_DEVICE = {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}


def _device_status(o: list[dict[str, Any]]) -> None:
    _status()(o)
    o[3]["status"]["devices"] = [_DEVICE, _DEVICE]


# Rules found on the way that differ between releases too (measured on each).
BY_RELEASE: list[tuple[str, Any, str, dict[int, str]]] = [
    ("a bad attribute name at its key before 1.36", _attribute("a.com/1x", {"int": 1}), "", {
        35: '3: spec.devices[0].attributes[a.com/1x]: Invalid value: "1x": a valid C identifier',
        37: '3: spec.devices[0].attributes: Invalid value: "1x": a valid C identifier'}),
    ("a result's tolerations checked from 1.37", _status(
        tolerations=[{"key": "k", "operator": "Maybe"}]), "DRADeviceTaints=true", {
        34: "", 35: "",
        37: f"4: {_RESULTS}.tolerations[0].operator: Unsupported value: \"Maybe\""}),
    ("a device status twice", _device_status, "", {
        34: '4: status.devices[1].deviceID: Duplicate value: {"Driver":{},"Pool":{},"Device":{},'
            '"ShareID":{}}',
        35: '4: status.devices[1]: Duplicate value: {"Driver":"gpu.example.com","Pool":"n1",'
            '"Device":"gpu-0","ShareID":""}'}),
    ("status.devices dropped with DRAResourceClaimDeviceStatus off", _device_status,
     "DRAResourceClaimDeviceStatus=false", {34: "", 35: ""}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "breakage", "gates", "by_minor"), BY_RELEASE, ids=[r[0] for r in BY_RELEASE]
)
def test_api_server_rule_by_release(
    name: str, breakage: Any, gates: str, by_minor: dict[int, str], tmp_path: Path
) -> None:
    """Each release's first error starts as given ("": the input is accepted)."""
    for minor, first in by_minor.items():
        objects = [*base(), claim(exactly())]
        breakage(objects)
        code, _, stderr = _run(objects, gates, tmp_path, minor)
        assert code == (2 if first else 0), f"1.{minor}: {stderr}"
        if first:
            found = _WHOLE.search(stderr)
            assert found and ": ".join(found.groups()).startswith(first), f"1.{minor}: {stderr}"
