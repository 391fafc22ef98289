"""A mount namespace, known by the inode of ``/proc/<pid>/ns/mnt``: its processes,
and stopping them.

A real node's processes (containerd, the kubelet, the runc shims) all live in the
node's private mount namespace; finding them by it, not by name, leaves every other
process on the machine alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

Inode = tuple[int, int]  # (st_dev, st_ino) of a /proc/<pid>/ns/mnt


def of(pid: int) -> Inode:
    """The mount namespace process ``pid`` is in."""
    st = os.stat(f"/proc/{pid}/ns/mnt")
    return (st.st_dev, st.st_ino)


def pids(ns: Inode) -> list[int]:
    """Every process in the mount namespace ``ns``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            st = os.stat(entry / "ns" / "mnt")
            if (st.st_dev, st.st_ino) == ns:
                found.append(int(entry.name))
    return sorted(found)


def stop_all(ns: Inode, keep: int, timeout: float) -> list[int]:
    """SIGTERM, then SIGKILL, every process in ``ns`` but ``keep``; those still
    there after ``timeout`` seconds (none: all gone)."""
    deadline = time.monotonic() + timeout
    signum = signal.SIGTERM
    while left := [p for p in pids(ns) if p != keep]:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        time.sleep(0.2)
        signum = signal.SIGKILL
        if time.monotonic() > deadline:
            return left
    return []
