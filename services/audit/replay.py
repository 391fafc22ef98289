"""Reading the CLAIMS stream as an auditor: a durable pull consumer, filtered by the server.

The filters (namespace, claim, node, event) become subject filters on the
consumer (services/core/bus/subjects.py puts each in its own escaped token), so
the server sends only the matching events. The consumer is durable: named,
it can be resumed where it stopped (``--durable``); unnamed, it gets a
random name and the server forgets it after ``INACTIVE_S`` without a reader.
"""

from __future__ import annotations

import datetime
import secrets
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent, SchemaError, decode

INACTIVE_S = 3600.0
BATCH = 256


@dataclass(frozen=True)
class Filters:
    namespace: str | None = None
    claim: str | None = None
    node: str | None = None
    events: Sequence[str] = ()

    def subjects(self) -> list[str]:
        names: list[str | None] = list(self.events) or [None]
        return [
            subjects.claim_events(self.namespace, self.claim, self.node, event) for event in names
        ]


@dataclass(frozen=True)
class Stored:
    """One event as the stream holds it."""

    stream_seq: int
    subject: str
    event: ClaimEvent
    headers: dict[str, str] = field(default_factory=dict)
    pending: int = 0  # matching events the stream held after this one when it was read


@dataclass(frozen=True)
class Unreadable:
    stream_seq: int
    subject: str
    error: str
    pending: int = 0


def consumer_config(
    name: str, filters: Filters, since: datetime.datetime | None, *, keep: bool = False
) -> api.ConsumerConfig:
    """``keep``: a named consumer stays until deleted; an unnamed one goes after an hour
    without a reader."""
    return api.ConsumerConfig(
        durable_name=name,
        deliver_policy=api.DeliverPolicy.BY_START_TIME if since else api.DeliverPolicy.ALL,
        opt_start_time=since,
        ack_policy=api.AckPolicy.EXPLICIT,
        filter_subjects=filters.subjects(),
        inactive_threshold=None if keep else INACTIVE_S,
        max_ack_pending=BATCH * 4,
    )


def new_name() -> str:
    return f"audit-{secrets.token_hex(4)}"


async def replay(
    bus: Bus,
    filters: Filters,
    *,
    since: datetime.datetime | None = None,
    durable: str | None = None,
    follow: bool = False,
    idle_wait: float = 1.0,
) -> AsyncGenerator[Stored | Unreadable, None]:
    """Every matching event, oldest first; without ``follow``, stops at the end of the stream.

    A named consumer that exists is resumed where its reader stopped, with the
    filters it was created with."""
    name = durable or new_name()
    try:
        await bus.js.consumer_info(subjects.CLAIMS_STREAM, name)  # resume a named one
    except Exception:
        config = consumer_config(name, filters, since, keep=durable is not None)
        await bus.js.add_consumer(subjects.CLAIMS_STREAM, config)
    sub = await bus.js.pull_subscribe_bind(name, stream=subjects.CLAIMS_STREAM)
    try:
        while True:
            try:
                msgs = await sub.fetch(BATCH, timeout=idle_wait)
            except NatsTimeoutError:
                if not follow and await _caught_up(sub):
                    return
                continue
            for msg in msgs:
                # The server starts a start time past the stream's end at its first message.
                if since is None or msg.metadata.timestamp >= since:
                    meta = msg.metadata
                    yield _read(
                        meta.sequence.stream, msg.subject, msg.data, msg.headers, meta.num_pending
                    )
                await msg.ack()
            if not follow and msgs and msgs[-1].metadata.num_pending == 0:
                return
    finally:
        await sub.unsubscribe()


async def _caught_up(sub: object) -> bool:
    info = await sub.consumer_info()  # type: ignore[attr-defined]
    return (info.num_pending or 0) == 0 and (info.num_ack_pending or 0) == 0


def _read(
    stream_seq: int,
    subject: str,
    data: bytes,
    headers: dict[str, str] | None,
    pending: int | None = 0,
) -> Stored | Unreadable:
    try:
        event = decode(data, ClaimEvent)
    except SchemaError as exc:
        return Unreadable(stream_seq, subject, str(exc), pending or 0)
    return Stored(stream_seq, subject, event, dict(headers or {}), pending or 0)
