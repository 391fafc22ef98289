"""What discovery finds, before it becomes CDI edits (the toolkit's discover types)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.core.model.refusal import ClaimRefused

LIBRARY_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")


class CdiGenError(ClaimRefused, RuntimeError):
    """The driver installation cannot give a working spec; the message says which path and why."""


@dataclass(frozen=True)
class Mount:
    host_path: str
    path: str
    options: tuple[str, ...] = LIBRARY_OPTIONS


@dataclass(frozen=True)
class Device:
    host_path: str
    path: str


@dataclass(frozen=True)
class Hook:
    name: str  # the nvidia-cdi-hook sub-command
    args: tuple[str, ...] = ()


@dataclass
class Found:
    """Devices, env, mounts and hooks, in the order the toolkit's edits list them."""

    devices: list[Device] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)

    def extend(self, other: Found) -> Found:
        self.devices += other.devices
        self.env += other.env
        self.mounts += other.mounts
        self.hooks += other.hooks
        return self
