"""The NATS connection under a bus: its servers, its reconnects, what it logs."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client

from services.core.bus.access import Identity
from services.core.bus.natsauth import Credentials
from services.core.bus.tokenrenew import TokenSource
from services.core.telemetry import logs

log = logging.getLogger(__name__)


async def connect(
    url: str,
    *,
    name: str,
    identity: Identity,
    credentials: Credentials,
    token: TokenSource | None,
) -> Client:
    """A client that reconnects forever, replies in ``identity``'s own inbox prefix."""
    # nats-py upgrades to TLS with a stream protocol that never learns it is over TLS
    # (nats-io/nats.py#574), so asyncio warns at each close that its eof_received()
    # "has no effect": in every process that connects, not only those with JSON logs
    # (a CLI's stderr is what `gpudra up` prints of `gpudra audit`).
    logs.quiet_tls_eof_warnings()
    return await nats.connect(
        servers=server_urls(url),
        name=name,
        nkeys_seed_str=credentials.seed() if credentials.creds else None,
        # Called on every (re)connect: a rotated token is read from its file again.
        token=token,
        tls=credentials.tls(),
        inbox_prefix=identity.inbox_prefix,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
        error_cb=_log_error,
        disconnected_cb=_log_event("disconnected"),
        reconnected_cb=_log_event("reconnected"),
    )


def server_urls(url: str) -> list[str]:
    """``--nats-url``'s servers: one URL or several, comma-separated (blanks ignored)."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError(f"no NATS server in --nats-url {url!r}")
    return servers


async def _log_error(exc: Exception) -> None:
    log.warning("nats error", extra={"error": str(exc)})


def _log_event(what: str) -> Callable[[], Awaitable[None]]:
    async def cb() -> None:
        log.info(f"nats {what}")

    return cb
