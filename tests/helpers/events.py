"""Claim events as the CLAIMS stream stores them (what an auditor replays)."""

from __future__ import annotations

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent, decode


async def stored_claim_events(bus: Bus) -> list[ClaimEvent]:
    """Every event in the stream now, oldest first (an ephemeral consumer reads them all)."""
    return [event for event, _ in await stored_claim_messages(bus)]


async def stored_claim_messages(bus: Bus) -> list[tuple[ClaimEvent, dict[str, str]]]:
    """Every event in the stream now with its headers (``Nats-Msg-Id``), oldest first."""
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
    sub = await bus.js.pull_subscribe(
        subjects.claim_events_all(), stream=subjects.CLAIMS_STREAM, config=config
    )
    stored: list[tuple[ClaimEvent, dict[str, str]]] = []
    try:
        pending = (await sub.consumer_info()).num_pending or 0
        while pending > 0:
            batch = await sub.fetch(min(pending, 256), timeout=10)
            pending -= len(batch)
            stored += [(decode(msg.data, ClaimEvent), dict(msg.headers or {})) for msg in batch]
    finally:
        await sub.unsubscribe()
    return stored
