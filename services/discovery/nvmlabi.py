"""NVML's structs as nvml.h lays them out, for reading what NVML wrote.

pynvml (nvidia-ml-py) declares each struct once more in Python, and its
declarations have not always matched the header: from 12.535 to 13.610 its
``c_nvmlGpuFabricInfo_t`` gave ``clusterUuid`` 80 bytes (NVML's UUID *string*
buffer size) where nvml.h has 16, so ``status``, ``cliqueId`` and ``state`` sat
64 bytes past where NVML writes them, and until 12.575 the array was ``c_char``,
which ctypes hands back cut at the first NUL (a cluster UUID may hold NULs; an
H100 outside a fabric answers sixteen of them). Since 13.615 it matches the header.

So the backend never reads a field through the binding's declaration. A struct
NVML fills in memory we allocate is one of ours (:class:`GpuFabricInfo`,
:class:`GpuInstancePlacement`); one the binding allocated and returned is read
with :func:`read`: its bytes, as NVML wrote them, copied into our declaration of
the same nvml.h struct. The layouts below are copied from nvml.h (go-nvml's
pkg/nvml/nvml.h) for Linux's LP64 ABI; a binding struct smaller than the header's
(NVML wrote past its end) is an error, never a partial read.
"""

from __future__ import annotations

import ctypes
from typing import Any, TypeVar

from services.discovery import backend as nv

S = TypeVar("S", bound=ctypes.Structure)

GPU_FABRIC_UUID_LEN = 16  # NVML_GPU_FABRIC_UUID_LEN
PCI_BUS_ID_BUFFER_SIZE = 32  # NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
PCI_BUS_ID_BUFFER_V2_SIZE = 16  # NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
DEVICE_NAME_V2_BUFFER_SIZE = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE


class GpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t (nvmlDeviceGetGpuFabricInfo)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),  # nvmlReturn_t
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),  # nvmlGpuFabricState_t is an unsigned char
    ]


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3)."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * PCI_BUS_ID_BUFFER_SIZE),
    ]


class Memory(ctypes.Structure):
    """nvmlMemory_t (nvmlDeviceGetMemoryInfo)."""

    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class GpuInstancePlacement(ctypes.Structure):
    """nvmlGpuInstancePlacement_t."""

    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


_PROFILE_COUNTS = [
    ("id", ctypes.c_uint),
    ("isP2pSupported", ctypes.c_uint),
    ("sliceCount", ctypes.c_uint),
    ("instanceCount", ctypes.c_uint),
    ("multiprocessorCount", ctypes.c_uint),
    ("copyEngineCount", ctypes.c_uint),
    ("decoderCount", ctypes.c_uint),
    ("encoderCount", ctypes.c_uint),
    ("jpegCount", ctypes.c_uint),
    ("ofaCount", ctypes.c_uint),
    ("memorySizeMB", ctypes.c_ulonglong),
]


class GpuInstanceProfileInfo(ctypes.Structure):
    """nvmlGpuInstanceProfileInfo_t (nvmlDeviceGetGpuInstanceProfileInfo)."""

    _fields_ = list(_PROFILE_COUNTS)


class GpuInstanceProfileInfoV2(ctypes.Structure):
    """nvmlGpuInstanceProfileInfo_v2_t (nvmlDeviceGetGpuInstanceProfileInfoV)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        *_PROFILE_COUNTS,
        ("name", ctypes.c_char * DEVICE_NAME_V2_BUFFER_SIZE),
    ]


class GpuInstanceInfo(ctypes.Structure):
    """nvmlGpuInstanceInfo_t (nvmlGpuInstanceGetInfo)."""

    _fields_ = [
        ("device", ctypes.c_void_p),  # nvmlDevice_t
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", GpuInstancePlacement),
    ]


class ComputeInstanceProfileInfoV2(ctypes.Structure):
    """nvmlComputeInstanceProfileInfo_v2_t (nvmlGpuInstanceGetComputeInstanceProfileInfoV)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("id", ctypes.c_uint),
        ("sliceCount", ctypes.c_uint),
        ("instanceCount", ctypes.c_uint),
        ("multiprocessorCount", ctypes.c_uint),
        ("sharedCopyEngineCount", ctypes.c_uint),
        ("sharedDecoderCount", ctypes.c_uint),
        ("sharedEncoderCount", ctypes.c_uint),
        ("sharedJpegCount", ctypes.c_uint),
        ("sharedOfaCount", ctypes.c_uint),
        ("name", ctypes.c_char * DEVICE_NAME_V2_BUFFER_SIZE),
    ]


class ComputeInstanceInfo(ctypes.Structure):
    """nvmlComputeInstanceInfo_t (nvmlComputeInstanceGetInfo_v2)."""

    _fields_ = [
        ("device", ctypes.c_void_p),  # nvmlDevice_t
        ("gpuInstance", ctypes.c_void_p),  # nvmlGpuInstance_t
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", GpuInstancePlacement),  # nvmlComputeInstancePlacement_t, the same shape
    ]


class EventData(ctypes.Structure):
    """nvmlEventData_t (nvmlEventSetWait_v2)."""

    _fields_ = [
        ("device", ctypes.c_void_p),  # nvmlDevice_t
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def read(layout: type[S], filled: Any, binding: str = "pynvml") -> S:
    """``filled`` (a struct the binding allocated and NVML filled) as nvml.h's ``layout``."""
    if not isinstance(filled, ctypes.Structure):
        raise nv.NvmlError(
            f"{binding}: wanted a ctypes struct for {layout.__name__}, got {type(filled).__name__}"
        )
    have, want = ctypes.sizeof(filled), ctypes.sizeof(layout)
    if have < want:
        raise nv.NvmlError(
            f"{binding}: {type(filled).__name__} is {have} bytes, nvml.h's struct is {want}: "
            "NVML wrote past the binding's struct; use a binding in the range pyproject.toml allows"
        )
    return layout.from_buffer_copy(filled)


def c_string(raw: bytes) -> str:
    """A C string field (char[N]) as text: up to its first NUL."""
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace")
