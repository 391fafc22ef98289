"""KV watches and a bucket's keys, read through ordered consumers under the identity's
own consumer names (:mod:`services.core.bus.ordered`, :mod:`services.core.bus.slots`).

Not nats-py's ``KeyValue.watch()`` and ``keys()``: their consumers are made through
the legacy ephemeral API, which no identity may use (one identity could otherwise
take every consumer a stream allows). A watch or listing cancelled while its consumer
is being made leaves nothing behind: the consumer, if made, is deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from services.core.bus.ordered import Names, OrderedConsumer, Start


@dataclass(frozen=True)
class Entry:
    """One change of a key: its value (None: deleted, purged or expired), its revision."""

    key: str
    value: bytes | None
    revision: int


KV_OPERATION = "KV-Operation"  # what a KV message is: a value, or DEL or PURGE


async def watch(
    nc: Client, names: Names, bucket: str, keys: str = ">", current: asyncio.Event | None = None
) -> AsyncGenerator[Entry, None]:
    """The current value of every key matching ``keys``, then every change, forever.

    ``current`` is set once the values the bucket held when the watch began have all
    been taken (the one after the last is asked for): a reader that wants them all
    before it goes on waits for it instead of reading every key again."""
    prefix = f"$KV.{bucket}."
    consumer = OrderedConsumer(nc, names, f"KV_{bucket}", prefix + keys)
    await consumer.open()
    if current is not None and not consumer.pending:
        current.set()
    try:
        while True:
            msg = await consumer.next()
            if msg is None:
                continue
            value = None if _removed(msg) else msg.data
            yield Entry(msg.subject[len(prefix) :], value, msg.metadata.sequence.stream)
            if current is not None and not msg.metadata.num_pending:
                current.set()
    finally:
        await consumer.close()


async def read_keys(nc: Client, names: Names, bucket: str, idle: float = 1.0) -> list[str]:
    """The keys of ``bucket`` that hold a value, read to the end of its stream."""
    return [entry.key for entry in await read_values(nc, names, bucket, idle=idle, bare=True)]


async def read_values(
    nc: Client,
    names: Names,
    bucket: str,
    keys: str = ">",
    idle: float = 1.0,
    bare: bool = False,
) -> list[Entry]:
    """Every key of ``keys`` that holds a value, with it (``bare``: without, headers
    only), in one pass of one consumer instead of a request per key.

    The end is what the server says: nothing pending when the consumer was made, or
    after the last message read; when nothing comes for ``idle`` (what was pending
    expired meanwhile) the consumer's state is asked.
    """
    prefix = f"$KV.{bucket}."
    start = Start(DeliverPolicy.LAST_PER_SUBJECT, headers_only=bare)
    consumer = OrderedConsumer(nc, names, f"KV_{bucket}", prefix + keys, start)
    await consumer.open()
    found: list[Entry] = []
    try:
        remaining = consumer.pending
        while remaining:
            msg = await consumer.next(timeout=idle)
            if msg is None:
                info = await consumer.info()
                delivered = (info.delivered.consumer_seq or 0) if info.delivered else 0
                remaining = (info.num_pending or 0) + max(0, delivered - consumer.taken)
                continue
            if not _removed(msg):
                key = msg.subject[len(prefix) :]
                found.append(Entry(key, None if bare else msg.data, msg.metadata.sequence.stream))
            remaining = msg.metadata.num_pending
    finally:
        await consumer.close()
    return found


def _removed(msg: Msg) -> bool:
    headers = msg.headers or {}
    return headers.get(KV_OPERATION) in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers
