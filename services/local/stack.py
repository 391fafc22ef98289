"""The whole gpudra stack on one machine, every component its own process.

Start order (stopped by PID in the reverse order)::

    jaeger (with ``jaeger=True``: every gpudra process exports its spans to it)
    nats-server (JetStream)
    etcd -> kube-apiserver -> kube-scheduler -> kube-controller-manager, Nodes
    DeviceClasses (deploy/deviceclasses.yaml), the ComputeDomain CRD (deploy/computedomains.yaml)
    per node: gpudra discovery (simulated fleet), gpudra preparer, gpudra kubeletplugin
    per node: kubelet-dra (the kubelet's DRA + plugin manager, same kubelet root),
              waited for until it has wiped its node's ResourceSlices
    gpudra publisher, gpudra allocator (claim watcher), gpudra domains (the
    ComputeDomain controller, daemons in namespace gpudra), cluster-wide
    the daemon pods' runner: each IMEX daemon pod Running on a simulated node
    becomes a local ``gpudra imex-daemon run`` (services/local/daemonpods.py)

With ``real_nodes=True`` every node is a real one (services/local/node.py):
its private mount namespace with the simulated driver root comes first (the
preparer runs inside it, with ``--driver-root /run/nvidia/driver``, so its CDI
specs name the driver files and device nodes containerd and the hooks see),
and in kubelet-dra's place containerd and the real kubelet run the pods in
real containers; the controller manager also runs the node lifecycle
controller, and the Nodes are the kubelets' own.

kubelet-dra starts before the publisher because a starting kubelet deletes its
node's ResourceSlices; our plugin registers with it, the presence record goes
on the bus and only then does the publisher write the node's slices, so a
started stack is one whose every node has a complete pool of slices.

Everything listens on 127.0.0.1. The work directory holds::

    kubeconfig, pki/, etcd/          the control plane (services/local/cluster.py)
    nats/                            JetStream store
    nats-access/                     the bus's CA, server certificate, config and one nkey
                                     seed per component (users/<identity>.nk)
    nodes/<node>/kubelet/            kubelet root: plugins_registry/, plugins/gpu.nvidia.com/
    nodes/<node>/cdi/                the CDI specs the preparer writes
    nodes/<node>/containerd/ ...     real nodes only (see services/local/node.py)
    images/                          real nodes only: the OCI archives imported on each node
    jaeger/jaeger.yaml               Jaeger's config (with ``jaeger=True``)
    logs/<component>.log             one log per process
    processes.json                   {name: pid} of every process started (current PIDs)
    supervision.json                 with ``supervise``: each process's PID, state, restarts

Every gpudra process serves its own metrics on a port of its own
(``metrics_ports``, on 127.0.0.1).

With ``supervise=True`` (what `gpudra up` runs) every process the stack started is
watched once it is up, as a cluster's kubelet watches its pods: a death is reported
at once (``say``, one line: process, PID, exit status or signal, its log's tail)
and the process is started again with the same command, nats-server on the same
port and store, after a back-off of 1 s doubling to 30 s
(:mod:`services.local.supervision`; restarts counted in ``supervision.json``).
Stopping the stack ends the supervision first.

:class:`Stack` starts and stops it all; beside it are its processes by name
(:mod:`services.local.stackprocs`), its nodes' kubelets
(:mod:`services.local.stackkubelets`) and what each node is
(:mod:`services.local.stacknodes`).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from services.core.bus.access import Role
from services.core.model import computedomain as cd
from services.core.model import featuregates, nvidia
from services.local import REPO, admission, images
from services.local.cluster import (
    DEFAULT_CONTROLLERS,
    REAL_NODE_CONTROLLERS,
    ControlPlane,
)
from services.local.clusteradmin import install_crd
from services.local.component import Process
from services.local.daemonpods import DaemonNode, DaemonPods
from services.local.jaeger import Jaeger
from services.local.kubebinary import build_controlplane
from services.local.natsserver import NatsServer
from services.local.node import RealNode
from services.local.nodepaths import NodePaths
from services.local.nodetools import NodeTools
from services.local.ports import free_port
from services.local.stackkubelets import StackKubelets
from services.local.stacknodes import DEMO_NODES, NodeSpec, StackNode
from services.local.stackprocs import StackError

DEVICE_CLASSES = REPO / "deploy" / "deviceclasses.yaml"
COMPUTE_DOMAIN_CRD = REPO / "deploy" / "computedomains.yaml"
COMPUTE_DOMAIN_CLIQUE_CRD = REPO / "deploy" / "computedomaincliques.yaml"
DRIVER_NAMESPACE = "gpudra"  # where `gpudra domains` puts the IMEX DaemonSets

#: Driver gates the examples need. DynamicMIG stays off: it cannot be combined
#: with MPSSupport or PassthroughSupport, so MIG devices come from the fleet's
#: static layout.
DEMO_GATES = "MPSSupport=true,PassthroughSupport=true,TimeSlicingSettings=true"

#: Kubernetes gates `gpudra up` turns on: DRAExtendedResource serves a pod's
#: ``nvidia.com/gpu`` limits from our DeviceClass (its extendedResourceName).
DEMO_KUBE_GATES: Mapping[str, bool] = {"DRAExtendedResource": True}

#: Simulated nodes: the IMEX daemons of a ComputeDomain are a DaemonSet's pods, which
#: the node's runner runs as local processes (services/local/daemonpods.py).
SIMULATED_CONTROLLERS = (*DEFAULT_CONTROLLERS, "daemonset-controller")

#: Simulated node i's IMEX daemons bind 127.0.0.<DAEMON_ADDRESS_BASE + i>.
DAEMON_ADDRESS_BASE = 10

#: The longest unix socket path (sun_path is 108 bytes with the NUL).
_MAX_SOCKET_PATH = 107


#: With domains, `gpudra up` shortens the kubelet plugin's prepare deadline from 45 s
#: to this: a channel claim's prepare waits for its node's daemon (whose pod
#: kubelet-dra syncs beside it), and a demo whose daemon cannot start fails sooner;
#: still far above any simulated GPU prepare.
DOMAIN_DEMO_PREPARE_TIMEOUT = 12.0


class Stack(StackKubelets):
    """NATS + control plane + every gpudra service for ``nodes``.

    ``gates`` are the driver's feature gates (preparer and publisher);
    ``kube_feature_gates`` go to the Kubernetes components (default
    :data:`DEMO_KUBE_GATES`, so that every example runs). ``pending_threshold``
    is how long a claim's pod waits before the allocator watcher explains why;
    ``prepare_timeout`` how long the kubelet plugin waits for the preparer
    (default: the plugin's own, 45 s). A given ``workdir`` must be empty or new.
    ``real_nodes``: containerd and the real kubelet instead of kubelet-dra (the
    caller checks :func:`services.local.node.unavailable` first); ``node_tools``
    their binaries (default: found beside the control plane, containerd built).
    ``kube_version``: the Kubernetes release to run (``1.34`` to ``1.36``, built on
    demand; default the newest, 1.37) when no ``binary`` is given.
    ``supervise``: once started, every process is watched and restarted when it dies
    (:meth:`~services.local.stackprocs.StackProcesses.supervise`), each death and
    restart reported to ``say`` (default: the log).
    """

    def __init__(
        self,
        nodes: Sequence[NodeSpec] = DEMO_NODES,
        *,
        workdir: Path | None = None,
        gates: str = DEMO_GATES,
        kube_feature_gates: Mapping[str, bool] | None = None,
        pending_threshold: float = 2.0,
        prepare_timeout: float | None = None,
        binary: Path | None = None,
        startup_timeout: float = 120.0,
        log_level: str = "info",
        jaeger: bool = False,
        real_nodes: bool = False,
        node_tools: NodeTools | None = None,
        webhook: bool = False,
        kube_version: str | None = None,
        supervise: bool = False,
        say: Callable[[str], None] | None = None,
    ) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise StackError(f"node names must be unique, got {names}")
        self.gates = featuregates.parse(gates).spec()
        if workdir is not None and workdir.exists() and any(workdir.iterdir()):
            raise StackError(f"work directory {workdir} is not empty; give a new or empty one")
        self._own_workdir = workdir is None
        workdir = Path(workdir or tempfile.mkdtemp(prefix="gpudra-up-")).resolve()
        nats = NatsServer(workdir / "nats", log_file=workdir / "logs" / "nats.log")
        cp = ControlPlane(
            binary,
            workdir=workdir,
            nodes=[] if real_nodes else names,  # real nodes register themselves
            feature_gates=DEMO_KUBE_GATES if kube_feature_gates is None else kube_feature_gates,
            controllers=REAL_NODE_CONTROLLERS if real_nodes else SIMULATED_CONTROLLERS,
            startup_timeout=startup_timeout,
        )
        # With ``jaeger``, every gpudra process exports its spans to a Jaeger started first.
        tracer = Jaeger(workdir / "jaeger") if jaeger else None
        super().__init__(workdir, cp, nats, tracer, startup_timeout)
        self.nodes = {
            n.name: StackNode(n, NodePaths.under(self.workdir / "nodes" / n.name)) for n in nodes
        }
        self.pending_threshold = pending_threshold
        self.prepare_timeout = prepare_timeout
        self.log_level = log_level
        self.real_nodes = real_nodes
        self.node_tools = node_tools
        self.webhook = webhook  # gpudra webhook + its ValidatingWebhookConfiguration
        self.kube_version = kube_version
        self.supervised = supervise
        self.say = say
        self.real: dict[str, RealNode] = {}  # node name -> its runner, with real_nodes
        self.images: tuple[images.ImageArchive, ...] = ()
        self.metrics_ports: dict[str, int] = {}  # gpudra process name -> its /metrics port
        self.daemon_pods: DaemonPods | None = None  # IMEX daemon pods of simulated nodes
        try:
            self._check_socket_paths()
        except StackError:
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            raise

    # ---- lifecycle ---------------------------------------------------------

    def start(self) -> Stack:
        try:
            self._start()
            if self.supervised:
                self.supervise(self.say)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if self.cp.binary is None:
            self.cp.binary = build_controlplane(version=self.kube_version)
        if self.jaeger is not None:
            self.jaeger.log_path = self.logs_dir / "jaeger.log"
            self._started.append("jaeger")
            self.jaeger.start()
            self.service_env["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.jaeger.otlp_grpc
            self.service_env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
        self.nats.start()
        self._started.append("nats")
        self.nats.provision()
        self._started.append("controlplane")
        self.cp.start()
        for node in self.nodes.values():
            if node.spec.taint and not self.real_nodes:
                self.cp.kubectl("taint", "nodes", node.name, node.spec.taint)
        self.cp.apply(DEVICE_CLASSES.read_text())
        install_crd(self.cp, COMPUTE_DOMAIN_CRD.read_text())
        install_crd(self.cp, COMPUTE_DOMAIN_CLIQUE_CRD.read_text())
        self.cp.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NAMESPACE}}
        )
        if self.webhook:
            self.start_webhook()
        if self.real_nodes:
            self._start_real_hosts()
        for node in self.nodes.values():
            node.paths.kubelet_root.mkdir(parents=True, exist_ok=True)
            node.paths.cdi_root.mkdir(parents=True, exist_ok=True)
            self._add("discovery", node.name)
        for node in self.nodes.values():
            self._add("preparer", node.name, ready='"preparer ready"')
            self._add("kubeletplugin", node.name, ready='"serving the kubelet"')
        self.start_kubelets(list(self.nodes))
        self._add("publisher")
        self._add("allocator", ready='"claim watcher synced"')
        self._add("domains", ready='"domain controller synced"')
        self._start_daemon_pods()
        for name in self.nodes:
            self.wait_slices(name)

    def stop(self) -> None:
        """End the supervision (nothing is restarted from here on), then stop
        everything started, newest first, each by its PID."""
        self.stop_supervision()
        while self._started:
            name = self._started.pop()
            if name == "nats":
                self.nats.stop()
            elif name == "jaeger" and self.jaeger is not None:
                self.jaeger.stop()
            elif name == "controlplane":
                self.cp.stop()
            elif name.startswith("kubelet-dra-"):
                self.cp.stop_kubelet_dra(name.removeprefix("kubelet-dra-"))
            elif name == "daemon-pods" and self.daemon_pods is not None:
                self.daemon_pods.stop()
            elif name.startswith("node-") and name.removeprefix("node-") in self.real:
                self.real[name.removeprefix("node-")].stop()
            elif name in self.processes:
                self.processes[name].stop()

    def cleanup(self) -> None:
        """Stop, and remove the work directory if this stack made it."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- gpudra services -----------------------------------------------------

    def _start_daemon_pods(self) -> None:
        """IMEX daemon pods on simulated nodes run as local processes (real nodes run
        their containers): each node's daemons bind an address of its own."""
        simulated = [n for n in self.nodes.values() if n.name not in self.real]
        nodes = [
            DaemonNode(n.name, n.paths.cdi_root, f"127.0.0.{DAEMON_ADDRESS_BASE + i}")
            for i, n in enumerate(simulated)
        ]
        # Every node's daemon identity now, not at a daemon's start: a new identity
        # reloads nats-server, and a reload drops the reply permissions of requests in
        # flight (a channel prepare waiting for that very daemon could never answer).
        argv = {
            n.name: [*self.nats.client_argv(Role.IMEX, n.name), "--log-level", self.log_level]
            for n in nodes
        }
        self.daemon_pods = DaemonPods(
            self.cp.api_get, nodes, argv.__getitem__, self.logs_dir, self.service_env
        )
        self._started.append("daemon-pods")
        self.daemon_pods.start()

    def _service_argv(self, service: str, node: str | None) -> list[str]:
        role = Role(service)
        name = service if node is None else f"{service}-{node}"
        port = self.metrics_ports.setdefault(name, free_port())
        common = [*self.nats.client_argv(role, node or ""), "--log-level", self.log_level,
                  "--metrics-port", str(port)]  # fmt: skip
        kubeconfig = ["--kubeconfig", str(self.cp.kubeconfig)]
        if node is None:
            if service == "publisher":
                return ["publisher", *common, *kubeconfig, "--feature-gates", self.gates,
                        "--gpu-clique-label", "--compute-domains"]  # fmt: skip
            if service == "domains":
                return ["domains", *common, *kubeconfig, "--namespace", DRIVER_NAMESPACE]
            threshold = f"{self.pending_threshold}s"
            return ["allocator", *common, *kubeconfig, "--pending-threshold", threshold]
        where = self.nodes[node]
        on_node = [*common, "--node-name", node]
        if service == "discovery":
            return ["discovery", *on_node, "--fleet", where.spec.fleet]
        if service == "preparer":
            # On a real node the preparer sees the node's driver installation.
            real = self.real.get(node)
            driver = ["--driver-root", str(real.driver_root)] if real is not None else []
            return [
                "preparer", *on_node, *kubeconfig,
                "--fleet", where.spec.fleet,
                "--kubelet-root", str(where.paths.kubelet_root),
                "--cdi-root", str(where.paths.cdi_root),
                "--feature-gates", self.gates,
                "--compute-domains",
                *driver,
            ]  # fmt: skip
        plugin = ["kubeletplugin", *on_node, "--kubelet-root", str(where.paths.kubelet_root),
                  "--compute-domains"]  # fmt: skip
        if self.prepare_timeout is not None:
            plugin += ["--prepare-timeout", str(self.prepare_timeout)]
        return plugin

    def _add(self, service: str, node: str | None = None, *, ready: str = "") -> Process:
        name = service if node is None else f"{service}-{node}"
        argv = [sys.executable, "-m", "services.cli", *self._service_argv(service, node)]
        if service == "preparer" and node in self.real:
            argv = self.real[node].argv(argv)  # inside the node's mount namespace
        self._argv[name] = argv
        self._started.append(name)  # before its ready wait: stop() ends it if that fails
        return self.start_service(name, ready=ready)

    def start_webhook(self) -> Process:
        """``gpudra webhook`` on 127.0.0.1 with a CA of its own, and the
        ValidatingWebhookConfiguration that has the API server call it by URL."""
        certs = admission.issue(self.workdir / "webhook")
        port, metrics = free_port(), self.metrics_ports.setdefault("webhook", free_port())
        self._argv["webhook"] = [
            sys.executable, "-m", "services.cli", "webhook",
            "--cert-file", str(certs.cert), "--key-file", str(certs.key),
            "--port", str(port), "--feature-gates", self.gates,
            "--log-level", self.log_level, "--metrics-port", str(metrics),
        ]  # fmt: skip
        process = self.start_service("webhook", ready='"serving admission reviews"')
        self._started.append("webhook")
        url = f"https://127.0.0.1:{port}{admission.PATH}"
        self.cp.apply(admission.configuration(url, certs.ca.read_bytes()))
        return process

    # ---- the API server ------------------------------------------------------

    def api_get(self, path: str, **params: str) -> Any:
        """GET ``path`` from the API server as JSON (None for 404)."""
        return self.cp.api_get(path, **params)

    def slices(self, node: str) -> list[dict[str, Any]]:
        """Our driver's ResourceSlices of ``node``."""
        listing = self.api_get(
            "/apis/resource.k8s.io/v1/resourceslices", fieldSelector=f"spec.nodeName={node}"
        )
        return [s for s in listing["items"] if s["spec"]["driver"] == nvidia.DRIVER_NAME]

    def wait_slices(self, node: str) -> list[dict[str, Any]]:
        """Wait until the node's pool is complete (every slice of its newest
        generation is there) and holds devices; return those slices."""

        def complete() -> list[dict[str, Any]] | None:
            found = self.slices(node)
            pool = complete_pool(found)
            return pool if pool and any(s["spec"].get("devices") for s in pool) else None

        result: list[dict[str, Any]] = self.wait_for(complete, f"the ResourceSlices of {node}")
        return result

    # ---- checks at construction -----------------------------------------------

    def _check_socket_paths(self) -> None:
        for node in self.nodes.values():
            longest = node.paths.registration_dir / f"{cd.CD_DRIVER}-reg.sock"
            if len(str(longest).encode()) > _MAX_SOCKET_PATH:
                raise StackError(
                    f"work directory {self.workdir} is too deep: the kubelet socket {longest} "
                    f"would exceed {_MAX_SOCKET_PATH} bytes; choose a shorter --workdir"
                )


def complete_pool(slices: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The slices of the newest generation if all of them are present, else []."""
    if not slices:
        return []
    newest = max(int(s["spec"]["pool"]["generation"]) for s in slices)
    current = [dict(s) for s in slices if int(s["spec"]["pool"]["generation"]) == newest]
    expected = int(current[0]["spec"]["pool"]["resourceSliceCount"])
    return current if len(current) == expected else []
