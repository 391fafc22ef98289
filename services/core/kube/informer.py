"""List-then-watch, as client-go's informers do: the one watch loop every service uses.

A listing gives the current objects and a resourceVersion; the watch goes on
from there (with bookmarks, so a quiet watch still advances). When the server
ends a watch it resumes from the last resourceVersion seen; when that version
is too old (410 Gone) it lists again. Errors back off exponentially.

:func:`watch_forever` is the loop itself, for any watch that yields events
with a resourceVersion (the publisher follows only which slices changed).
:class:`Informer` keeps the objects of one kind in memory on top of it and
reports additions, changes and deletions, including those a relist finds. An
object that does not decode is logged, counted and skipped: one bad object
never stops the watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Generic, TypeVar

import msgspec
from prometheus_client import Counter

from services.core.kit import limits
from services.core.kit.backoff import Backoff
from services.core.kube.client import ApiError, KubeApi, RawEvent

log = logging.getLogger(__name__)

T = TypeVar("T", bound=msgspec.Struct)
E = TypeVar("E")
R = TypeVar("R")
Handler = Callable[[T | None, T | None], Awaitable[None]]
# An object that cannot be read: what of it could be read (nesting capped), and why not.
MalformedHandler = Callable[[T, str], Awaitable[None]]

WATCH_RESTARTS = Counter(
    "gpudra_kube_watch_restarts_total",
    "Watches restarted: expired (410, relisted), ended by the server, or failed.",
    ["resource", "reason"],
)
MALFORMED_OBJECTS = Counter(
    "gpudra_kube_malformed_objects_total",
    "API objects or watch events that did not decode and were skipped.",
    ["resource"],
)
HANDLER_FAILURES = Counter(
    "gpudra_kube_handler_failures_total",
    "Object changes whose handling raised; the object is skipped, the watch goes on.",
    ["resource"],
)


async def watch_forever(
    resource: str,
    watch: Callable[[str], AsyncIterator[E]],
    resource_version: str,
    on_event: Callable[[E], Awaitable[str | None]],
    relist: Callable[[], Awaitable[str]],
) -> None:
    """Follow ``watch(rv)`` until cancelled.

    ``on_event`` handles one event and returns its resourceVersion (None: not
    known). A watch the server ends is resumed at once from the last version,
    or after a pause if it brought nothing (a server in trouble); 410 calls
    ``relist`` (which must retry until it works) and goes on from its version.
    """
    backoff = Backoff()
    while True:
        events = 0
        try:
            async for event in watch(resource_version):
                events += 1
                resource_version = await on_event(event) or resource_version
            WATCH_RESTARTS.labels(resource=resource, reason="ended").inc()
            if events:
                backoff.reset()
            else:
                await backoff.sleep()
        except ApiError as exc:
            if exc.gone:
                WATCH_RESTARTS.labels(resource=resource, reason="expired").inc()
                log.info("watch expired; listing again", extra={"resource": resource})
                resource_version = await relist()
                continue
            WATCH_RESTARTS.labels(resource=resource, reason="error").inc()
            log.warning("watch failed", extra={"resource": resource, "error": str(exc)})
            await backoff.sleep()


async def list_until_it_works(resource: str, list_once: Callable[[], Awaitable[R]]) -> R:
    """``list_once()`` again and again, backing off, until it answers."""
    backoff = Backoff()
    while True:
        try:
            return await list_once()
        except ApiError as exc:
            WATCH_RESTARTS.labels(resource=resource, reason="list-error").inc()
            log.warning("list failed", extra={"resource": resource, "error": str(exc)})
            await backoff.sleep()


class _Meta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str | None = None
    resource_version: str | None = None


class _Keyed(msgspec.Struct):
    """Enough of any object to key it, even when the rest does not decode."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)


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
        on_unreadable: MalformedHandler[T] | None = None,
    ) -> None:
        self.api = api
        self.resource = resource
        self.path = path
        self.kind = kind
        self.params = dict(params or {})
        self.on_change = on_change
        self.on_unreadable = on_unreadable
        self.items: dict[str, T] = {}
        self.version = 0
        self.synced = asyncio.Event()
        self.resource_version = ""

    async def run(self) -> None:
        """List, then watch until cancelled."""
        await self.relist()
        await watch_forever(
            self.resource,
            lambda rv: self.api.watch(self.path, self.params, rv),
            self.resource_version,
            self._event,
            self.relist,
        )

    async def relist(self) -> str:
        """List until it works; report additions, changes and deletions since the last view."""
        listing = await list_until_it_works(
            self.resource, lambda: self.api.list(self.path, self.params)
        )
        fresh: dict[str, T] = {}
        for raw in listing.items:
            obj = await self._decode(raw)
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
        return self.resource_version

    async def _event(self, event: RawEvent) -> str | None:
        try:
            keyed = _keyed(event.object)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._malformed(f"{event.type} event without readable metadata: {exc}")
            return None
        if keyed.metadata.resource_version:
            self.resource_version = keyed.metadata.resource_version
        if event.type in ("ADDED", "MODIFIED", "DELETED"):  # else BOOKMARK: only the RV matters
            await self._apply(event, object_key(keyed.metadata))
        return self.resource_version

    async def _apply(self, event: RawEvent, key: str) -> None:
        obj = await self._decode(event.object)
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

    async def _decode(self, raw: msgspec.Raw) -> T | None:
        try:
            return msgspec.json.decode(raw, type=self.kind)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            reason = (
                str(limits.too_deep(self.kind.__name__))
                if isinstance(exc, RecursionError)
                else str(exc)
            )
            readable = self._readable_part(raw)
            name = _name_of(raw) if readable is None else object_key(readable.metadata)  # type: ignore[attr-defined]
            self._malformed(f"{self.kind.__name__} {name}: {reason}")
            if readable is not None and self.on_unreadable is not None:
                try:
                    await self.on_unreadable(readable, reason)
                except Exception:
                    log.exception("reporting an unreadable object failed", extra={"object": name})
            return None

    def _readable_part(self, raw: msgspec.Raw) -> T | None:
        """The object with its deepest values dropped, to say which one it is."""
        try:
            return msgspec.json.decode(limits.cap_depth(raw), type=self.kind)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None

    def _malformed(self, reason: str) -> None:
        MALFORMED_OBJECTS.labels(resource=self.resource).inc()
        log.warning(
            "skipping malformed object", extra={"resource": self.resource, "reason": reason}
        )

    async def _notify(self, old: T | None, new: T | None) -> None:
        if self.on_change is None:
            return
        try:
            await self.on_change(old, new)
        except Exception:  # one object must never stop the watch
            HANDLER_FAILURES.labels(resource=self.resource).inc()
            obj = new if new is not None else old
            log.exception(
                "handling a change failed; skipped",
                extra={"resource": self.resource, "object": object_key(obj.metadata)},  # type: ignore[union-attr]
            )


def _keyed(raw: msgspec.Raw) -> _Keyed:
    """The object's key and version; its deepest values are dropped only when they must be."""
    try:
        return msgspec.json.decode(raw, type=_Keyed)
    except RecursionError:
        return msgspec.json.decode(limits.cap_depth(raw), type=_Keyed)


def _name_of(raw: msgspec.Raw) -> str:
    try:
        return object_key(_keyed(raw).metadata)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "?"


def _rv(obj: msgspec.Struct) -> str | None:
    return getattr(getattr(obj, "metadata", None), "resource_version", None)
