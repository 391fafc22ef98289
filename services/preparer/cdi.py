"""The claim's CDI spec: what the container runtime injects for each prepared device.

One transient spec per claim (``<cdiRoot>/k8s.gpu.nvidia.com-claim_<uid>.yaml``,
kind ``k8s.gpu.nvidia.com/claim``), one CDI device per allocated device
(``<uid>-<device>``), as the reference driver names them, so the kubelet and
the runtime see the same ids from either driver.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from services.preparer.cdigen.caps import mig_cap_minors
from services.preparer.cdigen.generator import Common, Generator, merge, vfio_common, with_vfio
from services.preparer.cdigen.model import CdiGenError
from services.preparer.checkpoint import GroupState, MpsState, PreparedDeviceState, ShareState
from services.preparer.fsutil import atomic_write, naming, remove

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
__all__ = ["mig_cap_minors"]
_CDI_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class MetadataMount:
    """A KEP-5304 device-metadata file and the request it describes."""

    host_path: str
    container_path: str
    device: str


def spec_path(root: Path, uid: str) -> Path:
    return root / f"{VENDOR}-{CLASS}_{uid}.yaml"


def device_name(uid: str, device: str, share_id: str | None = None) -> str:
    """``<claimUID>-<device>``, or ``<claimUID>-<device>-<shareID>`` for a consumable share."""
    return f"{uid}-{device}-{share_id}" if share_id else f"{uid}-{device}"


def device_id(uid: str, device: str, share_id: str | None = None) -> str:
    """The fully-qualified CDI id the kubelet hands to the runtime."""
    return f"{KIND}={device_name(uid, device, share_id)}"


def metadata_container_path(claim_name: str, request: str, driver: str, template: str) -> str:
    """KEP-5304 in-container path; ``template`` is the pod's claim name for generated claims."""
    base = request.split("/", 1)[0]
    scope = f"resourceclaimtemplates/{template}" if template else f"resourceclaims/{claim_name}"
    return f"{METADATA_IN_CONTAINER}/{scope}/{base}/{driver}-metadata.json"


def render(
    uid: str,
    devices: Sequence[PreparedDeviceState],
    groups: Sequence[GroupState],
    gen: Generator,
    nvml_version: str = "",
    metadata: Iterable[MetadataMount] = (),
) -> dict[str, Any]:
    """The spec as plain data (what is written); CdiGenError when the node cannot give one."""
    metadata_by_device: dict[str, list[MetadataMount]] = {}
    for mount in metadata:
        metadata_by_device.setdefault(mount.device, []).append(mount)
    named = []
    for device in devices:
        group = groups[device.group] if device.group < len(groups) else None
        edits = _device_edits(device, group, gen)
        for m in metadata_by_device.get(device.name, []):
            edits.setdefault("mounts", []).append(
                {"hostPath": m.host_path, "containerPath": m.container_path,
                 "options": ["ro", "nosuid", "nodev", "bind"]}
            )  # fmt: skip
        share_id = device.share.share_id if device.share is not None else None
        named.append((device_name(uid, device.name, share_id), edits))
    spec = gen.claim_spec(KIND, named, _common_edits(devices, groups, gen, nvml_version))
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def _device_edits(
    device: PreparedDeviceState, group: GroupState | None, gen: Generator
) -> dict[str, Any]:
    if device.kind == "vfio":
        assert device.vfio is not None
        iommufd = group is not None and group.vfio_iommufd and gen.iommufd()
        if iommufd and not device.vfio.iommufd_dev.startswith("vfio"):
            raise CdiGenError(f"missing iommufd cdev for GPU {device.vfio.pci_bus_id}")
        path = (
            f"/dev/vfio/devices/{device.vfio.iommufd_dev}"
            if iommufd
            else f"/dev/vfio/{device.vfio.iommu_group}"
        )
        return {"deviceNodes": [gen.node(path)]}
    minor = device.mig.parent_minor if device.mig else device.gpu_minor
    edits = gen.gpu_edits(minor, device.pci_bus_id)
    if device.mig is not None:
        caps = gen.caps(device.mig.parent_minor, device.mig.gi_id, device.mig.ci_id)
        edits.setdefault("deviceNodes", []).extend(caps)
    if group is not None and group.mps is not None:
        edits = merge([edits, _mps_edits(group.mps)])
    if device.share is not None and device.share_mps is not None:
        edits = merge([edits, _mps_edits(device.share_mps, share_env(device.share))])
    return edits


def share_env(share: ShareState) -> list[str]:
    """A consumable share's MPS client limits: its memory and its compute share."""
    env = [f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={share.thread_percentage}"]
    if share.memory_limit_mib is not None:
        env.append(
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={share.device_uuid}={share.memory_limit_mib}M"
        )
    return env


def _mps_edits(mps: MpsState, env: Sequence[str] = ()) -> dict[str, Any]:
    options = ["rw", "nosuid", "nodev", "bind"]
    return {
        "env": [f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}", *env],
        "mounts": [
            {
                "hostPath": mps.shm_dir,
                "containerPath": MPS_SHM_IN_CONTAINER,
                "options": options,
            },
            {
                "hostPath": mps.pipe_dir,
                "containerPath": MPS_PIPE_IN_CONTAINER,
                "options": options,
            },
        ],
    }


def _common_edits(
    devices: Sequence[PreparedDeviceState],
    groups: Sequence[GroupState],
    gen: Generator,
    nvml_version: str,
) -> Common:
    vfio_groups = [
        groups[g] for g in {d.group for d in devices if d.kind == "vfio"} if g < len(groups)
    ]
    api = any(g.vfio_api_device for g in vfio_groups)
    iommufd = any(g.vfio_iommufd for g in vfio_groups) and gen.iommufd()
    if all(d.kind == "vfio" for d in devices):
        return gen.finish(vfio_common(gen, api, iommufd))
    common = gen.common(nvml_version)
    return with_vfio(gen, common, api, iommufd) if api else common


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


def write(root: Path, uid: str, spec: dict[str, Any]) -> Path:
    """Write the claim's spec atomically: mode 0644 in a 0755 directory.

    The body is JSON, which is YAML too: the runtimes' CDI loader reads either
    whatever the file is called, and encoding JSON costs about 1 us where the
    YAML emitter took 150 (the file keeps the reference's ``.yaml`` name). Not
    fsynced: a spec a power loss tears is an orphan after the reboot (fsutil).
    """
    ensure_root(root)
    path = spec_path(root, uid)
    body = _JSON.encode(spec) + b"\n"
    atomic_write(path, body, mode=SPEC_MODE)
    return path


def delete(root: Path, uid: str) -> bool:
    return remove(spec_path(root, uid))


def ensure_root(root: Path) -> None:
    if not root.is_dir():
        with naming("create the folder", root):
            root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            os.chmod(root, DIR_MODE)


def claim_uids_on_disk(root: Path) -> list[str]:
    """UIDs of every claim spec of our kind in ``root`` (for orphan clean-up)."""
    if not root.is_dir():
        return []
    return sorted(m["uid"] for p in root.iterdir() if (m := _SPEC_FILE.match(p.name)))
