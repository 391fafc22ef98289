"""What the node runner (:mod:`services.local.node`) asks of a node's fake host
(:mod:`services.local.nodehost`), and the facts both sides share.

A module of its own so that the runner, and everything that imports it (the
stack), stays free of the simulated fleet's modules, which only the namespace's
side needs.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

#: Where the driver is installed inside the namespace (the GPU operator's place).
DRIVER_BASE = Path("/run/nvidia")
DRIVER_ROOT = DRIVER_BASE / "driver"
#: The files the kubelet writes at start-up (setupKernelTunables in 1.35).
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
#: The first word of the line the fake host prints once it is set up.
READY = "ready"


class HostSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the node runner asks for (written as JSON, the host module's one argument)."""

    node: str
    fleet: str
    seed: int = 0
    var_lib: str  # host folder mounted at /var/lib
    var_log: str  # host folder mounted at /var/log
    sysctl_dir: str  # host folder of the files that cover KUBELET_SYSCTLS
    nvidia_cdi_hook: str  # NVIDIA's binaries, installed into the driver root
    nvidia_ctk: str
