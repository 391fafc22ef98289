# ruff: noqa: RUF001 (Greek letters, the Kelvin sign and long s are what is tested)
"""Go's regexp as CEL's ``matches`` and Kubernetes' ``find`` / ``findAll`` run it
(services/allocator/cel/goregexp.py).

Every expectation below is what Go 1.26's ``regexp`` answered (``MatchString``,
``FindString``, ``FindAllString(s, -1)``, or ``regexp.Compile``'s error), recorded
with a small Go program; tests/e2e/allocator/test_differential_cel.py checks the same through
kube-apiserver's and kube-scheduler's own code.
"""

from __future__ import annotations

import pytest

from services.allocator.cel import goregexp
from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.regexptree import ERR_LARGE, ERR_NESTING_DEPTH, RegexpError
from services.allocator.cel.selector import DeviceInput
from services.core.kube.resource import Device, DeviceAttribute

GO_CASES = [
    ("^(?i)h100$", "H100", (True, "H100", ["H100"])),
    ("^\\pL\\d+$", "α1", (True, "α1", ["α1"])),
    ("^\\pL\\d+$", "_1", (False, "", [])),
    ("\\p{Greek}+", "xαβγy", (True, "αβγ", ["αβγ"])),
    ("(?s)a.b", "a\nb", (True, "a\nb", ["a\nb"])),
    ("a.b", "a\nb", (False, "", [])),
    ("(?m)^b$", "a\nb\nc", (True, "b", ["b"])),
    ("^b$", "a\nb\nc", (False, "", [])),
    ("a$", "a\n", (False, "", [])),
    ("(?U)a+", "aaa", (True, "a", ["a", "a", "a"])),
    ("(?U)a+?", "aaa", (True, "aaa", ["aaa"])),
    ("(?P<x>a)(?<y>b)", "ab", (True, "ab", ["ab"])),
    ("a\\z", "a", (True, "a", ["a"])),
    ("[[:alpha:]]+", "ab1", (True, "ab", ["ab"])),
    ("[[:^digit:]]+", "ab1", (True, "ab", ["ab"])),
    ("(?i)k", "K", (True, "K", ["K"])),
    ("(?i)ſ", "S", (True, "S", ["S"])),
    ("(?i)σ", "ς", (True, "ς", ["ς"])),
    ("\\p{Letter}+", "ab", (True, "ab", ["ab"])),
    ("\\p{lu}", "A", (True, "A", ["A"])),
    ("\\p{Cased_Letter}", "a", (True, "a", ["a"])),
    ("\\p{Assigned}", "\u0378", (False, "", [])),
    ("\\p{^Greek}", "α", (False, "", [])),
    ("\\PL", "α1", (True, "1", ["1"])),
    ("\\QH100.\\E", "H100x", (False, "", [])),
    ("\\bH\\d+\\b", "NVIDIA H100 80GB", (True, "H100", ["H100"])),
    ("\\BB", "ABC", (True, "B", ["B"])),
    ("\\B", "aσa", (False, "", [])),
    ("(|a)*", "aa", (True, "", ["", "", ""])),
    ("x*", "axxb", (True, "", ["", "xx", ""])),
    ("\\d{2,3}", "12345", (True, "123", ["123", "45"])),
    ("\\x{3a3}", "Σ", (True, "Σ", ["Σ"])),
    ("\\x41", "A", (True, "A", ["A"])),
    ("[\\d\\s]+", "1 2", (True, "1 2", ["1 2"])),
    ("\\p{So}", "\u2ffc", (False, "", [])),
    ("\\p{Lu}", "\u1c89", (False, "", [])),
    ("a|ab", "ab", (True, "a", ["a"])),
    ("(a+)(b)?", "aab", (True, "aab", ["aab"])),
    ("[^a]", "\n", (True, "\n", ["\n"])),
    ("(?i)ǅ", "ǆ", (True, "ǆ", ["ǆ"])),
    ("\\pN+", "٣4", (True, "٣4", ["٣4"])),
    ("\\d", "٣", (False, "", [])),
    ("\\w+", "é", (False, "", [])),
    ("(?i)[^k]", "K", (False, "", [])),
    ("^", "", (True, "", [""])),
    ("", "ab", (True, "", ["", "", ""])),
    ("(", "", "error parsing regexp: missing closing ): `(`"),
    (")", "", "error parsing regexp: unexpected ): `)`"),
    ("a**", "", "error parsing regexp: invalid nested repetition operator: `**`"),
    ("a++", "", "error parsing regexp: invalid nested repetition operator: `++`"),
    ("a{1001}", "", "error parsing regexp: invalid repeat count: `{1001}`"),
    ("a{2}{3}", "", "error parsing regexp: invalid nested repetition operator: `{2}{3}`"),
    ("(a{500}){3}", "", "error parsing regexp: invalid repeat count: `{3}`"),
    ("\\1", "", "error parsing regexp: invalid escape sequence: `\\1`"),
    ("(a)\\1", "", "error parsing regexp: invalid escape sequence: `\\1`"),
    ("(?=a)", "", "error parsing regexp: invalid or unsupported Perl syntax: `(?=`"),
    ("(?!a)", "", "error parsing regexp: invalid or unsupported Perl syntax: `(?!`"),
    ("(?<=a)", "", "error parsing regexp: invalid named capture: `(?<=a)`"),
    ("\\Z", "", "error parsing regexp: invalid escape sequence: `\\Z`"),
    ("\\C", "", "error parsing regexp: invalid escape sequence: `\\C`"),
    ("[z-a]", "", "error parsing regexp: invalid character class range: `z-a`"),
    ("[[:foo:]]", "", "error parsing regexp: invalid character class range: `[:foo:]`"),
    ("\\p{Foo}", "", "error parsing regexp: invalid character class range: `\\p{Foo}`"),
    ("\\p", "", "error parsing regexp: invalid character class range: `\\p`"),
    ("\\pX", "", "error parsing regexp: invalid character class range: `\\pX`"),
    ("(?P<>a)", "", "error parsing regexp: invalid named capture: `(?P<>`"),
    ("(?P<a-b>x)", "", "error parsing regexp: invalid named capture: `(?P<a-b>`"),
    ("(?x)a", "", "error parsing regexp: invalid or unsupported Perl syntax: `(?x`"),
    ("\\", "", "error parsing regexp: trailing backslash at end of expression: ``"),
    ("[a", "", "error parsing regexp: missing closing ]: `[a`"),
    ("*", "", "error parsing regexp: missing argument to repetition operator: `*`"),
    ("\\x{110000}", "", "error parsing regexp: invalid escape sequence: `\\x{110000`"),
    ("\\8", "", "error parsing regexp: invalid escape sequence: `\\8`"),
    ("x{1,2}{3}", "", "error parsing regexp: invalid nested repetition operator: `{1,2}{3}`"),
    ("a{,5}", "a{,5}", (True, "a{,5}", ["a{,5}"])),
    ("{", "{", (True, "{", ["{"])),
]


@pytest.mark.parametrize(("pattern", "text", "expected"), GO_CASES)
def test_as_go(pattern: str, text: str, expected: object) -> None:
    if isinstance(expected, str):
        with pytest.raises(RegexpError) as raised:
            goregexp.check(pattern)
        assert str(raised.value) == expected
        return
    assert (
        goregexp.matches(text, pattern),
        goregexp.find(text, pattern),
        goregexp.find_all(text, pattern),
    ) == expected


@pytest.mark.parametrize(
    "pattern",
    ["(" * 1001 + ")" * 1001, "(?:" + "a" * 3400 + "){1000}"],
    ids=["nests too deeply", "too large"],
)
def test_limits_as_go(pattern: str) -> None:
    with pytest.raises(RegexpError) as raised:
        goregexp.check(pattern)
    assert raised.value.code in (ERR_NESTING_DEPTH, ERR_LARGE)
    goregexp.check("(" * 999 + "a" + ")" * 999)  # 999 deep is fine
    assert goregexp.find_all("aaaa", "a", 2) == ["a", "a"]


def test_unicode_tables_are_go_s() -> None:
    """Unicode 15.0.0 (Go's), not the newer tables of the RE2 that runs the pattern:
    U+2FFC was assigned in 15.1, U+1C89 in 16.0."""
    assert not goregexp.matches("\u2ffc", r"\p{So}")
    assert not goregexp.matches("\u1c89", r"\p{Lu}")
    assert goregexp.matches("\u2ff0", r"\p{So}")


_A = "device.attributes['gpu.example.com']"
_INVALID = "compilation failed: ERROR: <input>:1:{}: invalid matches argument"


@pytest.fixture(scope="module")
def env() -> CelEnvironment:
    return CelEnvironment()


def _run(env: CelEnvironment, expression: str) -> object:
    device = Device(
        name="gpu-0",
        attributes={
            "productName": DeviceAttribute(string="NVIDIA H100 80GB HBM3"),
            "model": DeviceAttribute(string="αβ1"),
        },
    )
    selector = env.compile(expression)
    if selector.error:
        return selector.error.splitlines()[0]
    return env.matches(selector, env.activation(DeviceInput("gpu.example.com", device)))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'{_A}.productName.matches("^(?i)nvidia h100")', True),
        (f'{_A}.model.matches("^\\\\pL+\\\\d$")', True),
        (f'{_A}.model.matches("^\\\\p{{Greek}}{{2}}")', True),
        (f'{_A}.productName.matches("(?i)^nvidia\\\\s+a100")', False),
        (f'matches({_A}.productName, "H\\\\d+")', True),
        (f'{_A}.productName.find("(?i)h(\\\\d+)") == "H100"', True),
        (f'{_A}.productName.findAll("\\\\d+") == ["100", "80", "3"]', True),
        (f'{_A}.productName.findAll("\\\\d+", 1) == ["100"]', True),
        # Refused as kube-apiserver refuses them: at compile time a literal pattern
        # (the function form checks its first argument), at planning the function
        # form's pattern and find's.
        (f'{_A}.model.matches("\\\\C")', _INVALID.format(52)),
        (f'{_A}.model.matches("(?=x)")', _INVALID.format(52)),
        (f'matches("(", {_A}.model)', _INVALID.format(9)),
        (
            f'matches({_A}.model, "(")',
            "program instantiation failed: error parsing regexp: missing closing ): `(`",
        ),
        (
            f'{_A}.model.find("a**") == ""',
            "program instantiation failed: error parsing regexp: "
            "invalid nested repetition operator: `**`",
        ),
    ],
)
def test_selectors(env: CelEnvironment, expression: str, expected: object) -> None:
    assert _run(env, expression) == expected


def test_computed_pattern_fails_the_device(env: CelEnvironment) -> None:
    from services.allocator.cel.selector import CelError

    with pytest.raises(CelError, match=r"error parsing regexp: missing closing \): `αβ1\(`"):
        _run(env, f'{_A}.productName.matches({_A}.model + "(")')
    with pytest.raises(CelError, match=r"Illegal regex: error parsing regexp: invalid escape"):
        _run(env, f'{_A}.productName.find({_A}.model + "\\\\C") == ""')
