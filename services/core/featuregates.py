"""Driver feature gates, named and defaulted as in the reference NVIDIA driver."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

TIME_SLICING_SETTINGS = "TimeSlicingSettings"
MPS_SUPPORT = "MPSSupport"
PASSTHROUGH_SUPPORT = "PassthroughSupport"
DYNAMIC_MIG = "DynamicMIG"
NVML_DEVICE_HEALTH_CHECK = "NVMLDeviceHealthCheck"
DEVICE_METADATA = "DeviceMetadata"
# Alpha in the reference (PR #1257): GPU and MIG devices published for several claims at
# once (consumable capacity); the mode is --consumable-shares (services/core/shares.py).
CONSUMABLE_SHARES = "ConsumableShares"

DEFAULTS: Mapping[str, bool] = {
    TIME_SLICING_SETTINGS: False,
    MPS_SUPPORT: False,
    PASSTHROUGH_SUPPORT: False,
    DYNAMIC_MIG: False,
    NVML_DEVICE_HEALTH_CHECK: False,
    DEVICE_METADATA: False,
    CONSUMABLE_SHARES: False,
}

# The combinations the reference driver refuses at start-up (pkg/featuregates,
# ValidateFeatureGates), in the order it checks them; every command that takes
# --feature-gates refuses them here, before it does anything.
EXCLUSIVE: tuple[tuple[str, str], ...] = (
    (DYNAMIC_MIG, PASSTHROUGH_SUPPORT),
    (DYNAMIC_MIG, NVML_DEVICE_HEALTH_CHECK),
    (DYNAMIC_MIG, MPS_SUPPORT),
    (PASSTHROUGH_SUPPORT, NVML_DEVICE_HEALTH_CHECK),
)
# (gate, the gate it needs): DeviceMetadata describes VFIO devices only.
REQUIRES: tuple[tuple[str, str], ...] = ((DEVICE_METADATA, PASSTHROUGH_SUPPORT),)


class FeatureGateError(ValueError):
    """A gate string that names an unknown gate, a non-bool, or a forbidden mix."""


class FeatureGates(msgspec.Struct, frozen=True):
    """An immutable set of gate values; unknown names never get in."""

    values: dict[str, bool] = msgspec.field(default_factory=lambda: dict(DEFAULTS))

    def enabled(self, name: str) -> bool:
        if name not in DEFAULTS:
            raise FeatureGateError(f"unknown feature gate {name!r}; valid: {valid_names()}")
        return self.values.get(name, DEFAULTS[name])

    def spec(self) -> str:
        """The canonical ``A=true,B=false`` form of the gates that differ from defaults."""
        return ",".join(
            f"{k}={str(v).lower()}" for k, v in sorted(self.values.items()) if DEFAULTS[k] != v
        )


def valid_names() -> str:
    return ", ".join(sorted(DEFAULTS))


def parse(spec: str | None) -> FeatureGates:
    """Parse ``Name=bool,...`` (as the reference driver's --feature-gates flag)."""
    values = dict(DEFAULTS)
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if name not in DEFAULTS:
            raise FeatureGateError(f"unknown feature gate {name!r}; valid: {valid_names()}")
        if not sep or raw.strip().lower() not in ("true", "false"):
            raise FeatureGateError(
                f"feature gate {name!r}: expected {name}=true|false, got {item!r}"
            )
        values[name] = raw.strip().lower() == "true"
    check_combination(values)
    return FeatureGates(values)


def check_combination(values: Mapping[str, bool]) -> None:
    """Refuse what the reference refuses, naming both gates (its wording)."""
    for a, b in EXCLUSIVE:
        if values[a] and values[b]:
            raise FeatureGateError(
                f"feature gate {a} is currently mutually exclusive with {b}: "
                f"enable at most one of {a} and {b}"
            )
    for gate, needed in REQUIRES:
        if values[gate] and not values[needed]:
            raise FeatureGateError(f"feature gate {gate} requires {needed} to also be enabled")
