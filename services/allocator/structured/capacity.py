"""Consumable capacity (KEP-5075, gate DRAConsumableCapacity), as Kubernetes 1.35 computes it.

A request asks for amounts of a device's capacities. Each asked amount is
rounded up by the capacity's ``requestPolicy`` (to ``validRange.min`` and the
next ``step``, or to the next of ``validValues``); a capacity the request does
not mention consumes the policy's ``default``, or all of it when there is none.
A device fits when, for every capacity, what is already consumed plus what is
being allocated plus this request stays within the capacity's value and the
rounded amount obeys the policy.
"""

from __future__ import annotations

from services.core.quantity import Quantity
from services.core.resource import CapacityRequestPolicy, DeviceCapacity

Consumed = dict[str, Quantity]


class UnknownCapacity(ValueError):
    """The request names a capacity the device does not have."""


def _q(text: str | None) -> Quantity | None:
    return Quantity.parse(text) if text is not None else None


def _round_up(requested: Quantity, policy: CapacityRequestPolicy) -> Quantity:
    valid_range = policy.valid_range
    if valid_range is not None and valid_range.min is not None:
        low = Quantity.parse(valid_range.min)
        if requested.cmp(low) < 0:
            return low
        if valid_range.step is None:
            return requested
        step = Quantity.parse(valid_range.step).value_ceil()
        base = low.value_ceil()
        added = requested.value_ceil() - base
        steps = -(-added // step)
        return Quantity.from_int(base + step * steps, "BinarySI")
    for value in policy.valid_values or []:
        candidate = Quantity.parse(value)
        if requested.cmp(candidate) <= 0:
            return candidate
    return requested


def consumed_amount(requested: Quantity | None, capacity: DeviceCapacity) -> Quantity:
    """calculateConsumedCapacity: what one request takes of one capacity."""
    policy = capacity.request_policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return Quantity.parse(policy.default)
        return Quantity.parse(capacity.value)
    if policy is None:
        return requested
    return _round_up(requested, policy)


def violates_policy(amount: Quantity, policy: CapacityRequestPolicy | None) -> bool:
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
            step = Quantity.parse(policy.valid_range.step).value_ceil()
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
) -> bool:
    """CmpRequestOverCapacity; raises :class:`UnknownCapacity`."""
    for name in requested or {}:
        if name not in capacities:
            raise UnknownCapacity("some requested capacity has not been defined")
    for name, capacity in capacities.items():
        amount = consumed_amount((requested or {}).get(name), capacity)
        if violates_policy(amount, capacity.request_policy):
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
    requested: dict[str, Quantity] | None, capacities: dict[str, DeviceCapacity]
) -> Consumed:
    """GetConsumedCapacityFromRequest: the amounts a shared allocation records."""
    return {
        name: consumed_amount((requested or {}).get(name), cap) for name, cap in capacities.items()
    }


def add_into(target: Consumed, amounts: Consumed) -> None:
    for name, amount in amounts.items():
        target[name] = target[name].add(amount) if name in target else amount


def remove_from(target: Consumed, amounts: Consumed) -> None:
    for name, amount in amounts.items():
        if name in target:
            target[name] = target[name].sub(amount)
