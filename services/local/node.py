"""A real node without the GPU: containerd and the real kubelet, real containers.

:class:`RealNode` runs one simulated GPU node the way a cluster runs a node:
containerd (with CDI), runc, the real kubelet (v1.35, from the control-plane
binary), pods in real containers from images built here
(:mod:`services.local.images`) and imported with ``ctr``. The GPU is the one
thing simulated: the node's driver installation and device nodes are made by
:mod:`services.local.nodehost` inside the node's own private mount namespace,
which every node process joins (``nsenter``), so nothing on the host changes.
Settings: :mod:`services.local.nodeconfig`; binaries: :mod:`services.local.nodetools`;
cgroups: :mod:`services.local.nodecgroups`; the namespace's processes:
:mod:`services.local.mountns`.

::

    tools = NodeTools.find(build_controlplane())      # builds containerd on demand
    node = RealNode(cp, "gpu-node-a100", "dgx-a100", workdir / "nodes" / "gpu-node-a100", tools)
    node.start_host()                        # the namespace and the fake driver root
    ...                                      # gpudra's node processes: node.argv(...) for those
                                             # that must see the driver (the preparer)
    node.start_runtime(images)               # containerd, images, kubelet; Node Ready
    node.import_image(archive)               # any other OCI archive
    node.stop()                              # pods, kubelet, containerd, shims, cgroups, by PID

Layout under the node's folder (host paths; the kubelet root and the CDI
folder are the same paths inside the namespace)::

    kubelet/            the kubelet's --root-dir (plugins_registry/, plugins/, pods/)
    cdi/                the CDI folder containerd reads (the preparer writes there)
    containerd/         config.toml, containerd.sock, root/
    cni/                bin/ (the stand-in plugin), net.d/
    var-lib/, var-log/  /var/lib and /var/log inside the namespace (pod logs: var-log/pods)
    sysctl/             the files that stand for the sysctls the kubelet sets
    kubelet.yaml, host.json

Stopping goes by PID, newest first: the kubelet; every process in the node's
cgroups (the containers); containerd; what is left in the namespace (the runc
shims); the namespace's holder; then the node's cgroups, deepest first.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from services.local import REPO, hostspec, images, mountns, nodeconfig
from services.local.cluster import ControlPlane
from services.local.component import ControlPlaneError, Process, wait_until
from services.local.nodecgroups import NodeCgroups, cgroup_mounts
from services.local.nodepaths import NodePaths
from services.local.nodetools import NodeError, NodeTools, find_runc
from services.local.ports import free_port

#: The one namespace containerd keeps Kubernetes' images and containers in.
K8S_NAMESPACE = "k8s.io"
# ---- can it run here ---------------------------------------------------------


def unavailable() -> str | None:
    """Why real nodes cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "real nodes need root (mount namespaces, mknod, cgroups)"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"real nodes need util-linux's {tool}"
    mounts = cgroup_mounts()
    if not mounts:
        return "no cgroup hierarchy is mounted"
    probe = f"gpudra-probe-{os.getpid()}"
    for mount, _ in mounts:
        try:
            (mount / probe).mkdir()
            (mount / probe).rmdir()
        except OSError as exc:
            return f"cannot make cgroups in {mount} ({exc.strerror})"
    if find_runc() is None:
        return "no runc (Debian's runc package: make node-packages)"
    if shutil.which("ldconfig") is None and not Path("/usr/sbin/ldconfig").exists():
        return "the fake driver root needs ldconfig (its ld.so.cache)"
    return images.unavailable()  # cc, busybox-static


# ---- the node ----------------------------------------------------------------


class RealNode:
    """One simulated GPU node with containerd and the real kubelet (see the module)."""

    def __init__(
        self,
        cp: ControlPlane,
        name: str,
        fleet: str,
        root: Path,
        tools: NodeTools,
        *,
        seed: int = 0,
        feature_gates: Mapping[str, bool] | None = None,
        startup_timeout: float = 120.0,
        verbosity: int = 2,
    ) -> None:
        self.cp = cp
        self.name = name
        self.fleet = fleet
        self.root = root.resolve()
        self.paths = NodePaths.under(self.root)
        self.tools = tools
        self.seed = seed
        self.feature_gates = dict(feature_gates if feature_gates is not None else cp.feature_gates)
        self.startup_timeout = startup_timeout
        self.verbosity = verbosity
        self.logs_dir = cp.logs_dir
        self.cgroups = NodeCgroups(name, f"/gpudra-{name}-{uuid.uuid4().hex[:8]}")
        self.holder: Process | None = None
        self.containerd: Process | None = None
        self.kubelet: Process | None = None
        self.ns_inode: mountns.Inode | None = None
        # What the fake host holds: driverRoot, devRoot, driverVersion, and per GPU
        # its uuid, minor, pciBusId, iommuGroup and MIG devices (uuid, profile,
        # giCap, ciCap: their /dev/nvidia-caps minors), as nodehost.set_up says.
        self.host_facts: dict[str, Any] = {}

    # ---- paths -------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def driver_root(self) -> Path:
        """The driver root as the node's processes see it."""
        return hostspec.DRIVER_ROOT

    def inside(self, path: str | Path) -> Path:
        """A path of the node's namespace, as this process can read it."""
        if self.holder is None:
            raise NodeError(f"node {self.name}: the host is not started")
        return Path(f"/proc/{self.holder.pid}/root") / str(path).lstrip("/")

    def argv(self, argv: Sequence[str], cwd: Path | None = None) -> list[str]:
        """``argv`` run inside the node's mount namespace (as the same PID)."""
        if self.holder is None:
            raise NodeError(f"node {self.name}: the host is not started")
        return [
            "nsenter",
            f"--mount=/proc/{self.holder.pid}/ns/mnt",
            f"--wd={cwd or REPO}",
            "--",
            *argv,
        ]

    # ---- lifecycle -----------------------------------------------------------

    def start_host(self) -> None:
        """The mount namespace, its mounts and the fake driver installation;
        the node's folders (the CDI folder before containerd ever starts)."""
        self.launch_host()
        self.wait_host()

    def launch_host(self) -> None:
        """Start setting the host up (:meth:`wait_host` waits for it), so that
        several nodes build their driver roots at once."""
        for folder in (
            self.paths.kubelet_root,
            self.paths.cdi_root,
            self.root / "containerd" / "root",
        ):
            folder.mkdir(parents=True, exist_ok=True)
        spec = hostspec.HostSpec(
            node=self.name,
            fleet=self.fleet,
            seed=self.seed,
            var_lib=str(self.root / "var-lib"),
            var_log=str(self.root / "var-log"),
            sysctl_dir=str(self.root / "sysctl"),
            nvidia_cdi_hook=str(self.tools.nvidia_cdi_hook),
            nvidia_ctk=str(self.tools.nvidia_ctk),
        )
        spec_file = self.root / "host.json"
        spec_file.write_bytes(msgspec.json.encode(spec))
        argv = ["unshare", "--mount", "--propagation", "private", "--",
                sys.executable, "-m", "services.local.nodehost", str(spec_file)]  # fmt: skip
        log_path = self.logs_dir / f"nodehost-{self.name}.log"
        with open(log_path, "ab") as log:
            log.write(f"+ {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        self.holder = Process(f"nodehost-{self.name}", proc, log_path, argv)

    def wait_host(self) -> None:
        """Wait for the host's ``ready`` line (its facts), at most the start-up timeout."""
        assert self.holder is not None and self.holder.proc.stdout is not None
        proc, out = self.holder.proc, self.holder.proc.stdout
        ready, _, _ = select.select([out], [], [], self.startup_timeout)
        line = out.readline().decode() if ready else ""
        if not line.startswith(hostspec.READY):
            if proc.poll() is None:
                self.holder.stop()
            raise NodeError(
                f"node {self.name}: the fake host did not start (exit {proc.returncode}); "
                f"log {self.holder.log_path}:\n{self.holder.log_tail()}"
            )
        self.host_facts = json.loads(line.removeprefix(hostspec.READY))
        self.ns_inode = mountns.of(proc.pid)

    def start_runtime(self, archives: Sequence[images.ImageArchive]) -> None:
        """containerd, the images, the kubelet; returns when the Node is Ready
        and schedulable (the node lifecycle controller lifted the not-ready taint)."""
        self.cgroups.make_root()
        self.start_containerd()
        for archive in archives:
            self.import_image(archive.path)
        self.start_kubelet()
        self._wait_registered()

    def start_containerd(self) -> Process:
        if self.containerd is not None and self.containerd.running():
            raise NodeError(f"node {self.name}: containerd is already running")
        config = self.root / "containerd" / "config.toml"
        pause = images.PAUSE_IMAGE
        nodeconfig.write_cni(self.root / "cni" / "bin", self.root / "cni" / "net.d")
        config.write_text(
            nodeconfig.containerd_toml(
                nodeconfig.ContainerdSettings(
                    root=self.root / "containerd" / "root",
                    state="/run/containerd",
                    socket=self.socket,
                    cdi_dir=self.paths.cdi_root,
                    cni_bin=self.root / "cni" / "bin",
                    cni_conf=self.root / "cni" / "net.d",
                    runc=self.tools.runc,
                    sandbox_image=pause,
                    opt=self.root / "containerd" / "opt",
                )
            )
        )
        env = {"PATH": f"{self.tools.containerd_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.containerd = self._spawn(
            f"containerd-{self.name}",
            [str(self.tools.containerd), "--config", str(config), "--log-level", "info"],
            env,
        )
        self._wait(self.containerd, lambda: self._ctr_ok(), "containerd to serve")
        return self.containerd

    def kill_containerd(self) -> None:
        """SIGKILL containerd (its shims and containers keep running)."""
        if self.containerd is not None and self.containerd.running():
            os.kill(self.containerd.pid, signal.SIGKILL)
            self.containerd.proc.wait()

    def start_kubelet(self) -> Process:
        if self.kubelet is not None and self.kubelet.running():
            raise NodeError(f"node {self.name}: the kubelet is already running")
        config = self.root / "kubelet.yaml"
        config.write_text(
            json.dumps(
                nodeconfig.kubelet_config(
                    nodeconfig.KubeletSettings(
                        runtime_socket=self.socket,
                        cgroup_root=self.cgroups.root,
                        port=free_port(),
                        healthz_port=free_port(),
                        volume_plugin_dir=self.root / "volume-plugins",
                        feature_gates=self.feature_gates,
                    )
                ),
                indent=2,
            )
            + "\n"
        )
        argv = [
            str(self.tools.kubelet),
            "--config", str(config),
            "--kubeconfig", str(self.cp.kubeconfig),
            "--root-dir", str(self.paths.kubelet_root),
            "--hostname-override", self.name,
            "--node-ip", "127.0.0.1",
            f"--v={self.verbosity}",
        ]  # fmt: skip
        self.kubelet = self._spawn(f"kubelet-{self.name}", argv)
        return self.kubelet

    def stop_kubelet(self, timeout: float = 15.0) -> int | None:
        if self.kubelet is None:
            return None
        return self.kubelet.stop(timeout)

    def restart_kubelet(self) -> Process:
        self.stop_kubelet()
        process = self.start_kubelet()
        self._wait(process, self._ready, f"node {self.name} Ready after the kubelet's restart")
        return process

    def import_image(self, archive: Path) -> None:
        """``ctr images import`` into the namespace Kubernetes uses (the kubelet
        sees it at once)."""
        self.ctr("images", "import", "--local", str(archive), timeout=120)

    def ctr(self, *args: str, timeout: float = 60.0, check: bool = True) -> str:
        done = subprocess.run(
            [str(self.tools.ctr), "--address", str(self.socket), "--namespace", K8S_NAMESPACE,
             *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def stop(self) -> None:
        """Everything of this node, by PID, then its cgroups (see the module)."""
        if self.kubelet is not None:
            self.kubelet.stop()
        self.cgroups.kill_processes()
        if self.containerd is not None:
            self.containerd.stop()
        self._kill_namespace_processes()
        if self.holder is not None:
            self.holder.stop()
            if self.holder.proc.stdout is not None:
                self.holder.proc.stdout.close()
        self.cgroups.remove()

    # ---- what is left ----------------------------------------------------------

    def namespace_pids(self) -> list[int]:
        """Every process in the node's mount namespace (the holder included)."""
        return [] if self.ns_inode is None else mountns.pids(self.ns_inode)

    def leftovers(self) -> list[str]:
        """What a stopped node left behind (empty when it stopped cleanly)."""
        found = [f"process {pid} in the node's mount namespace" for pid in self.namespace_pids()]
        found += [f"process {pid} in the node's cgroups" for pid in self.cgroups.pids()]
        found += [f"cgroup {d}" for d in self.cgroups.dirs()]
        return found

    # ---- internals -------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Process:
        full = self.argv(argv)
        log_path = self.logs_dir / f"{name}.log"
        environ = {**os.environ, **(env or {})}
        return Process.start(name, full, log_path, cwd=REPO, env=environ)

    def _wait(self, process: Process, check: Callable[[], Any], what: str) -> Any:
        def probe() -> Any:
            if not process.running():
                raise NodeError(
                    f"{process.name} exited with {process.proc.returncode} while waiting for "
                    f"{what}; log {process.log_path}:\n{process.log_tail()}"
                )
            return check()

        try:
            return wait_until(probe, self.startup_timeout, what, interval=0.1)
        except TimeoutError as exc:
            raise NodeError(f"{exc}; log {process.log_path}:\n{process.log_tail()}") from None

    def _ctr_ok(self) -> bool:
        return self.socket.exists() and bool(self.ctr("version", timeout=10, check=False))

    def _node(self) -> Any:
        return self.cp.get("node", self.name)

    def _ready(self) -> bool:
        node = self._node()
        if node is None:
            return False
        conditions = {c["type"]: c["status"] for c in node["status"].get("conditions") or []}
        taints = [t["key"] for t in node["spec"].get("taints") or []]
        return conditions.get("Ready") == "True" and not taints

    def _wait_registered(self) -> None:
        assert self.kubelet is not None
        self._wait(self.kubelet, lambda: self._node() is not None, f"node {self.name} registered")
        # The kubelet leaves a loopback node IP out (nodeIP can't be loopback); the API
        # server reaches the kubelet (logs, exec) at the Node's InternalIP.
        status = {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}
        self.cp.kubectl(
            "patch", "node", self.name, "--subresource=status", "--type=merge",
            "-p", json.dumps(status),
        )  # fmt: skip
        self._wait(self.kubelet, self._ready, f"node {self.name} Ready without taints")

    def _kill_namespace_processes(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL, what is left in the namespace (the runc shims), but
        the holder, which goes last."""
        holder = self.holder.pid if self.holder is not None else -1
        left = [] if self.ns_inode is None else mountns.stop_all(self.ns_inode, holder, timeout)
        if left:
            raise NodeError(f"node {self.name}: processes {left} survive in its namespace")


@contextlib.contextmanager
def running(node: RealNode, archives: Sequence[images.ImageArchive]) -> Iterator[RealNode]:
    """``with running(node, archives):`` start the host and the runtime, stop it all after."""
    try:
        node.start_host()
        node.start_runtime(archives)
        yield node
    finally:
        node.stop()


def start_failed(exc: BaseException) -> str:
    """One line for a node that did not start."""
    if isinstance(exc, NodeError | ControlPlaneError | TimeoutError):
        return str(exc).splitlines()[0]
    return f"{type(exc).__name__}: {exc}"
