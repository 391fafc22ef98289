"""cel-go's ``==`` with a Semver, Quantity, IP, CIDR, URL or Format on the left
(check.py's rewrite, equality.py): another type on the right is ``no such
overload`` at run time, whether the right side is a literal or computed; null
and a value of the same type compare; ``!=`` and a plain value on the left never
fail."""

from __future__ import annotations

import datetime

import pytest

from services.allocator.cel import equality
from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.selector import CelError, DeviceInput
from services.core.kube.resource import Device, DeviceAttribute, DeviceCapacity

DRIVER = "gpu.example.com"
GPU = DeviceInput(
    DRIVER,
    Device(
        name="gpu-0",
        attributes={
            "name": DeviceAttribute(string="a"),
            "index": DeviceAttribute(int_=0),
            "version": DeviceAttribute(version="1.2.3"),
        },
        capacity={"memory": DeviceCapacity(value="1Gi")},
    ),
)
A = f"device.attributes['{DRIVER}']"
MEMORY = f"device.capacity['{DRIVER}'].memory"
FAILS = "no such overload"


@pytest.fixture(scope="module")
def env() -> CelEnvironment:
    return CelEnvironment()


def outcome(env: CelEnvironment, expression: str) -> bool | str:
    selector = env.compile(expression)
    assert selector.error is None, selector.error
    try:
        return env.matches(selector, env.activation(GPU))
    except CelError as exc:
        return exc.message


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f"{A}.version == {A}.name", FAILS),
        (f"(({A}.version)) == ({A}.name)", FAILS),
        (f"{A}.version == {A}.name + 'x'", FAILS),
        (f"{A}.version == {A}.index", FAILS),
        (f"{MEMORY} == {A}.index", FAILS),
        (f"{MEMORY} == {A}.version", FAILS),
        ("ip('1.2.3.4') == dyn(cidr('1.2.3.0/24').ip().family())", FAILS),
        (f"{A}.version == '1.2.3'", FAILS),
        (f"{A}.version == {A}.version", True),
        (f"{A}.version == semver('1.2.4')", False),
        (f"{MEMORY} == quantity('1024Mi')", True),
        (f"{MEMORY} == quantity('1').add(1)", False),
        (f"{A}.version == dyn(null)", False),
        (f"{A}.version == null", False),
        (f"{A}.version == optional.none()", FAILS),
        (f"{A}.name == optional.of('a') || {A}['name'] == {A}[?'name']", False),
        (f"{A}[?'index'] == optional.of(0)", True),
        (f"{A}.version != {A}.name", True),
        (f"{A}.name == {A}.version", False),
        (f"{A}.index == {MEMORY}", False),
        # The right side's error counts when the left side has none, as in cel-go.
        (f"{A}.version == [1].map(x, x / 0)", "division by zero"),
        (f"{A}.nothere == {A}.version", "no such key: nothere"),
        # Plain values on the left keep CEL's equality.
        (f"{A}.index == dyn(0u) && {A}.index == dyn(0.0) && {A}.name == dyn('a')", True),
        (f"{A}.index == dyn(false) || {A}.name == dyn(b'a') || {A}.index == dyn([0])", False),
    ],
)
def test_equality(env: CelEnvironment, expression: str, expected: bool | str) -> None:
    assert outcome(env, expression) == expected


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        (1, 1.0, True),
        (True, 1, False),
        (None, None, True),
        ([1, [2.0]], [1.0, [2]], True),
        ({"a": [1]}, {"a": [1.0]}, True),
        ({"a": 1}, {"b": 1}, False),
        ("a", b"a", False),
        (datetime.timedelta(seconds=1), datetime.timedelta(seconds=1), True),
        (float("nan"), float("nan"), False),
    ],
)
def test_same_is_cel_equality(left: object, right: object, expected: bool) -> None:
    assert equality.same(left, right) is expected
