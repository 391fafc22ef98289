"""A consumable capacity's request policy (validateCapacityRequestPolicy): the values a
request may consume of a device shared between allocations, as a list or a range."""

from __future__ import annotations

from dataclasses import dataclass

from services.core.kube.quantity import Quantity, QuantityError
from services.core.kube.resource import CapacityRequestPolicy
from services.offline.validation.fields import (
    duplicate,
    forbidden,
    internal,
    invalid,
    required,
    too_many,
)
from services.offline.validation.rules import Rules

MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions
_NANO = 10**9
_INT64_MAX = 2**63 - 1


def _q(text: str) -> Quantity:
    return Quantity.parse(text)


def request_policy(
    capacity: str, policy: CapacityRequestPolicy, path: str, rules: Rules
) -> list[str]:
    """The policy of a capacity whose value is ``capacity``: a list or a range of values."""
    try:
        return _policy_checks(_q(capacity), policy, path, rules)
    except QuantityError:
        return []  # the quantity check names it


def _policy_checks(
    maximum: Quantity, policy: CapacityRequestPolicy, path: str, rules: Rules
) -> list[str]:
    if policy.valid_values and policy.valid_range is not None:
        return [
            forbidden(
                path,
                'exactly one policy can be specified, cannot specify "validValues" and '
                '"validRange" at the same time',
            )
        ]
    if policy.valid_values:
        if policy.default is None:
            return [required(f"{path}.default", "required when validValues is defined")]
        return _valid_values(
            _q(policy.default), maximum, policy.valid_values, f"{path}.validValues", rules
        )
    if policy.valid_range is not None:
        if policy.default is None:
            return [required(f"{path}.default", "required when validRange is defined")]
        return _valid_range(_q(policy.default), maximum, policy, f"{path}.validRange", rules)
    return []


def _valid_values(
    default: Quantity, maximum: Quantity, values: list[str], path: str, rules: Rules
) -> list[str]:
    """validateRequestPolicyValidValues: sorted, at most 10, none above the capacity,
    unique (by integer value, or exactly with DRAFractionalCapacityRange), the default
    among them."""
    errors: list[str] = []
    parsed = [_q(v) for v in values]
    for i in range(len(parsed) - 1):
        if parsed[i].cmp(parsed[i + 1]) > 0:
            errors.append(
                invalid(
                    f"{path}[{i + 1}]",
                    str(parsed[i + 1]),
                    "values must be sorted in ascending order",
                )
            )
    found = False
    over = len(parsed) > MAX_VALID_VALUES
    if over and rules.minor >= 35:  # validateSet stops there from 1.35
        errors.append(too_many(path, len(parsed), MAX_VALID_VALUES))
    else:
        for i, option in enumerate(parsed):
            if option.cmp(maximum) > 0:
                errors.append(
                    invalid(
                        f"{path}[{i}]",
                        str(option),
                        f"option is larger than capacity value: {maximum}",
                    )
                )
            found = found or option.cmp(default) == 0
        if over:
            errors.append(too_many(path, len(parsed), MAX_VALID_VALUES))
        exact = rules.minor >= 37 and rules.fractional_range
        keys = [option.nanos() if exact else option.value_ceil() for option in parsed]
        for i, key in enumerate(keys):
            if key in keys[:i]:
                errors.append(duplicate(f"{path}[{i}]", _key_text(parsed[i], exact)))
    if not found:
        errors.append(
            invalid(path, str(default), "default value is not valid according to the requestPolicy")
        )
    return errors


def _key_text(value: Quantity, exact: bool) -> str:
    """quantityKeyAsDec / quantityKeyInt: what Duplicate value prints."""
    if not exact:
        return str(value.value_ceil())
    nanos = value.nanos()
    whole, fraction = divmod(abs(nanos), _NANO)
    sign = "-" if nanos < 0 else ""
    if fraction == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{fraction:09d}".rstrip("0")


@dataclass(frozen=True, slots=True)
class _Range:
    """A validRange with its default, parsed."""

    default: Quantity
    low: Quantity
    high: Quantity | None
    step: Quantity | None

    def named(self) -> list[tuple[str, Quantity]]:
        """The quantities given, by field name, in the order the API server checks them."""
        fields = ("default", self.default), ("min", self.low), ("max", self.high)
        return [(name, q) for name, q in (*fields, ("step", self.step)) if q is not None]


def _valid_range(
    default: Quantity, maximum: Quantity, policy: CapacityRequestPolicy, path: str, rules: Rules
) -> list[str]:
    """validateRequestPolicyRange (1.37 names the default's own field, checks steps in
    milli units with DRAFractionalCapacityRange and bounds the integer path)."""
    rng = policy.valid_range
    assert rng is not None
    new = rules.minor >= 37
    low = _q(rng.min)
    high = _q(rng.max) if rng.max is not None else None
    step = _q(rng.step) if rng.step is not None else None
    range_ = _Range(default, low, high, step)
    errors = _range_bounds(range_, maximum, path, new)
    milli = False
    if new and rules.fractional_range:
        milli = any(_fractional(q) for _, q in range_.named())
        unsafe = [
            invalid(f"{path}.{name}", str(q), "value cannot be represented as a milli value")
            for name, q in range_.named()
            if not _milli_exact(q)
        ]
        if milli and unsafe:
            return errors + unsafe
    if step is None:
        return errors
    return errors + _range_step(range_, step, maximum, path, rules, milli)


def _range_bounds(range_: _Range, maximum: Quantity, path: str, new: bool) -> list[str]:
    """min and max within the capacity and in order, the default between them."""
    default, low, high = range_.default, range_.low, range_.high
    errors: list[str] = []
    if low.cmp(maximum) > 0:
        errors.append(
            invalid(f"{path}.min", str(low), f"min is larger than capacity value: {maximum}")
        )
    if default.cmp(low) < 0:
        at = f"{path}.default" if new else f"{path}.min"
        errors.append(invalid(at, str(default), f"default is less than min: {low}"))
    if high is not None:
        if low.cmp(high) > 0:
            errors.append(invalid(f"{path}.max", str(low), f"min is larger than max: {high}"))
        if high.cmp(maximum) > 0:
            errors.append(
                invalid(f"{path}.max", str(high), f"max is larger than capacity value: {maximum}")
            )
        if default.cmp(high) > 0:
            at = f"{path}.default" if new else f"{path}.max"
            errors.append(invalid(at, str(default), f"default is more than max: {high}"))
    return errors


def _range_step(
    range_: _Range, step: Quantity, maximum: Quantity, path: str, rules: Rules, milli: bool
) -> list[str]:
    """The step: positive, one step from min within the capacity, and the default and max
    each a whole number of steps from min (in milli units when ``milli``)."""
    new = rules.minor >= 37
    if new and step.sign() <= 0:
        return [invalid(f"{path}.step", str(step), "must be greater than zero")]
    if not new and step.value_ceil() == 0:
        # Upstream 1.35 divides by the step's Value() unchecked: kube-apiserver panics
        # (the request fails with 500, nothing is stored); refused here in words.
        return [
            internal(
                f"{path}.step",
                f"kube-apiserver 1.{rules.minor} fails on a step whose integer value is 0 "
                "(integer divide by zero) and stores nothing",
            )
        ]
    errors: list[str] = []
    one = range_.low.add(step)
    if one.cmp(maximum) > 0:
        errors.append(
            invalid(
                f"{path}.step",
                str(step),
                f"one step {one} is larger than capacity value: {maximum}",
            )
        )
    if new and not milli:
        problems = [p for p in (_int64_bound(q, f"{path}.{n}") for n, q in range_.named()) if p]
        if problems:
            return errors + problems
    high = range_.high
    for value in [range_.default] + ([high] if high is not None else []):
        errors += _on_step(value, range_.low, step, f"{path}.step", milli)
    return errors


def _fractional(value: Quantity) -> bool:
    return value.nanos() % _NANO != 0


def _milli(value: Quantity) -> int:
    """MilliValue: rounded up to whole thousandths."""
    return -(-value.nanos() // 10**6)


def _milli_exact(value: Quantity) -> bool:
    return value.nanos() % 10**6 == 0 and abs(_milli(value)) <= _INT64_MAX


def _int64_bound(value: Quantity, path: str) -> str | None:
    """validateInt64Range."""
    if value.sign() < 0:
        return invalid(path, str(value), "must be greater than or equal to 0")
    if value.cmp(Quantity(_INT64_MAX)) > 0:
        return invalid(path, str(value), "must not be larger than 9223372036854775807")
    return None


def _on_step(value: Quantity, low: Quantity, step: Quantity, path: str, milli: bool) -> list[str]:
    if milli:
        step_value, offset = _milli(step), _milli(value) - _milli(low)
    else:
        step_value, offset = step.value_ceil(), value.value_ceil() - low.value_ceil()
    if step_value and offset % step_value != 0:
        return [
            invalid(
                path, str(value), f"value is not a multiple of a given step ({step}) from ({low})"
            )
        ]
    return []
