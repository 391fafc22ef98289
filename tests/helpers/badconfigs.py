"""Ten opaque configs prepare refuses, each for one field; shared by the webhook's
unit tests and the e2e that applies them with and without the webhook.

Each case: (name, parameters, the field-specific words both callers must say).
The gates are `gpudra up`'s (MPSSupport, PassthroughSupport, TimeSlicingSettings).
"""

from __future__ import annotations

from typing import Any

API = "resource.nvidia.com/v1beta1"
GATES = "MPSSupport=true,PassthroughSupport=true,TimeSlicingSettings=true"


def _gpu(**sharing: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}


BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "strategy",
        _gpu(strategy="Spatial"),
        "GpuConfig.sharing.strategy: unknown GPU sharing strategy 'Spatial'",
    ),
    (
        "interval",
        _gpu(strategy="TimeSlicing", timeSlicingConfig={"interval": "Forever"}),
        "GpuConfig.sharing.timeSlicingConfig.interval: unknown time-slice interval 'Forever'",
    ),
    (
        "threads",
        _gpu(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 150}),
        "GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage: must be between 0 and 100",
    ),
    (
        "threadtype",
        _gpu(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": "half"}),
        "GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage: expected `int | null`",
    ),
    (
        "pinned",
        _gpu(strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "lots"}),
        "GpuConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit:",
    ),
    (
        "mixed",
        _gpu(strategy="TimeSlicing", mpsConfig={}),
        "GpuConfig.sharing.mpsConfig: not allowed with strategy TimeSlicing",
    ),
    (
        "unknownfield",
        {"apiVersion": API, "kind": "GpuConfig", "sharingg": {"strategy": "MPS"}},
        "GpuConfig.sharingg: unknown field",
    ),
    (
        "kind",
        {"apiVersion": API, "kind": "TpuConfig"},
        "unknown kind 'TpuConfig'",
    ),
    (
        "apiversion",
        {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
        "unsupported apiVersion 'resource.nvidia.com/v1'",
    ),
    (
        "iommu",
        {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "Bogus"}},
        "VfioDeviceConfig.iommu.backendPolicy: unknown IOMMU backend policy 'Bogus'",
    ),
]


def claim(namespace: str, name: str, params: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    """A ResourceClaim asking one GPU (request ``gpu``) with ``params`` as its config."""
    request: dict[str, Any] = {"name": "gpu"}
    if version == "v1beta1":
        request.update(deviceClassName="gpu.nvidia.com")
    else:
        request["exactly"] = {"deviceClassName": "gpu.nvidia.com"}
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "devices": {
                "requests": [request],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {"driver": "gpu.nvidia.com", "parameters": params},
                    }
                ],
            }
        },
    }
