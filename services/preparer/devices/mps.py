"""MPS control daemons as host processes, one per claim config group.

Each daemon gets its own directory under ``<plugin dir>/mps/<daemon id>/``
(``pipe``, ``shm`` as a private tmpfs, ``log``) and a ``daemon.json`` written
before the process starts, so a preparer that crashed mid-start can still
find the daemon and stop it. The daemon is ``nvidia-cuda-mps-control -d``
with ``CUDA_VISIBLE_DEVICES``, ``CUDA_MPS_PIPE_DIRECTORY`` and
``CUDA_MPS_LOG_DIRECTORY`` set; limits are sent to it on stdin, as
``nvidia-cuda-mps-control`` takes them interactively.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from pathlib import Path

import msgspec

from services.preparer.checkpoint import MpsState
from services.preparer.devices import commands
from services.preparer.devices.base import DeviceOpError, MpsRequest
from services.preparer.fsutil import atomic_write

log = logging.getLogger(__name__)

STATE_FILE = "daemon.json"
PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the daemon into its pipe directory
DEFAULT_SHM_SIZE = "65536k"


class MpsDaemons:
    def __init__(
        self,
        root: Path,
        control: str,
        *,
        mount_shm: bool = True,
        ready_timeout: float = 10.0,
    ) -> None:
        self.root = root  # <plugin dir>/mps
        self.control = control  # path of nvidia-cuda-mps-control
        self.mount_shm = mount_shm
        self.ready_timeout = ready_timeout

    def _dirs(self, daemon_id: str) -> MpsState:
        base = self.root / daemon_id
        return MpsState(
            daemon_id=daemon_id,
            root_dir=str(base),
            pipe_dir=str(base / "pipe"),
            shm_dir=str(base / "shm"),
            log_dir=str(base / "log"),
            device_uuids=[],
        )

    def env(self, state: MpsState) -> dict[str, str]:
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(state.device_uuids),
            "CUDA_MPS_PIPE_DIRECTORY": state.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": state.log_dir,
        }

    async def start(self, request: MpsRequest) -> MpsState:
        existing = self._read(request.daemon_id)
        if existing is not None and existing.pid and _alive(existing.pid):
            return existing
        state = msgspec.structs.replace(
            self._dirs(request.daemon_id),
            device_uuids=request.device_uuids,
            gpu_uuids=request.gpu_uuids,
            active_thread_percentage=request.active_thread_percentage,
            pinned_memory_limits_mib=request.pinned_memory_limits_mib,
        )
        # The record goes down before the process: a crash from here on is findable.
        await asyncio.to_thread(self._create_dirs, state)
        if self.mount_shm and not await asyncio.to_thread(os.path.ismount, state.shm_dir):
            await commands.run(
                ["mount", "-t", "tmpfs", "-o",
                 f"rw,nosuid,nodev,noexec,relatime,size={DEFAULT_SHM_SIZE}", "shm", state.shm_dir],
                what=f"MPS daemon {state.daemon_id}: mounting its shm tmpfs",
            )  # fmt: skip
        what = f"MPS daemon {state.daemon_id}"
        args = [self.control, "-d"] + (["-M"] if request.multi_user else [])
        await commands.run(args, what=f"starting {what}", env=self.env(state))
        pid = await self._wait_ready(state)
        state = msgspec.structs.replace(state, pid=pid)
        self._write(state)
        if state.active_thread_percentage is not None:
            await self._send(
                state, f"set_default_active_thread_percentage {state.active_thread_percentage}"
            )
        for uuid, mib in sorted(state.pinned_memory_limits_mib.items()):
            await self._send(state, f"set_default_device_pinned_mem_limit {uuid} {mib}M")
        return state

    async def _send(self, state: MpsState, command: str) -> str:
        return await commands.run(
            [self.control],
            what=f"MPS daemon {state.daemon_id}: {command.split()[0]}",
            env=self.env(state),
            stdin=(command + "\n").encode(),
        )

    async def _wait_ready(self, state: MpsState) -> int | None:
        """The daemon is up when its pipe directory has its pid file (or control pipe)."""
        deadline = time.monotonic() + self.ready_timeout
        pid_path = Path(state.pipe_dir) / PID_FILE
        while time.monotonic() < deadline:
            if pid_path.exists():
                text = pid_path.read_text().strip()
                return int(text) if text.isdigit() else None
            if (Path(state.pipe_dir) / "control").exists():
                return None
            await asyncio.sleep(0.05)
        raise DeviceOpError(
            f"MPS daemon {state.daemon_id} did not come up within {self.ready_timeout:.0f}s "
            f"(see {state.log_dir}/control.log)"
        )

    async def stop(self, state: MpsState) -> None:
        current = self._read(state.daemon_id) or state
        if current.pid is None or _alive(current.pid):
            with contextlib.suppress(DeviceOpError):  # not running is fine
                await self._send(current, "quit")
            await self._wait_exit(current)
        if self.mount_shm and await asyncio.to_thread(os.path.ismount, current.shm_dir):
            await commands.run(
                ["umount", current.shm_dir], what=f"MPS daemon {current.daemon_id}: unmounting shm"
            )
        shutil.rmtree(current.root_dir, ignore_errors=True)

    async def _wait_exit(self, state: MpsState) -> None:
        if state.pid is None:
            return
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline and _alive(state.pid):  # noqa: ASYNC110 - not our child
            await asyncio.sleep(0.05)
        if _alive(state.pid):
            raise DeviceOpError(f"MPS daemon {state.daemon_id} (pid {state.pid}) did not quit")

    def list(self) -> list[MpsState]:
        if not self.root.is_dir():
            return []
        found = (self._read(p.name) for p in sorted(self.root.iterdir()) if p.is_dir())
        return [s for s in found if s is not None]

    def _read(self, daemon_id: str) -> MpsState | None:
        path = self.root / daemon_id / STATE_FILE
        try:
            return msgspec.json.decode(path.read_bytes(), type=MpsState)
        except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
            return None

    def _create_dirs(self, state: MpsState) -> None:
        for d in (state.pipe_dir, state.shm_dir, state.log_dir):
            Path(d).mkdir(parents=True, exist_ok=True)
        self._write(state)

    def _write(self, state: MpsState) -> None:
        atomic_write(Path(state.root_dir) / STATE_FILE, msgspec.json.encode(state), mode=0o600)


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (a dead daemon nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
