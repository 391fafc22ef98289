"""The two ``/dev/nvidia-caps`` nodes that give a container one MIG device.

As the reference driver does (``GetDevNodesForMigDevice``): the GI's and the
CI's ``access`` files under ``/proc/driver/nvidia/capabilities`` give each
node's minor and file mode, ``/proc/devices`` the ``nvidia-caps`` major, and
the node is made in the container only (type ``c``), so the host need not
have it. Without the proc files (a simulated node) the minors come from the
kernel module's static table, the same numbers ``mig-minors`` lists.
"""

from __future__ import annotations

import os
import re
from typing import Any

from services.preparer.cdigen.model import CdiGenError

# nv-caps.c numbers the nodes from one static table: nvlink fabric-mgmt (0),
# mig config (1), mig monitor (2), then for each GPU minor 0..31: per GPU
# instance 0..14 its "access" node followed by compute instances 0..7.
_FIRST_GPU_MINOR = 3
_PER_GI = 1 + 8
_PER_GPU = 15 * _PER_GI
_MAJOR = re.compile(r"(?s)Character devices:.*?(\d+) nvidia-caps\n.*Block devices:")


def mig_cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """Minors of ``/dev/nvidia-caps/nvidia-cap<N>`` for a MIG device's GI and its CI."""
    if not (0 <= gpu_minor < 32 and 0 <= gi_id < 15 and 0 <= ci_id < 8):
        raise ValueError(f"no MIG capability for gpu{gpu_minor}/gi{gi_id}/ci{ci_id}")
    gi_minor = _FIRST_GPU_MINOR + gpu_minor * _PER_GPU + gi_id * _PER_GI
    return gi_minor, gi_minor + 1 + ci_id


def node(major: int, minor: int, mode: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"path": f"/dev/nvidia-caps/nvidia-cap{minor}", "type": "c"}
    if mode:
        out["fileMode"] = mode
    if major:
        out["major"] = major
    if minor:
        out["minor"] = minor
    return out


def caps_major(proc: str = "/proc") -> int | None:
    """The ``nvidia-caps`` char major from ``/proc/devices`` (None when the driver has none)."""
    try:
        with open(os.path.join(proc, "devices")) as f:
            match = _MAJOR.search(f.read())
    except OSError:
        return None
    return int(match[1]) if match else None


class ProcCaps:
    """MIG capability nodes read from a real node's /proc."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc

    def __call__(self, gpu_minor: int, gi_id: int, ci_id: int) -> list[dict[str, Any]]:
        major = caps_major(self.proc)
        if major is None:
            raise CdiGenError(f"no nvidia-caps char device in {self.proc}/devices (MIG needs it)")
        base = os.path.join(self.proc, f"driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi_id}")
        table = mig_cap_minors(gpu_minor, gi_id, ci_id)
        out = []
        for path, fallback in (
            (f"{base}/access", table[0]),
            (f"{base}/ci{ci_id}/access", table[1]),
        ):
            minor, mode = _access(path)
            out.append(node(major, fallback if minor is None else minor, mode))
        return out


def _access(path: str) -> tuple[int | None, int | None]:
    """DeviceFileMinor and DeviceFileMode of a capability's access file (None when absent)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    values: dict[str, int] = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and value.strip().isdigit():
            values[key.strip()] = int(value.strip())
    return values.get("DeviceFileMinor"), values.get("DeviceFileMode")


class TableCaps:
    """MIG capability nodes of a simulated node: the static table and a fixed major."""

    def __init__(self, major: int) -> None:
        self.major = major

    def __call__(self, gpu_minor: int, gi_id: int, ci_id: int) -> list[dict[str, Any]]:
        return [node(self.major, m, None) for m in mig_cap_minors(gpu_minor, gi_id, ci_id)]
