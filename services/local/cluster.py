"""A real Kubernetes control plane on 127.0.0.1 (1.37; 1.34 to 1.36 on request), for
`gpudra up` and the e2e tests.

The components come from one multi-call binary built from the Go module proxy by
``services/local/controlplane/build.sh`` (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kubectl, the kubelet's DRA manager as ``kubelet-dra``,
and ``reference-allocator``). :class:`ControlPlane` starts one process per
component, each on free 127.0.0.1 ports, in this order::

    etcd -> kube-apiserver -> kube-scheduler -> kube-controller-manager

writes a kubeconfig (bearer token of a ``system:masters`` user, CA of the
self-signed serving certificate), creates Ready Node objects and stops
everything by PID in reverse order. Every component logs to
``<workdir>/logs/<component>.log``.

Command line::

    python -m services.local.clustercli up --nodes n1,n2 [--kubelet-dra] [--feature-gates G=true]
        [--kube-version 1.35]
    python -m services.local.clustercli build [--kube-version 1.35]

``up`` prints the kubeconfig path and keeps the cluster up until Ctrl-C
(:mod:`services.local.clustercli`).

This module starts and stops the components; what a client of the running control
plane does (kubeconfig, kubectl, GETs, Nodes, CRDs) is :mod:`services.local.clusteradmin`,
the binary :mod:`services.local.kubebinary`, the certificates :mod:`services.local.pki`.
"""

from __future__ import annotations

import json
import shutil
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.local.clusteradmin import ClusterAdmin
from services.local.component import ComponentExited, ControlPlaneError, Process, wait_until
from services.local.kubebinary import build_controlplane
from services.local.pki import make_pki
from services.local.ports import free_ports

#: Annotation in which kubelet-dra records ``{container: [CDI device ids]}``.
CDI_DEVICES_ANNOTATION = "gpudra.dev/cdi-devices"
#: Pod condition kubelet-dra sets: True once prepared, False with the error.
RESOURCES_PREPARED_CONDITION = "gpudra.dev/ResourcesPrepared"

#: Controllers of kube-controller-manager that DRA needs (names as in 1.35
#: cmd/kube-controller-manager/names): claims from templates and reservations,
#: owner-based deletion, namespace deletion.
DEFAULT_CONTROLLERS = (
    "resourceclaim-controller",
    "garbage-collector-controller",
    "namespace-controller",
)
#: With real kubelets (services/local/node.py): the controller that lifts the
#: not-ready taint a registering Node gets and watches the kubelets' heartbeats.
#: Not with kubelet-dra, whose Nodes are made Ready once and never heartbeat.
REAL_NODE_CONTROLLERS = (*DEFAULT_CONTROLLERS, "node-lifecycle-controller")
#: With workloads installed as users install them (the Helm chart on real nodes,
#: tests/e2e/deploy/test_chart_install.py): DaemonSets, Deployments, StatefulSets and Jobs,
#: each namespace's default ServiceAccount and its kube-root-ca.crt (the CA pods
#: trust the API server by). Use with ``service_accounts=True``.
WORKLOAD_CONTROLLERS = (
    *REAL_NODE_CONTROLLERS,
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
)

START_ATTEMPTS = 3


def _format_gates(gates: Mapping[str, bool]) -> str:
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))


@dataclass
class KubeletDRA(Process):
    """Handle of a ``kubelet-dra`` process for one node."""

    node: str = ""
    root: Path = Path()

    @property
    def plugins_registry(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"


class ControlPlane(ClusterAdmin):
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager.

    ``feature_gates`` go to the API server, the scheduler, the controller
    manager and every kubelet-dra (e.g. ``{"DRADeviceTaints": True}``);
    ``runtime_config`` adds API groups/versions to ``--runtime-config``.
    ``service_accounts``: the API server's ServiceAccount admission plugin stays on
    (pods get their account's token volume and must name an account that exists)
    and the controller manager publishes the CA as each namespace's kube-root-ca.crt
    (with :data:`WORKLOAD_CONTROLLERS`); off, pods need no ServiceAccount at all.
    """

    def __init__(
        self,
        binary: Path | None = None,
        *,
        workdir: Path | None = None,
        nodes: Sequence[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Mapping[str, bool] | None = None,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        service_accounts: bool = False,
        startup_timeout: float = 120.0,
        verbosity: int = 2,
    ) -> None:
        own = workdir is None  # ours to remove in cleanup()
        workdir = Path(workdir or tempfile.mkdtemp(prefix="gpudra-e2e-")).resolve()
        super().__init__(binary, workdir, nodes)
        self.service_accounts = service_accounts
        self._own_workdir = own
        self.logs_dir = self.workdir / "logs"
        self.feature_gates = dict(feature_gates or {})
        self.runtime_config: dict[str, bool] = {"resource.k8s.io/v1": True}
        self.runtime_config.update(runtime_config or {})
        self.controllers = list(controllers)
        self.extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        self.startup_timeout = startup_timeout
        self.verbosity = verbosity
        self.processes: list[Process] = []
        self.kubelets: dict[str, KubeletDRA] = {}

    # ---- addresses -------------------------------------------------------

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd-client']}"

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> ControlPlane:
        if self.binary is None:
            self.binary = build_controlplane()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start()
                return self
            except ControlPlaneError as e:
                self.stop()
                # free_port() releases a port before the component binds it, so
                # another process may take it meanwhile: start again on new ports.
                if "address already in use" not in str(e) or attempt == START_ATTEMPTS:
                    raise
                shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start(self) -> None:
        names = ("etcd-client", "etcd-peer", "apiserver", "scheduler", "controller-manager")
        self.ports.update(zip(names, free_ports(len(names)), strict=True))
        make_pki(self.pki)
        (self.workdir / "tokens.csv").write_text(
            f'{self.token},gpudra-e2e-admin,gpudra-e2e-admin,"system:masters"\n'
        )
        self._write_kubeconfig()

        self._start_etcd()
        self._start_apiserver()
        self._start_scheduler()
        self._start_controller_manager()
        for node in self.nodes:
            self.create_node(node)

    def stop(self) -> None:
        """Stop kubelet-dra processes, then the control plane, newest first."""
        for handle in list(self.kubelets.values()):
            self.stop_kubelet_dra(handle)
        while self.processes:
            self.processes.pop().stop()

    def cleanup(self) -> None:
        """Stop everything and remove the working directory if we made it."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def _spawn(self, name: str, args: list[str], log_name: str | None = None) -> Process:
        log_path = self.logs_dir / f"{log_name or name}.log"
        argv = [*self.command(name), *args, *self.extra_args.get(name, [])]
        return Process.start(log_name or name, argv, log_path, cwd=self.workdir)

    def _wait(self, process: Process, check: Callable[[], bool], what: str) -> None:
        def probe() -> bool:
            if not process.running():
                raise ComponentExited(
                    f"{process.name} exited with {process.proc.returncode} while waiting for "
                    f"{what}; log {process.log_path}:\n{process.log_tail()}"
                )
            return check()

        try:
            wait_until(probe, self.startup_timeout, what, interval=0.1)
            # Healthy only if it is our process that answered: one that failed to bind
            # its port exits a moment later, while whoever holds the port answers.
            time.sleep(0.2)
            probe()
        except ControlPlaneError:
            raise
        except TimeoutError as e:
            raise ControlPlaneError(f"{e}; log {process.log_path}:\n{process.log_tail()}") from None

    def _start_etcd(self) -> None:
        client = self.etcd_url
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        args = [
            "--name", "gpudra-e2e",
            "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"gpudra-e2e={peer}",
            "--initial-cluster-state", "new",
            "--unsafe-no-fsync",
            "--log-level", "warn",
        ]  # fmt: skip
        process = self._spawn("etcd", args)
        self.processes.append(process)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                return bool(json.load(resp).get("health") == "true")

        self._wait(process, healthy, "etcd /health")

    def _runtime_config(self) -> str:
        config = dict(self.runtime_config)
        if self.feature_gates.get("DRADeviceTaintRules"):
            # DeviceTaintRule is served as v1alpha3 until 1.35, v1beta2 in 1.36, v1 from 1.37.
            minor = self.kube_minor
            if minor < 37:
                version = "v1beta2" if minor == 36 else "v1alpha3"
                config.setdefault(f"resource.k8s.io/{version}", True)
        return ",".join(f"{k}={'true' if v else 'false'}" for k, v in config.items())

    def _start_apiserver(self) -> None:
        runtime_config = self._runtime_config()
        args = [
            "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.ports["apiserver"]),
            "--cert-dir", str(self.workdir / "apiserver"),
            "--tls-cert-file", str(self.pki / "apiserver.crt"),
            "--tls-private-key-file", str(self.pki / "apiserver.key"),
            "--token-auth-file", str(self.workdir / "tokens.csv"),
            "--authorization-mode", "RBAC",
            "--allow-privileged=true",  # the chart's node pod, as on a real cluster
            "--endpoint-reconciler-type", "none",
            "--runtime-config", runtime_config,
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(self.pki / "sa.pub"),
            "--service-account-signing-key-file", str(self.pki / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16",
            # Real nodes' kubelets serve on 127.0.0.1, their Node's only address.
            "--kubelet-preferred-address-types", "InternalIP",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            f"--v={self.verbosity}",
        ]  # fmt: skip
        if self.feature_gates:
            args += ["--feature-gates", _format_gates(self.feature_gates)]
        if not self.service_accounts:
            args += ["--disable-admission-plugins", "ServiceAccount"]
        process = self._spawn("kube-apiserver", args)
        self.processes.append(process)
        self._wait(process, lambda: self._get("/readyz") == "ok", "kube-apiserver /readyz")
        wait_until(
            lambda: (
                self.kubectl("get", "namespace", "default", "-o", "name", check=False).strip()
                == "namespace/default"
            ),
            self.startup_timeout,
            "namespace default",
        )

    def _component_args(self, name: str, port: int) -> list[str]:
        args = [
            "--kubeconfig", str(self.kubeconfig),
            "--authentication-kubeconfig", str(self.kubeconfig),
            "--authorization-kubeconfig", str(self.kubeconfig),
            "--leader-elect=false",
            "--bind-address", "127.0.0.1",
            "--secure-port", str(port),
            "--cert-dir", str(self.workdir / name),  # self-signed serving cert
            f"--v={self.verbosity}",
        ]  # fmt: skip
        if self.feature_gates:
            args += ["--feature-gates", _format_gates(self.feature_gates)]
        return args

    def _healthz(self, port: int) -> bool:
        return self.component_get(port, "/healthz").strip() == "ok"

    def component_get(
        self, port: int, path: str, *, as_admin: bool = False, timeout: float = 2.0
    ) -> str:
        """GET ``path`` from the scheduler's or controller manager's secure port (its
        certificate is self-signed in memory); ``as_admin``: with the admin's token, which
        paths such as /metrics ask for."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # in-memory self-signed certificate
        headers = {"Authorization": f"Bearer {self.token}"} if as_admin else {}
        request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", headers=headers)
        with urllib.request.urlopen(request, timeout=timeout, context=ctx) as r:
            return str(r.read().decode())

    def _start_scheduler(self) -> None:
        port = self.ports["scheduler"]
        process = self._spawn("kube-scheduler", self._component_args("kube-scheduler", port))
        self.processes.append(process)
        self._wait(process, lambda: self._healthz(port), "kube-scheduler /healthz")

    def _start_controller_manager(self) -> None:
        port = self.ports["controller-manager"]
        args = [
            *self._component_args("kube-controller-manager", port),
            "--controllers",
            ",".join(self.controllers),
            "--use-service-account-credentials=false",
        ]
        if self.service_accounts:
            args += ["--root-ca-file", str(self.pki / "ca.crt")]
        process = self._spawn("kube-controller-manager", args)
        self.processes.append(process)
        self._wait(process, lambda: self._healthz(port), "kube-controller-manager /healthz")

    # ---- kubelet-dra -----------------------------------------------------

    def start_kubelet_dra(
        self,
        node: str,
        root: Path | None = None,
        *,
        extra_args: Sequence[str] = (),
        wait: bool = True,
    ) -> KubeletDRA:
        """Start the kubelet's DRA manager + plugin manager for ``node`` with
        kubelet root ``root`` (default ``<workdir>/kubelet/<node>``). DRA
        plugins register through ``<root>/plugins_registry``."""
        if node in self.kubelets and self.kubelets[node].running():
            raise ControlPlaneError(f"kubelet-dra for {node} is already running")
        root = Path(root or self.workdir / "kubelet" / node).resolve()
        root.mkdir(parents=True, exist_ok=True)
        args = [
            "--node", node,
            "--kubeconfig", str(self.kubeconfig),
            "--root", str(root),
            f"--v={self.verbosity}",
        ]  # fmt: skip
        if self.feature_gates:
            args += ["--feature-gates", _format_gates(self.feature_gates)]
        args += list(extra_args)
        process = self._spawn("kubelet-dra", args, log_name=f"kubelet-dra-{node}")
        handle = KubeletDRA(
            name=process.name,
            proc=process.proc,
            log_path=process.log_path,
            args=process.args,
            cwd=process.cwd,
            node=node,
            root=root,
        )
        self.kubelets[node] = handle
        if wait:
            self._wait(
                handle,
                lambda: "kubelet-dra running" in handle.log_path.read_text(errors="replace"),
                f"kubelet-dra {node} to start",
            )
        return handle

    def stop_kubelet_dra(self, handle: KubeletDRA | str, timeout: float = 10.0) -> int | None:
        if isinstance(handle, str):
            found = self.kubelets.get(handle)
            if found is None:
                return None
            handle = found
        code = handle.stop(timeout)
        if self.kubelets.get(handle.node) is handle:
            del self.kubelets[handle.node]
        return code
