"""The DeviceClasses of the reference Helm chart, one per device type."""

from __future__ import annotations

from services.core.kube.resource import (
    CELDeviceSelector,
    DeviceClass,
    DeviceClassSpec,
    DeviceSelector,
    ObjectMeta,
)
from services.core.model.nvidia import DRIVER_NAME, GPU_TYPE, MIG_TYPE, VFIO_TYPE, DeviceType

GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
VFIO_CLASS = "vfio.gpu.nvidia.com"
GPU_EXTENDED_RESOURCE = "nvidia.com/gpu"


def _selector(device_type: DeviceType) -> DeviceSelector:
    # The chart quotes with single quotes; CONTRACTS.md shows double quotes (same CEL).
    expression = (
        f"device.driver == '{DRIVER_NAME}' && "
        f"device.attributes['{DRIVER_NAME}'].type == '{device_type}'"
    )
    return DeviceSelector(cel=CELDeviceSelector(expression=expression))


def device_classes() -> list[DeviceClass]:
    """The three DeviceClasses of the reference Helm chart (resource.k8s.io/v1)."""
    return [
        DeviceClass(
            metadata=ObjectMeta(name=GPU_CLASS),
            spec=DeviceClassSpec(
                selectors=[_selector(GPU_TYPE)], extended_resource_name=GPU_EXTENDED_RESOURCE
            ),
        ),
        DeviceClass(
            metadata=ObjectMeta(name=MIG_CLASS),
            spec=DeviceClassSpec(selectors=[_selector(MIG_TYPE)]),
        ),
        DeviceClass(
            metadata=ObjectMeta(name=VFIO_CLASS),
            spec=DeviceClassSpec(selectors=[_selector(VFIO_TYPE)]),
        ),
    ]
