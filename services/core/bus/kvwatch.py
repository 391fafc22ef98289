"""KV watches that are always made to the end, and stopped when nobody wants them."""

from __future__ import annotations

import asyncio

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
