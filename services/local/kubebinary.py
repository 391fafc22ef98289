"""The control-plane binary: built by ``controlplane/build.sh``, and the release it holds.

One multi-call binary holds etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kubectl, the kubelet, ``kubelet-dra`` and
``reference-allocator``; build.sh builds it from the Go module proxy once per
set of inputs and prints the cached path after that (about a second).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from services.local.component import ControlPlaneError

CONTROLPLANE_DIR = Path(__file__).resolve().parent / "controlplane"
BUILD_SCRIPT = CONTROLPLANE_DIR / "build.sh"


def build_controlplane(
    *, env: Mapping[str, str] | None = None, force: bool = False, version: str | None = None
) -> Path:
    """Run build.sh (a cache hit takes about a second) and return the binary's path.

    ``version``: ``1.34``, ``1.35`` or ``1.36`` for a release of the compatibility tier
    (built on demand and cached like the default, ``1.37``)."""
    cmd = [str(BUILD_SCRIPT)]
    if force:
        cmd.append("--force")
    if version:
        cmd += ["--version", version]
    proc = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=None,  # progress goes straight to the terminal / pytest capture
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit status {proc.returncode}")
    binary = Path(lines[-1])
    if not binary.is_file():
        raise ControlPlaneError(f"{BUILD_SCRIPT} printed {binary}, which is not a file")
    return binary


def kube_version(binary: Path) -> str:
    """The Kubernetes release a control-plane binary holds (``v1.37.2``)."""
    try:
        return (binary.parent / "kubernetes-version").read_text().strip()
    except OSError as exc:
        raise ControlPlaneError(f"{binary}: no kubernetes-version beside it ({exc})") from None


def kube_minor(binary: Path) -> int:
    """The minor of :func:`kube_version` (37 for ``v1.37.2``)."""
    version = kube_version(binary)
    try:
        return int(version.removeprefix("v").split(".")[1])
    except (IndexError, ValueError):
        raise ControlPlaneError(f"{binary}: unreadable kubernetes-version {version!r}") from None
