"""Dynamic MIG devices through NVML (pynvml): create, destroy, list.

The calls block, so callers run them in a worker thread. Order follows the
reference driver: enable MIG mode if needed, create the GPU instance at the
placement, then its full compute instance; destroying goes CI then GI, and a
part that is already gone is not an error.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from services.core.model.schemas import Gpu, MigPlacement, MigProfile
from services.preparer.checkpoint import MigState
from services.preparer.devices.base import DeviceOpError


class NvmlMig:
    def __init__(self) -> None:
        import pynvml

        self.nv: Any = pynvml
        self._lock = threading.Lock()
        self._initialized = False

    def _init(self) -> None:
        with self._lock:
            if not self._initialized:
                self.nv.nvmlInit()
                self._initialized = True

    def shutdown(self) -> None:
        with self._lock:
            if self._initialized:
                self.nv.nvmlShutdown()
                self._initialized = False

    def _error(self, what: str, exc: Exception) -> DeviceOpError:
        return DeviceOpError(f"{what}: {exc}")

    def create(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigState:
        nv = self.nv
        what = (
            f"creating MIG device {profile.name} at placement {placement.start} on GPU {gpu.minor}"
        )
        self._init()
        gi = None
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
            if current != nv.NVML_DEVICE_MIG_ENABLE:
                nv.nvmlDeviceSetMigMode(handle, nv.NVML_DEVICE_MIG_ENABLE)
            info = nv.nvmlDeviceGetGpuInstanceProfileInfoById(handle, profile.gi_profile_id)
            where = nv.c_nvmlGpuInstancePlacement_t()
            where.start, where.size = placement.start, placement.size
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, where)
            gi_info = nv.nvmlGpuInstanceGetInfo(gi)
            ci_profile = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, profile.ci_profile_id, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            ci_info = nv.nvmlComputeInstanceGetInfo(ci)
            uuid = self._mig_uuid(handle, gi_info.id, ci_info.id)
        except nv.NVMLError as exc:
            if gi is not None:  # never leave a GPU instance without its compute instance
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpuInstanceDestroy(gi)
            raise self._error(what, exc) from exc
        return MigState(
            uuid=uuid,
            parent_uuid=gpu.uuid,
            parent_minor=gpu.minor,
            profile=profile.name,
            gi_profile_id=profile.gi_profile_id,
            placement_start=placement.start,
            placement_size=placement.size,
            gi_id=int(gi_info.id),
            ci_id=int(ci_info.id),
            created=True,
        )

    def _mig_uuid(self, handle: Any, gi_id: int, ci_id: int) -> str:
        nv = self.nv
        for index in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nv.NVMLError_NotFound:
                continue
            if (nv.nvmlDeviceGetGpuInstanceId(mig), nv.nvmlDeviceGetComputeInstanceId(mig)) == (
                gi_id,
                ci_id,
            ):
                return str(nv.nvmlDeviceGetUUID(mig))
        raise DeviceOpError(
            f"MIG device GI {gi_id} CI {ci_id} was created but NVML does not list it"
        )

    def destroy(self, mig: MigState) -> None:
        nv = self.nv
        what = f"destroying MIG device {mig.uuid} (GPU {mig.parent_minor} GI {mig.gi_id})"
        self._init()
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(mig.parent_uuid)
            try:
                gi = nv.nvmlDeviceGetGpuInstanceById(handle, mig.gi_id)
            except (nv.NVMLError_NotFound, nv.NVMLError_NotSupported):
                return  # gone already (or MIG mode off: nothing can exist)
            with contextlib.suppress(nv.NVMLError_NotFound):
                ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, mig.ci_id)
                nv.nvmlComputeInstanceDestroy(ci)
            nv.nvmlGpuInstanceDestroy(gi)
        except nv.NVMLError as exc:
            raise self._error(what, exc) from exc

    def live(self) -> list[MigState]:
        nv = self.nv
        self._init()
        out: list[MigState] = []
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                try:
                    current, _ = nv.nvmlDeviceGetMigMode(handle)
                except nv.NVMLError_NotSupported:
                    continue
                if current != nv.NVML_DEVICE_MIG_ENABLE:
                    continue
                out.extend(self._live_on(handle))
        except nv.NVMLError as exc:
            raise self._error("listing MIG devices", exc) from exc
        return out

    def _live_on(self, handle: Any) -> list[MigState]:
        nv = self.nv
        parent_uuid = str(nv.nvmlDeviceGetUUID(handle))
        minor = int(nv.nvmlDeviceGetMinorNumber(handle))
        out = []
        for index in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nv.NVMLError_NotFound:
                continue
            gi_id = int(nv.nvmlDeviceGetGpuInstanceId(mig))
            ci_id = int(nv.nvmlDeviceGetComputeInstanceId(mig))
            info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(handle, gi_id))
            out.append(
                MigState(
                    uuid=str(nv.nvmlDeviceGetUUID(mig)),
                    parent_uuid=parent_uuid,
                    parent_minor=minor,
                    profile="",
                    gi_profile_id=int(info.profileId),
                    placement_start=int(info.placement.start),
                    placement_size=int(info.placement.size),
                    gi_id=gi_id,
                    ci_id=ci_id,
                )
            )
        return out
