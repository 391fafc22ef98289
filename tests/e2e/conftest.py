"""Fixtures for e2e tests: the control-plane binary and a running control plane.

``controlplane`` is session-scoped: one etcd + kube-apiserver + kube-scheduler +
kube-controller-manager for the whole session, with the Nodes ``e2e-node-1`` and
``e2e-node-2``. Tests that need feature gates start their own
:class:`~services.local.cluster.ControlPlane` with ``controlplane_binary``.

Component logs are kept under ``<workdir>/logs``; the working directory is
removed after a session without failures and kept (its path printed) otherwise.
Set ``GPUDRA_E2E_KEEP=1`` to always keep it.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from services.local.cluster import ControlPlane

E2E_NODES = ("e2e-node-1", "e2e-node-2")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs the real Kubernetes control plane")
    config.addinivalue_line(
        "markers",
        "realnode: runs real nodes (containerd, runc, the real kubelet; root and cgroups)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Name the logs directory in the report of a failed e2e test."""
    report = yield
    if report.failed:
        funcargs = getattr(item, "funcargs", {})
        for value in funcargs.values():
            if isinstance(value, ControlPlane):
                report.sections.append(("control-plane logs", str(value.logs_dir)))
    return report


def _report(request: pytest.FixtureRequest, cp: ControlPlane, failed: bool) -> None:
    keep = failed or os.environ.get("GPUDRA_E2E_KEEP") == "1"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if keep:
        message = f"e2e control-plane logs kept in {cp.logs_dir}"
        if reporter is not None:
            reporter.write_line(message)
        else:
            print(message)
    else:
        cp.cleanup()


@pytest.fixture(scope="session")
def controlplane(
    request: pytest.FixtureRequest, controlplane_binary: Path
) -> Iterator[ControlPlane]:
    """A running control plane shared by the session."""
    cp = ControlPlane(controlplane_binary, nodes=E2E_NODES)
    try:
        cp.start()
    except Exception:
        cp.stop()
        _report(request, cp, failed=True)
        raise
    failed_before = request.session.testsfailed
    try:
        yield cp
    finally:
        cp.stop()
        _report(request, cp, failed=request.session.testsfailed > failed_before)
