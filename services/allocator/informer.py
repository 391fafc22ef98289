"""List-then-watch one kind of object into a local cache, as client-go's informers do.

A listing gives the current objects and a resourceVersion; the watch goes on
from there (with bookmarks, so a quiet watch still advances). When the server
ends a watch it resumes from the last resourceVersion seen; when that version
is too old (410 Gone) the informer lists again and reports what changed in the
meantime (including deletions) as ordinary changes. Errors back off
exponentially. An object that does not decode is logged, counted and skipped:
one bad object never stops the watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Generic, TypeVar

import msgspec

from services.allocator import metrics
from services.allocator.kubeapi import ApiError, KubeApi, RawEvent
from services.allocator.kubeobjects import Keyed

log = logging.getLogger(__name__)

T = TypeVar("T", bound=msgspec.Struct)
Handler = Callable[[T | None, T | None], Awaitable[None]]

MAX_BACKOFF_S = 30.0


class Backoff:
    """Exponential delays between retries, reset after a success."""

    def __init__(self, first: float = 0.2, limit: float = MAX_BACKOFF_S) -> None:
        self.first = first
        self.limit = limit
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    async def sleep(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.limit)


def object_key(meta: msgspec.Struct) -> str:
    namespace = getattr(meta, "namespace", None)
    name = getattr(meta, "name", "")
    return f"{namespace}/{name}" if namespace else str(name)


class Informer(Generic[T]):
    """The current objects of one kind (``items``, keyed ``namespace/name``), kept by a watch.

    ``on_change(old, new)`` is awaited for every change in order: ``old`` None
    for an addition, ``new`` None for a deletion. ``version`` grows with every
    change, so callers can cache what they derive from ``items``.
    """

    def __init__(
        self,
        api: KubeApi,
        resource: str,
        path: str,
        kind: type[T],
        *,
        params: Mapping[str, str] | None = None,
        on_change: Handler[T] | None = None,
    ) -> None:
        self.api = api
        self.resource = resource
        self.path = path
        self.kind = kind
        self.params = dict(params or {})
        self.on_change = on_change
        self.items: dict[str, T] = {}
        self.version = 0
        self.synced = asyncio.Event()
        self.resource_version = ""

    async def run(self) -> None:
        """List, then watch until cancelled."""
        await self.relist()
        backoff = Backoff()
        while True:
            try:
                async for event in self.api.watch(self.path, self.params, self.resource_version):
                    backoff.reset()
                    await self._event(event)
                metrics.WATCH_RESTARTS.labels(resource=self.resource, reason="ended").inc()
            except ApiError as exc:
                if exc.gone:
                    metrics.WATCH_RESTARTS.labels(resource=self.resource, reason="expired").inc()
                    log.info("watch expired; listing again", extra={"resource": self.resource})
                    await self.relist()
                    continue
                metrics.WATCH_RESTARTS.labels(resource=self.resource, reason="error").inc()
                log.warning("watch failed", extra={"resource": self.resource, "error": str(exc)})
                await backoff.sleep()

    async def relist(self) -> None:
        """List until it works; report additions, changes and deletions since the last view."""
        backoff = Backoff()
        while True:
            try:
                listing = await self.api.list(self.path, self.params)
                break
            except ApiError as exc:
                metrics.WATCH_RESTARTS.labels(resource=self.resource, reason="list-error").inc()
                log.warning("list failed", extra={"resource": self.resource, "error": str(exc)})
                await backoff.sleep()
        fresh: dict[str, T] = {}
        for raw in listing.items:
            obj = self._decode(raw)
            if obj is not None:
                fresh[object_key(obj.metadata)] = obj  # type: ignore[attr-defined]
        old_items, self.items = self.items, dict(fresh)
        self.resource_version = listing.resource_version
        self.version += 1
        for key, old in old_items.items():
            if key not in fresh:
                await self._notify(old, None)
        for key, obj in fresh.items():
            old_obj = old_items.get(key)
            if old_obj is None or _rv(old_obj) != _rv(obj):
                await self._notify(old_obj, obj)
        self.synced.set()

    async def _event(self, event: RawEvent) -> None:
        try:
            keyed = msgspec.json.decode(event.object, type=Keyed)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._malformed(f"{event.type} event without readable metadata: {exc}")
            return
        if keyed.metadata.resource_version:
            self.resource_version = keyed.metadata.resource_version
        if event.type not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK: only the resourceVersion matters
        key = object_key(keyed.metadata)
        obj = self._decode(event.object)
        old = self.items.get(key)
        if event.type == "DELETED":
            self.items.pop(key, None)
            self.version += 1
            gone = old if old is not None else obj
            if gone is not None:
                await self._notify(gone, None)
            return
        if obj is None:
            return
        self.items[key] = obj
        self.version += 1
        await self._notify(old, obj)

    def _decode(self, raw: msgspec.Raw) -> T | None:
        try:
            return msgspec.json.decode(raw, type=self.kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            name = ""
            try:
                name = object_key(msgspec.json.decode(raw, type=Keyed).metadata)
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
            self._malformed(f"{self.kind.__name__} {name or '?'}: {exc}")
            return None

    def _malformed(self, reason: str) -> None:
        metrics.MALFORMED_OBJECTS.labels(resource=self.resource).inc()
        log.warning(
            "skipping malformed object", extra={"resource": self.resource, "reason": reason}
        )

    async def _notify(self, old: T | None, new: T | None) -> None:
        if self.on_change is None:
            return
        try:
            await self.on_change(old, new)
        except Exception:  # one object must never stop the watch
            metrics.HANDLER_FAILURES.labels(resource=self.resource).inc()
            obj = new if new is not None else old
            log.exception(
                "handling a change failed; skipped",
                extra={"resource": self.resource, "object": object_key(obj.metadata)},  # type: ignore[union-attr]
            )


def _rv(obj: msgspec.Struct) -> str | None:
    return getattr(getattr(obj, "metadata", None), "resource_version", None)
