"""Consumable shares (KEP-5075): one GPU or MIG device allocated to several claims.

With the driver gate ``ConsumableShares`` and a mode (``--consumable-shares``,
as the reference's flag: ``memory``, ``unlimited`` or a share count ``N``),
GPU and MIG devices are published with ``allowMultipleAllocations`` and a
``memory`` request policy (and, for ``N``, a ``shares`` capacity), exactly as
the reference's consumable_shares.go renders them, so a scheduler sees the
same slices from either driver. The scheduler then gives each allocation a
``shareID`` and its ``consumedCapacity``.

One place for the facts both ends need: the publisher renders the policies
with :func:`advertise`; the preparer rebuilds the same policies from its own
inventory to check what an allocation says it consumed (:func:`check_consumed`)
and to turn a share into MPS limits (:func:`thread_percentage`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import msgspec

from services.core.kube import quantity
from services.core.kube.resource import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    Device,
    DeviceCapacity,
)
from services.core.model import featuregates as fg

CAP_MEMORY = "memory"
CAP_SHARES = "shares"
STEP = 1024 * 1024  # 1Mi: the reference's memory granularity
FLAG = "--consumable-shares"

ModeKind = Literal["disabled", "memory", "unlimited", "count"]


class SharesError(ValueError):
    """A mode, or a share allocation, that cannot be used (which field, what was expected)."""


@dataclass(frozen=True)
class SharesMode:
    kind: ModeKind = "disabled"
    count: int = 0  # for kind "count": how many shares one device is cut into

    @property
    def enabled(self) -> bool:
        return self.kind != "disabled"

    def spec(self) -> str:
        return str(self.count) if self.kind == "count" else self.kind


DISABLED = SharesMode()


def parse_mode(text: str) -> SharesMode:
    """``disabled`` (or empty), ``memory``, ``unlimited`` or a positive integer."""
    value = text.strip()
    if value in ("", "disabled"):
        return DISABLED
    if value in ("memory", "unlimited"):
        return SharesMode(value)  # type: ignore[arg-type]  # narrowed by the test above
    if value.isdigit() and int(value) > 0:
        return SharesMode("count", int(value))
    raise SharesError(
        f"invalid value for {FLAG}: {text!r} "
        "(must be 'disabled', 'memory', 'unlimited', or a positive integer)"
    )


def require_gate(mode: SharesMode, gates: fg.FeatureGates) -> None:
    """The reference refuses a mode without its gate at start-up; so do we."""
    if mode.enabled and not gates.enabled(fg.CONSUMABLE_SHARES):
        raise SharesError(f"{FLAG} requires feature gate {fg.CONSUMABLE_SHARES} to be enabled")


# ------------------------------------------------------------------ advertisement


def _q(value: int) -> str:
    return quantity.format_int(value)


def advertise(device: Device, mode: SharesMode) -> Device:
    """The device as published in ``mode`` (applyConsumableShares); a new object.

    ``memory`` is rounded down to a multiple of 1Mi (a range's max must be a
    multiple of its step). Every other capacity keeps no policy: with
    ``allowMultipleAllocations`` a request that does not name it consumes all
    of it (KEP-5075), as with the reference.
    """
    if not mode.enabled:
        return device
    capacity = dict(device.capacity or {})
    memory = capacity.get(CAP_MEMORY)
    if memory is not None:
        top = _q(int(quantity.parse(memory.value)) // STEP * STEP)
        full = mode.kind == "memory"
        capacity[CAP_MEMORY] = DeviceCapacity(
            value=top,
            request_policy=CapacityRequestPolicy(
                default=top if full else "0",
                valid_range=CapacityRequestPolicyRange(
                    min=_q(STEP) if full else "0", max=top, step=_q(STEP)
                ),
            ),
        )
        if mode.kind == "count":
            n = _q(mode.count)
            capacity[CAP_SHARES] = DeviceCapacity(
                value=n,
                request_policy=CapacityRequestPolicy(
                    default="1", valid_range=CapacityRequestPolicyRange(min="1", max=n, step="1")
                ),
            )
    return msgspec.structs.replace(device, allow_multiple_allocations=True, capacity=capacity)


# ------------------------------------------------------------------ a share at prepare


def _amount(text: str, where: str) -> Fraction:
    try:
        return quantity.parse(text)
    except quantity.QuantityError as exc:
        raise SharesError(f"{where}: {text!r} is not a quantity ({exc})") from exc


def _default(cap: DeviceCapacity) -> Fraction:
    policy = cap.request_policy
    if policy is not None and policy.default is not None:
        return quantity.parse(policy.default)
    return quantity.parse(cap.value)


def check_consumed(
    device: Device, consumed: Mapping[str, str] | None, where: str
) -> dict[str, Fraction]:
    """What the share takes of each capacity, checked against the device's policies.

    ``consumed`` is the allocation's ``consumedCapacity`` (None: recomputed
    from the policies' defaults, as the scheduler would have). A name the
    device does not have, an amount outside its range or off its step, or an
    amount above the capacity is a :class:`SharesError` naming the capacity.
    """
    capacities = device.capacity or {}
    given = dict(consumed or {})
    unknown = sorted(set(given) - set(capacities))
    if unknown:
        raise SharesError(
            f"{where}: consumedCapacity names {unknown}, which device {device.name!r} "
            f"does not have (capacities: {sorted(capacities)})"
        )
    out: dict[str, Fraction] = {}
    for name, cap in capacities.items():
        field = f"{where}.consumedCapacity[{name}]"
        amount = _amount(given[name], field) if name in given else _default(cap)
        total = quantity.parse(cap.value)
        if amount < 0 or amount > total:
            raise SharesError(
                f"{field}: {given.get(name, _q(int(amount)))} is outside 0..{cap.value} "
                f"(device {device.name!r})"
            )
        policy = cap.request_policy
        rng = policy.valid_range if policy is not None else None
        if rng is not None and not (policy is not None and policy.default == given.get(name)):
            low = quantity.parse(rng.min) if rng.min is not None else Fraction(0)
            high = quantity.parse(rng.max) if rng.max is not None else total
            step = quantity.parse(rng.step) if rng.step is not None else None
            if amount < low or amount > high or (step and (amount - low) % step != 0):
                raise SharesError(
                    f"{field}: {given.get(name, _q(int(amount)))} disagrees with the device's "
                    f"request policy (range {rng.min}..{rng.max or cap.value} "
                    f"step {rng.step or 'any'})"
                )
        out[name] = amount
    return out


def thread_percentage(device: Device, consumed: Mapping[str, Fraction]) -> int:
    """The share's compute: ``shares``/N if the device counts shares, else memory/total.

    Rounded up, at least 1 and at most 100 (MPS takes 1..100).
    """
    capacities = device.capacity or {}
    for name in (CAP_SHARES, CAP_MEMORY):
        cap = capacities.get(name)
        if cap is not None and name in consumed:
            total = quantity.parse(cap.value)
            if total > 0 and consumed[name] > 0:
                return max(1, min(100, math.ceil(100 * consumed[name] / total)))
    return 100


def memory_limit_mib(consumed: Mapping[str, Fraction]) -> int | None:
    """The share's pinned memory in MiB, rounded down; None when it asked for none (0)."""
    memory = consumed.get(CAP_MEMORY)
    if memory is None or memory <= 0:
        return None
    return max(1, int(memory) // STEP)
