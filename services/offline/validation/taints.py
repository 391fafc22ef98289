"""Device taints and the tolerations that match them: on a device, in a request, in an
allocation result, and in a DeviceTaintRule. The effects a release knows differ."""

from __future__ import annotations

from services.core.kube.resource import DeviceTaint, DeviceTaintRule, Toleration
from services.offline.validation.fields import invalid, not_supported, required
from services.offline.validation.names import label_key, label_value
from services.offline.validation.rules import Rules

_TOLERATION_OPERATORS = ("Equal", "Exists")
_TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")  # sets.List: sorted


def taint_effects(minor: int) -> tuple[str, ...]:
    """validDeviceTaintEffects: ``None`` (a taint that only informs) came in 1.35."""
    return _TAINT_EFFECTS if minor >= 35 else ("NoExecute", "NoSchedule")


def toleration(item: Toleration, path: str, rules: Rules) -> list[str]:
    """validateDeviceToleration."""
    errors: list[str] = []
    if item.key:
        errors += label_key(item.key, f"{path}.key")
    operator = item.operator or ""
    value = item.value or ""
    if operator == "Exists":
        if value:
            errors.append(invalid(f"{path}.value", value, "must be empty for operator `Exists`"))
    elif operator == "Equal":
        errors += label_value(value, f"{path}.value")
    elif operator == "":
        errors.append(required(f"{path}.operator"))
    else:
        errors.append(not_supported(f"{path}.operator", operator, _TOLERATION_OPERATORS))
    effects = taint_effects(rules.minor)
    if item.effect and item.effect not in effects:
        errors.append(not_supported(f"{path}.effect", item.effect, effects))
    return errors


def taint(item: DeviceTaint, path: str, rules: Rules) -> list[str]:
    """validateDeviceTaint (the effects by release: taint_effects)."""
    errors = label_key(item.key, f"{path}.key")
    if item.value:
        errors += label_value(item.value, f"{path}.value")
    effects = taint_effects(rules.minor)
    if not item.effect:
        errors.append(required(f"{path}.effect"))
    elif item.effect not in effects:
        errors.append(not_supported(f"{path}.effect", item.effect, effects))
    return errors


def validate_taint_rule(rule: DeviceTaintRule, minor: int) -> list[str]:
    """The checks of validateDeviceTaintRule that matter offline (an effect no release
    knows is refused when decoding; ``None`` only from 1.35: taint_effects)."""
    errors = []
    if not rule.metadata.name:
        errors.append(required("metadata.name", "name or generateName is required"))
    if not rule.spec.taint.key:
        errors.append(required("spec.taint.key"))
    effects = taint_effects(minor)
    if rule.spec.taint.effect not in effects:
        errors.append(not_supported("spec.taint.effect", rule.spec.taint.effect, effects))
    return errors
