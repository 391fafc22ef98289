"""Every cluster service starts and stops by the one path (services/core/process/serve.py),
against the real API server: on SIGTERM it closes what it opened, newest first, and exits
0 without a traceback; one given settings its release refuses says why and exits 2.
The node services: tests/integration/local/test_service_stop.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.core.bus.access import Role
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from services.local.natsserver import NatsServer
from services.local.stack import COMPUTE_DOMAIN_CLIQUE_CRD, COMPUTE_DOMAIN_CRD
from tests.helpers.jsonlogs import said

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[3]


class Service:
    """``gpudra <command>`` as a process, its output in a file, stopped by PID."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.name, self.log = argv[0], log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "services.cli", *argv],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def said(self, message: str) -> bool:
        return said(self.output(), message)

    def stop(self) -> int:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
        try:
            return self.popen.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
            raise AssertionError(f"{self.name} did not stop on SIGTERM:\n{self.output()}") from None


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for each in started:
        if each.popen.poll() is None:
            os.kill(each.popen.pid, signal.SIGKILL)
            each.popen.wait()


async def until(check: object, what: str, service: Service, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if service.popen.poll() is not None:
            raise AssertionError(f"{service.name} exited waiting for {what}:\n{service.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout}s:\n{service.output()}")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize(
    ("command", "role", "extra"),
    [
        ("publisher", Role.PUBLISHER, ["--force-registered"]),
        ("allocator", Role.ALLOCATOR, []),
        ("domains", Role.DOMAINS, ["--namespace", "default"]),
    ],
)
async def test_a_cluster_service_stops_on_sigterm_with_status_0(
    controlplane: ControlPlane,
    nats_server: NatsServer,
    services: list[Service],
    tmp_path: Path,
    command: str,
    role: Role,
    extra: list[str],
) -> None:
    if command == "domains":
        install_crd(controlplane, COMPUTE_DOMAIN_CRD.read_text())
        install_crd(controlplane, COMPUTE_DOMAIN_CLIQUE_CRD.read_text())
    argv = [command, "--kubeconfig", str(controlplane.kubeconfig),
            *nats_server.client_argv(role), *extra]  # fmt: skip
    service = Service(argv, tmp_path / f"{command}.log")
    services.append(service)
    await until(lambda: service.said("running"), "the running line", service)
    assert service.stop() == 0, service.output()
    out = service.output()
    assert "Traceback" not in out, out
    assert service.said("stopping") and not service.said("closing failed"), out


async def test_gates_the_clusters_release_refuses_stop_the_allocator_with_2(
    controlplane: ControlPlane, nats_server: NatsServer, services: list[Service], tmp_path: Path
) -> None:
    """It asks the API server which release it follows, then refuses a gate that release
    locks, as the release's own components would; the API client it opened is closed."""
    argv = ["allocator", "--kubeconfig", str(controlplane.kubeconfig),
            *nats_server.client_argv(Role.ALLOCATOR),
            "--kube-feature-gates", "DRAPrioritizedList=false"]  # fmt: skip
    service = Service(argv, tmp_path / "allocator.log")
    services.append(service)
    code = service.popen.wait(60)
    out = service.output()
    assert code == 2, out
    assert "cannot set feature gate DRAPrioritizedList to false" in out, out
    assert "Traceback" not in out and not service.said("closing failed"), out
