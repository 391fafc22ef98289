"""Binding conditions (validateDeviceBindingParameters): what a device, and the allocation
result copied from it, makes the scheduler wait for before it binds a pod."""

from __future__ import annotations

from services.offline.validation.fields import duplicate, invalid
from services.offline.validation.lists import check_list, duplicates
from services.offline.validation.names import label_key
from services.offline.validation.rules import Rules

MAX_BINDING_CONDITIONS = 4


def binding_conditions(
    conditions: list[str] | None, failures: list[str] | None, path: str, rules: Rules
) -> list[str]:
    """Each list: at most 4 label keys; the two never overlap and come together."""
    good, bad = conditions or [], failures or []
    errors: list[str] = []
    for field, items in (("bindingConditions", good), ("bindingFailureConditions", bad)):
        where = f"{path}.{field}"

        def check(i: int, item: str, where: str = where) -> list[str]:
            return label_key(item, f"{where}[{i}]")

        errors += check_list(items, MAX_BINDING_CONDITIONS, where, rules, check)[0]
    errors += duplicates(good, f"{path}.bindingConditions")
    seen: set[str] = set()
    for i, item in enumerate(bad):
        if item in seen:
            errors.append(duplicate(f"{path}.bindingFailureConditions[{i}]", item))
        seen.add(item)
        if item in good:
            errors.append(
                invalid(
                    f"{path}.bindingFailureConditions[{i}]",
                    item,
                    "bindingFailureConditions must not overlap with bindingConditions",
                )
            )
    if not good and bad:
        errors.append(
            invalid(
                f"{path}.bindingConditions",
                good or None,
                "bindingConditions are required to use bindingFailureConditions",
            )
        )
    if not bad and good:
        errors.append(
            invalid(
                f"{path}.bindingFailureConditions",
                bad or None,
                "bindingFailureConditions are required to use bindingConditions",
            )
        )
    return errors
