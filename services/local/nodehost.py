"""The fake host of one real node: a private mount namespace that holds it.

``services.local.node`` starts this module under ``unshare --mount
--propagation private``; every process of the node (containerd, the kubelet,
the node's gpudra preparer) then joins its mount namespace with ``nsenter``.
It sets the namespace up, says ``ready`` on stdout and waits for SIGTERM; the
namespace, and with it every mount below, goes away with the node's last
process. What it sets up, none of it visible outside the namespace:

* ``/var/lib`` and ``/var/log``: bind mounts of the node's own folders (the
  kubelet and containerd write under them, some paths are fixed in their code);
* ``/run``: an empty tmpfs (containerd's state, runc's, the shims' sockets);
* the sysctls the kubelet sets at start (``kernel.panic``, ``vm.overcommit_memory``
  ...): each ``/proc/sys`` file is covered by a bind mount of a plain file
  holding the host's value, so the kubelet writes to that file, not the kernel;
* ``/run/nvidia/driver``: the simulated node's driver installation
  (:mod:`services.local.driverroot`: libraries with their sonames, ldconfig's
  cache, firmware, sockets, and ``dev/`` with the GPUs' device nodes made with
  mknod), as the GPU operator installs a driver; ``usr/bin`` holds NVIDIA's
  real ``nvidia-cdi-hook`` and ``nvidia-ctk`` and the stand-in ``nvidia-smi``
  (:mod:`services.local.nvidiasmi`).

    python -m services.local.nodehost SPEC.json   (only under unshare --mount)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import msgspec

from services.discovery.fleet import get_fleet
from services.local import driverfiles, driverroot, nvidiasmi
from services.local.hostspec import DRIVER_BASE, KUBELET_SYSCTLS, READY, HostSpec


class HostError(RuntimeError):
    """A step of the set-up failed; the message names it."""


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HostError(f"mount {' '.join(args)}: {done.stderr.strip()}")


def _cover_sysctls(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in KUBELET_SYSCTLS:
        live = Path("/proc/sys") / name
        if not live.exists():
            continue
        cover = folder / name.replace("/", ".")
        cover.write_text(live.read_text())
        _mount("--bind", str(cover), str(live))


def _driver(spec: HostSpec) -> driverroot.DriverRoot:
    version = get_fleet(spec.fleet).driver_version  # what the simulated NVML reports
    root = driverroot.build(
        DRIVER_BASE,
        fleet=spec.fleet,
        version=version,
        node=spec.node,
        seed=spec.seed,
        dev_in_driver_root=True,
    )
    bin_dir = root.driver_root / "usr" / "bin"
    for tool in (spec.nvidia_cdi_hook, spec.nvidia_ctk):
        shutil.copy2(tool, bin_dir / Path(tool).name)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(nvidiasmi.script(root))
    smi.chmod(0o755)
    driverfiles.cleanup()
    return root


def set_up(spec: HostSpec) -> dict[str, object]:
    """Everything above, in order; what was made, for the runner."""
    for source, target in ((spec.var_lib, "/var/lib"), (spec.var_log, "/var/log")):
        Path(source).mkdir(parents=True, exist_ok=True)
        _mount("--bind", source, target)
    _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
    _cover_sysctls(Path(spec.sysctl_dir))
    root = _driver(spec)
    return {
        "driverRoot": str(root.driver_root),
        "devRoot": str(root.dev_root),
        "driverVersion": root.version,
        "gpus": [
            {
                "uuid": g.uuid,
                "minor": g.minor,
                "pciBusId": g.pci_bus_id,
                "iommuGroup": g.iommu_group,
                "migs": [
                    {
                        "uuid": m.uuid,
                        "profile": m.profile,
                        "giCap": m.gi_cap_minor,
                        "ciCap": m.ci_cap_minor,
                    }
                    for m in g.migs
                ],
            }
            for g in root.gpus
        ],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m services.local.nodehost SPEC.json", file=sys.stderr)
        return 2
    if os.stat("/proc/self/ns/mnt").st_ino == os.stat(f"/proc/{os.getppid()}/ns/mnt").st_ino:
        print("nodehost: refusing to run in its parent's mount namespace", file=sys.stderr)
        return 2
    try:
        spec = msgspec.json.decode(Path(argv[0]).read_bytes(), type=HostSpec)
        made = set_up(spec)
    except (HostError, OSError, RuntimeError, ValueError, msgspec.ValidationError) as exc:
        print(f"nodehost: {exc}", file=sys.stderr)
        return 1
    print(f"{READY} {json.dumps(made)}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    sys.exit(main(sys.argv[1:]))
