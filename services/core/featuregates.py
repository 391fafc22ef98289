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

DEFAULTS: Mapping[str, bool] = {
    TIME_SLICING_SETTINGS: False,
    MPS_SUPPORT: False,
    PASSTHROUGH_SUPPORT: False,
    DYNAMIC_MIG: False,
    NVML_DEVICE_HEALTH_CHECK: False,
    DEVICE_METADATA: False,
}

# Gates that cannot be on together (reference driver: DynamicMIG excludes both).
EXCLUSIVE: tuple[tuple[str, str], ...] = (
    (DYNAMIC_MIG, PASSTHROUGH_SUPPORT),
    (DYNAMIC_MIG, MPS_SUPPORT),
)


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
    for a, b in EXCLUSIVE:
        if values[a] and values[b]:
            raise FeatureGateError(f"feature gates {a} and {b} cannot both be enabled")
    return FeatureGates(values)
