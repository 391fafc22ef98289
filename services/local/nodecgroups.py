"""A real node's cgroups: its kubelet's cgroup root in every hierarchy, and below it
the pods' and containers' cgroups.

Every node gets a root of its own (``/gpudra-<node>-<random>``), so that stopping a
node finds its containers by their cgroups and leaves no other process's alone;
the folders made here are removed once their processes are gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.local.nodetools import NodeError


def cgroup_mounts() -> list[tuple[Path, str]]:
    """(mount point, fstype) of every cgroup hierarchy of this host."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype = fields[sep + 1]
            if fstype in ("cgroup", "cgroup2"):
                found.append((Path(fields[4]), fstype))
    return found


@dataclass
class NodeCgroups:
    """The cgroups of node ``node`` under ``root`` (the kubelet's cgroupRoot)."""

    node: str
    root: str
    made: list[Path] = field(default_factory=list)

    def dirs(self) -> list[Path]:
        """The node's cgroup folders that exist, in every hierarchy."""
        found = []
        for mount, _ in cgroup_mounts():
            top = mount / self.root.lstrip("/")
            if top.is_dir():
                # os.walk skips a folder that goes away meanwhile (rglob raises): the
                # kubelet removes pod cgroups while a stopping node is looked at.
                found += sorted(Path(folder) for folder, _, _ in os.walk(top))
        return found

    def pids(self) -> list[int]:
        pids: set[int] = set()
        for folder in self.dirs():
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
        return sorted(pids)

    def make_root(self) -> None:
        """The kubelet wants its cgroup root to exist; a new cpuset gets its parent's CPUs."""
        for mount, fstype in cgroup_mounts():
            top = mount / self.root.lstrip("/")
            if top.exists():
                continue
            top.mkdir()
            self.made.append(top)
            if fstype == "cgroup2":
                with contextlib.suppress(OSError):
                    wanted = (mount / "cgroup.subtree_control").read_text().split()
                    (top / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (top / name).exists() and not (top / name).read_text().strip():
                    (top / name).write_text((mount / name).read_text())

    def kill_processes(self, timeout: float = 20.0) -> None:
        """SIGKILL every process in the node's cgroups (the containers), until none is left."""
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise NodeError(f"node {self.node}: processes {pids} survive in its cgroups")
            time.sleep(0.1)

    def remove(self, timeout: float = 20.0) -> None:
        """rmdir the node's cgroups, deepest first (a cgroup goes once it is empty)."""
        deadline = time.monotonic() + timeout
        while dirs := self.dirs():
            for folder in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            if self.dirs() and time.monotonic() > deadline:
                raise NodeError(f"node {self.node}: cgroups {self.dirs()} cannot be removed")
            if self.dirs():
                time.sleep(0.1)
