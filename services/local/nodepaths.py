"""Where a node's files live under its folder: one layout for every node run here.

The stack's simulated nodes (:mod:`services.local.stacknodes`), the real nodes
(:mod:`services.local.node`) and the tests' preparer nodes all put a node in one
folder: the kubelet root and the CDI folder beside each other, the rest below the
kubelet root where the kubelet and the kubelet plugin meet. The node's gpudra
processes are given the first two (``--kubelet-root``, ``--cdi-root``) and find
the others themselves, as they do on a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.core.model import nvidia


@dataclass(frozen=True)
class NodePaths:
    """The folders of the node in ``root``."""

    root: Path
    kubelet_root: Path  # the kubelet's --root-dir
    cdi_root: Path  # the CDI specs the preparer writes and the runtime reads
    plugin_dir: Path  # plugins/gpu.nvidia.com: our plugin's sockets and checkpoint
    registration_dir: Path  # plugins_registry: where the kubelet finds plugins

    @classmethod
    def under(cls, root: Path) -> NodePaths:
        kubelet_root = root / "kubelet"
        return cls(
            root=root,
            kubelet_root=kubelet_root,
            cdi_root=root / "cdi",
            plugin_dir=kubelet_root / "plugins" / nvidia.DRIVER_NAME,
            registration_dir=kubelet_root / "plugins_registry",
        )
