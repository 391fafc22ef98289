"""A good CDI spec and one broken copy per rule of the runtimes' CDI loader."""

from __future__ import annotations

import copy
from typing import Any

from tests.helpers.cdistate import UID


def good() -> dict[str, Any]:
    return {
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": [
                {"hostPath": "/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1"}
            ],
            "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook"}],
        },
        "devices": [
            {
                "name": f"{UID}-gpu-0",
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "type": "c"}]},
            }
        ],
    }


def broken(change: str) -> dict[str, Any]:
    spec = copy.deepcopy(good())
    edits = spec["containerEdits"]
    device = spec["devices"][0]
    match change:
        case "version":
            spec["cdiVersion"] = "9.9.9"
        case "version-too-old":
            spec["cdiVersion"] = "0.3.0"  # the device name starts with a digit: needs 0.5.0
        case "kind":
            spec["kind"] = "k8s.gpu.nvidia.com"
        case "vendor":
            spec["kind"] = "-bad/claim"
        case "unknown-field":
            spec["containerEdit"] = {}
        case "unknown-node-field":
            device["containerEdits"]["deviceNodes"][0]["hostpath"] = "/dev/nvidia0"
        case "env":
            edits["env"] = ["=void"]
        case "node-type":
            device["containerEdits"]["deviceNodes"][0]["type"] = "x"
        case "node-path":
            device["containerEdits"]["deviceNodes"][0]["path"] = ""
        case "node-major":
            device["containerEdits"]["deviceNodes"][0]["major"] = -1
        case "permissions":
            device["containerEdits"]["deviceNodes"][0]["permissions"] = "rwx"
        case "hook-name":
            edits["hooks"][0]["hookName"] = "create-container"
        case "hook-path":
            edits["hooks"][0]["path"] = ""
        case "mount":
            edits["mounts"][0]["containerPath"] = ""
        case "device-name":
            device["name"] = "gpu/0"
        case "duplicate":
            spec["devices"].append(copy.deepcopy(device))
        case "no-devices":
            spec["devices"] = []
        case "empty-device":
            device["containerEdits"] = {}
    return spec


CASES = {
    "version": "cdiVersion: invalid version '9.9.9'",
    "version-too-old": "cdiVersion: the spec version must be at least v0.5.0 (got 0.3.0)",
    "kind": "kind: 'k8s.gpu.nvidia.com' is not vendor/class",
    "vendor": "kind: vendor: invalid name '-bad'",
    "unknown-field": "spec: unknown field 'containerEdit'",
    "unknown-node-field": "devices[0].containerEdits.deviceNodes[0]: unknown field 'hostpath'",
    "env": "containerEdits.env[0]: invalid environment variable '=void'",
    "node-type": "devices[0].containerEdits.deviceNodes[0].type: device '/dev/nvidia0': "
    "invalid type 'x'",
    "node-path": "devices[0].containerEdits.deviceNodes[0].path: invalid (empty) device path",
    "node-major": "devices[0].containerEdits.deviceNodes[0].major: device '/dev/nvidia0': "
    "invalid device number -1",
    "permissions": "devices[0].containerEdits.deviceNodes[0].permissions: device '/dev/nvidia0': "
    "invalid permissions 'rwx'",
    "hook-name": "containerEdits.hooks[0].hookName: invalid hook name 'create-container'",
    "hook-path": "containerEdits.hooks[0].path: invalid hook 'createContainer' with empty path",
    "mount": "containerEdits.mounts[0].containerPath: invalid mount, empty container path",
    "device-name": "devices[0].name: invalid name 'gpu/0'",
    "duplicate": f"devices[1].name: invalid spec, multiple device '{UID}-gpu-0'",
    "no-devices": "devices: invalid spec, no devices",
    "empty-device": "devices[0].containerEdits: a device needs at least one edit",
}
