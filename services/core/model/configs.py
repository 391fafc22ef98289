"""Opaque device configs (``resource.nvidia.com/v1beta1``): decode, normalise, validate, resolve.

A claim's allocation carries the configs of its DeviceClasses (``FromClass``)
and of the claim itself (``FromClaim``). Users write these by hand, so
decoding is strict (an unknown field is an error, not silently ignored) and
every error names the config and the field path, e.g.::

    config[1] (FromClaim) GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage:
        must be between 0 and 100, got 150

Resolution follows the reference driver: built-in defaults first, then class
configs, then claim configs; for each allocated device the last config that
names its request (or names no request and fits the device type) wins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import msgspec

from services.core.kube import quantity
from services.core.kube.resource import DeviceAllocationConfiguration, DeviceRequestAllocationResult
from services.core.model import featuregates as fg
from services.core.model.computedomain import CD_DRIVER as CD_DRIVER
from services.core.model.computedomain import decode_compute_domain, validate_compute_domain
from services.core.model.opaque import API_VERSION as API_VERSION
from services.core.model.opaque import ConfigError as ConfigError
from services.core.model.opaque import Strict, decode_strict

DRIVER = "gpu.nvidia.com"
GPU_CONFIG = "GpuConfig"
MIG_DEVICE_CONFIG = "MigDeviceConfig"
VFIO_DEVICE_CONFIG = "VfioDeviceConfig"

TIME_SLICING = "TimeSlicing"
MPS = "MPS"
INTERVALS = ("Default", "Short", "Medium", "Long")  # nvidia-smi --set-timeslice 0..3
BACKEND_POLICIES = ("LegacyOnly", "PreferIommuFD")

DeviceKind = Literal["gpu", "mig", "vfio"]
MIB = 2**20
MAX_MEMORY_LIMIT_BYTES = 2**63 - 1  # resource.Quantity.Value() is an int64
_ATOI = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.Atoi reads as a number


_Strict = Strict


class TimeSlicingConfig(_Strict, kw_only=True):
    interval: str | None = None


# A quantity as resource.Quantity reads JSON: a string, or a number written any way
# JSON allows (``1.5e9``, ``1073741824.0``: the reference parses the number's text).
Quantity = str | int | float


class MpsConfig(_Strict, kw_only=True):
    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: Quantity | None = None
    default_per_device_pinned_memory_limit: dict[str, Quantity] | None = None
    multi_user: bool | None = None


class GpuSharing(_Strict, kw_only=True):
    strategy: str
    time_slicing_config: TimeSlicingConfig | None = None
    mps_config: MpsConfig | None = None


class MigDeviceSharing(_Strict, kw_only=True):
    """MIG devices cannot be time-sliced individually: no timeSlicingConfig field."""

    strategy: str
    mps_config: MpsConfig | None = None


class IommuConfig(_Strict, kw_only=True):
    backend_policy: str | None = ""  # null is "" (Go's string field), then LegacyOnly
    enable_api_device: bool | None = msgspec.field(default=None, name="enableAPIDevice")


class GpuConfig(_Strict, kw_only=True):
    api_version: str = API_VERSION
    kind: str = GPU_CONFIG
    sharing: GpuSharing | None = None


class MigDeviceConfig(_Strict, kw_only=True):
    api_version: str = API_VERSION
    kind: str = MIG_DEVICE_CONFIG
    sharing: MigDeviceSharing | None = None


class VfioDeviceConfig(_Strict, kw_only=True):
    api_version: str = API_VERSION
    kind: str = VFIO_DEVICE_CONFIG
    iommu: IommuConfig | None = None


DeviceConfig = GpuConfig | MigDeviceConfig | VfioDeviceConfig

_KINDS: Mapping[str, type[GpuConfig] | type[MigDeviceConfig] | type[VfioDeviceConfig]] = {
    GPU_CONFIG: GpuConfig,
    MIG_DEVICE_CONFIG: MigDeviceConfig,
    VFIO_DEVICE_CONFIG: VfioDeviceConfig,
}
_FITS: Mapping[str, DeviceKind] = {
    GPU_CONFIG: "gpu",
    MIG_DEVICE_CONFIG: "mig",
    VFIO_DEVICE_CONFIG: "vfio",
}


@dataclass(frozen=True)
class SourcedConfig:
    """One decoded config and where it came from (for error messages)."""

    config: DeviceConfig
    origin: str  # "default" or "config[1] (FromClaim)"
    requests: tuple[str, ...] = ()


@dataclass
class ConfigGroup:
    """The devices one config applies to; sharing (e.g. one MPS daemon) is per group."""

    config: DeviceConfig
    origin: str
    results: list[DeviceRequestAllocationResult] = field(default_factory=list)


# ------------------------------------------------------------------ decoding


def decode(params: Any, origin: str) -> DeviceConfig:
    """Strictly decode one opaque ``parameters`` object."""
    config: DeviceConfig = decode_strict(params, origin, _KINDS)
    return config


def collect(configs: Sequence[DeviceAllocationConfiguration] | None) -> list[SourcedConfig]:
    """Our driver's configs, class ones before claim ones, each strictly decoded."""
    by_source: dict[str, list[SourcedConfig]] = {"FromClass": [], "FromClaim": []}
    for index, entry in enumerate(configs or ()):
        origin = f"config[{index}] ({entry.source})"
        if entry.source not in by_source:
            raise ConfigError(f"{origin}: unknown source; expected FromClass or FromClaim")
        if entry.opaque is None:
            raise ConfigError(f"{origin}: only opaque parameters are supported by {DRIVER}")
        if entry.opaque.driver != DRIVER:
            continue  # another driver's config: not ours to judge
        decoded = decode(entry.opaque.parameters, origin)
        by_source[entry.source].append(SourcedConfig(decoded, origin, tuple(entry.requests or ())))
    return by_source["FromClass"] + by_source["FromClaim"]


# ------------------------------------------------------------------ normalise and validate


def defaults(gates: fg.FeatureGates) -> list[SourcedConfig]:
    """The lowest-precedence configs, one per device type (as the reference driver)."""
    out = [SourcedConfig(GpuConfig(), "default"), SourcedConfig(MigDeviceConfig(), "default")]
    if gates.enabled(fg.PASSTHROUGH_SUPPORT):
        out.append(SourcedConfig(VfioDeviceConfig(), "default"))
    return out


def normalize(config: DeviceConfig, gates: fg.FeatureGates) -> DeviceConfig:
    """Fill the implied defaults (the reference driver's ``Normalize()``)."""
    if isinstance(config, VfioDeviceConfig):
        iommu = config.iommu or IommuConfig()
        return msgspec.structs.replace(
            config,
            iommu=IommuConfig(
                backend_policy=iommu.backend_policy or "LegacyOnly",
                enable_api_device=bool(iommu.enable_api_device),
            ),
        )
    sharing = config.sharing
    if sharing is None:
        return config
    if sharing.strategy == MPS and sharing.mps_config is None and gates.enabled(fg.MPS_SUPPORT):
        sharing = msgspec.structs.replace(sharing, mps_config=MpsConfig())
    if (
        isinstance(sharing, GpuSharing)
        and sharing.strategy == TIME_SLICING
        and sharing.time_slicing_config is None
        and gates.enabled(fg.TIME_SLICING_SETTINGS)
    ):
        sharing = msgspec.structs.replace(
            sharing, time_slicing_config=TimeSlicingConfig(interval="Default")
        )
    return msgspec.structs.replace(config, sharing=sharing)


def validate(config: DeviceConfig, origin: str, gates: fg.FeatureGates) -> None:
    """Raise :class:`ConfigError` naming the first field that is wrong."""
    where = f"{origin} {config.kind}"
    if isinstance(config, VfioDeviceConfig):
        _validate_vfio(config, where, gates)
        return
    if config.sharing is not None:
        _validate_sharing(config.sharing, f"{where}.sharing", gates)


def _validate_vfio(config: VfioDeviceConfig, where: str, gates: fg.FeatureGates) -> None:
    if not gates.enabled(fg.PASSTHROUGH_SUPPORT):
        raise ConfigError(
            f'{where}: needs the "{fg.PASSTHROUGH_SUPPORT}" feature gate, which is not enabled'
        )
    policy = config.iommu.backend_policy if config.iommu else "LegacyOnly"
    if policy not in BACKEND_POLICIES:
        raise ConfigError(
            f"{where}.iommu.backendPolicy: unknown IOMMU backend policy {policy!r}; "
            f"valid: {', '.join(BACKEND_POLICIES)}"
        )


def _validate_sharing(
    sharing: GpuSharing | MigDeviceSharing, where: str, gates: fg.FeatureGates
) -> None:
    gate = {TIME_SLICING: fg.TIME_SLICING_SETTINGS, MPS: fg.MPS_SUPPORT}.get(sharing.strategy)
    if gate is None:
        raise ConfigError(
            f"{where}.strategy: unknown GPU sharing strategy {sharing.strategy!r}; "
            f"valid: {TIME_SLICING}, {MPS}"
        )
    if not gates.enabled(gate):
        raise ConfigError(
            f'{where}.strategy: "{sharing.strategy}" is selected as the GPU sharing strategy, '
            f'but the "{gate}" feature gate is not enabled'
        )
    ts_config = sharing.time_slicing_config if isinstance(sharing, GpuSharing) else None
    if sharing.strategy == TIME_SLICING and sharing.mps_config is not None:
        raise ConfigError(f"{where}.mpsConfig: not allowed with strategy {TIME_SLICING}")
    if sharing.strategy == MPS and ts_config is not None:
        raise ConfigError(f"{where}.timeSlicingConfig: not allowed with strategy {MPS}")
    if ts_config is not None and ts_config.interval is not None:
        if ts_config.interval not in INTERVALS:
            raise ConfigError(
                f"{where}.timeSlicingConfig.interval: unknown time-slice interval "
                f"{ts_config.interval!r}; valid: {', '.join(INTERVALS)}"
            )
    if sharing.mps_config is not None:
        _validate_mps(sharing.mps_config, f"{where}.mpsConfig")


def _validate_mps(mps: MpsConfig, where: str) -> None:
    pct = mps.default_active_thread_percentage
    if pct is not None and not 0 <= pct <= 100:
        raise ConfigError(
            f"{where}.defaultActiveThreadPercentage: must be between 0 and 100, got {pct}"
        )
    if mps.default_pinned_device_memory_limit is not None:
        memory_limit_mib(
            mps.default_pinned_device_memory_limit, f"{where}.defaultPinnedDeviceMemoryLimit"
        )
    for key, value in (mps.default_per_device_pinned_memory_limit or {}).items():
        memory_limit_mib(value, f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]")


def memory_limit_mib(value: Quantity, where: str) -> int:
    """A pinned-memory limit in whole MiB (what nvidia-cuda-mps-control takes); > 0, and
    at most :data:`MAX_MEMORY_LIMIT_BYTES`.

    Read as resource.Quantity's UnmarshalJSON reads it: the text of a string with
    surrounding blanks trimmed, or of a JSON number however it is written. Above
    int64 the reference's ``Quantity.Value()`` keeps the low 64 bits of the number
    (a limit it never meant, or "too low"); nothing that large is a device's memory
    either, so it is refused here, at admission too. A limit above the memory of
    the device it lands on is capped at prepare (:func:`capped`).
    """
    try:
        amount = quantity.parse(value.strip() if isinstance(value, str) else str(value))
    except quantity.QuantityError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    if amount <= 0:
        raise ConfigError(f"{where}: must be greater than zero, got {value}")
    if amount > MAX_MEMORY_LIMIT_BYTES:
        raise ConfigError(
            f"{where}: {value} is more memory than any device has; a limit is at most "
            "2^63-1 bytes (just under 8Ei, what a Kubernetes quantity's value holds)"
        )
    mib = int(amount / Fraction(MIB))
    if mib < 1:
        raise ConfigError(f"{where}: must be at least 1Mi, got {value}")
    return mib


def per_device_limits(mps: MpsConfig, uuids: Sequence[str], where: str) -> dict[str, int]:
    """MiB limit per device UUID: the default for all, then per-device overrides.

    A per-device key is a UUID of one of ``uuids`` or an index into them in
    sorted order, whatever the allocation order: the reference indexes the
    sorted UUIDs of the config's devices (MpsPerDevicePinnedMemoryLimit.Normalize
    over PreparedDevices.UUIDs(), which sorts).
    """
    uuids = sorted(uuids)
    limits: dict[str, int] = {}
    index = {str(i): u for i, u in enumerate(uuids)}
    if mps.default_pinned_device_memory_limit is not None:
        mib = memory_limit_mib(
            mps.default_pinned_device_memory_limit, f"{where}.defaultPinnedDeviceMemoryLimit"
        )
        limits = dict.fromkeys(uuids, mib)
    for key, value in (mps.default_per_device_pinned_memory_limit or {}).items():
        path = f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]"
        if key in uuids:
            uuid = key
        elif _ATOI.fullmatch(key) and str(int(key)) in index:  # strconv.Atoi, as the reference
            uuid = index[str(int(key))]
        else:
            raise ConfigError(
                f"{path}: not a UUID or index of this config's devices "
                f"(devices: {', '.join(uuids) or 'none'})"
            )
        limits[uuid] = memory_limit_mib(value, path)
    return limits


@dataclass(frozen=True)
class Capped:
    """A pinned-memory limit above its device's memory, lowered to that memory."""

    uuid: str
    asked_mib: int
    device_mib: int


def capped(
    limits: Mapping[str, int], memory_mib: Mapping[str, int]
) -> tuple[dict[str, int], list[Capped]]:
    """``limits`` with each above its device's memory (``memory_mib``, by UUID) lowered to
    it, and what was lowered.

    A limit is a ceiling: "at most 40Gi" on a 24 GB device is no limit, the same as
    its memory. Configs are written before the device is known (a DeviceClass for a
    mixed fleet, a template, ``firstAvailable`` alternatives), so refusing would fail
    a claim for a ceiling it already meets; capping keeps the user's intent and hands
    MPS a number the device can hold (docs/differences.md). The caller says so.
    """
    out, lowered = dict(limits), []
    for uuid, mib in limits.items():
        device = memory_mib.get(uuid)
        if device is not None and 0 < device < mib:
            out[uuid] = device
            lowered.append(Capped(uuid, mib, device))
    return out, lowered


# ------------------------------------------------------------------ resolution


def request_matches(named: Sequence[str], request: str) -> bool:
    """A config naming ``req`` applies to ``req`` and its subrequests ``req/sub``."""
    return request in named or request.split("/", 1)[0] in named


def resolve(
    configs: Sequence[DeviceAllocationConfiguration] | None,
    results: Sequence[DeviceRequestAllocationResult],
    kinds: Mapping[str, DeviceKind],
    gates: fg.FeatureGates,
) -> list[ConfigGroup]:
    """Group ``results`` by the config that wins for each; every config is validated.

    ``kinds`` gives the device type of every result's device.
    """
    candidates = defaults(gates) + collect(configs)
    normalized = []
    for item in candidates:
        config = normalize(item.config, gates)
        validate(config, item.origin, gates)
        normalized.append(SourcedConfig(config, item.origin, item.requests))
    _check_each_fits_a_device(normalized, results, kinds)
    groups: dict[int, ConfigGroup] = {}
    for result in results:
        index = _winner(normalized, result, kinds[result.device])
        chosen = normalized[index]
        groups.setdefault(index, ConfigGroup(chosen.config, chosen.origin)).results.append(result)
    return list(groups.values())


def _check_each_fits_a_device(
    configs: Sequence[SourcedConfig],
    results: Sequence[DeviceRequestAllocationResult],
    kinds: Mapping[str, DeviceKind],
) -> None:
    """A config naming no request applies to the claim's devices of its kind; one that fits
    none of them (a MigDeviceConfig on a claim for a full GPU) would leave each device the
    default config, the user's settings silently dropped, as the reference does. Refused,
    unless the claim chose among alternatives (``firstAvailable``, results ``req/sub``):
    there configs for the alternatives not chosen are expected to apply to nothing."""
    if not results or any("/" in r.request for r in results):
        return
    present = {kinds[r.device] for r in results}
    for item in configs:
        kind = _FITS[item.config.kind]
        if item.origin == "default" or item.requests or kind in present:
            continue
        devices = ", ".join(f"{r.device!r} of type {kinds[r.device]}" for r in results)
        raise ConfigError(
            f"{item.origin} {item.config.kind}: names no request and fits none of the claim's "
            f"devices ({devices}): a {item.config.kind} applies to {kind} devices only; it "
            "would be replaced by the default"
        )


def _winner(
    configs: Sequence[SourcedConfig], result: DeviceRequestAllocationResult, kind: DeviceKind
) -> int:
    for index in range(len(configs) - 1, -1, -1):
        item = configs[index]
        fits = _FITS[item.config.kind] == kind
        if item.requests and request_matches(item.requests, result.request):
            if not fits:
                raise ConfigError(
                    f"{item.origin} {item.config.kind}: cannot apply to device "
                    f"{result.device!r} of type {kind} (request {result.request!r})"
                )
            return index
        if not item.requests and fits:
            return index
    raise ConfigError(
        f"device {result.device!r} of type {kind} (request {result.request!r}): "
        "no config applies (is the PassthroughSupport feature gate enabled?)"
    )


# ------------------------------------------------------------------ admission
#
# ``gpudra webhook`` judges a claim's configs when it is written, with the very
# functions prepare uses (decode, normalize, validate), so the same config is
# refused at admission and at prepare with the same words. The webhook also
# judges the compute-domain driver's configs (the reference's webhook skips them,
# NVIDIA/k8s-dra-driver-gpu#1349); their fields are the reference's
# (api/nvidia.com/resource/v1beta1/computedomainconfig.go).

DRIVERS = (DRIVER, CD_DRIVER)


def check_opaque(driver: str, params: Any, origin: str, gates: fg.FeatureGates) -> bool:
    """Judge one opaque config as prepare would; False if ``driver`` is not one of ours.

    Raises :class:`ConfigError` with prepare's own message for a config prepare
    would refuse (``gpu.nvidia.com``: :func:`decode`, :func:`normalize`,
    :func:`validate`, the per-device memory limits' syntax).
    """
    if driver == DRIVER:
        config = normalize(decode(params, origin), gates)
        validate(config, origin, gates)
        return True
    if driver == CD_DRIVER:
        validate_compute_domain(decode_compute_domain(params, origin), origin)
        return True
    return False
