"""A claim's derived attributes (validateDeviceDerivedAttributes, 1.37): values computed
by CEL per device for the claim's constraints to compare."""

from __future__ import annotations

from services.allocator.cel.env import CelEnvironment
from services.core.kube.resource import DeviceConstraint, DeviceDerivedAttribute
from services.offline.validation.cel import MAX_EXPRESSION, compile_error
from services.offline.validation.fields import forbidden, invalid, too_long
from services.offline.validation.lists import duplicates

DERIVED_COST_LIMIT = 1_000_000


class DerivedAttributes:
    """Each name used by a constraint on the request, each expression compiled; the
    claim's total cost bounded (so one claim is checked by one instance)."""

    def __init__(self, env: CelEnvironment, constraints: list[DeviceConstraint]) -> None:
        self.env = env
        self.total = 0
        self.used: dict[str, set[str]] = {}
        for constraint in constraints:
            name = constraint.match_attribute or constraint.distinct_attribute
            if name is None:
                continue
            for request in constraint.requests or [""]:
                self.used.setdefault(request, set()).add(name)

    def _referenced(self, name: str, request: str) -> bool:
        parent = request.split("/", 1)[0]
        return any(name in self.used.get(key, ()) for key in ("", request, parent))

    def check(
        self, attrs: list[DeviceDerivedAttribute] | None, path: str, request: str
    ) -> list[str]:
        errors: list[str] = []
        for i, attr in enumerate(attrs or []):
            where = f"{path}[{i}]"
            if attr.name and not self._referenced(attr.name, request):
                errors.append(
                    invalid(
                        f"{where}.name",
                        attr.name,
                        "must be referenced by at least one matchAttribute or "
                        "distinctAttribute constraint targeting this request",
                    )
                )
            if attr.expression:
                errors += self._expression(attr.expression, f"{where}.expression")
        return errors + duplicates((a.name for a in attrs or []), path)

    def _expression(self, expression: str, path: str) -> list[str]:
        if len(expression) > MAX_EXPRESSION:
            return [too_long(path, MAX_EXPRESSION)]
        compiled = self.env.compile(expression)
        error = compiled.error
        if error is not None and error.startswith("must evaluate to bool"):
            error = None  # a derived attribute is a value, not a match
        if error is None:
            self.total += compiled.cost or 0
            return []
        return compile_error(error, expression, path)

    def total_cost(self, path: str) -> list[str]:
        """Checked once every request of the claim has been."""
        if self.total <= DERIVED_COST_LIMIT:
            return []
        return [
            forbidden(
                path,
                "too complex, total cost of derived attribute CEL expressions in the claim "
                "exceeds cost limit",
            )
        ]
