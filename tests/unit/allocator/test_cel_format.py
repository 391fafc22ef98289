"""Kubernetes' ``format`` CEL library in the DRA environment (formatlib.py).

``validate`` is over the cost limit in every selector, as in kube-apiserver, so
its results are checked in an environment without that limit; its messages are
apimachinery's, kube-openapi's and Go's ``url.ParseRequestURI``'s.
"""

from __future__ import annotations

import json

import pytest

from services.allocator.cel import cost as celcost
from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.selector import DeviceInput
from services.core.kube import names
from services.core.kube.resource import Device

DEVICE = DeviceInput("gpu.example.com", Device(name="gpu-0"))


@pytest.fixture(scope="module")
def env() -> CelEnvironment:
    return CelEnvironment()


@pytest.fixture(scope="module")
def unlimited() -> CelEnvironment:
    return CelEnvironment(cost_limit=celcost.UNBOUNDED * 10)


def run(env: CelEnvironment, expression: str) -> bool:
    selector = env.compile(expression)
    assert selector.error is None, selector.error
    return env.matches(selector, env.activation(DEVICE))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('format.named("dns1123Label").hasValue()', True),
        ('format.named("dns1123label").hasValue()', False),
        ('format.named("uuid").value() == format.uuid()', True),
        ("format.dns1123Label() == format.dns1035Label()", False),
        ('format.named("x").orValue(format.byte()) == format.byte()', True),
    ],
)
def test_named_formats(env: CelEnvironment, expression: str, expected: bool) -> None:
    assert run(env, expression) is expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        # kube-apiserver 1.35: validate is priced by the Format's unknown size.
        ('format.dns1123Label().validate("a") == optional.none()', "exceeds cost limit"),
        ('format.named("x") == optional.none()', "exceeds cost limit"),
        ("format.dns1123Label() != format.uuid()", "exceeds cost limit"),
        ("format.labelValue()", "not kubernetes.NamedFormat"),
        ('format.named("x")', "not optional_type(kubernetes.NamedFormat)"),
        ("format.nope().hasValue()", "undeclared reference"),
    ],
)
def test_refused(env: CelEnvironment, expression: str, fragment: str) -> None:
    error = env.compile(expression).error
    assert error is not None and fragment in error, error


def validated(name: str, value: str, expected: list[str]) -> str:
    """``format.named(name).value().validate(value)`` holds these messages (none: [])."""
    call = f"format.named({name!r}).value().validate({value!r})"
    return f"{call}.orValue([]) == {expected!r}"


_LABEL = names.regex_error(
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character",
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?",
    "my-name",
    "123-abc",
)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("dns1123Label", "my-name", []),
        ("dns1123Label", "a_b", [_LABEL]),
        ("dns1123Label", "a.b", ["must not contain dots"]),
        ("dns1123Label", "a" * 64, ["must be no more than 63 characters"]),
        ("dns1123LabelPrefix", "ab-", []),  # the dash a generated name ends with
        ("dns1123Label", "ab-", [_LABEL]),
        ("qualifiedName", "example.com/Name", []),
        ("qualifiedName", "/Name", ["prefix part must be non-empty"]),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000", []),
        ("uuid", "123e4567", ["does not match the UUID format"]),
        ("byte", "aGVsbG8=", []),
        ("byte", "aGVsbG8", ["invalid base64"]),
        ("date", "2024-02-29", []),
        ("date", "2023-02-29", ["invalid date"]),
        ("datetime", "2021-01-01T23:59:59.5+01:00", []),
        ("datetime", "2021-01-01T24:00:00Z", ["invalid datetime"]),
        ("uri", "http://example.com/a?b", []),
        ("uri", "x y", ['parse "x y": invalid URI for request']),
        ("uri", "http://a:b", ['parse "http://a:b": invalid port ":b" after host']),
        ("uri", "", ['parse "": empty url']),
        ("uri", "http://[::1]:80/", []),
        ("uri", "http://a b/", ['parse "http://a b/": invalid character " " in host name']),
        ("uri", "http://x/%zz", ['parse "http://x/%zz": invalid URL escape "%zz"']),
        ("uri", "http://a^b@x/", ['parse "http://a^b@x/": net/url: invalid userinfo']),
        ("uri", "mailto:a@b", []),
    ],
)
def test_validate(unlimited: CelEnvironment, name: str, value: str, expected: list[str]) -> None:
    assert run(unlimited, validated(name, value, expected))
    assert not run(unlimited, validated(name, value, [*expected, "x"]))


def test_a_valid_string_gives_none(unlimited: CelEnvironment) -> None:
    assert run(unlimited, 'format.dns1123Label().validate("a") == optional.none()')
    assert not run(unlimited, 'format.dns1123Label().validate("A") == optional.none()')


def test_names_word_for_word() -> None:
    """apimachinery's texts, including its double space before "or" and the
    three-part key's single message."""
    assert names.label_key("a/b/c") == [
        "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and "
        "must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  "
        "or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?"
        "[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
    ]
    assert names.label_value("-") == [
        "a valid label must be an empty string or consist of alphanumeric characters, '-', "
        "'_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  "
        "or 'my_value',  or '12345', regex used for validation is "
        "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    ]
    assert names.dns1035_label("1a")[0].startswith("a DNS-1035 label must consist")
    # util/validation counts characters, the content package (label keys, values) bytes.
    assert names.dns1123_label("a" * 64) == ["must be no more than 63 characters"]
    assert names.label_value("a" * 64) == ["must be no more than 63 bytes"]
    assert names.label_key("a" * 64) == ["name part must be no more than 63 bytes"]
    assert names.dns1123_subdomain("é") == [
        names.regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
            "characters, '-' or '.', and must start and end with an alphanumeric character",
            "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
            "example.com",
        )
    ]


# string.format's run-time text as cel-go writes it: each expected text is one
# reference-allocator 1.37 agreed with (the selector `<call> == "<text>"` allocated
# in both tools).
_GO_FORMAT = [
    ("'%s'.format([1.5])", "1.5"),
    ("'%s'.format([1e21])", "1e+21"),
    ("'%s'.format([0.1])", "0.1"),
    ("'%s'.format([1.0])", "1"),
    ("'%s'.format([-0.0])", "-0"),
    ("'%s'.format([123456789.0])", "1.23456789e+08"),
    ("'%s'.format([1e-5])", "1e-05"),
    ("'%s'.format([0.0001])", "0.0001"),
    ("'%s'.format([[1, 'a', 2.5, b'x', true, null]])", '[1, "a", 2.500000, b"x", true, null]'),
    ("'%s'.format([{'b': 1, 'a': [2.0]}])", '{"a":[2.000000], "b":1}'),
    ("'%s'.format([{2: 'x', 1: 'y'}])", '{1:"y", 2:"x"}'),
    ("'%s'.format([b'abc'])", "abc"),
    ("'%s'.format([duration('90s')])", "90s"),
    ("'%s'.format([duration('1.5s')])", "1.5s"),
    ("'%s'.format([timestamp('2020-01-01T00:00:00.25Z')])", "2020-01-01T00:00:00.25Z"),
    ("'%s'.format([2u])", "2"),
    ("'%s'.format([-5])", "-5"),
    ("'%d'.format([-5])", "-5"),
    ("'%d'.format([5u])", "5"),
    ("'%x'.format([255])", "ff"),
    ("'%X'.format([255])", "FF"),
    ("'%x'.format([-255])", "-ff"),
    ("'%x'.format(['hi'])", "6869"),
    ("'%X'.format([b'\\x01\\xff'])", "01FF"),
    ("'%o'.format([8])", "10"),
    ("'%o'.format([-8])", "-10"),
    ("'%b'.format([5])", "101"),
    ("'%b'.format([-5])", "-101"),
    ("'%b'.format([true])", "1"),
    ("'%f'.format([1.5])", "1.500000"),
    ("'%.2f'.format([1234.567])", "1,234.57"),
    ("'%.0f'.format([2.5])", "2"),
    ("'%f'.format([-0.5])", "-0.500000"),
    ("'%.3f'.format([1e20])", "100,000,000,000,000,000,000.000"),
    ("'%f'.format(['NaN'])", "NaN"),
    ("'%f'.format(['Infinity'])", "∞"),
    ("'%f'.format(['-Infinity'])", "-∞"),
    ("'%e'.format([1.5])", "1.500000×10⁰⁰"),  # noqa: RUF001
    ("'%.2e'.format([0.000123])", "1.230000×10⁻⁰⁴"),  # noqa: RUF001
    ("'%e'.format([-1e-300])", "-1.000000×10⁻³⁰⁰"),  # noqa: RUF001
    ("'%e'.format(['NaN'])", "   NaN"),
    ("'%.10e'.format(['Infinity'])", "         ∞"),
    ("'%s'.format([[[1], {'k': 'v'}]])", '[[1], {"k":"v"}]'),
    ("'%s'.format([[dyn(1.0)]])", "[1.000000]"),
    ("'%s'.format([{true: 1}])", "{true:1}"),
    ("'%s'.format([['a\\nb', 'é', '\"q\"']])", '["a\\nb", "é", "\\"q\\""]'),
    (
        "'%s'.format([[[duration('1m')], [timestamp('2020-01-01T00:00:00Z')]]])",
        '[[duration("60s")], [timestamp("2020-01-01T00:00:00Z")]]',
    ),
    ("'%s'.format([[1.0/0.0]])", '["+Inf"]'),
    ("'%s %s'.format(['a', 1])", "a 1"),
    ("'%s'.format([['\\u00ad']])", '["\\u00ad"]'),
]


@pytest.mark.parametrize(("call", "text"), _GO_FORMAT)
def test_format_text_as_cel_go(call: str, text: str) -> None:
    env = CelEnvironment()
    selector = env.compile(f"{call} == {json.dumps(text, ensure_ascii=False)}")
    assert selector.error is None, selector.error
    device = DeviceInput("gpu.example.com", Device(name="d"))
    assert env.matches(selector, env.activation(device)), call
