"""The checks a container runtime's CDI loader makes on a spec, so a bad spec fails here first.

containerd and CRI-O load specs with tags.cncf.io/container-device-interface:
strict decoding (an unknown field fails the whole file), a known
``cdiVersion`` no older than the features used need, vendor/class and device
name syntax, and per-edit rules (``KEY=VALUE`` env, device node types and
permissions, hook names, mount paths). A spec that breaks one of them makes
every device in it unresolvable, so the pod never starts. :func:`problems`
applies the same rules (v1.1 of the library) and says what is wrong, field by
field; the e2e tests also load every spec with the Go library itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from services.preparer.cdi import minimum_version

KNOWN_VERSIONS = (
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
)  # fmt: skip
HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
DEVICE_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})

_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")

# Every field the Go types (specs-go v1.1) accept; anything else fails strict decoding.
_SPEC_FIELDS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
_DEVICE_FIELDS = {"name", "annotations", "containerEdits"}
_EDIT_FIELDS = {
    "env",
    "deviceNodes",
    "netDevices",
    "hooks",
    "mounts",
    "intelRdt",
    "additionalGids",
}
_NODE_FIELDS = {
    "path",
    "hostPath",
    "type",
    "major",
    "minor",
    "fileMode",
    "permissions",
    "uid",
    "gid",
}
_HOOK_FIELDS = {"hookName", "path", "args", "env", "timeout"}
_MOUNT_FIELDS = {"hostPath", "containerPath", "options", "type"}


def problems(spec: Any) -> list[str]:
    """Every reason the CDI library would refuse ``spec`` (a decoded file); empty when none."""
    if not isinstance(spec, Mapping):
        return [f"spec: expected a mapping, got {type(spec).__name__}"]
    return list(_spec_problems(spec))


def _spec_problems(spec: Mapping[str, Any]) -> Iterator[str]:
    yield from _unknown("spec", spec, _SPEC_FIELDS)
    version = str(spec.get("cdiVersion", "")).removeprefix("v")
    if version not in KNOWN_VERSIONS:
        yield f"cdiVersion: invalid version {spec.get('cdiVersion')!r}"
    else:
        try:
            needed = minimum_version(dict(spec))
        except (KeyError, TypeError, AttributeError):
            needed = version  # malformed kind or devices: reported below
        if _semver(needed) > _semver(version):
            yield f"cdiVersion: the spec version must be at least v{needed} (got {version})"
    kind = str(spec.get("kind", ""))
    vendor, _, klass = kind.partition("/")
    if not vendor or not klass:
        yield f"kind: {kind!r} is not vendor/class"
    else:
        yield from _name("kind: vendor", vendor, _VENDOR_OR_CLASS)
        yield from _name("kind: class", klass, _VENDOR_OR_CLASS)
    yield from _edits_problems("containerEdits", spec.get("containerEdits"))
    devices = spec.get("devices") or []
    if not isinstance(devices, list) or not devices:
        yield "devices: invalid spec, no devices"
        return
    seen: set[str] = set()
    for i, device in enumerate(devices):
        where = f"devices[{i}]"
        if not isinstance(device, Mapping):
            yield f"{where}: expected a mapping"
            continue
        yield from _unknown(where, device, _DEVICE_FIELDS)
        name = str(device.get("name", ""))
        yield from _name(f"{where}.name", name, _DEVICE_NAME)
        if name in seen:
            yield f"{where}.name: invalid spec, multiple device {name!r}"
        seen.add(name)
        edits = device.get("containerEdits")
        if not _has_edits(edits):
            yield f"{where}.containerEdits: a device needs at least one edit"
        yield from _edits_problems(f"{where}.containerEdits", edits)


def _edits_problems(where: str, edits: Any) -> Iterator[str]:
    if edits is None:
        return
    if not isinstance(edits, Mapping):
        yield f"{where}: expected a mapping"
        return
    yield from _unknown(where, edits, _EDIT_FIELDS)
    yield from _env(f"{where}.env", edits.get("env") or [])
    for i, node in enumerate(edits.get("deviceNodes") or []):
        yield from _device_node(f"{where}.deviceNodes[{i}]", node)
    for i, hook in enumerate(edits.get("hooks") or []):
        yield from _hook(f"{where}.hooks[{i}]", hook)
    for i, mount in enumerate(edits.get("mounts") or []):
        yield from _mount(f"{where}.mounts[{i}]", mount)


def _device_node(where: str, node: Any) -> Iterator[str]:
    if not isinstance(node, Mapping):
        yield f"{where}: expected a mapping"
        return
    yield from _unknown(where, node, _NODE_FIELDS)
    path = node.get("path", "")
    if not path:
        yield f"{where}.path: invalid (empty) device path"
    if node.get("type", "") not in DEVICE_NODE_TYPES:
        yield f"{where}.type: device {path!r}: invalid type {node.get('type')!r}"
    for number in ("major", "minor"):
        value = node.get(number, 0)
        if not isinstance(value, int) or value < 0:
            yield f"{where}.{number}: device {path!r}: invalid device number {value!r}"
    permissions = str(node.get("permissions", ""))
    if permissions not in ("", "none") and permissions.strip("rwm"):
        yield f"{where}.permissions: device {path!r}: invalid permissions {permissions!r}"


def _hook(where: str, hook: Any) -> Iterator[str]:
    if not isinstance(hook, Mapping):
        yield f"{where}: expected a mapping"
        return
    yield from _unknown(where, hook, _HOOK_FIELDS)
    name = hook.get("hookName", "")
    if name not in HOOK_NAMES:
        yield f"{where}.hookName: invalid hook name {name!r}"
    if not hook.get("path"):
        yield f"{where}.path: invalid hook {name!r} with empty path"
    yield from _env(f"{where}.env", hook.get("env") or [])


def _mount(where: str, mount: Any) -> Iterator[str]:
    if not isinstance(mount, Mapping):
        yield f"{where}: expected a mapping"
        return
    yield from _unknown(where, mount, _MOUNT_FIELDS)
    if not mount.get("hostPath"):
        yield f"{where}.hostPath: invalid mount, empty host path"
    if not mount.get("containerPath"):
        yield f"{where}.containerPath: invalid mount, empty container path"


def _env(where: str, env: Any) -> Iterator[str]:
    for i, entry in enumerate(env):
        if not isinstance(entry, str) or entry.find("=") <= 0:
            yield f"{where}[{i}]: invalid environment variable {entry!r}"


def _name(where: str, name: str, pattern: re.Pattern[str]) -> Iterator[str]:
    if not pattern.match(name):
        yield f"{where}: invalid name {name!r}"


def _unknown(where: str, obj: Mapping[str, Any], allowed: set[str]) -> Iterator[str]:
    for key in sorted(set(obj) - allowed):
        yield f"{where}: unknown field {key!r}"


def _has_edits(edits: Any) -> bool:
    return isinstance(edits, Mapping) and any(edits.get(key) for key in _EDIT_FIELDS)


def _semver(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))
