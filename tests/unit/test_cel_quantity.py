"""Kubernetes Quantity and blang semver semantics, case by case (values from Go's behaviour)."""

from __future__ import annotations

import pytest

from services.allocator.cel.semver import Semver, SemverError
from services.core.quantity import ERR_FORMAT, ERR_SUFFIX, Quantity, QuantityError

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
