"""An attacker on the bus: a raw NATS client with one identity's real credentials.

Not our Bus: an attacker need not play by its rules. What the server refuses it
reports asynchronously, as an error on the connection; these are collected.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client

from services.core.bus.access import Identity, Role
from services.local.natsserver import NatsServer

DENIED = "permissions violation"


@dataclass
class Attacker:
    nc: Client
    identity: Identity
    errors: list[str] = field(default_factory=list)

    def refused(self, subject: str) -> bool:
        """Whether the server has said no to ``subject`` yet."""
        return any(DENIED in e and subject.lower() in e.lower() for e in self.errors)

    async def denied(self, subject: str, timeout: float = 5.0) -> None:
        """Wait until the server has said no to ``subject``."""
        deadline = time.monotonic() + timeout
        while not self.refused(subject):
            assert time.monotonic() < deadline, f"no refusal of {subject}; errors: {self.errors}"
            await asyncio.sleep(0.02)


MakeAttacker = Callable[..., Awaitable[Attacker]]


@asynccontextmanager
async def attackers(server: NatsServer) -> AsyncIterator[MakeAttacker]:
    """Makes attackers of any role (and node) on ``server``; closes them all after."""
    made: list[Attacker] = []

    async def make(role: Role, node: str = "") -> Attacker:
        creds = server.credentials(role, node)
        who = Identity(role, node)
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            server.url, nkeys_seed_str=creds.seed(), tls=creds.tls(),
            inbox_prefix=who.inbox_prefix, error_cb=on_error, max_reconnect_attempts=0,
        )  # fmt: skip
        made.append(Attacker(nc, who, errors))
        return made[-1]

    try:
        yield make
    finally:
        for one in made:
            await one.nc.close()
