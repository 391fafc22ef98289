"""The ComputeDomain model: the ``compute-domain.nvidia.com`` driver as the reference has it.

One place for each fact the controller, the node driver, the webhook and the IMEX
daemon share: the CRD's coordinates, the label and finalizer keys, the names of
the objects the controller creates, the two devices every node publishes
(``channel-0``, ``daemon-0``), the two DeviceClasses, and the two strict opaque
configs with the reference's rules (api/nvidia.com/resource/v1beta1/
computedomainconfig.go; cmd/compute-domain-controller; cmd/compute-domain-kubelet-plugin).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from services.core.kube.resource import (
    CELDeviceSelector,
    Device,
    DeviceAllocationConfiguration,
    DeviceAttribute,
    DeviceClass,
    DeviceClassSpec,
    DeviceSelector,
    ObjectMeta,
)
from services.core.model.opaque import API_VERSION, ConfigError, Strict, decode_strict

CD_DRIVER = "compute-domain.nvidia.com"

# ------------------------------------------------------------------ the CRD
GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
PLURAL = "computedomains"
KIND = "ComputeDomain"
READY, NOT_READY = "Ready", "NotReady"


def domains_path(namespace: str | None = None, name: str | None = None) -> str:
    """The REST path of the ComputeDomains of a namespace (all with None), or of one."""
    base = f"/apis/{GROUP}/{VERSION}"
    if namespace is None:
        return f"{base}/{PLURAL}"
    path = f"{base}/namespaces/{namespace}/{PLURAL}"
    return path if name is None else f"{path}/{name}"


# ------------------------------------------------------------------ labels, finalizer, names
# The key is both the label (value: the domain's UID) and the finalizer.
DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
FINALIZER = DOMAIN_LABEL
CLIQUE_LABEL = "resource.nvidia.com/computeDomain.cliqueID"  # on daemon pods
TARGET_LABEL = "resource.nvidia.com/computeDomainTarget"
TARGET_DAEMON, TARGET_WORKLOAD = "Daemon", "Workload"
DAEMON_CONTAINER = "compute-domain-daemon"  # also the daemon pod's claim name
DAEMON_SERVICE_ACCOUNT = "compute-domain-daemon-service-account"
MAX_NODES_PER_IMEX_DOMAIN = 18


def daemon_name(domain_uid: str) -> str:
    """The daemon DaemonSet's and the daemon ResourceClaimTemplate's name."""
    return f"computedomain-daemon-{domain_uid}"


# ------------------------------------------------------------------ devices and classes
DeviceType = Literal["channel", "daemon"]
CHANNEL_TYPE: DeviceType = "channel"
DAEMON_TYPE: DeviceType = "daemon"
ATTR_TYPE, ATTR_ID = "type", "id"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS = "compute-domain-daemon.nvidia.com"
IMEX_CHANNELS = 2048  # the reference enumerates this many; only channel 0 is published
CHANNEL_REQUEST, DAEMON_REQUEST = "channel", "daemon"


def channel_device_name(channel: int) -> str:
    return f"channel-{channel}"


DAEMON_DEVICE = "daemon-0"


def node_devices() -> list[Device]:
    """What every node publishes: ``channel-0`` and ``daemon-0``, attributes type and id.

    No capacity and no cliqueID attribute, as the reference.
    """
    return [
        Device(
            name=channel_device_name(0),
            attributes={
                ATTR_TYPE: DeviceAttribute(string=CHANNEL_TYPE),
                ATTR_ID: DeviceAttribute(int_=0),
            },
        ),
        Device(
            name=DAEMON_DEVICE,
            attributes={
                ATTR_TYPE: DeviceAttribute(string=DAEMON_TYPE),
                ATTR_ID: DeviceAttribute(int_=0),
            },
        ),
    ]


# ------------------------------------------------------------------ binding conditions
# On every channel device where the API server keeps them (Kubernetes 1.36+, gates
# DRADeviceBindingConditions and DRAResourceClaimDeviceStatus): the scheduler binds a
# channel claim's pod to a node only once the claim's status.devices entry says
# IMEX_DOMAIN_READY True (the controller sets it when the node's IMEX daemon is Ready,
# services/domains/binding.py), and gives the node up when IMEX_DOMAIN_FAILED is True.
# The daemon device has none: its pod is what makes the domain Ready.
IMEX_DOMAIN_READY = f"{CD_DRIVER}/IMEXDomainReady"
IMEX_DOMAIN_FAILED = f"{CD_DRIVER}/IMEXDomainFailed"


def with_binding_conditions(devices: Sequence[Device]) -> list[Device]:
    """``devices`` with the binding conditions on each channel device (copies)."""
    return [
        msgspec.structs.replace(
            d,
            binding_conditions=[IMEX_DOMAIN_READY],
            binding_failure_conditions=[IMEX_DOMAIN_FAILED],
        )
        if _is_channel(d)
        else d
        for d in devices
    ]


def _is_channel(device: Device) -> bool:
    kind = (device.attributes or {}).get(ATTR_TYPE)
    return kind is not None and kind.string == CHANNEL_TYPE


def device_type(device_name: str) -> DeviceType:
    """The type of one of our device names; ValueError for a name that is none of them."""
    if device_name == DAEMON_DEVICE:
        return DAEMON_TYPE
    prefix, _, number = device_name.partition("-")
    if prefix == "channel" and number.isdigit() and int(number) < IMEX_CHANNELS:
        return CHANNEL_TYPE
    raise ValueError(f"{device_name!r} is not a {CD_DRIVER} device (channel-N or daemon-0)")


def _class(name: str, expression: str) -> DeviceClass:
    selector = DeviceSelector(cel=CELDeviceSelector(expression=expression))
    return DeviceClass(metadata=ObjectMeta(name=name), spec=DeviceClassSpec(selectors=[selector]))


def device_classes() -> list[DeviceClass]:
    """The reference chart's two ComputeDomain DeviceClasses (resource.k8s.io/v1)."""
    driver = f"device.driver == '{CD_DRIVER}'"
    attrs = f"device.attributes['{CD_DRIVER}']"
    return [
        _class(DAEMON_CLASS, f"{driver} && {attrs}.type == '{DAEMON_TYPE}'"),
        _class(CHANNEL_CLASS, f"{driver} && {attrs}.type == '{CHANNEL_TYPE}' && {attrs}.id == 0"),
    ]


# ------------------------------------------------------------------ opaque configs
CHANNEL_CONFIG = "ComputeDomainChannelConfig"
DAEMON_CONFIG = "ComputeDomainDaemonConfig"
SINGLE, ALL = "Single", "All"
ALLOCATION_MODES = (SINGLE, ALL)


class ComputeDomainChannelConfig(Strict, kw_only=True):
    api_version: str = API_VERSION
    kind: str = CHANNEL_CONFIG
    domain_id: str = msgspec.field(default="", name="domainID")
    allocation_mode: str | None = None

    @property
    def mode(self) -> str:
        """The allocation mode, ``Single`` when unset (the reference's default)."""
        return self.allocation_mode or SINGLE


class ComputeDomainDaemonConfig(Strict, kw_only=True):
    api_version: str = API_VERSION
    kind: str = DAEMON_CONFIG
    domain_id: str = msgspec.field(default="", name="domainID")


ComputeDomainConfig = ComputeDomainChannelConfig | ComputeDomainDaemonConfig

_KINDS: Mapping[str, type[ComputeDomainChannelConfig] | type[ComputeDomainDaemonConfig]] = {
    CHANNEL_CONFIG: ComputeDomainChannelConfig,
    DAEMON_CONFIG: ComputeDomainDaemonConfig,
}
_FITS: Mapping[str, DeviceType] = {CHANNEL_CONFIG: CHANNEL_TYPE, DAEMON_CONFIG: DAEMON_TYPE}


def decode_compute_domain(params: Any, origin: str) -> ComputeDomainConfig:
    """Strictly decode one ``compute-domain.nvidia.com`` opaque ``parameters`` object."""
    config: ComputeDomainConfig = decode_strict(params, origin, _KINDS, f"driver {CD_DRIVER}")
    return config


def validate_compute_domain(config: ComputeDomainConfig, origin: str) -> None:
    """The reference's ``Validate()`` (domainID required) plus the allocation-mode enum.

    An empty or null allocationMode is unset (``Single``), as Go reads it; any other
    value than ``Single`` or ``All`` is refused, where the reference injects one
    channel for anything but ``All`` (a misspelt ``all`` would get one, not 2048).
    """
    where = f"{origin} {config.kind}"
    if not config.domain_id:
        raise ConfigError(f"{where}.domainID: must not be empty (the ComputeDomain's UID)")
    if isinstance(config, ComputeDomainChannelConfig) and config.allocation_mode:
        if config.allocation_mode not in ALLOCATION_MODES:
            raise ConfigError(
                f"{where}.allocationMode: unknown allocation mode {config.allocation_mode!r}; "
                f"valid: {', '.join(ALLOCATION_MODES)}"
            )


def config_for(
    configs: Sequence[DeviceAllocationConfiguration] | None, request: str, kind: DeviceType
) -> tuple[ComputeDomainConfig, str]:
    """The config that applies to one allocated device of ``kind`` for ``request``, validated.

    As the reference: class configs before claim configs, the last one naming the
    request (or naming none) wins; with none, the default config, whose empty
    domainID then fails validation. A winner of the other kind is refused
    ("cannot apply ComputeDomainChannelConfig to request: ..."). Every config of
    ours is decoded strictly, winner or not. Returns the config and its origin.
    """
    chosen: tuple[ComputeDomainConfig, str] | None = None
    for source in ("FromClass", "FromClaim"):
        for index, entry in enumerate(configs or ()):
            if entry.source != source or entry.opaque is None or entry.opaque.driver != CD_DRIVER:
                continue
            origin = f"config[{index}] ({source})"
            config = decode_compute_domain(entry.opaque.parameters, origin)
            if not entry.requests or request in entry.requests:
                chosen = (config, origin)
    if chosen is None:
        default: ComputeDomainConfig = (
            ComputeDomainChannelConfig() if kind == CHANNEL_TYPE else ComputeDomainDaemonConfig()
        )
        chosen = (default, "default config")
    config, origin = chosen
    if _FITS[config.kind] != kind:
        raise ConfigError(f"{origin}: cannot apply {config.kind} to request: {request}")
    validate_compute_domain(config, origin)
    return chosen
