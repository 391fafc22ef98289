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

    python -m services.local.cluster up --nodes n1,n2 [--kubelet-dra] [--feature-gates G=true]
        [--kube-version 1.35]
    python -m services.local.cluster build [--kube-version 1.35]

``up`` prints the kubeconfig path and keeps the cluster up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from services.local.ports import free_ports

CONTROLPLANE_DIR = Path(__file__).resolve().parent / "controlplane"
BUILD_SCRIPT = CONTROLPLANE_DIR / "build.sh"

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

T = TypeVar("T")


START_ATTEMPTS = 3


class ControlPlaneError(RuntimeError):
    """A component failed to start or a kubectl call failed."""


class ComponentExited(ControlPlaneError):
    """A component process ended while we waited for it."""


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


def wait_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
) -> T:
    """Call ``check`` until it returns something other than None/False."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
            if result is not None and result is not False:
                return result
        except ComponentExited:
            raise  # waiting longer cannot help
        except Exception as e:  # retried; the last one is reported on timeout
            last_error = e
        if time.monotonic() >= deadline:
            detail = f": {last_error}" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ControlPlaneError(
            "the openssl command is needed to make the API server's certificates"
        )
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def make_pki(pki: Path) -> None:
    """CA, API server serving certificate (127.0.0.1, localhost) and the
    service-account signing key pair, made with the openssl command."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650", "-subj", "/CN=gpudra-e2e-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=pki,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "apiserver.key", "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver",
        cwd=pki,
    )  # fmt: skip
    (pki / "apiserver.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "apiserver.crt", "-days", "3650",
        "-extfile", "apiserver.ext",
        cwd=pki,
    )  # fmt: skip
    _openssl(
        "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key",
        cwd=pki,
    )  # fmt: skip
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def _format_gates(gates: Mapping[str, bool]) -> str:
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))


@dataclass
class Process:
    """One component process that we started."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; only this process, by PID."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


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


class ControlPlane:
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
        self.binary = binary
        self.service_accounts = service_accounts
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="gpudra-e2e-")).resolve()
        self.logs_dir = self.workdir / "logs"
        self.nodes = list(nodes)
        self.feature_gates = dict(feature_gates or {})
        self.runtime_config: dict[str, bool] = {"resource.k8s.io/v1": True}
        self.runtime_config.update(runtime_config or {})
        self.controllers = list(controllers)
        self.extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        self.startup_timeout = startup_timeout
        self.verbosity = verbosity
        self.token = secrets.token_hex(16)
        self.ports: dict[str, int] = {}
        self.processes: list[Process] = []
        self.kubelets: dict[str, KubeletDRA] = {}
        self.kubeconfig = self.workdir / "kubeconfig"
        self.pki = self.workdir / "pki"

    # ---- addresses -------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd-client']}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients (KUBECONFIG set)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def command(self, component: str) -> list[str]:
        """argv prefix for one component of the multi-call binary."""
        if self.binary is None:
            raise ControlPlaneError("no control-plane binary: call build_controlplane()")
        link = self.binary.parent / component
        argv = [str(link)] if link.exists() else [str(self.binary), component]
        if component == "kubectl":
            # kubectl caches discovery per host:port for minutes; a control plane of
            # an earlier run on the same port (one that served other resource.k8s.io
            # versions, say) would answer for this one.
            argv += ["--cache-dir", str(self.workdir / "kubectl-cache")]
        return argv

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
        self.stop()

    def _spawn(self, name: str, args: list[str], log_name: str | None = None) -> Process:
        log_path = self.logs_dir / f"{log_name or name}.log"
        argv = [*self.command(name), *args, *self.extra_args.get(name, [])]
        with open(log_path, "ab") as log:
            log.write(f"+ {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,  # Ctrl-C goes to us; we stop children by PID
            )
        return Process(name=log_name or name, proc=proc, log_path=log_path, args=argv)

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

    @property
    def kube_version(self) -> str:
        """The release this control plane runs (``v1.37.2``)."""
        if self.binary is None:
            raise ControlPlaneError("no control-plane binary: call build_controlplane()")
        return kube_version(self.binary)

    @property
    def kube_minor(self) -> int:
        if self.binary is None:
            raise ControlPlaneError("no control-plane binary: call build_controlplane()")
        return kube_minor(self.binary)

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
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # in-memory self-signed certificate
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz", timeout=2, context=ctx
        ) as r:
            return bool(r.read().decode().strip() == "ok")

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

    # ---- API access ------------------------------------------------------

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpudra-e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "gpudra-e2e-admin", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "gpudra-e2e",
                    "context": {"cluster": "gpudra-e2e", "user": "gpudra-e2e-admin"},
                }
            ],
            "current-context": "gpudra-e2e",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2) + "\n")
        self.kubeconfig.chmod(0o600)

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki / "ca.crt"))

    def _open(self, path: str, timeout: float) -> Any:
        """An authenticated GET of ``path`` (a response to use in ``with``)."""
        request = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        return urllib.request.urlopen(request, timeout=timeout, context=self.ssl_context())

    def api_get(self, path: str, **params: str) -> Any:
        """GET ``path`` from the API server as JSON (None for 404)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with self._open(path + query, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _get(self, path: str) -> str:
        try:
            with self._open(path, timeout=5) as resp:
                return str(resp.read().decode())
        except urllib.error.HTTPError as e:
            return f"HTTP {e.code}"

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> str:
        """Run kubectl against this cluster and return its stdout."""
        proc = subprocess.run(
            [*self.command("kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc.stdout

    def kubectl_json(self, *args: str, check: bool = True) -> Any:
        """``kubectl ... -o json``, decoded."""
        out = self.kubectl(*args, "-o", "json", check=check)
        return json.loads(out) if out.strip() else None

    def apply(self, objects: Mapping[str, Any] | Iterable[Mapping[str, Any]] | str) -> str:
        """Create or update objects (dicts, a list of dicts, or YAML/JSON text)."""
        if isinstance(objects, str):
            text = objects
        elif isinstance(objects, Mapping):
            text = json.dumps(objects)
        else:
            text = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        return self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=text)

    def get(self, kind: str, name: str, namespace: str | None = None) -> Any:
        """The object as a dict, or None if it does not exist."""
        args = ["get", kind, name, "--ignore-not-found"]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl_json(*args)

    def create_node(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """A Node that looks like a healthy kubelet registered it: Ready, no
        not-ready taint (the TaintNodesByCondition admission adds one; no node
        lifecycle controller runs here to lift it), 110 pods allocatable."""
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
            },
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "gpudra e2e node",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": self.kube_version,
                    "bootID": "",
                    "containerRuntimeVersion": "",
                    "kernelVersion": "",
                    "kubeProxyVersion": "",
                    "machineID": "",
                    "osImage": "",
                    "systemUUID": "",
                },
            },
        }
        self.kubectl("create", "-f", "-", input=json.dumps(node))
        self.kubectl("patch", "node", name, "--type=merge", "-p", '{"spec":{"taints":null}}')
        # The status of a created Node is kept, but make sure it is Ready.
        status = {"status": node["status"]}
        self.kubectl(
            "patch", "node", name, "--subresource=status", "--type=merge",
            "-p", json.dumps(status),
        )  # fmt: skip
        if name not in self.nodes:
            self.nodes.append(name)

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


# ---- command line --------------------------------------------------------


def _parse_gates(text: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"feature gate {item!r}: want NAME=true|false")
        gates[name] = value.lower() == "true"
    return gates


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.local.cluster", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a control plane and keep it up until Ctrl-C")
    up.add_argument("--nodes", default="node-1", help="comma-separated Node names")
    up.add_argument("--feature-gates", type=_parse_gates, default={}, help="NAME=bool,...")
    up.add_argument("--workdir", type=Path, help="working directory (default: a temp dir)")
    up.add_argument("--kube-version", help="1.34, 1.35, 1.36 or 1.37 (default)")
    up.add_argument(
        "--kubelet-dra",
        action="store_true",
        help="also run kubelet-dra for every node (root <workdir>/kubelet/<node>)",
    )
    build = sub.add_parser("build", help="build (or find) the binary and print its path")
    build.add_argument("--kube-version", help="1.34, 1.35, 1.36 or 1.37 (default)")
    args = parser.parse_args(argv)

    if args.cmd == "build":
        print(build_controlplane(version=args.kube_version))
        return 0

    nodes = [n for n in (s.strip() for s in args.nodes.split(",")) if n]
    cp = ControlPlane(
        build_controlplane(version=args.kube_version),
        workdir=args.workdir,
        nodes=nodes,
        feature_gates=args.feature_gates,
    )
    stop = False
    failed = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cp.start()
        if args.kubelet_dra:
            for node in nodes:
                handle = cp.start_kubelet_dra(node)
                print(f"kubelet-dra {node}: {handle.plugins_registry}", file=sys.stderr)
        print(f"logs: {cp.logs_dir}", file=sys.stderr)
        print(f"export KUBECONFIG={cp.kubeconfig}", file=sys.stderr)
        print(cp.kubeconfig, flush=True)
        while not stop:
            for p in [*cp.processes, *cp.kubelets.values()]:
                if not p.running():
                    print(
                        f"{p.name} exited with {p.proc.returncode}; see {p.log_path}",
                        file=sys.stderr,
                    )
                    stop = failed = True
            time.sleep(0.5)
    except BaseException:
        failed = True
        raise
    finally:
        if failed or args.workdir is not None:
            cp.stop()
            print(f"logs kept in {cp.logs_dir}", file=sys.stderr)
        else:
            cp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())


def install_crd(cp: ControlPlane, text: str, timeout: float = 60.0) -> None:
    """Apply CustomResourceDefinitions and wait until the API server serves them."""
    cp.apply(text)
    for doc in yaml.safe_load_all(text):
        if doc and doc.get("kind") == "CustomResourceDefinition":
            name = doc["metadata"]["name"]
            cp.kubectl(
                "wait", "--for=condition=Established", f"crd/{name}", f"--timeout={int(timeout)}s"
            )
