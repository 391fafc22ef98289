"""The scenario generator and the independent allocation checker themselves.

No control plane needed; tests/e2e/test_differential_allocator.py runs both
allocators on the scenarios (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.scenarios import (
    ERR,
    GATE_SETS,
    Sel,
    _and,
    _gpu_only_scenario,
    _not,
    _or,
    _outcome,
    check,
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
