"""Fixtures for integration tests: a simulated node's directories and its processes.

Unix socket paths are limited to 108 bytes, so a node's kubelet root lives in a
short directory under /tmp rather than pytest's deep tmp_path.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.core.bus.client import Bus
from services.local.natsserver import NatsServer
from tests.helpers.attacker import MakeAttacker, attackers
from tests.helpers.preparer import Node


@pytest.fixture
def short_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gi-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def node(short_root: Path, nats_server: NatsServer, bus: Bus) -> AsyncIterator[Node]:
    """A simulated dgx-h100 node with discovery running (start the preparer in the test)."""
    running = Node(short_root, nats_server, bus, fleet="dgx-h100")
    await running.start_discovery()
    try:
        yield running
    finally:
        await running.close()


@pytest.fixture
async def attacker(nats_server: NatsServer) -> AsyncIterator[MakeAttacker]:
    """Raw clients with a role's real credentials (tests.helpers.attacker)."""
    async with attackers(nats_server) as make:
        yield make
