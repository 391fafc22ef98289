"""The control plane as its admin sees it: where the API server is, and what to ask it.

:class:`ControlPlane` (:mod:`services.local.cluster`) is one: it starts the
components, this part is how its callers and it reach the API server, as a
``system:masters`` user with a bearer token, over TLS checked against the
control plane's own CA (:mod:`services.local.pki`). kubectl runs from the
same multi-call binary as the components.
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from services.local import kubebinary
from services.local.component import ControlPlaneError


class ClusterAdmin:
    """The API server of a control plane in ``workdir``, as its admin, and the Nodes
    it holds. ``ports["apiserver"]`` is set once the control plane has its ports."""

    def __init__(self, binary: Path | None, workdir: Path, nodes: Sequence[str]) -> None:
        self.binary = binary
        self.workdir = workdir
        self.nodes = list(nodes)
        self.token = secrets.token_hex(16)
        self.ports: dict[str, int] = {}
        self.kubeconfig = self.workdir / "kubeconfig"
        self.pki = self.workdir / "pki"

    # ---- addresses -------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

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

    @property
    def kube_version(self) -> str:
        """The release this control plane runs (``v1.37.2``)."""
        if self.binary is None:
            raise ControlPlaneError("no control-plane binary: call build_controlplane()")
        return kubebinary.kube_version(self.binary)

    @property
    def kube_minor(self) -> int:
        if self.binary is None:
            raise ControlPlaneError("no control-plane binary: call build_controlplane()")
        return kubebinary.kube_minor(self.binary)

    # ---- API access ------------------------------------------------------

    def _write_kubeconfig(self) -> None:
        """The kubeconfig of every client (mode 0600: it holds the token)."""
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
        node = ready_node(name, labels or {}, self.kube_version)
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


def ready_node(name: str, labels: Mapping[str, str], kubelet_version: str) -> dict[str, Any]:
    """The Node object :meth:`ClusterAdmin.create_node` creates."""
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
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
                "kubeletVersion": kubelet_version,
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


def install_crd(cp: ClusterAdmin, text: str, timeout: float = 60.0) -> None:
    """Apply CustomResourceDefinitions and wait until the API server serves them."""
    cp.apply(text)
    for doc in yaml.safe_load_all(text):
        if doc and doc.get("kind") == "CustomResourceDefinition":
            name = doc["metadata"]["name"]
            cp.kubectl(
                "wait", "--for=condition=Established", f"crd/{name}", f"--timeout={int(timeout)}s"
            )
