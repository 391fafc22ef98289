"""Fixtures shared by every test tier."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.bus.client import Bus
from services.core.telemetry import logs
from services.local.component import ControlPlaneError
from services.local.kubebinary import build_controlplane
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect

logs.quiet_tls_eof_warnings()

# Modules that run real nodes (cgroups and mount namespaces on this host): never two
# at once, because each compares the host before and after itself.
REAL_NODE_MODULES = frozenset(
    {"test_chart_install.py", "test_real_nodes.py", "test_stack_up.py", "test_realnode_host.py"}
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test`'s two workers (pytest-xdist) get whole modules, so a module's
    fixtures (a control plane, a stack) start once, and every real-node module goes
    to the same worker, one after another."""
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class ModuleScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "real-nodes" if Path(module).name in REAL_NODE_MODULES else module

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that runs real nodes in a module not listed above would run beside another."""
    for item in items:
        if item.get_closest_marker("realnode") and item.path.name not in REAL_NODE_MODULES:
            raise pytest.UsageError(f"{item.path.name}: add it to REAL_NODE_MODULES (conftest)")


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real nats-server with JetStream, TLS and the production permissions on a free
    127.0.0.1 port, its streams and buckets provisioned; stopped by PID."""
    server = NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log")
    server.start()
    server.provision()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    client = await connect(nats_server)
    try:
        yield client
    finally:
        await client.close()


def _controlplane(version: str | None = None) -> Path:
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        # build.sh can still answer from its cache without a toolchain.
        try:
            return build_controlplane(version=version)
        except ControlPlaneError as e:
            pytest.skip(f"no Go toolchain and no cached control-plane binary: {e}")
    return build_controlplane(version=version)


@pytest.fixture(scope="session")
def controlplane_binary() -> Path:
    """The multi-call binary from services/local/controlplane/build.sh (cached): the
    default Kubernetes release, 1.37."""
    return _controlplane()


@pytest.fixture(scope="session")
def controlplane_for() -> Callable[[int], Path]:
    """``controlplane_for(35)``: the multi-call binary of Kubernetes 1.35 (34 to 37), built
    on first use (build.sh --version) and cached like the default."""
    built: dict[int, Path] = {}

    def binary(minor: int) -> Path:
        if minor not in built:
            built[minor] = _controlplane(f"1.{minor}")
        return built[minor]

    return binary
