"""Consumable capacity (KEP-5075, gate DRAConsumableCapacity), as Kubernetes 1.34-1.37 compute it.

A request asks for amounts of a device's capacities. Each asked amount is
rounded up by the capacity's ``requestPolicy`` (to ``validRange.min`` and the
next ``step``, or to the next of ``validValues``); a capacity the request does
not mention consumes the policy's ``default``, or all of it when there is none.
A device fits when, for every capacity, what is already consumed plus what is
being allocated plus this request stays within the capacity's value and the
rounded amount obeys the policy.

Releases differ (structured/internal/*/consumable_capacity.go): up to 1.36 a
range is rounded in whole units (``Value()``, rounded up) and the result is
BinarySI; 1.37 keeps the step's format and, with DRAFractionalCapacityRange,
rounds in milli units (``useMilli``) so ``0.5`` steps work; and 1.37 refuses a
request it cannot represent (or a negative amount) with an error that stops the
claim (:class:`CapacityError`), where 1.36 just skipped the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.core.kube.quantity import Quantity
from services.core.kube.resource import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    DeviceCapacity,
)

Consumed = dict[str, Quantity]

_INT64_MAX = 2**63 - 1
_NOT_REPRESENTABLE = "capacity request cannot be represented in the device's range arithmetic"


class UnknownCapacity(ValueError):
    """The request names a capacity the device does not have."""


class CapacityError(ValueError):
    """1.37: a request that cannot be represented, or a negative amount (stops the claim)."""


@dataclass(frozen=True, slots=True)
class Rules:
    """How one release computes capacity: ``fractional`` is DRAFractionalCapacityRange,
    ``v137`` the 1.37 code (step format kept, errors instead of skipping)."""

    fractional: bool = False
    v137: bool = False


OLD = Rules()


def _q(text: str | None) -> Quantity | None:
    return Quantity.parse(text) if text is not None else None


def _safe_milli(q: Quantity) -> int | None:
    """safeMilliValue: the value in milli units if that is exact (and fits int64)."""
    nanos = q.nanos()
    if nanos % 10**6:
        return None
    milli = nanos // 10**6
    return milli if -(2**63) <= milli <= _INT64_MAX else None


def _use_milli(valid_range: CapacityRequestPolicyRange, rules: Rules) -> bool:
    if not rules.fractional:
        return False
    for i, text in enumerate((valid_range.min, valid_range.max, valid_range.step)):
        if text is None:
            continue
        milli = _safe_milli(Quantity.parse(text))
        if milli is None or (i == 2 and milli < 1):
            return False
    return True


def _milli_ceil(q: Quantity) -> int:
    """Go's MilliValue(): rounded up to whole milli units."""
    return -(-q.nanos() // 10**6)


def _round_up(requested: Quantity, policy: CapacityRequestPolicy, rules: Rules) -> Quantity:
    valid_range = policy.valid_range
    if valid_range is not None and valid_range.min is not None:
        low = Quantity.parse(valid_range.min)
        if requested.cmp(low) < 0:
            return low
        if valid_range.step is None:
            return requested
        step_q = Quantity.parse(valid_range.step)
        if not rules.v137:
            step = step_q.value_ceil()
            base = low.value_ceil()
            added = requested.value_ceil() - base
            steps = -(-added // step)
            return Quantity.from_int(base + step * steps, "BinarySI")
        if _use_milli(valid_range, rules):
            wanted = _safe_milli(requested)
            if wanted is None:
                raise CapacityError(
                    f"{_NOT_REPRESENTABLE}: request {requested} is not a representable milli value"
                )
            step, base = _milli_ceil(step_q), _milli_ceil(low)
            steps = -(-(wanted - base) // step)
            if steps > (_INT64_MAX - base) // step:
                raise CapacityError(
                    f"{_NOT_REPRESENTABLE}: rounding request {requested} up to the next step "
                    "passes the milli-value range"
                )
            milli = base + step * steps
            if milli % 1000 == 0:
                return Quantity(milli // 1000, 0, step_q.format)
            return Quantity(milli, -3, step_q.format)
        if requested.nanos() > _INT64_MAX * 10**9:
            raise CapacityError(f"{_NOT_REPRESENTABLE}: request {requested} exceeds MaxInt64")
        step, base = step_q.value_ceil(), low.value_ceil()
        steps = -(-(requested.value_ceil() - base) // step)
        if base >= 0 and steps > (_INT64_MAX - base) // step:
            raise CapacityError(
                f"{_NOT_REPRESENTABLE}: rounding request {requested} up to the next step "
                "passes MaxInt64"
            )
        return Quantity(base + step * steps, 0, step_q.format)
    for value in policy.valid_values or []:
        candidate = Quantity.parse(value)
        if requested.cmp(candidate) <= 0:
            return candidate
    return requested


def consumed_amount(
    requested: Quantity | None, capacity: DeviceCapacity, rules: Rules = OLD
) -> Quantity:
    """calculateConsumedCapacity: what one request takes of one capacity."""
    policy = capacity.request_policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return Quantity.parse(policy.default)
        return Quantity.parse(capacity.value)
    if policy is None:
        return requested
    return _round_up(requested, policy, rules)


def violates_policy(
    amount: Quantity, policy: CapacityRequestPolicy | None, rules: Rules = OLD
) -> bool:
    if policy is None:
        return False
    default = _q(policy.default)
    if default is not None and amount == default:
        return False
    if policy.valid_range is not None:
        high = _q(policy.valid_range.max)
        if high is not None and amount.cmp(high) > 0:
            return True
        if policy.valid_range.step is not None:
            low = _q(policy.valid_range.min) or Quantity(0)
            step_q = Quantity.parse(policy.valid_range.step)
            if rules.v137 and _use_milli(policy.valid_range, rules):
                wanted = _safe_milli(amount)
                if wanted is None:
                    return True
                return (wanted - _milli_ceil(low)) % _milli_ceil(step_q) != 0
            step = step_q.value_ceil()
            return (amount.value_ceil() - low.value_ceil()) % step != 0
        return False
    if policy.valid_values:
        return all(amount.cmp(Quantity.parse(v)) != 0 for v in policy.valid_values)
    return False


def fits(
    consumed: Consumed,
    requested: dict[str, Quantity] | None,
    capacities: dict[str, DeviceCapacity],
    allocating: Consumed | None,
    rules: Rules = OLD,
) -> bool:
    """CmpRequestOverCapacity; raises :class:`UnknownCapacity` (the device is skipped) and,
    with 1.37's rules, :class:`CapacityError` (the claim stops)."""
    for name in requested or {}:
        if name not in capacities:
            raise UnknownCapacity("some requested capacity has not been defined")
    amounts: dict[str, Quantity] = {}
    if rules.v137:
        # 1.37 resolves every amount first, so an error does not depend on map order.
        for name, capacity in capacities.items():
            try:
                amount = consumed_amount((requested or {}).get(name), capacity, rules)
            except CapacityError as exc:
                raise CapacityError(f'capacity "{name}": {exc}') from exc
            if amount.sign() < 0:
                raise CapacityError(f'capacity "{name}": capacity value is negative')
            amounts[name] = amount
    for name, capacity in capacities.items():
        amount = amounts.get(name) or consumed_amount((requested or {}).get(name), capacity, rules)
        if violates_policy(amount, capacity.request_policy, rules):
            return False
        total = amount
        if name in consumed:
            total = consumed[name].add(total)
        if allocating and name in allocating:
            total = total.add(allocating[name])
        if total.cmp(Quantity.parse(capacity.value)) > 0:
            return False
    return True


def consumption(
    requested: dict[str, Quantity] | None,
    capacities: dict[str, DeviceCapacity],
    rules: Rules = OLD,
) -> Consumed:
    """GetConsumedCapacityFromRequest: the amounts a shared allocation records."""
    return {
        name: consumed_amount((requested or {}).get(name), cap, rules)
        for name, cap in capacities.items()
    }


def add_into(target: Consumed, amounts: Consumed) -> None:
    for name, amount in amounts.items():
        target[name] = target[name].add(amount) if name in target else amount


def remove_from(target: Consumed, amounts: Consumed) -> None:
    for name, amount in amounts.items():
        if name in target:
            target[name] = target[name].sub(amount)
