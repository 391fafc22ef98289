"""The slice checker: every fleet x gate x API version renders valid pools; each rule bites."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest

from services.core.kube import resource
from services.core.kube.resource import ResourceSlice
from services.core.model import featuregates
from services.offline import slicecheck
from services.offline.slices import fleet_inventory
from services.publisher.render import RenderOptions, render_slices
from tests.helpers.inventories import dgx_a100, node


def _gate_combinations() -> list[str]:
    """Every on/off mix of the gates that change what is published, minus forbidden ones."""
    names = [
        featuregates.DYNAMIC_MIG,
        featuregates.PASSTHROUGH_SUPPORT,
        featuregates.NVML_DEVICE_HEALTH_CHECK,
    ]
    specs = []
    for values in itertools.product([False, True], repeat=len(names)):
        spec = ",".join(f"{n}={str(v).lower()}" for n, v in zip(names, values, strict=True))
        try:
            featuregates.parse(spec)
        except featuregates.FeatureGateError:
            continue
        specs.append(spec)
    return specs


def _fleets() -> list[str]:
    from services.discovery.fleet import fleet_names

    return fleet_names()


@pytest.mark.parametrize("fleet", _fleets())
def test_every_fleet_gate_and_version_renders_a_valid_pool(fleet: str) -> None:
    inventory = fleet_inventory(fleet, "node-1")
    combos = _gate_combinations()
    # The reference refuses DynamicMIG with either of the others, and the other two together.
    assert len(combos) == 4
    for gates, minor in itertools.product(combos, (34, 35)):
        options = RenderOptions(gates=featuregates.parse(gates), kube_minor=minor)
        slices = render_slices(inventory, options, generation=1)
        problems = slicecheck.check_pool(slices, kube_minor=minor)
        assert not problems, f"{fleet} {gates} 1.{minor}: {problems[:3]}"
        as_json = [resource.to_builtins(s) for s in slices]
        assert not slicecheck.check_pool(as_json, kube_minor=minor)


def test_hand_built_inventories_render_valid_pools() -> None:
    for inv, gates, minor in itertools.product(
        (node(), dgx_a100()), _gate_combinations(), (34, 35)
    ):
        slices = render_slices(inv, RenderOptions(featuregates.parse(gates), minor))
        assert not slicecheck.check_pool(slices, kube_minor=minor), (gates, minor)


def test_every_health_taint_at_once_fits_both_api_versions() -> None:
    """unmonitored + xid + gpu-lost on one device: 3 taints, within 1.34's limit of 4."""
    import msgspec

    from services.core.model.schemas import GpuHealth, Xid

    sick = GpuHealth(xids=[Xid(79, 1.0)], lost=True, unmonitored=True)
    for inv in (node(), dgx_a100()):
        gpus = [msgspec.structs.replace(g, health=sick) for g in inv.gpus]
        inv = msgspec.structs.replace(inv, gpus=gpus)
        for minor in (34, 35):
            options = RenderOptions(featuregates.parse("NVMLDeviceHealthCheck=true"), minor)
            slices = render_slices(inv, options)
            counts = {len(d.taints or []) for s in slices for d in s.spec.devices or []}
            assert max(counts) == 3  # MIG devices miss the whole-GPU XID
            assert not slicecheck.check_pool(slices, kube_minor=minor), minor


# --------------------------------------------------------------------------- rules


def _good() -> dict[str, Any]:
    (s,) = render_slices(node(), RenderOptions())
    return resource.to_builtins(s)


def _paths(data: dict[str, Any], minor: int = 35) -> list[str]:
    return [p.path for p in slicecheck.check_slice(data, kube_minor=minor)]


def test_a_rendered_slice_has_no_problems() -> None:
    assert slicecheck.check_slice(_good()) == []


def test_problems_name_the_field_and_the_expectation() -> None:
    data = _good()
    data["spec"]["devices"][1]["name"] = "GPU_1"
    (problem,) = slicecheck.check_slice(data)
    assert problem.path == "spec.devices[1].name"
    assert "DNS label" in problem.message and "GPU_1" in problem.message
    assert str(problem).startswith("spec.devices[1].name: must be a DNS label")


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (lambda d: d["spec"].update(driver="Not_A.domain"), "spec.driver"),
        (lambda d: d["spec"].update(driver="a" * 64 + ".com"), "spec.driver"),
        (lambda d: d["spec"]["pool"].update(name=""), "spec.pool.name"),
        (lambda d: d["spec"]["pool"].update(name="x" * 254), "spec.pool.name"),
        (lambda d: d["spec"]["pool"].update(generation=-1), "spec.pool.generation"),
        (lambda d: d["spec"]["pool"].update(resourceSliceCount=0), "spec.pool.resourceSliceCount"),
        (lambda d: d["spec"].update(allNodes=True), "spec"),
        (lambda d: d["spec"].pop("nodeName"), "spec"),
        (lambda d: d["spec"].update(allNodes=False), "spec.allNodes"),
        (lambda d: d["metadata"].update(name="Bad_Name"), "metadata.name"),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update(x={"int": 1, "string": "a"}),
            "spec.devices[0].attributes[x]",
        ),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update(x={}),
            "spec.devices[0].attributes[x]",
        ),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update(x={"string": "s" * 65}),
            "spec.devices[0].attributes[x].string",
        ),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update(x={"version": "9.0"}),
            "spec.devices[0].attributes[x].version",
        ),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update({"a" * 33: {"int": 1}}),
            f"spec.devices[0].attributes[{'a' * 33}]",
        ),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update({"1st": {"int": 1}}),
            "spec.devices[0].attributes[1st]",
        ),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update({"Bad_Domain/x": {"int": 1}}),
            "spec.devices[0].attributes[Bad_Domain/x]",
        ),
        (
            lambda d: d["spec"]["devices"][0]["capacity"].update(memory={"value": "lots"}),
            "spec.devices[0].capacity[memory].value",
        ),
        (
            lambda d: d["spec"]["devices"][0]["attributes"].update(
                {f"a{i}": {"int": i} for i in range(30)}
            ),
            "spec.devices[0]",
        ),
        (
            lambda d: d["spec"]["devices"].append(dict(d["spec"]["devices"][0])),
            "spec.devices[8].name",
        ),
        (
            lambda d: d["spec"]["devices"][0].update(taints=[{"key": "a/b", "effect": "Maybe"}]),
            "spec.devices[0].taints[0].effect",
        ),
        (
            lambda d: d["spec"]["devices"][0].update(taints=[{"key": "a b", "effect": "None"}]),
            "spec.devices[0].taints[0].key",
        ),
        (
            lambda d: d["spec"]["devices"][0].update(
                taints=[{"key": "a", "value": "v" * 64, "effect": "None"}]
            ),
            "spec.devices[0].taints[0].value",
        ),
        (
            lambda d: d["spec"]["devices"][0].update(nodeName="n1"),
            "spec.devices[0]",
        ),
        (
            lambda d: d["spec"]["devices"][0]["capacity"]["memory"].update(
                requestPolicy={"default": "1"}
            ),
            "spec.devices[0].capacity[memory].requestPolicy",
        ),
        (
            lambda d: d["spec"].update(sharedCounters=[{"name": "set", "counters": {}}]),
            "spec",  # 1.35: not beside devices (and the empty set is reported too)
        ),
        (lambda d: d.update(spec="nope"), "spec"),
        (lambda d: d.pop("spec"), "$"),
    ],
)
def test_each_rule_reports_its_field(edit: Any, path: str) -> None:
    data = _good()
    edit(data)
    assert path in _paths(data)


def test_device_limits_depend_on_taints_counters_and_version() -> None:
    data = _good()
    template = data["spec"]["devices"][0]
    data["spec"]["devices"] = [dict(template, name=f"d{i}") for i in range(100)]
    assert _paths(data) == []
    data["spec"]["devices"][0] = dict(template, name="d0", taints=[{"key": "k", "effect": "None"}])
    assert _paths(data) == ["spec.devices"]  # 64 with a taint on 1.35
    assert _paths(data, minor=34) == []  # 1.34 allows 128 regardless
    data["spec"]["devices"] = [dict(template, name=f"d{i}") for i in range(129)]
    assert _paths(data, minor=34) == ["spec.devices"]


def test_counter_limits_per_version() -> None:
    counters = {f"c{i}": {"value": "1"} for i in range(20)}
    data = _good()
    data["spec"].pop("devices")
    data["spec"]["sharedCounters"] = [{"name": f"s{i}", "counters": counters} for i in range(2)]
    assert _paths(data, 35) == []
    assert _paths(data, 34) == ["spec.sharedCounters"]  # 40 counters in all sets > 32
    data["spec"]["sharedCounters"] = [
        {"name": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(9)
    ]
    assert _paths(data, 35) == ["spec.sharedCounters"]  # more than 8 sets
    data["spec"]["sharedCounters"] = [{"name": "Bad", "counters": {"c_1": {"value": "x"}}}]
    assert set(_paths(data, 35)) == {
        "spec.sharedCounters[0].name",
        "spec.sharedCounters[0].counters[c_1]",
        "spec.sharedCounters[0].counters[c_1].value",
    }


def _dynamic_pool(minor: int) -> list[ResourceSlice]:
    return render_slices(node(), RenderOptions(featuregates.parse("DynamicMIG=true"), minor))


def test_pool_checks_catch_what_one_slice_cannot_show() -> None:
    slices = _dynamic_pool(35)
    assert slicecheck.check_pool(slices) == []
    paths = [p.path for p in slicecheck.check_pool(slices[1:])]
    assert "slices[0].spec.pool.resourceSliceCount" in paths  # one slice missing
    assert any(p.endswith("consumesCounters[0].counterSet") for p in paths)  # set gone
    bumped = [slices[0], *[_with_generation(s, 2) for s in slices[1:]]]
    assert "slices[1].spec.pool.generation" in [p.path for p in slicecheck.check_pool(bumped)]
    twice = [*slices, slices[3]]
    assert any("already used" in p.message for p in slicecheck.check_pool(twice))


def test_consumption_must_fit_its_counter_set() -> None:
    slices = _dynamic_pool(35)
    counters = slices[0].spec.shared_counters or []
    counters[0].counters["multiprocessors"] = resource.Counter(value="10")
    problems = slicecheck.check_pool(slices)
    assert problems and all("exceeds 10" in p.message for p in problems)


def test_on_1_34_consumers_must_find_their_set_in_the_same_slice() -> None:
    slices = _dynamic_pool(34)
    assert slicecheck.check_pool(slices, kube_minor=34) == []
    moved = [msgspec.structs.replace(s, spec=s.spec) for s in slices]
    moved[0].spec.shared_counters, moved[1].spec.shared_counters = (
        moved[1].spec.shared_counters,
        moved[0].spec.shared_counters,
    )
    problems = slicecheck.check_pool(moved, kube_minor=34)
    assert any("no counter set 'gpu-0-counter-set' in scope" in p.message for p in problems)


def _with_generation(s: ResourceSlice, generation: int) -> ResourceSlice:
    pool = msgspec.structs.replace(s.spec.pool, generation=generation)
    return msgspec.structs.replace(s, spec=msgspec.structs.replace(s.spec, pool=pool))


# --------------------------------------------------------------------------- list attributes


def test_list_attributes_exist_from_1_36_and_follow_its_rules() -> None:
    data = _good()
    numa = "resource.kubernetes.io/numaNode"
    attrs = data["spec"]["devices"][0]["attributes"]
    attrs[numa] = {"ints": [0]}
    assert _paths(data, 37) == [] and _paths(data, 36) == []
    (problem,) = slicecheck.check_slice(data, kube_minor=35)
    assert problem.path == f"spec.devices[0].attributes[{numa}].ints"
    assert "Kubernetes 1.36 or later" in problem.message
    attrs[numa] = {"ints": []}
    assert _paths(data, 37) == [f"spec.devices[0].attributes[{numa}].ints"]
    attrs[numa] = {"ints": [0], "int": 0}
    assert _paths(data, 37) == [f"spec.devices[0].attributes[{numa}]"]
    attrs[numa] = {"versions": ["1.0.0", "one"], "ints": None}
    assert _paths(data, 37) == [f"spec.devices[0].attributes[{numa}].versions[1]"]
    attrs[numa] = {"strings": ["x" * 65]}
    assert _paths(data, 37) == [f"spec.devices[0].attributes[{numa}].strings[0]"]
    attrs[numa] = {"bools": [True] * 40}  # 40 values and the other attributes: over 48
    (problem,) = slicecheck.check_slice(data, kube_minor=37)
    assert problem.path == "spec.devices[0]" and "at most 48 attribute values" in problem.message


def test_a_list_attribute_lowers_the_device_limit_from_1_36() -> None:
    data = _good()
    template = data["spec"]["devices"][0]
    data["spec"]["devices"] = [dict(template, name=f"d{i}") for i in range(100)]
    assert _paths(data, 37) == []
    listed = dict(template["attributes"], **{"resource.kubernetes.io/numaNode": {"ints": [0]}})
    data["spec"]["devices"][5] = dict(template, name="d5", attributes=listed)
    assert _paths(data, 37) == ["spec.devices"]
    del data["spec"]["devices"][64:]
    assert _paths(data, 37) == []
