"""The streams and buckets the bus holds, created idempotently with their configured limits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from services.core.bus import retention, subjects

STREAMS: Mapping[str, list[str]] = {
    subjects.CLAIMS_STREAM: [f"{subjects.CLAIM_ROOT}.>"],
    subjects.HEALTH_STREAM: [f"{subjects.HEALTH_ROOT}.>"],
    subjects.INVENTORY_EVENTS_STREAM: [f"{subjects.INVENTORY_ROOT}.>"],
}
#: Streams that refuse a new message when full instead of dropping their oldest. The
#: audit trail is evidence: in one stream no limit is per identity, so with "discard
#: old" one compromised node's flood (17,000 64 KB fake events in 33.5 s) dropped every
#: other emitter's history. Refused, its flood evicts nobody's; new events then wait in
#: their emitters (a 503, retried) until old ones age out or the limit is raised.
REFUSE_WHEN_FULL = frozenset({subjects.CLAIMS_STREAM})
DUPLICATE_WINDOW_S = 120.0  # JetStream's default; never longer than the stream's max age
#: Consumers a stream or bucket takes. nats-server 2.15 allows 1,000 per stream unless
#: the stream says otherwise, and every node's front, preparer and discovery watch
#: ``inventory``: a fleet of 334 nodes would be refused its watches. One identity
#: holds at most services.core.bus.slots.SLOTS of them whatever this says, so the
#: limit only has to leave room for every identity's (5,000 nodes x 3 x 4 over it).
MAX_CONSUMERS = 1 << 16

BUCKETS: Mapping[str, int] = {  # bucket -> history depth
    subjects.INVENTORY_BUCKET: 1,
    subjects.CLAIMS_BUCKET: 1,
    subjects.PRESENCE_BUCKET: 1,
    subjects.SIM_BUCKET: 1,
    subjects.PREPARED_BUCKET: 1,
    subjects.PUBLISHERS_BUCKET: 1,
    subjects.DOMAINS_BUCKET: 1,
}


async def provision_streams(js: JetStreamContext, replicas: int) -> None:
    """Create every stream we use, and keep their limits as configured."""
    for stream, subs in STREAMS.items():
        wanted = _stream_config(stream, subs, replicas)
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            await js.add_stream(wanted)
            continue
        if _limits_differ(info.config, wanted):
            await js.update_stream(
                replace(info.config, max_age=wanted.max_age, max_bytes=wanted.max_bytes,
                        max_msg_size=wanted.max_msg_size, discard=wanted.discard,
                        duplicate_window=wanted.duplicate_window,
                        max_consumers=wanted.max_consumers)
            )  # fmt: skip


def _stream_config(stream: str, subs: list[str], replicas: int) -> js_api.StreamConfig:
    limits = retention.limits(stream)
    full = js_api.DiscardPolicy.NEW if stream in REFUSE_WHEN_FULL else js_api.DiscardPolicy.OLD
    return js_api.StreamConfig(
        name=stream,
        subjects=subs,
        storage=js_api.StorageType.FILE,
        num_replicas=replicas,
        max_age=limits.max_age_s or None,
        max_bytes=limits.max_bytes,
        max_msg_size=limits.max_msg_size,
        discard=full,
        max_consumers=MAX_CONSUMERS,
        # The server refuses a window longer than the max age (a trail kept minutes).
        duplicate_window=min(DUPLICATE_WINDOW_S, limits.max_age_s or DUPLICATE_WINDOW_S),
    )


async def create_bucket(js: JetStreamContext, bucket: str, history: int, replicas: int) -> KeyValue:
    """Create ``bucket`` with its configured limits, closed to rollups and purges."""
    limits = retention.limits(bucket)
    kv = await js.create_key_value(
        bucket=bucket,
        history=history,
        storage=js_api.StorageType.FILE,
        replicas=replicas,
        max_bytes=limits.max_bytes,
        max_value_size=limits.max_msg_size,
        ttl=limits.max_age_s or None,
    )
    await close_bucket(js, bucket)
    return kv


async def close_bucket(js: JetStreamContext, bucket: str) -> None:
    """No rollup headers and no purge on ``bucket``'s stream; room for every identity's
    consumers (:data:`MAX_CONSUMERS`).

    nats-py creates every bucket with ``allow_rollup_hdrs``: a writer of one key
    could then send ``Nats-Rollup: all`` on it and wipe every other writer's keys
    (one node's discovery, every node's inventory), and a purge emits no watch
    event for the owners to notice. Keys are removed with a delete marker instead
    (:meth:`services.core.bus.client.Bus.kv_delete`). Buckets made before are
    closed by the next provisioning.
    """
    config = (await js.stream_info(f"KV_{bucket}")).config
    closed = (config.allow_rollup_hdrs, config.deny_purge, config.max_consumers)
    if closed != (False, True, MAX_CONSUMERS):
        await js.update_stream(replace(config, allow_rollup_hdrs=False, deny_purge=True,
                                       max_consumers=MAX_CONSUMERS))  # fmt: skip


def in_stream(subject: str) -> bool:
    """Whether one of our streams holds ``subject``."""
    return any(subject.startswith(pattern[:-1]) for pats in STREAMS.values() for pattern in pats)


def _limits_differ(have: js_api.StreamConfig, want: js_api.StreamConfig) -> bool:
    def limits(config: js_api.StreamConfig) -> tuple[object, ...]:
        return (config.max_age or 0, config.max_bytes, config.max_msg_size, config.discard,
                config.duplicate_window, config.max_consumers)  # fmt: skip

    return limits(have) != limits(want)
