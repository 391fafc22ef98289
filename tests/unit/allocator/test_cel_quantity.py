"""Kubernetes Quantity and blang semver semantics, case by case (values from Go's behaviour)."""

from __future__ import annotations

import pytest

from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.selector import CelError, DeviceInput
from services.allocator.cel.semver import Semver, SemverError
from services.core.kube.quantity import ERR_FORMAT, ERR_SUFFIX, Quantity, QuantityError
from services.core.kube.resource import Device

CANONICAL = [
    ("0", "0"),
    ("1", "1"),
    ("1Gi", "1Gi"),
    ("1024Mi", "1Gi"),
    ("1000M", "1G"),
    ("1.5Gi", "1536Mi"),
    ("0.5Ki", "512"),
    (".001Ki", "1024m"),
    (".000001Ki", "1024u"),
    (".000000001Ki", "1024n"),
    (".000000000001Ki", "2n"),  # rounded up to nano units
    ("1000m", "1"),
    ("1.5", "1500m"),
    ("0.1", "100m"),
    ("1e3", "1e3"),
    ("1E3", "1e3"),
    ("5e-1", "500e-3"),
    ("1e-12", "1e-9"),
    ("1k", "1k"),
    ("1000k", "1M"),
    ("+3k", "3k"),
    ("-1Ki", "-1Ki"),
    ("1023", "1023"),
    ("12345678901234567890", "12345678901234567890"),
    ("9999999999999999999999999999999999999G", "9999999999999999999999999999999999999G"),
    ("Mi", "0"),  # Go's parser reads an empty number as zero
    (".", "0"),
]


@pytest.mark.parametrize(("text", "canonical"), CANONICAL)
def test_canonical_form_matches_go(text: str, canonical: str) -> None:
    assert str(Quantity.parse(text)) == canonical


@pytest.mark.parametrize(
    ("text", "message"),
    [
        *[(bad, ERR_FORMAT) for bad in ("1.1.M", "aoeu", " 1", "")],
        *[(bad, ERR_SUFFIX) for bad in ("1i", "0.1mi", "200K")],
    ],
)
def test_invalid_quantities_give_gos_message(text: str, message: str) -> None:
    with pytest.raises(QuantityError) as err:
        Quantity.parse(text)
    assert str(err.value) == message


def test_arithmetic_comparison_and_integers() -> None:
    q = Quantity.parse
    assert q("200M").cmp(q("0.2G")) == 0
    assert q("50M").cmp(q("50Mi")) == -1
    assert q("1Gi") == q("1024Mi")
    total = q("50k").add(Quantity.from_int(20, "DecimalExponent")).sub(q("100k"))
    assert total.sub(Quantity.from_int(-50000, "DecimalExponent")) == q("20")
    assert q("80Gi").as_int64() == 80 * 2**30
    assert q("1000m").as_int64() is None  # Go keeps scale -3: not an int64 without rounding
    assert q("1.5Gi").as_int64() is None  # Go's inf.Dec form never converts
    assert q("1.2").value_ceil() == 2
    assert str(Quantity.from_int(85899345920)) == "80Gi"
    assert str(Quantity.from_int(1000)) == "1k"


def test_semver_parse_and_order_follow_blang() -> None:
    v = Semver.parse
    assert v("1.2.3").compare(v("1.2.3+build")) == 0
    assert v("1.0.0-alpha").compare(v("1.0.0")) == -1
    assert v("1.0.0-alpha.1").compare(v("1.0.0-alpha.beta")) == -1
    assert v("1.0.0-2").compare(v("1.0.0-10")) == -1
    assert v("2.0.0").compare(v("10.0.0")) == -1
    assert Semver.parse_normalized("v01.2") == v("1.2.0")
    for bad, message in [
        ("1.0", "No Major.Minor.Patch elements found"),
        ("01.0.0", "Major number must not contain leading zeroes '01'"),
        ("1.0.0-01", "Numeric PreRelease version must not contain leading zeroes '01'"),
        ("1.0.0+", "Build meta data is empty"),
    ]:
        with pytest.raises(SemverError) as err:
            v(bad)
        assert str(err.value) == message


# Go's AsInt64 after resource.MustParse and Add/Sub (k8s.io/apimachinery v0.37.2),
# recorded with a small Go program: isInteger answers from how Go holds the value.
_GO_IS_INTEGER = [
    ("quantity('9999999999999999999999999999999999999G').isInteger()", False),
    ("quantity('99999999999999999999').isInteger()", False),
    ("quantity('1000m').isInteger()", False),
    ("quantity('10E18').isInteger()", False),
    ("quantity('9E18').isInteger()", True),
    ("quantity('1Ei').isInteger()", False),
    ("quantity('7Ei').isInteger()", False),
    ("quantity('100000000000000000000m').isInteger()", False),
    ("quantity('1').isInteger()", True),
    ("quantity('1500m').isInteger()", False),
    ("quantity('512Mi').isInteger()", True),
    ("quantity('0.5Gi').isInteger()", False),
    ("quantity('1e3').isInteger()", True),
    ("quantity('1E-3').isInteger()", False),
    ("quantity('9223372036854775807').add(1).sub(1).isInteger()", False),
    ("quantity('99999999999999999999').sub(quantity('99999999999999999998')).isInteger()", False),
    ("quantity('512Mi').add(1).sub(quantity('1')).asInteger() == 536870912", True),
    ("quantity('80Gi').add(quantity('1000m')).isInteger()", False),
    ("quantity('1').sub(quantity('500m')).add(quantity('500m')).isInteger()", False),
    ("quantity('2k').add(3).isInteger()", True),
    ("(quantity('1Ei')).isInteger()", False),
    ("((quantity('1')).add(quantity('1000m'))).isInteger()", False),
]


@pytest.mark.parametrize(("expression", "expected"), _GO_IS_INTEGER)
def test_is_integer_as_go(expression: str, expected: bool) -> None:
    env = CelEnvironment()
    selector = env.compile(expression)
    assert selector.error is None
    device = DeviceInput("gpu.example.com", Device(name="d"))
    assert env.matches(selector, env.activation(device)) is expected


def test_as_integer_of_a_decimal_fails() -> None:
    env = CelEnvironment()
    selector = env.compile("quantity('1Ei').asInteger() > 0")
    device = DeviceInput("gpu.example.com", Device(name="d"))
    with pytest.raises(CelError, match="cannot convert value to integer"):
        env.matches(selector, env.activation(device))
