"""A CUDA process on a simulated node, as an MPS client: it obeys the limits it is given.

On a real node the MPS server enforces a client's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
(an allocation beyond it fails with an out-of-memory error) and caps its SMs to
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (never above the daemon's own percentage).
The simulated backend has no CUDA, so this stands in for a client process: it
connects through the pipe directory its environment names (resolved through
the container's mounts, as a process in the container would see it), to a
daemon the simulated host runs, and refuses allocations past its limit. Tests
drive it with a claim's CDI edits, so they prove what a container would get.

What it models is also what MPS cannot stop: the limits come from the
client's own environment, so a process that rewrites it before CUDA starts
gets what it writes (see docs/operations.md, "Consumable shares").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from services.preparer.checkpoint import MpsState
from services.preparer.devices.simulated import STATE_FILE, SimHost

MIB = 1024 * 1024


class SimCudaError(RuntimeError):
    """What CUDA would return to the process (the message names the CUDA error)."""


def _limits(text: str) -> dict[str, int]:
    """``uuid=8192M,uuid2=4G`` -> bytes per device, as MPS parses the variable."""
    out: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        device, sep, amount = item.partition("=")
        units = {"M": MIB, "G": 1024 * MIB}
        if not sep or not amount[:-1].isdigit() or amount[-1:] not in units:
            raise SimCudaError(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: cannot parse {item!r}")
        out[device] = int(amount[:-1]) * units[amount[-1]]
    return out


@dataclass
class SimMpsClient:
    daemon: MpsState
    env: dict[str, str]
    used: dict[str, int] = field(default_factory=dict)  # device uuid -> bytes allocated

    @classmethod
    def connect(
        cls, plugin_dir: Path, env: Mapping[str, str], mounts: Mapping[str, str]
    ) -> SimMpsClient:
        """Connect as a process with ``env`` and ``mounts`` (container path -> host path)."""
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
        if not pipe:
            raise SimCudaError("no CUDA_MPS_PIPE_DIRECTORY: not an MPS client")
        host_pipe = mounts.get(pipe, pipe)
        try:
            host = msgspec.json.decode((plugin_dir / STATE_FILE).read_bytes(), type=SimHost)
        except FileNotFoundError:
            host = SimHost()
        for daemon in host.mps.values():
            if daemon.pipe_dir == host_pipe:
                return cls(daemon, dict(env))
        raise SimCudaError(
            f"cudaErrorMpsConnectionFailed: no MPS control daemon serves {pipe} ({host_pipe})"
        )

    @classmethod
    def from_cdi(cls, plugin_dir: Path, spec: Mapping[str, Any], device: str) -> SimMpsClient:
        """As a container given CDI device ``device`` of ``spec`` (the claim's spec)."""
        env: dict[str, str] = {}
        mounts: dict[str, str] = {}
        edits: list[Mapping[str, Any]] = [spec.get("containerEdits") or {}]
        edits += [d.get("containerEdits") or {} for d in spec["devices"] if d["name"] == device]
        if len(edits) == 1:
            raise SimCudaError(f"CDI device {device!r} is not in the spec")
        for e in edits:
            env.update(_env(e.get("env") or []))
            mounts.update({m["containerPath"]: m["hostPath"] for m in e.get("mounts") or []})
        return cls.connect(plugin_dir, env, mounts)

    def limit(self, device_uuid: str) -> int | None:
        """The pinned-memory limit in bytes for ``device_uuid`` (None: the whole device)."""
        own = _limits(self.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""))
        if device_uuid in own:
            return own[device_uuid]
        mib = self.daemon.pinned_memory_limits_mib.get(device_uuid)
        return mib * MIB if mib is not None else None

    @property
    def active_thread_percentage(self) -> int:
        """The client's share of SMs: its own setting, never above the daemon's."""
        ceiling = self.daemon.active_thread_percentage or 100
        own = self.env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
        return min(int(own), ceiling) if own.isdigit() else ceiling

    def allocate(self, device_uuid: str, nbytes: int) -> None:
        """cuMemAlloc: refused past the pinned limit, as the MPS server refuses it."""
        if device_uuid not in self.daemon.device_uuids:
            raise SimCudaError(
                f"CUDA_ERROR_INVALID_DEVICE: {device_uuid} is not visible to this MPS daemon"
            )
        total = self.used.get(device_uuid, 0) + nbytes
        limit = self.limit(device_uuid)
        if limit is not None and total > limit:
            raise SimCudaError(
                f"CUDA_ERROR_OUT_OF_MEMORY: {total // MIB} MiB on {device_uuid} exceeds this "
                f"client's pinned device memory limit of {limit // MIB} MiB"
            )
        self.used[device_uuid] = total


def _env(items: Sequence[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items if "=" in item)
