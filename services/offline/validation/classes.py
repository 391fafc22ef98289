"""A DeviceClass's spec (ValidateDeviceClass): selectors, configs, extendedResourceName."""

from __future__ import annotations

from services.allocator.cel.env import CelEnvironment
from services.core.kube import names
from services.core.kube.resource import DeviceClass, DeviceClassConfiguration
from services.offline.validation.cel import selectors
from services.offline.validation.configs import MAX_CONFIGS, opaque
from services.offline.validation.fields import invalid
from services.offline.validation.lists import check_list
from services.offline.validation.rules import Rules


def validate_class(device_class: DeviceClass, env: CelEnvironment, rules: Rules) -> list[str]:
    """ValidateDeviceClass's spec rules."""
    errors = selectors(device_class.spec.selectors, "spec.selectors", env, rules)

    def config(i: int, item: DeviceClassConfiguration) -> list[str]:
        return opaque(item.opaque, f"spec.config[{i}]")

    configs = device_class.spec.config or []
    errors += check_list(configs, MAX_CONFIGS, "spec.config", rules, config)[0]
    name = device_class.spec.extended_resource_name
    if name is not None and not _extended_resource_name(name):
        errors.append(
            invalid("spec.extendedResourceName", name, "must be a valid extended resource name")
        )
    return errors


def _extended_resource_name(name: str) -> bool:
    """v1helper.IsExtendedResourceName: not native (no ``/``, or ``kubernetes.io/`` in
    it), not ``requests.``-prefixed, and a qualified name once so prefixed."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return not names.label_key(f"requests.{name}")
