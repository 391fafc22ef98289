"""Seeded random CEL selectors over the differential cases' devices.

Expressions mix attribute and capacity lookups, literals of every type, the
Kubernetes libraries' constructors, operators, conversions and methods, nested
a few levels: many do not compile, many fail at run time, a few select devices.
tests/e2e/test_differential_cel.py runs each through ``gpudra allocate`` and
``reference-allocator`` and compares the outcome (refused, error, allocated,
unschedulable).

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


def expression(rng: random.Random, depth: int = 0) -> str:
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
