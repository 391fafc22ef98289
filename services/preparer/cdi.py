"""The claim's CDI spec: what the container runtime injects for each prepared device.

One transient spec per claim (``<cdiRoot>/k8s.gpu.nvidia.com-claim_<uid>.yaml``,
kind ``k8s.gpu.nvidia.com/claim``), one CDI device per allocated device
(``<uid>-<device>``), as the reference driver names them, so the kubelet and
the runtime see the same ids from either driver.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from services.preparer.checkpoint import GroupState, PreparedDeviceState
from services.preparer.fsutil import DirSyncer, atomic_write, remove

VENDOR = "k8s.gpu.nvidia.com"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
DEFAULT_ROOT = Path("/var/run/cdi")
SPEC_MODE = 0o644
DIR_MODE = 0o755

MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
MPS_SHM_IN_CONTAINER = "/dev/shm"
METADATA_IN_CONTAINER = "/var/run/kubernetes.io/dra-device-attributes"

_JSON = msgspec.json.Encoder()
_SPEC_FILE = re.compile(rf"^{re.escape(VENDOR)}-{CLASS}_(?P<uid>.+)\.yaml$")
_CDI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")

# The nvidia kernel module numbers its capability device nodes from one static
# table (nv-caps.c): nvlink fabric-mgmt (0), mig config (1), mig monitor (2),
# then for each GPU minor 0..31: per GPU instance 0..14 its "access" node
# followed by compute instances 0..7. So the minors are a pure function of
# (GPU minor, GI id, CI id), the same numbers /proc/driver/nvidia-caps/mig-minors lists.
_CAPS_FIRST_GPU_MINOR = 3
_CAPS_PER_GI = 1 + 8
_CAPS_PER_GPU = 15 * _CAPS_PER_GI


def mig_cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """Minors of ``/dev/nvidia-caps/nvidia-cap<N>`` for a MIG device's GI and its CI."""
    if not (0 <= gpu_minor < 32 and 0 <= gi_id < 15 and 0 <= ci_id < 8):
        raise ValueError(f"no MIG capability for gpu{gpu_minor}/gi{gi_id}/ci{ci_id}")
    gi_minor = _CAPS_FIRST_GPU_MINOR + gpu_minor * _CAPS_PER_GPU + gi_id * _CAPS_PER_GI
    return gi_minor, gi_minor + 1 + ci_id


@dataclass(frozen=True)
class DriverFile:
    """A driver library or binary to bind-mount read-only into the container."""

    host_path: str
    container_path: str


@dataclass(frozen=True)
class NodeFacts:
    """What the spec needs to know about this node besides the claim."""

    driver_files: Sequence[DriverFile] = ()
    caps_major: int | None = None  # char major of nvidia-caps (from /proc/devices)
    dev_root: str = "/"  # where the host's /dev lives, as seen by the runtime
    # (major, minor) of a char device node, by its path on the host; None when unknown.
    # Known numbers go into the spec, so the runtime need not stat the node itself.
    char_device: Callable[[str], tuple[int, int] | None] = lambda _path: None


def stat_char_device(path: str) -> tuple[int, int] | None:
    """The numbers of the char device node at ``path``; None when it is missing or not one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


@dataclass(frozen=True)
class MetadataMount:
    """A KEP-5304 device-metadata file and the request it describes."""

    host_path: str
    container_path: str
    device: str


@dataclass
class _Edits:
    env: list[str] = field(default_factory=list)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = self.env
        if self.device_nodes:
            out["deviceNodes"] = self.device_nodes
        if self.mounts:
            out["mounts"] = self.mounts
        return out


def spec_path(root: Path, uid: str) -> Path:
    return root / f"{VENDOR}-{CLASS}_{uid}.yaml"


def device_name(uid: str, device: str) -> str:
    return f"{uid}-{device}"


def device_id(uid: str, device: str) -> str:
    """The fully-qualified CDI id the kubelet hands to the runtime."""
    return f"{KIND}={device_name(uid, device)}"


def metadata_container_path(claim_name: str, request: str, driver: str, template: str) -> str:
    """KEP-5304 in-container path; ``template`` is the pod's claim name for generated claims."""
    base = request.split("/", 1)[0]
    scope = f"resourceclaimtemplates/{template}" if template else f"resourceclaims/{claim_name}"
    return f"{METADATA_IN_CONTAINER}/{scope}/{base}/{driver}-metadata.json"


def render(
    uid: str,
    devices: Sequence[PreparedDeviceState],
    groups: Sequence[GroupState],
    facts: NodeFacts,
    metadata: Iterable[MetadataMount] = (),
) -> dict[str, Any]:
    """The spec as plain data (what is written as YAML)."""
    metadata_by_device: dict[str, list[MetadataMount]] = {}
    for mount in metadata:
        metadata_by_device.setdefault(mount.device, []).append(mount)
    specs = []
    for device in devices:
        edits = _device_edits(device, facts)
        group = groups[device.group] if device.group < len(groups) else None
        if group is not None and group.mps is not None:
            _add_mps(edits, group)
        for mount in metadata_by_device.get(device.name, []):
            edits.mounts.append(
                {
                    "hostPath": mount.host_path,
                    "containerPath": mount.container_path,
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            )
        specs.append({"name": device_name(uid, device.name), "containerEdits": edits.render()})
    spec: dict[str, Any] = {"cdiVersion": "", "kind": KIND, "devices": specs}
    common = _common_edits(devices, groups, facts).render()
    if common:
        spec["containerEdits"] = common
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def _dev(facts: NodeFacts, path: str) -> str:
    return path if facts.dev_root in ("", "/") else os.path.join(facts.dev_root, path.lstrip("/"))


def _node(facts: NodeFacts, path: str) -> dict[str, Any]:
    host = _dev(facts, path)
    node: dict[str, Any] = {"path": path} if host == path else {"path": path, "hostPath": host}
    numbers = facts.char_device(host)
    if numbers is not None:
        node.update(type="c", major=numbers[0], minor=numbers[1])
    return node


def _device_edits(device: PreparedDeviceState, facts: NodeFacts) -> _Edits:
    edits = _Edits()
    if device.kind == "vfio":
        assert device.vfio is not None
        edits.device_nodes.append(_node(facts, f"/dev/vfio/{device.vfio.iommu_group}"))
        return edits
    edits.device_nodes.append(_node(facts, f"/dev/nvidia{device.gpu_minor}"))
    if device.kind == "mig":
        assert device.mig is not None
        for minor in mig_cap_minors(device.mig.parent_minor, device.mig.gi_id, device.mig.ci_id):
            node: dict[str, Any] = {"path": f"/dev/nvidia-caps/nvidia-cap{minor}"}
            if facts.caps_major is not None:  # the node may exist only in the container
                node.update(type="c", major=facts.caps_major, minor=minor, permissions="rw")
            edits.device_nodes.append(node)
    return edits


def _add_mps(edits: _Edits, group: GroupState) -> None:
    assert group.mps is not None
    edits.env.append(f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}")
    options = ["rw", "nosuid", "nodev", "bind"]
    edits.mounts.append(
        {"hostPath": group.mps.shm_dir, "containerPath": MPS_SHM_IN_CONTAINER, "options": options}
    )
    edits.mounts.append(
        {"hostPath": group.mps.pipe_dir, "containerPath": MPS_PIPE_IN_CONTAINER, "options": options}
    )


def _common_edits(
    devices: Sequence[PreparedDeviceState], groups: Sequence[GroupState], facts: NodeFacts
) -> _Edits:
    # NVIDIA_VISIBLE_DEVICES=void keeps nvidia-container-runtime from injecting
    # devices of its own on top of what CDI injects.
    edits = _Edits(env=["NVIDIA_VISIBLE_DEVICES=void"])
    if any(d.kind != "vfio" for d in devices):
        for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
            edits.device_nodes.append(_node(facts, path))
        for f in facts.driver_files:
            edits.mounts.append(
                {
                    "hostPath": f.host_path,
                    "containerPath": f.container_path,
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            )
    vfio_groups = {d.group for d in devices if d.kind == "vfio"}
    if any(groups[g].vfio_api_device for g in vfio_groups if g < len(groups)):
        iommufd = any(groups[g].vfio_iommufd for g in vfio_groups if g < len(groups))
        edits.device_nodes.append(_node(facts, "/dev/iommu" if iommufd else "/dev/vfio/vfio"))
    return edits


def minimum_version(spec: dict[str, Any]) -> str:
    """The lowest cdiVersion whose features this spec uses (the CDI spec's own rules)."""
    edits = [d.get("containerEdits", {}) for d in spec.get("devices", [])]
    edits.append(spec.get("containerEdits", {}))
    if any(e.get("additionalGids") or e.get("intelRdt") for e in edits):
        return "0.7.0"
    cls = spec["kind"].partition("/")[2]
    if spec.get("annotations") or any(d.get("annotations") for d in spec["devices"]) or "." in cls:
        return "0.6.0"
    if any(not d["name"][:1].isalpha() for d in spec["devices"]) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])
    ):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def valid_device_name(name: str) -> bool:
    return bool(_CDI_NAME.match(name))


def write(
    root: Path, uid: str, spec: dict[str, Any], *, fsync: bool = True, dirs: DirSyncer | None = None
) -> Path:
    """Write the claim's spec atomically: mode 0644 in a 0755 directory.

    The body is JSON, which is YAML too: the runtimes' CDI loader reads either
    whatever the file is called, and encoding JSON costs about 1 us where the
    YAML emitter took 150 (the file keeps the reference's ``.yaml`` name).
    """
    ensure_root(root)
    path = spec_path(root, uid)
    body = _JSON.encode(spec) + b"\n"
    atomic_write(path, body, mode=SPEC_MODE, fsync=fsync, dirs=dirs)
    return path


def delete(root: Path, uid: str, *, fsync: bool = True, dirs: DirSyncer | None = None) -> bool:
    return remove(spec_path(root, uid), fsync=fsync, dirs=dirs)


def ensure_root(root: Path) -> None:
    if not root.is_dir():
        root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(root, DIR_MODE)


def claim_uids_on_disk(root: Path) -> list[str]:
    """UIDs of every claim spec of our kind in ``root`` (for orphan clean-up)."""
    if not root.is_dir():
        return []
    return sorted(m["uid"] for p in root.iterdir() if (m := _SPEC_FILE.match(p.name)))
