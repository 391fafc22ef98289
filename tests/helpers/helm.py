"""Real helm for the chart tests: built by services/local/helm/build.sh (``make test``
builds it first; a warm call hashes three files) or named by ``GPUDRA_HELM``.

Skipped only where there is neither a Go toolchain nor a cached binary, as the
control plane's e2e tests are; a failed build fails the tests.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest

from services.local.helm import CHART, Helm, HelmError, build_helm

__all__ = ["CHART", "helm", "objects_by_kind", "one", "pod_specs"]


@functools.cache
def _binary() -> Path | str:
    try:
        return build_helm()
    except HelmError as e:
        if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
            return f"no Go toolchain and no cached helm binary: {e}"
        raise


def helm(home: Path) -> Helm:
    """helm with its XDG directories under ``home``."""
    binary = _binary()
    if isinstance(binary, str):
        pytest.skip(binary)
    return Helm(binary, home)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def objects_by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod template of every workload (DaemonSet, Deployment, StatefulSet, Job), by name."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job")
    }
