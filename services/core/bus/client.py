"""The one NATS JetStream client every service uses.

It knows every stream and bucket (from :mod:`services.core.bus.subjects`), creates
them idempotently, and speaks msgspec Structs so no service handles raw bytes.
A payload that fails to decode is logged with the reason, counted and skipped:
one bad message never stops a consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import (
    ConnectionReconnectingError,
    NoRespondersError,
    OutboundBufferLimitError,
    StaleConnectionError,
    UnexpectedEOF,
)
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyNotFoundError,
    NoKeysError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue

from services.core.bus import retention, subjects, tokenrenew
from services.core.bus.access import Identity, Role
from services.core.bus.natsauth import Credentials
from services.core.kit import supervisor
from services.core.kit.env import env
from services.core.model.schemas import SchemaError, decode, encode
from services.core.telemetry import logs
from services.core.telemetry.metrics import FOREIGN_MESSAGES, MALFORMED_MESSAGES

log = logging.getLogger(__name__)
T = TypeVar("T")

STREAMS: Mapping[str, list[str]] = {
    subjects.CLAIMS_STREAM: [f"{subjects.CLAIM_ROOT}.>"],
    subjects.HEALTH_STREAM: [f"{subjects.HEALTH_ROOT}.>"],
    subjects.INVENTORY_EVENTS_STREAM: [f"{subjects.INVENTORY_ROOT}.>"],
}
BUCKETS: Mapping[str, int] = {  # bucket -> history depth
    subjects.INVENTORY_BUCKET: 1,
    subjects.CLAIMS_BUCKET: 1,
    subjects.PRESENCE_BUCKET: 1,
    subjects.SIM_BUCKET: 1,
    subjects.PREPARED_BUCKET: 1,
    subjects.PUBLISHERS_BUCKET: 1,
    subjects.DOMAINS_BUCKET: 1,
}


DEFAULT_MAX_INFLIGHT = 64


class RequestFailed(Exception):
    """A request got no answer: nobody listens, or the answer came too late."""


class RequestTimeout(RequestFailed, TimeoutError):
    """A responder exists but did not answer in time."""


class NotProvisioned(RuntimeError):
    """A stream or bucket is missing, and this identity may not create it."""


@dataclass(frozen=True)
class KvUpdate(Generic[T]):
    key: str
    value: T | None  # None: the key was deleted or purged
    revision: int


@dataclass(frozen=True)
class Delivery(Generic[T]):
    subject: str
    value: T
    headers: dict[str, str]
    msg: Msg

    async def ack(self) -> None:
        await self.msg.ack()


#: How often a bus checks that its client has not closed for good (see _stop_when_closed).
CLOSED_POLL_S = 0.5


class Bus:
    """A connected NATS client with JetStream and our schemas."""

    default_replicas: int | None = None  # set from --nats-replicas by core.runner
    default_credentials: Credentials = Credentials()  # --nats-creds / --nats-ca, by core.runner
    max_inflight: int = DEFAULT_MAX_INFLIGHT  # set from --max-inflight by core.runner
    delete_marker_ttl: float = retention.DELETE_MARKER_TTL_S

    def __init__(self, nc: Client, replicas: int = 1, identity: Identity | None = None) -> None:
        self.nc = nc
        self.identity = identity or Identity(Role.ADMIN)
        self.replicas = replicas  # JetStream replicas for what we create (3 in a cluster)
        self.js: JetStreamContext = nc.jetstream()
        self._kv: dict[str, KeyValue] = {}
        self._served: list[Subscription] = []
        self._inflight: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(self.max_inflight)
        self._closing = False  # set by close(): a close we asked for
        self._background: list[asyncio.Task[None]] = []  # the watchdog, the token renewal

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        identity: Identity,
        credentials: Credentials | None = None,
        replicas: int | None = None,
    ) -> Bus:
        """Connect as ``identity``; the admin identity also provisions streams and buckets.

        ``url`` names one server or, comma-separated, several (a cluster's): the
        client connects to one of them and, when that one goes away, reconnects
        to another (or to one the cluster told it about), forever.

        Replies come to the identity's own inbox prefix, the only inboxes its
        permissions let it read.
        """
        creds = credentials or cls.default_credentials
        token = tokenrenew.TokenSource(creds) if creds.token_file else None
        # nats-py upgrades to TLS with a stream protocol that never learns it is over TLS
        # (nats-io/nats.py#574), so asyncio warns at each close that its eof_received()
        # "has no effect": in every process that connects, not only those with JSON logs
        # (a CLI's stderr is what `gpudra up` prints of `gpudra audit`).
        logs.quiet_tls_eof_warnings()
        nc = await nats.connect(
            servers=server_urls(url),
            name=name,
            nkeys_seed_str=creds.seed() if creds.creds else None,
            # Called on every (re)connect: a rotated token is read from its file again.
            token=token,
            tls=creds.tls(),
            inbox_prefix=identity.inbox_prefix,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=5,
            error_cb=_log_error,
            disconnected_cb=_log_event("disconnected"),
            reconnected_cb=_log_event("reconnected"),
        )
        if replicas is None:
            replicas = cls.default_replicas or int(env("nats-replicas", "1"))
        bus = cls(nc, replicas=replicas, identity=identity)
        loop = asyncio.get_running_loop()
        bus._background.append(
            loop.create_task(_stop_when_closed(bus, name), name=f"bus {name}: closed for good?")
        )
        if token is not None:
            bus._background.append(
                loop.create_task(tokenrenew.renew(nc, token, name), name=f"bus {name}: token")
            )
        if identity.role is Role.ADMIN:
            await bus.provision()
        return bus

    async def close(self) -> None:
        self._closing = True
        await settle_watchers()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        await supervisor.cancel_and_wait(list(self._background))

    async def provision(self) -> None:
        """Create every stream and bucket we use, and keep their limits as configured."""
        for stream, subs in STREAMS.items():
            limits = retention.limits(stream)
            wanted = js_api.StreamConfig(
                name=stream,
                subjects=subs,
                storage=js_api.StorageType.FILE,
                num_replicas=self.replicas,
                max_age=limits.max_age_s or None,
                max_bytes=limits.max_bytes,
                max_msg_size=limits.max_msg_size,
                discard=js_api.DiscardPolicy.OLD,
            )
            try:
                info = await self.js.stream_info(stream)
            except NotFoundError:
                await self.js.add_stream(wanted)
                continue
            if _limits_differ(info.config, wanted):
                await self.js.update_stream(
                    replace(info.config, max_age=wanted.max_age, max_bytes=wanted.max_bytes,
                            max_msg_size=wanted.max_msg_size, discard=wanted.discard)
                )  # fmt: skip
        for bucket, history in BUCKETS.items():
            await self.kv(bucket, history=history)

    async def kv(self, bucket: str, history: int = 1) -> KeyValue:
        if bucket not in self._kv:
            try:
                self._kv[bucket] = await self.js.key_value(bucket)
            except BucketNotFoundError:
                if self.identity.role is not Role.ADMIN:
                    raise NotProvisioned(
                        f"bucket {bucket!r} does not exist and {self.identity.name!r} may not "
                        "create it: provision the bus first (`gpudra provision`, the chart's job)"
                    ) from None
                limits = retention.limits(bucket)
                self._kv[bucket] = await self.js.create_key_value(
                    bucket=bucket,
                    history=history,
                    storage=js_api.StorageType.FILE,
                    replicas=self.replicas,
                    max_bytes=limits.max_bytes,
                    max_value_size=limits.max_msg_size,
                    ttl=limits.max_age_s or None,
                )
        return self._kv[bucket]

    # ------------------------------------------------------------ KV

    async def kv_put(self, bucket: str, key: str, value: msgspec.Struct) -> int:
        return int(await (await self.kv(bucket)).put(key, encode(value)))

    async def kv_get(self, bucket: str, key: str, kind: type[T]) -> tuple[T, int] | None:
        """The value and its revision, or None if absent or deleted."""
        try:
            entry = await (await self.kv(bucket)).get(key)
        except KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        return decode(entry.value, kind), int(entry.revision or 0)

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Remove the key; the marker watchers see expires on its own (see retention)."""
        kv = await self.kv(bucket)
        with contextlib.suppress(KeyNotFoundError):
            await kv.purge(key, msg_ttl=self.delete_marker_ttl)

    async def kv_keys(self, bucket: str) -> list[str]:
        try:
            return list(await (await self.kv(bucket)).keys())
        except (NotFoundError, NoKeysError):  # an empty bucket raises NoKeysError
            return []

    async def watch_kv(
        self, bucket: str, kind: type[T], keys: str = ">"
    ) -> AsyncIterator[KvUpdate[T]]:
        """Current values first, then every change; malformed values are skipped."""
        watcher = await open_watcher(await self.kv(bucket), keys)
        try:
            async for entry in watcher:
                if entry is None:  # end of the initial values
                    continue
                revision = int(entry.revision or 0)
                if entry.operation in ("DEL", "PURGE") or not entry.value:
                    yield KvUpdate(entry.key, None, revision)
                    continue
                value = _decode_or_skip(entry.value, kind, f"kv:{bucket}", f"key {entry.key!r}")
                if value is not None:
                    yield KvUpdate(entry.key, value, revision)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------ messages

    async def publish(
        self, subject: str, value: msgspec.Struct, headers: dict[str, str] | None = None
    ) -> None:
        """Publish to JetStream (acknowledged) when a stream holds the subject."""
        data = encode(value)
        if _in_stream(subject):
            await self.js.publish(subject, data, headers=headers or None)
        else:
            await self.nc.publish(subject, data, headers=headers or None)

    async def js_publish(
        self, subject: str, value: msgspec.Struct, headers: dict[str, str]
    ) -> js_api.PubAck:
        """Publish to JetStream and return its acknowledgement (stream sequence, duplicate)."""
        return await self.js.publish(subject, encode(value), headers=headers)

    async def request(
        self,
        subject: str,
        value: msgspec.Struct,
        reply_kind: type[T],
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> T:
        try:
            msg = await self.nc.request(subject, encode(value), timeout=timeout, headers=headers)
        except NoRespondersError as exc:
            raise RequestFailed(f"no responder on {subject}") from exc
        except (TimeoutError, NatsTimeoutError) as exc:
            raise RequestTimeout(f"no reply on {subject} within {timeout:.1f}s") from exc
        return decode(msg.data, reply_kind)

    async def serve(
        self,
        subject: str,
        kind: type[T],
        handler: Callable[[T, dict[str, str]], Awaitable[msgspec.Struct]],
        queue: str = "",
        sender: Identity | None = None,
    ) -> None:
        """Answer requests on ``subject`` with ``handler``'s reply, each in its own task.

        With ``sender``, only its requests are answered (see :func:`_foreign`).

        At most ``max_inflight`` requests (over every subject this bus serves) run
        at once; at the limit the next message waits in the client (NATS delivers
        a subscription's messages one callback at a time) instead of piling up
        tasks. :meth:`stop_serving` lets the running ones finish.
        """

        async def on_msg(msg: Msg) -> None:
            try:
                if _foreign(msg, subject, sender):
                    return
                value = _decode_or_skip(msg.data, kind, subject)
                if value is None:
                    return
                reply = await handler(value, dict(msg.headers or {}))
                if msg.reply:
                    await msg.respond(encode(reply))
            finally:
                self._slots.release()

        async def spawn(msg: Msg) -> None:
            await self._slots.acquire()
            task = asyncio.get_running_loop().create_task(on_msg(msg))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

        self._served.append(await self.nc.subscribe(subject, queue=queue, cb=spawn))
        await self.nc.flush()  # the server knows it: a request sent from now on finds us

    @property
    def inflight(self) -> int:
        """Requests being handled right now."""
        return len(self._inflight)

    async def stop_serving(self, timeout: float = 10.0) -> None:
        """Take no new requests; wait (up to ``timeout``) for the running ones to answer."""
        served, self._served = self._served, []
        for sub in served:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._inflight:
            _, late = await asyncio.wait(set(self._inflight), timeout=timeout)
            if late:
                log.warning("requests still running at shutdown", extra={"count": len(late)})

    async def subscribe(
        self,
        subject: str,
        kind: type[T],
        handler: Callable[[T, dict[str, str]], Awaitable[None]],
        sender: Identity | None = None,
    ) -> None:
        """Core (non-durable) subscription; malformed messages and, with ``sender``,
        anyone else's are skipped."""

        async def on_msg(msg: Msg) -> None:
            if _foreign(msg, subject, sender):
                return
            value = _decode_or_skip(msg.data, kind, subject)
            if value is None:
                return
            await handler(value, dict(msg.headers or {}))

        await self.nc.subscribe(subject, cb=on_msg)
        await self.nc.flush()  # the server knows it: what is published from now on reaches us

    async def pull(
        self,
        stream: str,
        durable: str,
        subject_filter: str,
        kind: type[T],
        batch: int = 64,
        idle_wait: float = 1.0,
    ) -> AsyncIterator[Delivery[T]]:
        """A durable pull consumer: yields each message; the caller acks it.

        Malformed messages are acked and skipped (redelivering them cannot help).
        """
        sub = await self.js.pull_subscribe(subject_filter, durable=durable, stream=stream)
        try:
            while True:
                try:
                    msgs = await sub.fetch(batch, timeout=idle_wait)
                except NatsTimeoutError:
                    continue
                for msg in msgs:
                    value = _decode_or_skip(msg.data, kind, f"stream:{stream}", msg.subject)
                    if value is None:
                        await msg.ack()
                        continue
                    yield Delivery(msg.subject, value, dict(msg.headers or {}), msg)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


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


def unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the bus could not answer now, and the same call may succeed later.

    A stream without a leader (a server died and the cluster elects another, or
    quorum is lost) answers 503 or nobody answers; a connection that is being
    re-established to another server fails or times out what is sent meanwhile.
    Any other API error (4xx: too large, wrong sequence, no such stream) is the
    request's own fault and fails again the same way.
    """
    if isinstance(exc, ServiceUnavailableError | ServerError):
        return True
    if isinstance(exc, APIError):
        return False
    return isinstance(
        exc,
        TimeoutError  # nats' own TimeoutError is one
        | NoStreamResponseError
        | NoRespondersError
        | ConnectionReconnectingError
        | OutboundBufferLimitError
        | StaleConnectionError
        | UnexpectedEOF,
    )


def server_urls(url: str) -> list[str]:
    """``--nats-url``'s servers: one URL or several, comma-separated (blanks ignored)."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError(f"no NATS server in --nats-url {url!r}")
    return servers


def _limits_differ(have: js_api.StreamConfig, want: js_api.StreamConfig) -> bool:
    return (have.max_age or 0, have.max_bytes, have.max_msg_size, have.discard) != (
        want.max_age or 0,
        want.max_bytes,
        want.max_msg_size,
        want.discard,
    )


def _in_stream(subject: str) -> bool:
    return any(subject.startswith(pattern[:-1]) for pats in STREAMS.values() for pattern in pats)


def _foreign(msg: Msg, subject: str, sender: Identity | None) -> bool:
    """True (logged, counted) when ``msg`` is not ``sender``'s publish on ``subject``.

    Publish permissions say who may publish on a subject, but anyone allowed to
    create a JetStream push consumer can make the server deliver stored messages
    to any subject: those keep their stored subject and carry a ``$JS.ACK``
    reply. A real publish of ``sender`` carries a reply in its inbox (a request,
    or a JetStream publish awaiting its ack), where nobody else may publish.
    """
    reason = ""
    if not subjects.matches(subject, msg.subject):
        reason = f"subject {msg.subject!r}"
    elif sender is not None and not (msg.reply or "").startswith(sender.inbox_prefix + "."):
        reason = f"reply {msg.reply!r} is not in {sender.name}'s inbox"
    if not reason:
        return False
    FOREIGN_MESSAGES.labels(subject=subject).inc()
    log.warning("refusing a foreign message", extra={"subject": subject, "reason": reason})
    return True


def _decode_or_skip(data: bytes, kind: type[T], source: str, where: str = "") -> T | None:
    """The decoded payload, or None after logging and counting why it was malformed."""
    try:
        return decode(data, kind)
    except SchemaError as exc:
        _malformed(source, f"{where}: {exc}" if where else str(exc))
        return None


def _malformed(source: str, reason: str) -> None:
    MALFORMED_MESSAGES.labels(source=source).inc()
    log.warning("skipping malformed message", extra={"source": source, "reason": reason})


async def _log_error(exc: Exception) -> None:
    log.warning("nats error", extra={"error": str(exc)})


async def _stop_when_closed(bus: Bus, name: str) -> None:
    """A client that gave up on its own stops the process. nats-py closes for good on any
    server error while connected (an auth callout late at start-up, an expired token)
    and never reconnects, sometimes without its closed callback (an error that raced
    the initial connect). A process left with that connection would serve nothing while
    looking alive, so it stops as a fatal task's failure stops it (exit 1), and its
    orchestrator starts it again with a fresh connection."""
    # nats-py has no awaitable for its closed state, and its callback is not always run.
    while not bus.nc.is_closed:  # noqa: ASYNC110
        await asyncio.sleep(CLOSED_POLL_S)
    if not bus._closing:
        reason = f"the bus connection {name!r} closed for good"
        log.error(reason, extra={"error": str(bus.nc.last_error or "closed by the client")})
        supervisor.current().fail(reason)


def _log_event(what: str) -> Callable[[], Awaitable[None]]:
    async def cb() -> None:
        log.info(f"nats {what}")

    return cb
