"""The lists extension's results typed by element, as cel-go types them (only the
checking environment declares them so; programs run the ``list(dyn)`` ones)."""

from __future__ import annotations

import re

import pytest

from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.selector import DeviceInput
from services.core.kube.resource import Device, DeviceAttribute

DEVICE = DeviceInput(
    "gpu.example.com", Device(name="gpu-0", attributes={"index": DeviceAttribute(int_=0)})
)


@pytest.fixture(scope="module")
def env() -> CelEnvironment:
    return CelEnvironment()


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        (
            "true in [1, 2].sort()",
            "found no matching overload for '@in' applied to '(bool, list(int))'",
        ),
        ("[[1]].sort() == [[1]]", "found no matching overload for 'sort'"),
        ("'a' in [1].reverse()", "'(string, list(int))'"),
        ("[1, 2].slice(0, 1)[0] == 'a'", "'(int, string)'"),
        ("[1, 1].distinct()[0] == 'a'", "'(int, string)'"),
        ("[[1], [2]].flatten()[0] == 'a'", "'(int, string)'"),
    ],
)
def test_refused_by_element_type(env: CelEnvironment, expression: str, fragment: str) -> None:
    error = env.compile(expression).error
    assert error is not None and fragment in error, error


@pytest.mark.parametrize(
    "expression",
    [
        "[3, 1].sort() == [1, 3] && ['b', 'a'].sort()[0] == 'a'",
        "dyn([2, 1]).sort() == [1, 2]",
        "device.attributes['gpu.example.com'].index in [1, 0].sort()",
        "[[1], [2]].flatten(1) == [1, 2] && [1, 2, 3].slice(1, 2) == [2]",
        "[1, 1, 2].distinct().reverse() == [2, 1]",
    ],
)
def test_typed_results_still_run(env: CelEnvironment, expression: str) -> None:
    selector = env.compile(expression)
    assert selector.error is None, selector.error
    assert env.matches(selector, env.activation(DEVICE))


@pytest.mark.parametrize(
    ("expression", "undeclared"),
    [
        ("[2, 1].sort()[0] == 1", ["sort"]),
        ("[1, 2].slice(0, 1).size() == 1", ["slice"]),
        ("[[1]].flatten().size() == 1", ["flatten"]),
        ("[1, 2].reverse()[0] == 2", ["reverse"]),
        ("[1, 1].distinct().size() == 1", ["distinct"]),
        ("lists.range(2).size() == 2", ["lists", "range"]),  # as cel-go says it
    ],
)
def test_kube_apiserver_1_34_validates_without_the_lists_extension(
    expression: str, undeclared: list[str]
) -> None:
    """kube-apiserver 1.34's NewExpressions environment (compatibility version 1.33)
    predates ext.Lists; 1.35's has it, and kube-scheduler's StoredExpressions one
    always does (reference-allocator 1.34.4 and 1.35.8 measured)."""
    error = CelEnvironment(new_expressions=34).compile(expression).error
    assert error is not None, expression
    found = re.findall(r"undeclared reference to '(\w+)' \(in container ''\)", error)
    assert found == undeclared, error
    for other in (CelEnvironment(new_expressions=35), CelEnvironment()):
        selector = other.compile(expression)
        assert selector.error is None, selector.error
        assert other.matches(selector, other.activation(DEVICE))
