"""Fixtures shared by every test tier."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.core import logs
from services.core.bus import Bus
from services.core.natsserver import NatsServer
from tests.helpers.bus import connect

logs.quiet_tls_eof_warnings()


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
