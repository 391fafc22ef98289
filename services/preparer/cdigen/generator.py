"""The claim's CDI spec from the driver installation and the prepared devices.

Common edits (driver libraries, binaries, firmware, IPC sockets, control
device nodes, hooks) depend only on the driver installation: they are found
once and reused until the installation changes, which costs two ``stat``
calls per claim to notice (the version's libcuda and its folder; an upgrade
replaces both). Per-device edits (the GPU's nodes, MIG capability nodes,
VFIO nodes, MPS and metadata mounts) are built per claim. The result goes
through the toolkit's simplify and host-root transforms, so it matches what
the reference driver writes for the same node.
"""

from __future__ import annotations

import copy
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from services.preparer.cdigen import driver, hooks, lookup, transform
from services.preparer.cdigen.devfs import DevFs, devices, render
from services.preparer.cdigen.model import CdiGenError, Device, Found

CONTROL_NODES = (
    "/dev/nvidia-modeset",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-uvm",
    "/dev/nvidiactl",
)
# A spec without these cannot work, so a node without them is an error on the
# claim (the toolkit would leave them out and the container would fail later).
REQUIRED_CONTROL = "/dev/nvidiactl"
VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"

# (gpu minor, GI id, CI id) -> the two nvidia-caps device nodes of a MIG device.
CapsNodes = Callable[[int, int, int], list[dict[str, Any]]]


@dataclass(frozen=True)
class Options:
    """Where the driver is, as the preparer sees it and as the runtime on the host sees it."""

    driver_root: str = "/"
    host_driver_root: str = "/"
    hook_path: str = hooks.DEFAULT_PATH  # on the host
    sysfs: str = "/sys"

    def local(self, host_path: str) -> str | None:
        """A host path under the host driver root as this process sees it (under the
        driver root); None for a path elsewhere, which this process may not see."""
        root = os.path.normpath(self.host_driver_root)
        if root == "/" or host_path == root or host_path.startswith(root + "/"):
            rest = host_path[len(root) :] if root != "/" else host_path
            return os.path.normpath(os.path.join(self.driver_root, rest.lstrip("/")))
        return None


@dataclass(frozen=True)
class Common:
    """Finished common edits (deduped, sorted, host paths rewritten) and their identities.

    Shared by every spec until the installation changes: never modified.
    """

    edits: dict[str, Any]
    ids: frozenset[str | bytes]


@dataclass
class _Cached:
    installation: driver.Installation
    nvml_version: str
    fingerprint: tuple[int, ...]
    common: Common


class Generator:
    def __init__(
        self, options: Options, fs: DevFs, caps: CapsNodes, iommufd: Callable[[], bool]
    ) -> None:
        self.options = options
        self._hook_local = options.local(options.hook_path)
        self.fs = fs
        self.caps = caps
        self.iommufd = iommufd
        self._common: _Cached | None = None
        self._raw: dict[str, Any] = {}
        self._gpus: dict[tuple[int, str], dict[str, Any]] = {}
        self.discoveries = 0  # how often the common edits were computed (tests, bench)

    # ------------------------------------------------------------ common edits

    def common(self, nvml_version: str = "") -> Common:
        """The installation's common edits; found again when the driver changed."""
        self.check_hook()
        cached = self._common
        if (
            cached is None
            or cached.nvml_version != nvml_version
            or cached.fingerprint != _fingerprint(cached.installation)
        ):
            cached = self._discover(nvml_version)
        return cached.common

    def common_edits(self, nvml_version: str = "") -> dict[str, Any]:
        """The common edits as discovered (before the host-root rewrite), a copy."""
        self.common(nvml_version)
        return copy.deepcopy(self._raw)

    def finish(self, edits: dict[str, Any]) -> Common:
        """Dedupe, sort and rewrite host paths of common edits (the spec's own part)."""
        transform.dedupe(edits)
        transform.sort_edits(edits)
        self.host_paths(edits)
        return Common(edits, transform.keys(edits))

    def host_paths(self, edits: dict[str, Any]) -> None:
        """Files and device nodes under the driver root as the host names them.

        A dev root elsewhere is taken to be the same path on the host, as the
        reference does (its dev root is the driver root or /).
        """
        transform.host_root(edits, self.options.driver_root, self.options.host_driver_root)

    def _discover(self, nvml_version: str) -> _Cached:
        self._common = None
        self._gpus.clear()
        inst = driver.find(self.options.driver_root, nvml_version)
        found = Found(devices=devices(self.fs, list(CONTROL_NODES)))
        if not any(d.path == REQUIRED_CONTROL for d in found.devices):
            raise CdiGenError(
                f"no char device {REQUIRED_CONTROL} under the dev root {self.fs.root} "
                "(is the NVIDIA driver loaded, and is the dev root right?)"
            )
        found.extend(driver.graphics(inst))
        found.extend(driver.libraries(inst))
        found.extend(driver.ipc_sockets(inst.root))
        found.extend(driver.firmware(inst, self.options.sysfs))
        found.extend(driver.binaries(inst.root))
        found.env.append(VISIBLE_DEVICES_VOID)
        raw = self._edits(found)
        self._raw = copy.deepcopy(raw)
        cached = _Cached(inst, nvml_version, _fingerprint(inst), self.finish(raw))
        self._common = cached
        self.discoveries += 1
        return cached

    def check_hook(self) -> None:
        """The hook must be there for every spec to work (one stat per claim).

        Checked where this process can see it: under the host driver root. A hook
        elsewhere (e.g. the kubelet plugin directory, as the reference puts it)
        is the operator's to provide.
        """
        local = self._hook_local
        if local is None:
            return
        try:
            st = os.stat(local)
            usable = stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)
        except OSError:
            usable = False
        if not usable:
            seen = f" (seen here as {local})" if local != self.options.hook_path else ""
            raise CdiGenError(
                f"the CDI hook {self.options.hook_path}{seen} is missing or not executable: "
                "install the NVIDIA Container Toolkit's nvidia-cdi-hook there or point "
                "--nvidia-cdi-hook-path at it"
            )

    def _edits(self, found: Found) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if found.devices:
            out["deviceNodes"] = [render(d, self.fs) for d in found.devices]
        if found.env:
            out["env"] = list(found.env)
        if found.mounts:
            out["mounts"] = [
                {"hostPath": m.host_path, "containerPath": m.path, "options": list(m.options)}
                for m in found.mounts
            ]
        if found.hooks:
            out["hooks"] = [hooks.render(h, self.options.hook_path) for h in found.hooks]
        return out

    # ------------------------------------------------------------ devices

    def gpu_edits(self, minor: int, pci_bus_id: str) -> dict[str, Any]:
        """A copy of a full GPU's edits: its node, its DRM nodes and their by-path links."""
        key = (minor, pci_bus_id)
        if key not in self._gpus:
            self._gpus[key] = self._gpu(minor, pci_bus_id)
        return _copy(self._gpus[key])

    def _gpu(self, minor: int, pci_bus_id: str) -> dict[str, Any]:
        bus = sysfs_bus_id(pci_bus_id)
        node = f"/dev/nvidia{minor}"
        found = Found(devices=devices(self.fs, [node, *self.fs.drm_nodes(bus)]))
        if not any(d.path == node for d in found.devices):
            raise CdiGenError(
                f"GPU {pci_bus_id}: no char device {node} under the dev root {self.fs.root}"
            )
        found.hooks += hooks.create_symlinks(
            self._by_path_links(bus, {d.host_path for d in found.devices})
        )
        return self._edits(found)

    def _by_path_links(self, bus: str, nodes: set[str]) -> list[str]:
        links = []
        for kind in ("card", "render"):
            link = os.path.join(self.fs.root, f"dev/dri/by-path/pci-{bus}-{kind}")
            target = self.fs.readlink(link)
            if target is None:
                continue
            node = (
                target
                if os.path.isabs(target)
                else os.path.normpath(os.path.join(os.path.dirname(link), target))
            )
            if node in nodes:
                links.append(f"{target}::{link}")
        return links

    def node(self, path: str) -> dict[str, Any]:
        """A device node outside the toolkit's sets (VFIO), with what stat says of it.

        The reference writes VFIO nodes as the host's ``/dev`` path only and leaves
        the rest to the runtime; we write the same path with the numbers we read
        at the dev root, as for every other node.
        """
        return render(Device(host_path=path, path=path), self.fs, lookup.join(self.fs.root, path))

    # ------------------------------------------------------------ the claim

    def claim_spec(
        self, kind: str, device_edits: Sequence[tuple[str, dict[str, Any]]], common: Common
    ) -> dict[str, Any]:
        """The finished spec from named device edits (modified here) and the common edits.

        The toolkit's simplify and host-root transform, applied to the common
        edits once (:meth:`finish`) and to each device's own edits here.
        """
        devices = []
        for name, edits in sorted(device_edits, key=lambda d: d[0]):
            transform.dedupe(edits)
            self.host_paths(edits)
            edits = transform.without(edits, common.ids)
            transform.sort_edits(edits)
            devices.append({"name": name, "containerEdits": edits})
        spec: dict[str, Any] = {"cdiVersion": "", "kind": kind, "devices": devices}
        if any(common.edits.values()):
            spec["containerEdits"] = common.edits
        return spec


def vfio_common(gen: Generator, api_device: bool, iommufd: bool) -> dict[str, Any]:
    """What a VFIO claim shares: no driver files, only the IOMMU API device when asked."""
    edits: dict[str, Any] = {"env": [VISIBLE_DEVICES_VOID]}
    if api_device:
        edits["deviceNodes"] = [gen.node("/dev/iommu" if iommufd else "/dev/vfio/vfio")]
    return edits


def with_vfio(gen: Generator, common: Common, api_device: bool, iommufd: bool) -> Common:
    """GPU common edits plus a VFIO claim's API device (a claim mixing both)."""
    node = gen.node("/dev/iommu" if iommufd else "/dev/vfio/vfio")
    edits = copy.deepcopy(common.edits)
    gen.host_paths(extra := {"deviceNodes": [node]})
    edits["deviceNodes"] = edits.get("deviceNodes", []) + extra["deviceNodes"]
    transform.dedupe(edits)
    transform.sort_edits(edits)
    return Common(edits, transform.keys(edits))


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs names it (``0000:3b:00.0``), as go-nvlib does."""
    bus = pci_bus_id.lower()
    domain, sep, rest = bus.partition(":")
    if sep and len(domain) == 8 and domain.startswith("0000"):
        return domain[4:] + ":" + rest
    return bus


def _copy(edits: dict[str, Any]) -> dict[str, Any]:
    """A copy the spec steps may change: new lists, new entity dicts (their lists shared,
    as no step changes them in place)."""
    return {k: [dict(e) if isinstance(e, dict) else e for e in v] for k, v in edits.items()}


def _fingerprint(inst: driver.Installation) -> tuple[int, ...]:
    """Cheap evidence that the installation is unchanged: its library and its folder."""
    out: list[int] = []
    for path in (inst.libcuda, lookup.join(inst.root, inst.lib_dir)):
        try:
            st = os.stat(path)
        except OSError:
            return (-1,)
        out += [st.st_ino, st.st_mtime_ns, st.st_size]
    return tuple(out)


def merge(*parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate edits (the CDI library's ContainerEdits.Append)."""
    out: dict[str, Any] = {}
    for part in parts:
        for edits in part:
            for k, v in edits.items():
                out.setdefault(k, []).extend(copy.deepcopy(v))
    return out
