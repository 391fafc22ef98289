"""Fixtures shared by every test tier."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.core import logs
from services.core.bus import Bus
from services.core.natsserver import NatsServer
from services.local.cluster import ControlPlaneError, build_controlplane
from tests.helpers.bus import connect

logs.quiet_tls_eof_warnings()

# Modules that change the host the way a real node does (cgroups, mount namespaces):
# never two at once, because each compares the host before and after itself.
HOST_NODE_MODULES = {"test_realnode_host.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for `make test`'s two workers (pytest-xdist, ``--dist loadgroup``).

    A module's tests stay together on one worker, so its module fixtures (a control
    plane, a stack) start once; every module that runs real nodes shares one group.
    """
    real = {item.path for item in items if item.get_closest_marker("realnode")}
    real |= {item.path for item in items if item.path.name in HOST_NODE_MODULES}
    for item in items:
        group = "real-nodes" if item.path in real else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


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


@pytest.fixture(scope="session")
def controlplane_binary() -> Path:
    """The multi-call binary from services/local/controlplane/build.sh (cached)."""
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        # build.sh can still answer from its cache without a toolchain.
        try:
            return build_controlplane()
        except ControlPlaneError as e:
            pytest.skip(f"no Go toolchain and no cached control-plane binary: {e}")
    return build_controlplane()
