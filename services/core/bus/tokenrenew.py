"""Reconnect with the rotated token before the one a connection was made with expires.

In a cluster a client proves who it is with a projected ServiceAccount token, and the
auth callout gives its connection the token's expiry: the server drops the connection
then ("User Authentication Expired"). nats-py takes that error as final and closes for
good (the bus then stops the process, see ``bus._stop_when_closed``), so a pod would
restart once per token lifetime. The kubelet writes a fresh token at 80% of the old
one's life; this task waits for it and reconnects before the old one runs out (nats-py
reads the token again on every reconnect), so the connection never reaches its expiry.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.aio.client import Client

from services.core.bus.natsauth import Credentials, CredentialsError
from services.core.bus.natsjwt import unverified_claims

log = logging.getLogger(__name__)

LEAD_S = 60.0  # reconnect this long before expiry at most
LEAD_SHARE = 0.2  # ...and at most this share of the token's life (short test tokens)
POLL_S = 5.0  # how often to look for the rotated token once it is due


def expiry(token: str) -> tuple[float, float] | None:
    """``(issued, expires)`` of a JWT (unverified: it only schedules), or None."""
    claims = unverified_claims(token)
    if claims is None:
        return None
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        return None
    issued = iat if isinstance(iat, int | float) and not isinstance(iat, bool) else time.time()
    return float(issued), float(exp)


def renew_at(issued: float, expires: float) -> float:
    """When to start looking for the next token: ``LEAD_S`` before expiry, or earlier in
    proportion for a short-lived token."""
    return expires - min(LEAD_S, max(0.0, expires - issued) * LEAD_SHARE)


class TokenSource:
    """The token callable nats-py calls on every (re)connect: reads the file afresh and
    remembers the expiry of the token it handed over (the one the server holds us to,
    which the file may already have moved past)."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self.used: tuple[float, float] | None = None
        self.sent = asyncio.Event()  # set each time a token is handed over

    def __call__(self) -> str:
        token = self.creds.token()
        self.used = expiry(token)
        self.sent.set()
        return token


async def renew(nc: Client, source: TokenSource, name: str) -> None:
    """Forever: sleep until the token the connection was made with is due, wait for a
    later one in the file, then reconnect with it. Returns when a token has no expiry."""
    while (used := source.used) is not None:
        issued, expires = used
        poll = _poll(issued, expires)
        await asyncio.sleep(max(0.0, renew_at(issued, expires) - time.time()))
        if source.used != used:
            continue  # reconnected meanwhile (a server restart), with another token
        if await _token(source.creds, name, newer_than=expires, poll=poll) is None:
            return
        log.info("reconnecting with the rotated token", extra={"connection": name})
        source.sent.clear()
        await nc.force_reconnect()
        await source.sent.wait()  # the reconnect has sent a token (the loop reads its expiry)


async def _token(
    creds: Credentials, name: str, *, newer_than: float | None = None, poll: float = POLL_S
) -> tuple[float, float] | None:
    """The file's token once it expires after ``newer_than``; None if it has no expiry."""
    warned = False
    while True:
        try:
            found = expiry(creds.token())
        except CredentialsError as exc:  # a file mid-rotation: the next look finds it
            log.warning("cannot read the token file", extra={"connection": name, "error": str(exc)})
        else:
            if found is None or newer_than is None or found[1] > newer_than:
                return found
            if time.time() >= newer_than and not warned:
                warned = True
                log.warning(
                    "the token expired before a fresh one was written",
                    extra={"connection": name, "token_file": str(creds.token_file)},
                )
        await asyncio.sleep(poll)


def _poll(issued: float, expires: float) -> float:
    return min(POLL_S, max(0.05, (expires - issued) * LEAD_SHARE / 4))
