"""Real helm v3 for the chart (deploy/chart/gpudra): render, lint, install, upgrade.

The binary comes from ``services/local/helm/build.sh`` (built from the Go module
proxy, cached outside the repository like the control plane); ``GPUDRA_HELM``
names another one. :class:`Helm` runs it with its own config, cache and data
directories under a work directory, so nothing in the user's ~/.config/helm is
read or written, and :meth:`Helm.template` returns the rendered objects.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from services.local import REPO

BUILD_SCRIPT = REPO / "services" / "local" / "helm" / "build.sh"
CHART = REPO / "deploy" / "chart" / "gpudra"
#: The Kubernetes version the chart is rendered for without a cluster (the control plane's).
KUBE_VERSION = "1.37.2"


class HelmError(RuntimeError):
    """helm did not build, or a helm command failed (its output is in the message)."""


def build_helm(*, force: bool = False) -> Path:
    """``GPUDRA_HELM``, else build.sh's binary (a cache hit hashes three files)."""
    given = os.environ.get("GPUDRA_HELM")
    if given and not force:
        if not os.access(given, os.X_OK):
            raise HelmError(f"GPUDRA_HELM={given} is not an executable file")
        return Path(given)
    cmd = [str(BUILD_SCRIPT), *(["--force"] if force else [])]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        raise HelmError(f"{BUILD_SCRIPT} failed with exit status {proc.returncode}")
    return Path(lines[-1])


def set_args(values: Mapping[str, object]) -> list[str]:
    """``--set-json key=<json>`` for each value: no escaping rules of ``--set`` to get wrong."""
    args: list[str] = []
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


class Helm:
    """One helm binary with private XDG directories under ``home``."""

    def __init__(self, binary: Path, home: Path, *, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.home = home
        self.kubeconfig = kubeconfig

    @property
    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def run(self, *args: str, timeout: float = 600) -> str:
        """Run ``helm ARGS``; its stdout, or :class:`HelmError` with everything it said."""
        proc = subprocess.run(
            [str(self.binary), *args],
            capture_output=True, text=True, env=self.env, timeout=timeout, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise HelmError(
                f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
            )
        return proc.stdout

    def template(
        self,
        values: Mapping[str, object] | None = None,
        *,
        release: str = "gpudra",
        namespace: str = "gpu-system",
        chart: Path = CHART,
        extra: Iterable[str] = (),
    ) -> list[dict[str, Any]]:
        """The chart's objects as ``helm template`` renders them (hooks included)."""
        out = self.run(
            "template", release, str(chart), "--namespace", namespace,
            "--kube-version", KUBE_VERSION, *set_args(values or {}), *extra,
        )  # fmt: skip
        return [d for d in yaml.safe_load_all(out) if d]
