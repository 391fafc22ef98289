"""Looking at real nodes from a test: what a pod left behind, what the host looks like.

:func:`pod_traces` lists what a pod of a real node may leave behind: its
containers in containerd, its cgroups under the node's cgroup root, mounts in
the node's namespace that name it, its claims' CDI specs and checkpoint
entries (gpudra's and the kubelet's own DRA checkpoint). :class:`HostState` is
what a real node must never change on the host: the sysctls the kubelet sets,
iptables, the host's mounts, the cgroup hierarchies' top level and the paths a
kubelet or containerd would create by default.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from services.core.bus.access import Role
from services.local.hostspec import KUBELET_SYSCTLS
from services.local.node import RealNode
from services.local.nodecgroups import cgroup_mounts
from services.local.stack import Stack
from services.preparer import cdi, checkpointfile
from tests.helpers.bus import connect
from tests.helpers.events import stored_claim_events

#: Other sysctls a node could be expected to touch (forwarding, bridges, route_localnet).
NETWORK_SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
)
#: Where a kubelet, containerd or CNI would write with their defaults.
DEFAULT_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/nri",
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/opt/containerd",
    "/usr/libexec/kubernetes",
    "/etc/cdi",
    "/var/run/cdi",
    "/run/nvidia",
)


def pod_containers(stack: Stack, node: str, pod_uid: str) -> list[str]:
    """The ids of the pod's containers in containerd (its sandbox included)."""
    label = f'labels."io.kubernetes.pod.uid"=={pod_uid}'
    return stack.real[node].ctr("containers", "ls", "-q", label).split()


def pod_traces(
    stack: Stack, node: str, pod_uid: str, claim_uids: Iterable[str], containers: Iterable[str]
) -> list[str]:
    """What is left on ``node`` of pod ``pod_uid`` (``containers``: its container ids,
    taken while it ran) and its claims; empty: nothing. A stopped sandbox's record
    in containerd is not counted: the kubelet's container GC removes it within a
    minute; its task, processes, mounts and cgroups must be gone at once."""
    real = stack.real[node]
    ids = set(containers)
    tasks = {line.split()[0] for line in real.ctr("tasks", "ls", "-q").split("\n") if line}
    found = [f"task {t} of the pod in containerd" for t in sorted(tasks & ids)]
    marker = f"pod{pod_uid}"
    found += [f"cgroup {d}" for d in real.cgroups.dirs() if marker in d.name]
    found += [
        f"mount {m}" for m in namespace_mounts(real) if pod_uid in m or any(i in m for i in ids)
    ]
    cdi_root = stack.nodes[node].paths.cdi_root
    prepared = gpudra_checkpoint(stack, node)
    kubelet = kubelet_checkpoint(stack, node)
    for uid in claim_uids:
        if cdi.spec_path(cdi_root, uid).exists():
            found.append(f"CDI spec of claim {uid}")
        if uid in prepared:
            found.append(f"gpudra checkpoint entry of claim {uid}")
        if uid in kubelet:
            found.append(f"kubelet DRA checkpoint entry of claim {uid}")
    return found


def claim_events(stack: Stack, uid: str) -> list[str]:
    """The names of claim ``uid``'s events on the CLAIMS stream, in order (as the auditor)."""

    async def read() -> list[str]:
        bus = await connect(stack.nats, Role.AUDITOR, name="e2e-real-nodes")
        try:
            return [e.event for e in await stored_claim_events(bus) if e.claim.uid == uid]
        finally:
            await bus.close()

    return asyncio.run(read())


def namespace_mounts(real: RealNode) -> list[str]:
    """Mount points in the node's namespace (its holder's view)."""
    if real.holder is None or not real.holder.running():
        return []
    text = Path(f"/proc/{real.holder.pid}/mountinfo").read_text()
    return [line.split()[4] for line in text.splitlines()]


def gpudra_checkpoint(stack: Stack, node: str) -> dict[str, str]:
    """claim uid -> state in gpudra's checkpoint on ``node``."""
    path = stack.nodes[node].paths.plugin_dir / "checkpoint.json"
    if not path.exists():
        return {}
    return {uid: c.state for uid, c in checkpointfile.decode(path.read_bytes()).claims.items()}


def kubelet_checkpoint(stack: Stack, node: str) -> set[str]:
    """Claim uids in the kubelet's DRA manager checkpoint (``<root>/dra_manager_state``:
    ``{"Data": "<JSON of {ClaimInfoStateList: [{ClaimUID, ...}]}>", "Checksum": N}``)."""
    path = stack.nodes[node].paths.kubelet_root / "dra_manager_state"
    if not path.exists():
        return set()
    data = json.loads(json.loads(path.read_text())["Data"])
    return {str(entry["ClaimUID"]) for entry in data.get("ClaimInfoStateList") or []}


@dataclass(frozen=True)
class HostState:
    sysctls: dict[str, str]
    iptables: str
    mounts: tuple[str, ...]
    cgroup_tops: dict[str, tuple[str, ...]]
    paths: dict[str, bool]

    @classmethod
    def now(cls) -> HostState:
        sysctls = {}
        for name in (*KUBELET_SYSCTLS, *NETWORK_SYSCTLS):
            path = Path("/proc/sys") / name
            if path.exists():
                sysctls[name] = path.read_text().strip()
        return cls(
            sysctls=sysctls,
            iptables=_iptables(),
            mounts=tuple(
                " ".join(line.split()[3:5])
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
            ),
            cgroup_tops={
                str(mount): tuple(sorted(p.name for p in mount.iterdir() if p.is_dir()))
                for mount, _ in cgroup_mounts()
            },
            paths={p: os.path.lexists(p) for p in DEFAULT_PATHS},
        )

    def differences(self, later: HostState, cgroups: Iterable[str] = ("",)) -> list[str]:
        """What changed; new top-level cgroups only where named with one of
        ``cgroups`` (prefixes: other sessions on a shared machine make their own)."""
        prefixes = tuple(cgroups)
        found = []
        for name, value in self.sysctls.items():
            if later.sysctls.get(name) != value:
                found.append(f"sysctl {name}: {value!r} -> {later.sysctls.get(name)!r}")
        if later.iptables != self.iptables:
            found.append(f"iptables changed:\n{self.iptables}\n->\n{later.iptables}")
        for mount in sorted(set(later.mounts) - set(self.mounts)):
            found.append(f"new host mount {mount}")
        for top, names in later.cgroup_tops.items():
            for name in sorted(set(names) - set(self.cgroup_tops.get(top, ()))):
                if name.startswith(prefixes):
                    found.append(f"new cgroup {top}/{name}")
        for path, existed in self.paths.items():
            if later.paths.get(path) != existed:
                found.append(f"{path}: existed {existed}, now {later.paths.get(path)}")
        return found


def _iptables() -> str:
    """The tables in use and, where the tools are installed, every rule."""
    parts = []
    for name in ("ip_tables_names", "ip6_tables_names"):
        path = Path("/proc/net") / name
        if path.exists():
            parts.append(f"{name}: {path.read_text().split()}")
    for tool in ("iptables-save", "ip6tables-save"):
        if shutil.which(tool):
            done = subprocess.run([tool], capture_output=True, text=True, check=False)
            rules = [ln for ln in done.stdout.splitlines() if not ln.startswith("#")]
            parts.append(f"{tool}: " + "\n".join(_no_counters(rules)))
    if shutil.which("nft"):
        done = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True)
        parts.append(f"nft: {done.stdout}")
    return "\n".join(parts)


def _no_counters(lines: list[str]) -> list[str]:
    return [ln.split(" [", 1)[0] if ln.startswith(":") else ln for ln in lines]
