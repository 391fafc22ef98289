"""Connecting to the test nats-server as one identity, as a component would."""

from __future__ import annotations

from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.local.natsserver import NatsCluster, NatsServer


async def connect(
    server: NatsServer | NatsCluster,
    role: Role = Role.ADMIN,
    node: str = "",
    *,
    name: str = "tests",
) -> Bus:
    """A bus client with ``role``'s credentials and permissions (admin also provisions)."""
    return await Bus.connect(
        server.url,
        name=name,
        identity=Identity(role, node),
        credentials=server.credentials(role, node),
    )
