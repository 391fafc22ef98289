"""What a container on a real node actually sees, read from inside it.

``kubectl exec`` (API server -> the node's kubelet -> containerd's streaming
server -> runc) runs :data:`PROBE` with the container's own busybox ``sh``; it
prints the character devices under /dev with their numbers, the environment,
/proc/self/mountinfo, the symlinks in the library folder (what
``nvidia-cdi-hook create-symlinks`` and the ldconfig of ``update-ldcache``
made), the ld.so.conf.d files the hook wrote, whether the container's
ld.so.cache names libcuda.so.1, and the stand-in ``nvidia-smi -L``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from services.local.cluster import ControlPlane

LIB_DIR = "/usr/lib/x86_64-linux-gnu"

PROBE = f"""
echo '== devices'
find /dev -type c | while read -r f; do stat -c '%n %t %T' "$f"; done
echo '== env'
env
echo '== mounts'
cat /proc/self/mountinfo
echo '== links'
for f in {LIB_DIR}/* {LIB_DIR}/*/*; do [ -L "$f" ] && echo "$f -> $(readlink "$f")"; done
echo '== ldconf'
ls /etc/ld.so.conf.d 2>/dev/null
echo '== ldcache'
grep -c libcuda.so.1 /etc/ld.so.cache 2>/dev/null || echo 0
echo '== smi'
nvidia-smi -L 2>&1
echo "== smi-exit $?"
"""


@dataclass(frozen=True)
class Mount:
    root: str  # the source's path inside its filesystem (mountinfo field 4)
    target: str  # where the container sees it
    fstype: str


@dataclass
class ContainerView:
    devices: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (major, minor)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # path -> target
    ldconf: list[str] = field(default_factory=list)
    ldcache_names_libcuda: bool = False
    smi: list[str] = field(default_factory=list)  # nvidia-smi -L lines
    smi_exit: int = -1

    def gpu_nodes(self) -> dict[str, tuple[int, int]]:
        """/dev/nvidia<N>: the GPUs' own nodes."""
        return {p: n for p, n in self.devices.items() if re.fullmatch(r"/dev/nvidia\d+", p)}

    def caps_nodes(self) -> dict[str, tuple[int, int]]:
        return {p: n for p, n in self.devices.items() if p.startswith("/dev/nvidia-caps/")}

    def vfio_nodes(self) -> dict[str, tuple[int, int]]:
        return {p: n for p, n in self.devices.items() if p.startswith("/dev/vfio/")}

    def mounted_at(self, target: str) -> Mount | None:
        return next((m for m in self.mounts if m.target == target), None)

    def smi_uuids(self) -> list[str]:
        """Every UUID nvidia-smi -L lists (GPUs and MIG devices), in order."""
        return re.findall(r"UUID: ((?:GPU|MIG)-[0-9a-f-]+)", "\n".join(self.smi))


def parse(text: str) -> ContainerView:
    view = ContainerView()
    section = ""
    for line in text.splitlines():
        if line.startswith("== "):
            section = line[3:]
            if section.startswith("smi-exit "):
                view.smi_exit = int(section.split()[1])
            continue
        if not line.strip():
            continue
        if section == "devices":
            path, major, minor = line.rsplit(" ", 2)
            view.devices[path] = (int(major, 16), int(minor, 16))
        elif section == "env":
            name, _, value = line.partition("=")
            view.env[name] = value
        elif section == "mounts":
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            view.mounts.append(Mount(root=fields[3], target=fields[4], fstype=fstype))
        elif section == "links":
            path, _, target = line.partition(" -> ")
            view.links[path] = target
        elif section == "ldconf":
            view.ldconf.append(line.strip())
        elif section == "ldcache":
            view.ldcache_names_libcuda = int(line.strip()) > 0
        elif section == "smi":
            view.smi.append(line)
    return view


def look(cp: ControlPlane, namespace: str, pod: str, container: str) -> ContainerView:
    """Run :data:`PROBE` in the container and parse what it printed."""
    out = cp.kubectl("exec", "-n", namespace, pod, "-c", container, "--", "sh", "-c", PROBE)
    return parse(out)


def summary(view: ContainerView) -> dict[str, object]:
    """What the container saw, in short (for the e2e report)."""
    gpu_devices = {
        p: f"{a}:{b}"
        for p, (a, b) in sorted(view.devices.items())
        if p.startswith(("/dev/nvidia", "/dev/vfio"))
    }
    return {
        "devices": gpu_devices,
        "env": {k: v for k, v in sorted(view.env.items()) if k.startswith(("NVIDIA", "CUDA"))},
        "driver mounts": sorted(m.target for m in view.mounts if "/nvidia/driver/" in m.root),
        "other gpudra mounts": sorted(m.target for m in view.mounts if "gpu.nvidia.com" in m.root),
        "hook links": sorted(f"{p} -> {t}" for p, t in view.links.items()),
        "ld.so.conf.d": view.ldconf,
        "nvidia-smi -L": view.smi,
    }
