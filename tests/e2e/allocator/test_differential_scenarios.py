"""The scenario generator and the independent allocation checker themselves.

No control plane needed; tests/e2e/allocator/test_differential_allocator.py runs both
allocators on the scenarios (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.helpers.scenarios import (
    ERR,
    GATE_SETS,
    RK,
    Sel,
    _all_distinct,
    _all_match,
    _and,
    _gpu_only_scenario,
    _not,
    _or,
    _outcome,
    check,
    gate_sets,
    generate,
)

# One batch = one invocation of each allocator, so one set of Kubernetes gates.


# ---------------------------------------------------------------- devices


# ---------------------------------------------------------------- selectors


# ---------------------------------------------------------------- scenarios


# Both allocators search depth first and, when a later request fails, retry every
# ordering of devices for the earlier ones: exponential, as in kube-scheduler
# (which gives up after a timeout). Claims are kept to a search both finish quickly.


# ---------------------------------------------------------------- the checker


# ---------------------------------------------------------------- tests of the above


def test_generation_is_reproducible() -> None:
    first = [generate(7, i, GATE_SETS[i % len(GATE_SETS)]).objects() for i in range(6)]
    again = [generate(7, i, GATE_SETS[i % len(GATE_SETS)]).objects() for i in range(6)]
    assert json.dumps(first) == json.dumps(again)
    assert json.dumps(first) != json.dumps([generate(8, i, "").objects() for i in range(6)])


def test_scenarios_are_isolated_by_driver_and_names() -> None:
    a, b = generate(1, 1, ""), generate(1, 2, "")
    assert {s["spec"]["driver"] for s in a.slices} == {a.driver}
    assert not set(a.nodes) & set(b.nodes)
    assert not set(a.classes) & set(b.classes)
    names = [s["metadata"]["name"] for s in a.slices + b.slices]
    assert len(names) == len(set(names))


def test_predicates_follow_cel_error_rules() -> None:
    assert _and(False, ERR) is False and _and(True, ERR) is ERR
    assert _or(True, ERR) is True and _or(False, ERR) is ERR
    assert _not(ERR) is ERR


def test_checker_accepts_a_valid_allocation_and_names_each_fault() -> None:
    sc = _gpu_only_scenario()
    assert check(sc, _outcome(sc, ["gpu-0", "gpu-1"])) == []
    assert any("count 2" in p for p in check(sc, _outcome(sc, ["gpu-0"])))
    assert any("unknown device" in p for p in check(sc, _outcome(sc, ["gpu-0", "gpu-9"])))
    assert any("already used" in p for p in check(sc, _outcome(sc, ["gpu-0", "gpu-0"])))
    assert any("not s000-n1" in p for p in check(sc, _outcome(sc, ["gpu-0", "gpu-1"], "s000-n1")))
    sc.request_selectors[("c", "r")] = [Sel("false", lambda dev: False)]
    assert any("does not satisfy" in p for p in check(sc, _outcome(sc, ["gpu-0", "gpu-1"])))


@pytest.mark.parametrize("gates", GATE_SETS)
def test_generated_existing_allocations_pass_the_checker(gates: str) -> None:
    for index in range(10):
        sc = generate(11, index, gates)
        assert check(sc, {}) == [], (index, gates)


def test_every_release_gets_every_gate_set_it_accepts() -> None:
    assert len(gate_sets(37)) == 288 and len(gate_sets(35)) == 144
    # 1.34: DRAConsumableCapacity stays off (its allocator's bugs with it on)
    assert len(gate_sets(34)) == 64
    assert all("DRAConsumableCapacity=false" in gates for gates in gate_sets(34))
    for minor in (34, 35, 37):
        for gates in gate_sets(minor)[::37]:
            sc = generate(5, 1, gates, minor)
            assert sc.features.minor == minor and check(sc, {}) == []


def test_1_35_scenarios_are_drawn_as_before_1_37_existed() -> None:
    """The 1.35 suite keeps its scenarios: what was drawn from the seed before 1.37
    existed is the same (digest of the generator at e257929, DeviceTaintRules aside:
    they come from a stream of their own)."""
    objects = [
        [o for o in generate(20261122, i, GATE_SETS[i % 64], 35).objects()
         if o["kind"] != "DeviceTaintRule"]
        for i in range(40)
    ]  # fmt: skip
    digest = hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()
    assert digest == "6bb9456ace8e94b0735fcf6195aaffd23f6b74e412a6b351a6d7def81e54c189"


def test_1_37_scenarios_reach_what_1_37_added() -> None:
    """Over 1.37's gate sets the generator writes every new kind of input somewhere."""
    seen: set[str] = set()
    for index, gates in enumerate(gate_sets(37)[::3]):
        sc = generate(13, index, gates, 37)
        text = json.dumps(sc.objects())
        for word in (
            "ints",
            "derivedAttributes",
            "compatibilityGroups",
            "skipNodeOperations",
            "declaredFeatures",
            "DeviceTaintRule",
            "DoesNotExist",
            "compute",
        ):
            if word in text:
                seen.add(word)
    assert len(seen) == 8, seen


def test_constraint_checks_follow_each_release() -> None:
    new_lists = generate(1, 1, "DRAListTypeAttributes=true,DRAConsumableCapacity=true", 37)
    old = generate(1, 1, "DRAConsumableCapacity=true", 35)
    a, b, c = ("ints", [0, 1]), ("ints", [1]), ("ints", [0])
    assert _all_match(new_lists, [a, b]) and not _all_match(new_lists, [b, c])
    assert _all_distinct(new_lists, [b, c]) and not _all_distinct(new_lists, [a, b])
    assert _all_match(old, [a]) and not _all_match(old, [a, a])
    one = ("int", 1)
    assert _all_distinct(old, [one, one])  # up to 1.36: per request, presence only
    assert not _all_distinct(generate(1, 1, "", 37), [one, one])
    assert RK == "resource.kubernetes.io"
