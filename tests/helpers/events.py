"""Claim events as the CLAIMS stream stores them (what an auditor replays)."""

from __future__ import annotations

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent, decode


async def stored_claim_events(bus: Bus) -> list[ClaimEvent]:
    """Every event in the stream now, oldest first (an ephemeral consumer reads them all)."""
    return [event for event, _ in await stored_claim_messages(bus)]


async def stored_claim_messages(bus: Bus) -> list[tuple[ClaimEvent, dict[str, str]]]:
    """Every event in the stream now with its headers (``Nats-Msg-Id``), oldest first."""
    return [(decode(msg.data, ClaimEvent), dict(msg.headers or {})) for msg in await _stored(bus)]


async def stored_claim_subjects(bus: Bus) -> list[tuple[str, ClaimEvent]]:
    """Every event in the stream now with the subject it was stored under, oldest first."""
    return [(msg.subject, decode(msg.data, ClaimEvent)) for msg in await _stored(bus)]


async def _stored(bus: Bus) -> list[Msg]:
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
    sub = await bus.js.pull_subscribe(
        subjects.claim_events_all(), stream=subjects.CLAIMS_STREAM, config=config
    )
    stored: list[Msg] = []
    try:
        pending = (await sub.consumer_info()).num_pending or 0
        while pending > 0:
            batch = await sub.fetch(min(pending, 256), timeout=10)
            pending -= len(batch)
            stored += batch
    finally:
        await sub.unsubscribe()
    return stored
