"""Device nodes as the spec describes them, read from the node (runc's DeviceFromPath).

The toolkit lstat()s each node it injects and writes its major, minor, file
mode, ``rwm`` permissions and owning group, so the runtime need not look; a
node it cannot find is left out. :class:`HostDevFs` reads a real dev root; the
simulated backend supplies its own :class:`DevFs` (the one thing simulated).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any, Protocol

from services.preparer.cdigen import lookup
from services.preparer.cdigen.model import Device


@dataclass(frozen=True)
class NodeStat:
    major: int
    minor: int
    mode: int  # permission bits (st_mode without the file type)
    gid: int = 0
    kind: str = "c"  # c (char), b (block) or p (fifo), as CDI spells the type


class DevFs(Protocol):
    """Where device nodes are looked up: a dev root and the sysfs that names DRM nodes."""

    @property
    def root(self) -> str: ...

    def find(self, path: str) -> list[str]:
        """Host paths of the char devices matching ``path`` (e.g. ``/dev/nvidia0``)."""
        ...

    def stat(self, host_path: str) -> NodeStat | None:
        """The node's numbers; None when it is missing or not a device."""
        ...

    def drm_nodes(self, pci_bus_id: str) -> list[str]:
        """``/dev/dri/<name>`` of the GPU's DRM devices (from sysfs)."""
        ...

    def readlink(self, path: str) -> str | None: ...


class HostDevFs:
    """A real dev root (``/`` or the driver root when it has a ``dev`` folder)."""

    def __init__(self, root: str = "/", sysfs: str = "/sys") -> None:
        self._root = root
        self.sysfs = sysfs

    @property
    def root(self) -> str:
        return self._root

    def find(self, path: str) -> list[str]:
        return lookup.char_devices(self._root, path)

    def stat(self, host_path: str) -> NodeStat | None:
        try:
            st = os.lstat(host_path)
        except OSError:
            return None
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            return None
        kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else "p"
        return NodeStat(
            kind=kind,
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
            mode=st.st_mode & ~stat.S_IFMT(st.st_mode),
            gid=st.st_gid,
        )

    def drm_nodes(self, pci_bus_id: str) -> list[str]:
        folder = os.path.join(self.sysfs, "bus/pci/devices", pci_bus_id, "drm")
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return []
        return [os.path.join("/dev/dri", n) for n in names]

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None


def dev_root_of(driver_root: str) -> str:
    """The reference's rule: the driver root is the dev root when it has a ``dev`` folder."""
    return driver_root if os.path.isdir(os.path.join(driver_root, "dev")) else "/"


def devices(fs: DevFs, paths: list[str]) -> list[Device]:
    """The toolkit's char-device discoverer: each node found, with its path inside the root."""
    base = os.path.join("/", fs.root)
    out: list[Device] = []
    seen: set[str] = set()
    for wanted in paths:
        for host in fs.find(wanted):
            if host in seen:
                continue
            seen.add(host)
            inside = host if base == "/" else host.removeprefix(base)
            out.append(Device(host_path=host, path=inside or host))
    return out


def render(device: Device, fs: DevFs, stat_at: str = "") -> dict[str, Any]:
    """The CDI deviceNode; fields that are zero are left out, as Go's omitempty does.

    The node is read at ``stat_at`` (default: its host path). A node that
    cannot be read is written with its paths only, as the toolkit does; the
    runtime then reads it itself.
    """
    node: dict[str, Any] = {"path": device.path}
    if device.host_path and device.host_path != device.path:
        node["hostPath"] = device.host_path
    st = fs.stat(stat_at or device.host_path or device.path)
    if st is None:
        return node
    for key, value in (("major", st.major), ("minor", st.minor), ("fileMode", st.mode)):
        if value:
            node[key] = value
    node["permissions"] = "rwm"
    # The toolkit leaves the type out and the runtime stats the node again to
    # find it; we write what we read, so the runtime need not (and a simulated
    # node, whose device nodes exist only here, still injects).
    node["type"] = st.kind
    if st.gid:
        node["gid"] = st.gid
    return node
