"""The CDI edits of a prepared ComputeDomain claim, as the reference's plugin makes them.

A channel claim gets the IMEX channel character devices
``/dev/nvidia-caps-imex-channels/channel<N>`` (major of ``nvidia-caps-imex-channels``
in ``/proc/devices``, minor N, mode 0666; ``Single``: channel 0, ``All``: all 2048),
no environment, and nothing at all on a node outside a fabric. A daemon claim gets
the domain's identity in its environment (``CLIQUE_ID``, ``COMPUTE_DOMAIN_UUID``,
``COMPUTE_DOMAIN_NAME``, ``COMPUTE_DOMAIN_NAMESPACE``), the domain's directory
bind-mounted at ``/imexd`` and, in a fabric, the ``fabric-imex-mgmt`` capability
node (``/dev/nvidia-caps/nvidia-cap<minor>``, from
``/proc/driver/nvidia/capabilities/fabric-imex-mgmt``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from services.core.model import computedomain as cd
from services.core.model.refusal import ClaimRefused

IMEX_CHANNELS_DEVICE = "nvidia-caps-imex-channels"
CAPS_DEVICE = "nvidia-caps"
IMEXD_IN_CONTAINER = "/imexd"
VENDOR = "k8s.compute-domain.nvidia.com"


class EditsError(ClaimRefused, ValueError):
    """What the node's driver files do not say (a missing major, an unreadable capability)."""


def char_major(proc_devices: str, name: str) -> int:
    """The major of character device ``name`` in ``/proc/devices`` text; EditsError if absent.

    Only the "Character devices:" section counts (a block device of the same name
    is not it), as the reference's getDeviceMajor.
    """
    section = False
    for raw in proc_devices.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.endswith(":"):
            section = line.startswith("Character")
            continue
        parts = line.split()
        if section and len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    raise EditsError(f"/proc/devices has no character device {name!r}: is the driver loaded?")


@dataclass(frozen=True)
class CapFile:
    minor: int
    mode: int


_FIELD = re.compile(r"^\s*(DeviceFileMinor|DeviceFileMode)\s*:\s*(\d+)\s*$", re.M)


def parse_cap_file(text: str) -> CapFile:
    """``DeviceFileMinor``/``DeviceFileMode`` of a capability file; EditsError if missing."""
    found = dict(_FIELD.findall(text))
    if "DeviceFileMinor" not in found:
        raise EditsError("fabric-imex-mgmt capability file names no DeviceFileMinor")
    return CapFile(minor=int(found["DeviceFileMinor"]), mode=int(found.get("DeviceFileMode", 0)))


def channel_edits(mode: str, clique_id: str, imex_major: int) -> dict[str, Any]:
    """The containerEdits of a channel claim (empty outside a fabric)."""
    if mode not in cd.ALLOCATION_MODES:
        raise EditsError(f"allocationMode {mode!r}: want one of {', '.join(cd.ALLOCATION_MODES)}")
    if not clique_id:
        return {}
    channels = range(cd.IMEX_CHANNELS) if mode == cd.ALL else range(1)
    nodes = [
        {"path": f"/dev/nvidia-caps-imex-channels/channel{n}", "type": "c",
         "major": imex_major, "minor": n, "fileMode": 0o666}
        for n in channels
    ]  # fmt: skip
    return {"deviceNodes": nodes}


@dataclass(frozen=True)
class DomainRef:
    uid: str
    name: str
    namespace: str


def daemon_edits(
    domain: DomainRef, clique_id: str, host_dir: str, cap: CapFile | None, caps_major: int
) -> dict[str, Any]:
    """The containerEdits of a daemon claim: identity, ``/imexd``, the management capability."""
    edits: dict[str, Any] = {
        "env": [
            f"CLIQUE_ID={clique_id}",
            f"COMPUTE_DOMAIN_UUID={domain.uid}",
            f"COMPUTE_DOMAIN_NAME={domain.name}",
            f"COMPUTE_DOMAIN_NAMESPACE={domain.namespace}",
        ],
        "mounts": [
            {"hostPath": host_dir, "containerPath": IMEXD_IN_CONTAINER,
             "options": ["rw", "nosuid", "nodev", "bind"]}
        ],
    }  # fmt: skip
    if clique_id:
        if cap is None:
            raise EditsError("a daemon in a fabric needs the fabric-imex-mgmt capability")
        edits["deviceNodes"] = [
            {"path": f"/dev/nvidia-caps/nvidia-cap{cap.minor}", "type": "c",
             "major": caps_major, "minor": cap.minor, "fileMode": cap.mode or 0o400}
        ]  # fmt: skip
    return edits


def cdi_device_id(claim_uid: str, device: str) -> str:
    """``k8s.compute-domain.nvidia.com/claim=<claimUID>-<channel-0|daemon-0>``."""
    cd.device_type(device)  # ValueError for a name that is not ours
    return f"{VENDOR}/claim={claim_uid}-{device}"
