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
# once (consumable capacity); the mode is --consumable-shares (services/core/model/shares.py).
CONSUMABLE_SHARES = "ConsumableShares"
# Alpha in the reference, off by default: the standard resource.kubernetes.io/numaNode
# attribute is published as a one-element list (ints) instead of an int
# (services.core.model.deviceattrs.list_type_attributes). Needs Kubernetes 1.36+ with its own
# gate of the same name on; a server that cannot store lists gets the int (docs/operations.md).
DRA_LIST_TYPE_ATTRIBUTES = "DRAListTypeAttributes"
# The compute-domain.nvidia.com driver's gates (docs/computedomains.md). Beta and on by
# default in the reference: the IMEX daemons name their peers by DNS names
# (services/imexdaemon/dnsnames.py); ComputeDomainClique objects per clique, which need
# those names (services/domains/cliques.py); a node whose NVLink fabric reports an
# error is refused rather than taken as outside a fabric (services/core/model/domainnode.py).
IMEX_DAEMONS_WITH_DNS_NAMES = "IMEXDaemonsWithDNSNames"
COMPUTE_DOMAIN_CLIQUES = "ComputeDomainCliques"
CRASH_ON_NVLINK_FABRIC_ERRORS = "CrashOnNVLinkFabricErrors"
# Alpha in the reference, off by default; gpudra accepts them off and refuses them on
# (UNSUPPORTED says why).
FABRIC_MANAGER_PARTITIONING = "FabricManagerPartitioning"
HOST_MANAGED_IMEX_DAEMON = "HostManagedIMEXDaemon"

DEFAULTS: Mapping[str, bool] = {
    TIME_SLICING_SETTINGS: False,
    MPS_SUPPORT: False,
    PASSTHROUGH_SUPPORT: False,
    DYNAMIC_MIG: False,
    NVML_DEVICE_HEALTH_CHECK: False,
    DEVICE_METADATA: False,
    CONSUMABLE_SHARES: False,
    DRA_LIST_TYPE_ATTRIBUTES: False,
    IMEX_DAEMONS_WITH_DNS_NAMES: True,
    COMPUTE_DOMAIN_CLIQUES: True,
    CRASH_ON_NVLINK_FABRIC_ERRORS: True,
    FABRIC_MANAGER_PARTITIONING: False,
    HOST_MANAGED_IMEX_DAEMON: False,
}

# Gates gpudra knows but cannot honour when turned on: refused then, with the reason,
# by every command that takes --feature-gates (their default, off, is accepted).
UNSUPPORTED: Mapping[str, str] = {
    FABRIC_MANAGER_PARTITIONING: (
        "it makes each prepare activate the NVIDIA Fabric Manager partition whose GPUs are "
        "the claim's (NVSwitch systems with Fabric Manager in FABRIC_MODE=1) and publishes "
        "partitionN attributes; gpudra has no Fabric Manager client and neither manages "
        "nor simulates partitions"
    ),
    HOST_MANAGED_IMEX_DAEMON: (
        "it unlocks the reference's imex.mode=hostManaged (the host's own nvidia-imex "
        "service, no daemon-0 device, no IMEX DaemonSet per ComputeDomain); gpudra runs "
        "each ComputeDomain's IMEX daemons itself and has no host-managed mode"
    ),
}

# Gates of the compute-domain.nvidia.com driver alone: the GPU driver's slices and
# prepares never read them.
DOMAIN_GATES = frozenset(
    {
        IMEX_DAEMONS_WITH_DNS_NAMES,
        COMPUTE_DOMAIN_CLIQUES,
        CRASH_ON_NVLINK_FABRIC_ERRORS,
        HOST_MANAGED_IMEX_DAEMON,
    }
)

# The combinations the reference driver refuses at start-up (pkg/featuregates,
# ValidateFeatureGates), in the order it checks them; every command that takes
# --feature-gates refuses them here, before it does anything.
EXCLUSIVE: tuple[tuple[str, str], ...] = (
    (DYNAMIC_MIG, PASSTHROUGH_SUPPORT),
    (DYNAMIC_MIG, NVML_DEVICE_HEALTH_CHECK),
    (DYNAMIC_MIG, MPS_SUPPORT),
    (PASSTHROUGH_SUPPORT, NVML_DEVICE_HEALTH_CHECK),
)
# (gate, the gate it needs): the cliques' daemons are numbered for their DNS names
# (the reference checks this one first); DeviceMetadata describes VFIO devices only.
REQUIRES: tuple[tuple[str, str], ...] = (
    (COMPUTE_DOMAIN_CLIQUES, IMEX_DAEMONS_WITH_DNS_NAMES),
    (DEVICE_METADATA, PASSTHROUGH_SUPPORT),
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
    for name, reason in UNSUPPORTED.items():
        if values[name]:
            raise FeatureGateError(
                f"feature gate {name}=true is not supported by gpudra: {reason}; leave {name}=false"
            )
    check_combination(values)
    return FeatureGates(values)


def check_combination(values: Mapping[str, bool]) -> None:
    """Refuse what the reference refuses, naming both gates (its wording, its order)."""
    first, *rest = REQUIRES
    _require(values, *first)
    for a, b in EXCLUSIVE:
        if values[a] and values[b]:
            raise FeatureGateError(
                f"feature gate {a} is currently mutually exclusive with {b}: "
                f"enable at most one of {a} and {b}"
            )
    for gate, needed in rest:
        _require(values, gate, needed)


def _require(values: Mapping[str, bool], gate: str, needed: str) -> None:
    if values[gate] and not values[needed]:
        raise FeatureGateError(f"feature gate {gate} requires {needed} to also be enabled")
