"""KV watches that are always made to the end, and stopped when nobody wants them;
a bucket's keys read to the end."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo, DeliverPolicy
from nats.js.kv import KeyValue

_OPENING: set[asyncio.Future[KeyValue.KeyWatcher]] = set()
_ORPHANS: set[asyncio.Task[None]] = set()


async def open_watcher(kv: KeyValue, keys: str) -> KeyValue.KeyWatcher:
    """``kv.watch(keys)``, made to the end even when its caller is cancelled meanwhile.

    A watch cancelled half made (a SIGTERM in a service's first milliseconds)
    leaves a subscription behind whose callback waits seconds for a setup that
    never completes, and a drain then waits for it. Here the watch is always
    completed and, when nobody wants it any more, stopped.
    """
    opening = asyncio.ensure_future(kv.watch(keys))
    _OPENING.add(opening)
    opening.add_done_callback(_OPENING.discard)
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_stop_orphan)
        raise


def _stop_orphan(opening: asyncio.Future[KeyValue.KeyWatcher]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        return
    task = asyncio.ensure_future(opening.result().stop())  # type: ignore[no-untyped-call]
    _ORPHANS.add(task)
    task.add_done_callback(_ORPHANS.discard)


async def settle_watchers(timeout: float = 5.0) -> None:
    """Let watches still being made finish, and orphaned ones stop (before a drain)."""
    loop = asyncio.get_running_loop()
    opening = {f for f in _OPENING if f.get_loop() is loop}
    if opening:
        await asyncio.wait(opening, timeout=timeout)
        await asyncio.sleep(0)  # their done callbacks have run
    orphans = {t for t in _ORPHANS if t.get_loop() is loop}
    if orphans:
        await asyncio.wait(orphans, timeout=timeout)


async def read_keys(js: JetStreamContext, bucket: str, idle: float = 1.0) -> list[str]:
    """The keys of ``bucket`` that hold a value, read to the end of its stream.

    Not nats-py's ``KeyValue.keys()``: it asks for its consumer's info while the
    first deliveries wait for that answer, and then takes "nothing pending, nothing
    received" for an empty bucket; under load it answered [] for a bucket with
    keys. Here the end is what the server says it delivered, all of it read, and
    nothing pending after it.
    """
    prefix = f"$KV.{bucket}."
    sub = await js.subscribe(
        prefix + ">",
        stream=f"KV_{bucket}",
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        headers_only=True,
        inactive_threshold=60.0,
    )
    keys: list[str] = []
    received = 0
    try:
        info = await sub.consumer_info()
        while info.num_pending or received < _delivered(info):
            try:
                msg = await sub.next_msg(timeout=idle)
            except NatsTimeoutError:  # what was pending expired meanwhile
                info = await sub.consumer_info()
                continue
            received += 1
            if not _removed(msg):
                keys.append(msg.subject[len(prefix) :])
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return keys


def _delivered(info: ConsumerInfo) -> int:
    return (info.delivered.consumer_seq or 0) if info.delivered else 0


def _removed(msg: Msg) -> bool:
    headers = msg.headers or {}
    return headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers
