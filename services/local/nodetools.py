"""The binaries a real node (:mod:`services.local.node`) runs, found or built here.

The kubelet and NVIDIA's hooks come beside the control-plane binary
(``controlplane/build.sh``), containerd from ``containerd/build.sh`` (cached by its
inputs), runc from the distribution (Debian's runc package: ``make node-packages``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CONTAINERD_BUILD = Path(__file__).resolve().parent / "containerd" / "build.sh"
RUNC_PATHS = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc")


class NodeError(RuntimeError):
    """The node could not be started or stopped as asked; the message says which step."""


def build_containerd(*, force: bool = False) -> Path:
    """Run containerd/build.sh (a cache hit hashes three files); the binaries' folder."""
    cmd = [str(CONTAINERD_BUILD), *(["--force"] if force else [])]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise NodeError(f"{CONTAINERD_BUILD} failed with exit status {done.returncode}")
    return Path(lines[-1])


def find_runc() -> Path | None:
    for candidate in RUNC_PATHS:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    found = shutil.which("runc")
    return Path(found) if found else None


@dataclass(frozen=True)
class NodeTools:
    """The binaries a real node runs."""

    kubelet: Path  # the control plane's kubelet component
    containerd_dir: Path  # containerd, ctr, containerd-shim-runc-v2
    runc: Path
    nvidia_cdi_hook: Path
    nvidia_ctk: Path

    @property
    def containerd(self) -> Path:
        return self.containerd_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.containerd_dir / "ctr"

    @classmethod
    def find(
        cls,
        controlplane: Path,
        containerd_dir: Path | None = None,
        *,
        hooks_from: Path | None = None,
    ) -> NodeTools:
        """The kubelet beside the control-plane binary, NVIDIA's hooks beside it or beside
        ``hooks_from`` (the default build: a compatibility-tier build has none), containerd
        (built if needed), runc."""
        runc = find_runc()
        if runc is None:
            raise NodeError("no runc (Debian's runc package: make node-packages)")
        hooks = (hooks_from or controlplane).parent
        tools = cls(
            kubelet=controlplane.parent / "kubelet",
            containerd_dir=containerd_dir or build_containerd(),
            runc=runc,
            nvidia_cdi_hook=hooks / "nvidia-cdi-hook",
            nvidia_ctk=hooks / "nvidia-ctk",
        )
        for path in (tools.kubelet, tools.containerd, tools.ctr, tools.nvidia_cdi_hook):
            if not os.access(path, os.X_OK):
                raise NodeError(f"{path} is missing (services/local/*/build.sh builds it)")
        return tools
