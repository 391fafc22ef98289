"""The allocator per Kubernetes release (services/allocator/structured/variant.py): which
upstream implementation a release runs for its gates, and what each one does differently.

The outcomes are those tests/e2e/allocator/test_differential_cases.py checks against each
release's own reference-allocator (tests/helpers/diffcases.py, RELEASES and the
documented deviations); here they run without a control plane, so a change that breaks
them fails in the unit tier too.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from services.allocator.structured import taintrules
from services.allocator.structured.engine import Engine
from services.allocator.structured.features import MINORS, accepted_sets, defaults, parse
from services.allocator.structured.pools import ANONYMOUS, Node, node_matches
from services.allocator.structured.variant import Variant, channel
from services.cli import main as gpudra
from services.core.kube.resource import (
    DeviceTaintRule,
    NodeSelector,
    ResourceSlice,
    from_builtins,
)
from tests.helpers.diffcases import DEVIATIONS, RELEASES, Case, base

CASES = [(minor, case) for case in RELEASES for minor in case.minors]


def _allocate(items: list[dict[str, Any]], gates: str, minor: int, tmp: Path) -> dict[str, Any]:
    path = tmp / "input.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    argv = ["allocate", "--kube-version", f"1.{minor}", "-f", str(path), "-o", "json"]
    if gates:
        argv += ["--feature-gates", gates]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = gpudra(argv)
    return {"code": code, "stderr": err.getvalue(), "out": out.getvalue()}


def _devices(entry: dict[str, Any]) -> list[str]:
    results = ((entry.get("allocation") or {}).get("devices") or {}).get("results") or []
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]


@pytest.mark.parametrize(("minor", "case"), CASES, ids=[f"1.{m}-{c.name}" for m, c in CASES])
def test_each_release_gives_its_own_outcome(minor: int, case: Case, tmp_path: Path) -> None:
    items = (base() if case.base else []) + case.objects
    run = _allocate(items, case.gates_for(minor), minor, tmp_path)
    assert run["code"] == case.rc, run["stderr"]
    if case.rc:
        assert case.says in run["stderr"]
        return
    claims = {c["name"]: c for c in json.loads(run["out"])["claims"]}
    assert {n: c["status"] for n, c in claims.items()} == case.statuses_for(minor), claims
    wanted = case.devices_for(minor)
    if wanted is not None:
        assert {n: _devices(c) for n, c in claims.items()} == wanted


@pytest.mark.parametrize(
    ("minor", "deviation"),
    [(m, d) for d in DEVIATIONS for m in d.minors],
    ids=[f"1.{m}-{d.name}" for d in DEVIATIONS for m in d.minors],
)
def test_gpudra_keeps_the_right_outcome_where_upstream_had_a_bug(
    deviation: Any, minor: int, tmp_path: Path
) -> None:
    from tests.helpers.diffcases import ANY_CLASS

    run = _allocate([ANY_CLASS, *deviation.objects], deviation.gates, minor, tmp_path)
    assert run["code"] == 0, run["stderr"]
    claims = json.loads(run["out"])["claims"]
    assert {c["name"]: c["status"] for c in claims} == deviation.ours


# ---------------------------------------------------------------- which allocator


@pytest.mark.parametrize(
    ("minor", "gates", "expected"),
    [
        (34, "", "experimental"),  # DRAResourceClaimDeviceStatus on by default
        (34, "DRAResourceClaimDeviceStatus=false", "incubating"),
        (34, "DRAResourceClaimDeviceStatus=false,DRAAdminAccess=false,"
             "DRAPrioritizedList=false", "stable"),
        (35, "", "incubating"),
        (35, "DRAAdminAccess=false,DRAPrioritizedList=false", "stable"),
        (35, "DRAConsumableCapacity=true", "experimental"),
        (36, "", "incubating"),
        (36, "DRAConsumableCapacity=false,DRADeviceBindingConditions=false", "stable"),
        (36, "DRAListTypeAttributes=true", "incubating"),  # not an allocator feature in 1.36
        (37, "", "incubating"),
        (37, "DRAConsumableCapacity=false,DRADeviceBindingConditions=false", "stable"),
        (37, "DRAListTypeAttributes=true", "experimental"),
        (37, "DRADeviceCompatibilityGroups=true", "experimental"),
    ],
)  # fmt: skip
def test_each_release_picks_the_allocator_kube_scheduler_picks(
    minor: int, gates: str, expected: str
) -> None:
    assert channel(parse(gates, minor)) == expected


@pytest.mark.parametrize("minor", MINORS)
def test_every_accepted_gate_set_has_an_allocator(minor: int) -> None:
    for gates in accepted_sets(minor):
        assert Variant.of(parse(gates, minor)).channel


def test_what_changed_between_releases_is_named_once_per_behaviour() -> None:
    old, new = Variant.of(defaults(35)), Variant.of(defaults(37))
    assert not old.combinations and new.combinations
    assert old.rejected_device_keeps_counters and not new.rejected_device_keeps_counters
    assert old.distinct_per_request and not new.distinct_per_request
    assert not old.claim_config_once and new.claim_config_once
    stable = Variant.of(parse("DRAConsumableCapacity=false,DRADeviceBindingConditions=false", 37))
    assert stable.channel == "stable" and not stable.combinations and not stable.pools_sorted


# ---------------------------------------------------------------- pieces


def test_a_node_selector_without_a_node_is_matched_against_an_unnamed_node() -> None:
    selector = from_builtins(
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}]},
        NodeSelector,
    )
    assert node_matches(None, None, None, selector)
    assert not node_matches(Node("n1", {"a": "x"}), None, None, selector)
    assert ANONYMOUS.name == "" and not ANONYMOUS.labels


def _slice(devices: list[str]) -> ResourceSlice:
    slice_: ResourceSlice = from_builtins(
        {
            "metadata": {"name": "s"},
            "spec": {
                "driver": "d.example.com",
                "nodeName": "n1",
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": n} for n in devices],
            },
        },
        ResourceSlice,
    )
    return slice_


def _rule(selector: dict[str, str] | None) -> DeviceTaintRule:
    spec: dict[str, Any] = {"taint": {"key": "k", "effect": "NoSchedule"}}
    if selector is not None:
        spec["deviceSelector"] = selector
    rule: DeviceTaintRule = from_builtins(
        {"metadata": {"name": "r"}, "spec": spec}, DeviceTaintRule
    )
    return rule


def test_taint_rules_patch_copies_of_the_slices_they_select() -> None:
    slices = [_slice(["a", "b"])]
    patched = taintrules.apply(slices, [_rule({"device": "a"})], defaults(37))
    assert [bool(d.taints) for d in patched[0].spec.devices or []] == [True, False]
    assert not any(d.taints for d in slices[0].spec.devices or [])  # the input is left alone
    off = parse("DRADeviceTaintRules=false", 37)
    assert taintrules.apply(slices, [_rule({"device": "a"})], off) is slices


def test_a_taint_rule_without_selector_taints_all_before_1_37_and_nothing_since() -> None:
    rules = [_rule(None)]
    on_35 = parse("DRADeviceTaints=true,DRADeviceTaintRules=true", 35)
    assert all(
        d.taints for d in taintrules.apply([_slice(["a"])], rules, on_35)[0].spec.devices or []
    )
    assert not any(
        d.taints
        for d in taintrules.apply([_slice(["a"])], rules, defaults(37))[0].spec.devices or []
    )


def test_1_34_uses_an_incomplete_pool_and_stops_at_an_invalid_one() -> None:
    incomplete = from_builtins(
        {
            "metadata": {"name": "s"},
            "spec": {
                "driver": "d.example.com",
                "nodeName": "n1",
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 2},
                "devices": [{"name": "a"}],
            },
        },
        ResourceSlice,
    )
    for minor, usable in ((34, 1), (35, 0)):
        engine = Engine({}, [incomplete], defaults(minor))
        assert len(engine.view(Node("n1")).candidates) == usable
    duplicate = _slice(["a", "a"])
    view = Engine({}, [duplicate], defaults(34)).view(Node("n1"))
    assert view.stop == (0, "pool p is invalid: duplicate device name a")


# ---------------------------------------------------------------- explanations


def _explained(name: str, minor: int, tmp: Path, **changes: Any) -> str:
    case = next(c for c in RELEASES if c.name == name)
    items = json.loads(json.dumps((base() if case.base else []) + case.objects))
    for claim_object in items:
        if claim_object["kind"] == "ResourceClaim" and "count" in changes:
            claim_object["spec"]["devices"]["requests"][0]["exactly"]["count"] = changes["count"]
    run = _allocate(items, case.gates_for(minor), minor, tmp)
    return json.dumps([c["explanation"] for c in json.loads(run["out"])["claims"]])


@pytest.mark.parametrize(
    ("name", "minor", "changes", "words"),
    [
        ("device-taint-rule-without-selector-1-35", 35, {},
         "taint example.com/maint:NoSchedule (from DeviceTaintRule maintenance) not tolerated"),
        ("all-with-capacity-in-use", 37, {},
         "asks for all matching devices, and x.example.com/shared/gpu-0 has too little capacity"),
        ("compatibility-groups-disjoint", 37, {}, "compatibility groups do not fit together"),
        ("optional-node-operations-undeclared", 37, {},
         "does not declare DRAOptionalNodeOperations"),
        ("list-attribute-match-as-sets", 37, {"count": 3},
         "no value common to all (attribute lists compared as sets)"),
        ("derived-attribute-constraint", 37, {"count": 3}, "(a derived attribute of the request)"),
    ],
)  # fmt: skip
def test_explanations_name_what_the_newer_releases_check(
    name: str, minor: int, changes: dict[str, int], words: str, tmp_path: Path
) -> None:
    assert words in _explained(name, minor, tmp_path, **changes)
