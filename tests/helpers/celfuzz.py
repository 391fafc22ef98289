"""Seeded random CEL selectors over the differential cases' devices.

Expressions mix attribute and capacity lookups, literals of every type, the
Kubernetes libraries' constructors, operators, conversions and methods, nested
a few levels: many do not compile, many fail at run time, a few select devices.
tests/e2e/allocator/test_differential_cel.py runs each through ``gpudra allocate`` and
``reference-allocator`` and compares the outcome (refused, error, allocated,
unschedulable).

What users write is in it too: regexes as Go's regexp takes them (inline flags,
Unicode classes, POSIX classes, named groups, ``\\z``; and what Go refuses:
lookaround, backreferences, ``\\C``, ``\\Z``, stacked repetitions) through
``matches`` in both forms, ``find`` and ``findAll``; ``string.format`` clauses
on arguments of every type; quantity arithmetic ending in ``isInteger``.

Nothing is left out for a known difference: the ones left in
docs/differences.md (cel-cpp's own limits) need shapes this generator does not
make (maps of a dozen entries beside ``cel.bind``, comprehensions over
thousands of elements).
"""

from __future__ import annotations

import random

DOMAIN = "gpu.example.com"
A = f"device.attributes['{DOMAIN}']"
C = f"device.capacity['{DOMAIN}']"

PLAIN = (
    f"{A}.index",
    f"{A}.productName",
    f"{A}.driverVersion",
    f"{A}.type",
    f"{C}.memory",
    "device.driver",
    "1",
    "2u",
    "1.5",
    "'a'",
    "true",
    "null",
    "[1, 2]",
    "{'a': 1}",
    "b'x'",
    f"{A}.nothere",
    f"{A}.productName.size()",
    "duration('1h')",
    "timestamp('2020-01-01T00:00:00Z')",
    A,
)
CUSTOM = (
    "quantity('1Gi')",
    "semver('1.2.3')",
    "ip('1.2.3.4')",
    "format.dns1123Label()",
    "format.named('uuid')",
)
OPERATORS = ("==", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "%", "in", "&&", "||")
FUNCTIONS = ("size", "string", "int", "double", "uint", "dyn")
METHODS = (
    ".size()",
    ".lowerAscii()",
    ".isInteger()",
    ".asInteger()",
    ".major()",
    ".sum()",
    ".contains('a')",
    ".startsWith('N')",
    ".compareTo(quantity('1'))",
    ".isGreaterThan(semver('1.0.0'))",
    ".family()",
    ".hasValue()",
    ".validate('a')",
    ".exists(x, x == 1)",
    ".all(k, v, v != null)",
    ".map(x, x)",
    ".indexOf('a')",
    ".split(' ')",
    ".matches('a')",
    "[0]",
    "['a']",
    ".reverse()",
    ".distinct()",
    ".sort()",
    ".slice(0, 1)",
    ".flatten()",
)


# Patterns as users write them, Go-valid or not (single-quoted CEL strings).
REGEXES = (
    "^(?i)example gpu",
    "(?i)^EXAMPLE\\\\s+gpu\\\\s+(\\\\d+)gb$",
    "^\\\\pL+",
    "\\\\p{Greek}",
    "\\\\p{Letter}+",
    "\\\\PL",
    "[[:alpha:]]+",
    "[[:^digit:]]",
    "(?s)E.*B",
    "(?m)^G",
    "(?U)\\\\d+",
    "(?P<size>\\\\d+)GB",
    "(?<n>\\\\w+)",
    "GB\\\\z",
    "\\\\bGPU\\\\b",
    "\\\\d{2,3}",
    "\\\\QGPU 8\\\\E",
    "(|E)*",
    "x*",
    "\\\\C",
    "(?=G)",
    "(a)\\\\1",
    "\\\\Z",
    "a**",
    "x{1001}",
    "[z-a]",
    "(?P<>x)",
    "\\\\p{Klingon}",
)
FORMATS = ("%d", "%s", "%x", "%.2f", "%e", "%b", "%o", "%s %s", "%%", "%.0f", "%X")
FORMAT_ARGUMENTS = (
    "1234.5678",
    "-0.5",
    "123456789.0",
    "'Infinity'",
    "[1, 'a', 2.5]",
    "{'b': 1, 'a': true}",
    "duration('90s')",
    "timestamp('2020-01-01T00:00:00Z')",
    "255",
    "b'hi'",
)
QUANTITY_CHAINS = (
    "quantity('1Ei').isInteger()",
    "quantity('1000m').isInteger()",
    "quantity('9223372036854775807').add(1).sub(1).isInteger()",
    "quantity('512Mi').add(quantity('1')).asInteger() > 0",
    f"{C}.memory.sub(1).isInteger()",
)


def _user(rng: random.Random) -> str:
    """A call users write: a regex, a format clause, quantity arithmetic."""
    kind = rng.random()
    text = rng.choice((f"{A}.productName", "device.driver", f"{A}.type", "'GPU 80'"))
    pattern = f"'{rng.choice(REGEXES)}'"
    if kind < 0.35:
        return f"{text}.matches({pattern})"
    if kind < 0.45:
        return f"matches({text}, {pattern})"
    if kind < 0.6:
        return f"{text}.find({pattern}) == {rng.choice(['{}'.format(repr('')), text])}"
    if kind < 0.7:
        return f"{text}.findAll({pattern}{rng.choice(['', ', 1', ', 0'])}).size() > 0"
    if kind < 0.85:
        argument = rng.choice(PLAIN + CUSTOM + FORMAT_ARGUMENTS)
        call = f"'{rng.choice(FORMATS)}'.format([{argument}])"
        return rng.choice([f"{call} != ''", f"{call}.size() == {rng.randint(1, 14)}"])
    return rng.choice(QUANTITY_CHAINS)


def expression(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth == 0 and roll < 0.25:
        return _user(rng)
    if depth == 0:
        roll = rng.random()
    if depth > 2 or roll < 0.3:
        return rng.choice(PLAIN + CUSTOM)
    if roll < 0.6:
        op = rng.choice(OPERATORS)
        return f"({expression(rng, depth + 1)} {op} {expression(rng, depth + 1)})"
    if roll < 0.75:
        prefix = rng.choice(("!", "-", *FUNCTIONS, "has"))
        if prefix == "has":
            return f"has({A}.index)"
        inner = expression(rng, depth + 1)
        return f"{prefix}{inner}" if prefix in ("!", "-") else f"{prefix}({inner})"
    return f"{expression(rng, depth + 1)}{rng.choice(METHODS)}"
