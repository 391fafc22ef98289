"""A component's API identity as the chart makes it, on a real API server.

``Account.make`` creates a ServiceAccount, a ClusterRole holding exactly the chart's
rules for the component (read from deploy/chart/gpudra/values.yaml: ``rbac.rules.<c>``
plus the named extra lists, as templates/rbac.yaml adds them) and its binding; its
:meth:`kubeconfig` carries a token of that account, bound to a pod when one is given
(the API server then adds the pod's node to the token's user, as for the chart's
projected tokens: what ``associated-node:`` verbs check). Waits use
``kubectl auth can-i`` (the same authorizer the requests meet), never a fixed time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.local.cluster import ControlPlane

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "deploy" / "chart" / "gpudra" / "values.yaml"


def chart_rules(component: str, *extra: str) -> list[dict[str, Any]]:
    rbac = yaml.safe_load(VALUES.read_text())["rbac"]
    rules = list(rbac["rules"][component] or [])
    for name in extra:
        rules += rbac[name]
    return rules


@dataclass
class Account:
    cp: ControlPlane
    name: str
    namespace: str = "default"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @classmethod
    def make(
        cls, cp: ControlPlane, name: str, rules: list[dict[str, Any]], namespace: str = "default"
    ) -> Account:
        account = cls(cp, name, namespace)
        cp.apply([
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": name, "namespace": namespace}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": f"test-{name}"}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": f"test-{name}"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": f"test-{name}"},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
        ])  # fmt: skip
        return account

    def can(self, verb: str, resource: str, timeout: float = 30.0, namespace: str = "") -> None:
        """Wait until the authorizer grants ``verb`` on ``resource`` to the account (in
        ``namespace``, else the default one or the cluster)."""
        deadline = time.monotonic() + timeout
        where = ["-n", namespace] if namespace else []
        while True:
            out = self.cp.kubectl("auth", "can-i", verb, resource, *where, f"--as={self.user}",
                                  check=False).strip()  # fmt: skip
            if out == "yes":
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.user} still may not {verb} {resource}: {out}")
            time.sleep(0.1)

    def kubeconfig(self, path: Path, pod: str = "") -> Path:
        """A kubeconfig with a token of the account (bound to ``pod`` in its namespace)."""
        args = ["create", "token", self.name, "-n", self.namespace, "--duration", "1h"]
        if pod:
            args += ["--bound-object-kind", "Pod", "--bound-object-name", pod]
        token = self.cp.kubectl(*args).strip()
        config = json.loads(self.cp.kubectl("config", "view", "--raw", "-o", "json"))
        config["users"][0]["user"] = {"token": token}
        path.write_text(json.dumps(config))
        return path
