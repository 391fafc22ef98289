"""CEL in created objects: device selectors (validateCELSelector) and what the API server
says when an expression does not compile, which derived attributes share."""

from __future__ import annotations

from services.allocator.cel.env import CelEnvironment
from services.core.kube.resource import DeviceSelector
from services.offline.validation.fields import forbidden, internal, invalid, required, too_long
from services.offline.validation.lists import check_list
from services.offline.validation.rules import Rules

MAX_SELECTORS = 32
MAX_EXPRESSION = 10 * 1024


def selectors(
    items: list[DeviceSelector] | None, path: str, env: CelEnvironment, rules: Rules
) -> list[str]:
    def check(i: int, selector: DeviceSelector) -> list[str]:
        if selector.cel is None:
            return [required(f"{path}[{i}].cel")]
        return _expression(selector.cel.expression, f"{path}[{i}].cel.expression", env)

    return check_list(items or [], MAX_SELECTORS, path, rules, check)[0]


def _expression(expression: str, path: str, env: CelEnvironment) -> list[str]:
    """validateCELSelector: too long, does not compile, or over the cost limit."""
    if len(expression) > MAX_EXPRESSION:
        return [too_long(path, MAX_EXPRESSION)]
    compiled = env.compile(expression)
    if compiled.error is None:
        return []
    return compile_error(compiled.error, expression, path)


def compile_error(error: str, expression: str, path: str) -> list[str]:
    """The API server's words for an expression the compiler refused with ``error``."""
    if error.startswith("too complex"):
        return [forbidden(path, "too complex, exceeds cost limit")]
    if error.startswith("program instantiation failed"):
        return [internal(path, error)]
    return [invalid(path, expression, error)]
