"""pynvml's own declarations of the structs the NVML backend touches, per release.

Copied field for field from each release's pynvml.py (the nvidia-ml-py wheels on
PyPI), so a test can put another release's layouts into the installed ``pynvml``
and check the backend reads what NVML wrote all the same. Between the releases
below only ``c_nvmlGpuFabricInfo_t`` differs; every other struct here has the same
fields in all three, and the same layout in all eleven releases compared (12.535.161,
12.550.89, 12.560.30, 12.570.172, 12.575.51, 13.580.65, 13.580.126, 13.590.48,
13.595.45, 13.610.43, 13.615.71):

- 12.575.51 (and 12.535-12.575): ``clusterUuid`` is ``c_char * 80``
  (NVML_DEVICE_UUID_BUFFER_SIZE): 92 bytes where nvml.h has 28, and ctypes returns
  the array as bytes cut at the first NUL (then decoded to str by
  ``_PrintableStructure``).
- 13.610.43 (and 13.580.65-13.610.43; the version NVIDIA's CUDA image ships):
  ``c_uint8 * 80``: 92 bytes, ``status``/``cliqueId``/``state`` at 80/84/88 where
  NVML writes them at 16/20/24.
- 13.615.71 (requirements.lock): ``c_uint8 * NVML_GPU_FABRIC_UUID_LEN`` (16), as
  nvml.h has it.

Every layout keeps pynvml's base class (``_PrintableStructure`` turns a ``c_char``
field into str when read) and its ``__init__``, which set the version field.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_char, c_uint, c_uint8, c_uint32, c_ulonglong
from typing import Any

import pynvml
import pytest
from pynvml import (
    NVML_DEVICE_NAME_V2_BUFFER_SIZE,
    NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE,
    NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE,
    NVML_DEVICE_UUID_BUFFER_SIZE,
    NVML_GPU_FABRIC_UUID_LEN,
    _nvmlGpuFabricState_t,
    _nvmlReturn_t,
    _PrintableStructure,
    c_nvmlDevice_t,
    c_nvmlGpuInstance_t,
    nvmlComputeInstanceProfileInfo_v2,
    nvmlGpuInstanceProfileInfo_v2,
)

# ---------------------------------------------------------------- the same in every release


class nvmlPciInfo_t(_PrintableStructure):  # type: ignore[misc]
    _fields_ = [
        # Moved to the new busId location below
        ("busIdLegacy", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        # Added in 2.285
        ("pciSubSystemId", c_uint),
        # New busId replaced the long deprecated and reserved fields with a
        # field of the same size in 9.0
        ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]
    _fmt_ = {
        "domain": "0x%08X",
        "bus": "0x%02X",
        "device": "0x%02X",
        "pciDeviceId": "0x%08X",
        "pciSubSystemId": "0x%08X",
    }


class c_nvmlMemory_t(_PrintableStructure):  # type: ignore[misc]
    _fields_ = [
        ("total", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]
    _fmt_ = {"<default>": "%d B"}


class c_nvmlGpuInstancePlacement_t(Structure):
    _fields_ = [("start", c_uint), ("size", c_uint)]


class c_nvmlGpuInstanceProfileInfo_t(Structure):
    _fields_ = [
        ("id", c_uint),
        ("isP2pSupported", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("copyEngineCount", c_uint),
        ("decoderCount", c_uint),
        ("encoderCount", c_uint),
        ("jpegCount", c_uint),
        ("ofaCount", c_uint),
        ("memorySizeMB", c_ulonglong),
    ]


class c_nvmlGpuInstanceProfileInfo_v2_t(_PrintableStructure):  # type: ignore[misc]
    _fields_ = [
        ("version", c_uint),
        ("id", c_uint),
        ("isP2pSupported", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("copyEngineCount", c_uint),
        ("decoderCount", c_uint),
        ("encoderCount", c_uint),
        ("jpegCount", c_uint),
        ("ofaCount", c_uint),
        ("memorySizeMB", c_ulonglong),
        ("name", c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuInstanceProfileInfo_v2)


class c_nvmlGpuInstanceInfo_t(Structure):
    _fields_ = [
        ("device", c_nvmlDevice_t),
        ("id", c_uint),
        ("profileId", c_uint),
        ("placement", c_nvmlGpuInstancePlacement_t),
    ]


class c_nvmlComputeInstancePlacement_t(Structure):
    _fields_ = [("start", c_uint), ("size", c_uint)]


class c_nvmlComputeInstanceProfileInfo_v2_t(_PrintableStructure):  # type: ignore[misc]
    _fields_ = [
        ("version", c_uint),
        ("id", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("sharedCopyEngineCount", c_uint),
        ("sharedDecoderCount", c_uint),
        ("sharedEncoderCount", c_uint),
        ("sharedJpegCount", c_uint),
        ("sharedOfaCount", c_uint),
        ("name", c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlComputeInstanceProfileInfo_v2)


class c_nvmlComputeInstanceInfo_t(Structure):
    _fields_ = [
        ("device", c_nvmlDevice_t),
        ("gpuInstance", c_nvmlGpuInstance_t),
        ("id", c_uint),
        ("profileId", c_uint),
        ("placement", c_nvmlComputeInstancePlacement_t),
    ]


class c_nvmlEventData_t(_PrintableStructure):  # type: ignore[misc]
    _fields_ = [
        ("device", c_nvmlDevice_t),
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]
    _fmt_ = {"eventType": "0x%08X"}


# ---------------------------------------------------------------- c_nvmlGpuFabricInfo_t


class fabric_12_575_51(_PrintableStructure):  # type: ignore[misc]
    _fields_ = [
        ("clusterUuid", c_char * NVML_DEVICE_UUID_BUFFER_SIZE),
        ("status", _nvmlReturn_t),
        ("cliqueId", c_uint32),
        ("state", _nvmlGpuFabricState_t),
    ]


class fabric_13_610_43(_PrintableStructure):  # type: ignore[misc]
    _fields_ = [
        ("clusterUuid", c_uint8 * NVML_DEVICE_UUID_BUFFER_SIZE),
        ("status", _nvmlReturn_t),
        ("cliqueId", c_uint32),
        ("state", _nvmlGpuFabricState_t),
    ]


class fabric_13_615_71(_PrintableStructure):  # type: ignore[misc]
    _fields_ = [
        ("clusterUuid", c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", _nvmlReturn_t),
        ("cliqueId", c_uint32),
        ("state", _nvmlGpuFabricState_t),
    ]


_COMMON: dict[str, type[Structure]] = {
    "nvmlPciInfo_t": nvmlPciInfo_t,
    "c_nvmlMemory_t": c_nvmlMemory_t,
    "c_nvmlGpuInstancePlacement_t": c_nvmlGpuInstancePlacement_t,
    "c_nvmlGpuInstanceProfileInfo_t": c_nvmlGpuInstanceProfileInfo_t,
    "c_nvmlGpuInstanceProfileInfo_v2_t": c_nvmlGpuInstanceProfileInfo_v2_t,
    "c_nvmlGpuInstanceInfo_t": c_nvmlGpuInstanceInfo_t,
    "c_nvmlComputeInstancePlacement_t": c_nvmlComputeInstancePlacement_t,
    "c_nvmlComputeInstanceProfileInfo_v2_t": c_nvmlComputeInstanceProfileInfo_v2_t,
    "c_nvmlComputeInstanceInfo_t": c_nvmlComputeInstanceInfo_t,
    "c_nvmlEventData_t": c_nvmlEventData_t,
}
LAYOUTS: dict[str, dict[str, type[Structure]]] = {
    "12.575.51": {**_COMMON, "c_nvmlGpuFabricInfo_t": fabric_12_575_51},
    "13.610.43": {**_COMMON, "c_nvmlGpuFabricInfo_t": fabric_13_610_43},
    "13.615.71": {**_COMMON, "c_nvmlGpuFabricInfo_t": fabric_13_615_71},
}


def install(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    """Put ``release``'s struct declarations into the installed pynvml."""
    for name, cls in LAYOUTS[release].items():
        monkeypatch.setattr(pynvml, name, cls)


def shape(cls: Any) -> list[tuple[str, str, int, int]]:
    """A struct's fields as (name, ctypes type, offset, size), to compare declarations."""
    out = []
    for name, kind, *_ in cls._fields_:
        if issubclass(kind, ctypes.Array):
            type_name = f"{kind._type_.__name__}[{kind._length_}]"
        elif issubclass(kind, Structure):
            type_name = repr(shape(kind))
        else:
            type_name = kind.__name__
        field = getattr(cls, name)
        out.append((name, type_name, field.offset, field.size))
    return out
