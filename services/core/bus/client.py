"""The one NATS JetStream client every service uses.

It knows every stream and bucket (:mod:`.provisioning`), creates them idempotently,
and speaks msgspec Structs so no service handles raw bytes. A payload that fails to
decode, or that its sender could not have sent, is logged with the reason, counted
and skipped (:mod:`.intake`): one bad message never stops a consumer. The connection
under it is :mod:`.connection`; what its calls fail with, :mod:`.failures`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from services.core.bus import (
    connection,
    kvwatch,
    ordered,
    payloads,
    provisioning,
    retention,
    tokenrenew,
)
from services.core.bus.access import Identity, Role
from services.core.bus.failures import NotProvisioned, RequestFailed, RequestTimeout
from services.core.bus.intake import decode_or_skip, foreign
from services.core.bus.natsauth import Credentials
from services.core.kit import supervisor
from services.core.kit.env import env
from services.core.model.schemas import decode, encode

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_MAX_INFLIGHT = 64


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


def _update(bucket: str, kind: type[T], entry: kvwatch.Entry) -> KvUpdate[T] | None:
    """A KV entry as an update of ``kind`` (a removal: value None); None if malformed
    (logged and counted by decode_or_skip)."""
    if not entry.value:
        return KvUpdate(entry.key, None, entry.revision)
    value = decode_or_skip(entry.value, kind, f"kv:{bucket}", f"key {entry.key!r}")
    return None if value is None else KvUpdate(entry.key, value, entry.revision)


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
        self.consumer_names = ordered.Names(self.identity.name)  # see services.core.bus.slots

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
        nc = await connection.connect(
            url, name=name, identity=identity, credentials=creds, token=token
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
        await ordered.settle()  # our consumers deleted: their names free at once
        with contextlib.suppress(Exception):
            await self.nc.drain()
        await supervisor.cancel_and_wait(list(self._background))

    async def provision(self) -> None:
        """Create every stream and bucket we use, and keep their limits as configured."""
        await provisioning.provision_streams(self.js, self.replicas)
        for bucket, history in provisioning.BUCKETS.items():
            await self.kv(bucket, history=history)
            await provisioning.close_bucket(self.js, bucket)

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
                self._kv[bucket] = await provisioning.create_bucket(
                    self.js, bucket, history, self.replicas
                )
        return self._kv[bucket]

    # ------------------------------------------------------------ KV

    async def kv_put(self, bucket: str, key: str, value: msgspec.Struct) -> int:
        data = encode(value)
        payloads.check(self.identity.role, f"$KV.{bucket}.{key}", data)
        return int(await (await self.kv(bucket)).put(key, data))

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
        """Remove the key: a delete marker, which replaces its value (every bucket keeps
        one revision a key) and expires on its own (see retention). Not a purge: its
        rollup header is refused (:func:`provisioning.close_bucket`)."""
        await self.kv(bucket)
        await self.js.publish(
            f"$KV.{bucket}.{key}",
            b"",
            headers={kvwatch.KV_OPERATION: "DEL"},
            msg_ttl=self.delete_marker_ttl,
        )

    async def kv_keys(self, bucket: str) -> list[str]:
        await self.kv(bucket)  # provisioned, or NotProvisioned
        return await kvwatch.read_keys(self.nc, self.consumer_names, bucket)

    async def kv_read(self, bucket: str, keys: str = ">") -> list[kvwatch.Entry]:
        """Every key of ``keys`` holding a value, with its raw value, read at once: a
        restart's load of thousands of keys, not a request per key."""
        await self.kv(bucket)  # provisioned, or NotProvisioned
        return await kvwatch.read_values(self.nc, self.consumer_names, bucket, keys)

    async def kv_values(self, bucket: str, kind: type[T], keys: str = ">") -> list[KvUpdate[T]]:
        """:meth:`kv_read`, decoded as :meth:`watch_kv` decodes: malformed values skipped."""
        found = (_update(bucket, kind, entry) for entry in await self.kv_read(bucket, keys))
        return [update for update in found if update is not None]

    async def watch_kv(
        self, bucket: str, kind: type[T], keys: str = ">", current: asyncio.Event | None = None
    ) -> AsyncGenerator[KvUpdate[T], None]:
        """Current values first, then every change; malformed values are skipped.
        ``current``: set once the current values are all taken (kvwatch.watch)."""
        async with contextlib.aclosing(self.kv_entries(bucket, keys, current)) as entries:
            async for entry in entries:
                update = _update(bucket, kind, entry)
                if update is not None:
                    yield update

    async def kv_entries(
        self, bucket: str, keys: str = ">", current: asyncio.Event | None = None
    ) -> AsyncGenerator[kvwatch.Entry, None]:
        """The raw current values of ``keys``, then every change (a value None: removed)."""
        await self.kv(bucket)  # provisioned, or NotProvisioned
        async with contextlib.aclosing(
            kvwatch.watch(self.nc, self.consumer_names, bucket, keys, current)
        ) as entries:
            async for entry in entries:
                yield entry

    # ------------------------------------------------------------ messages

    async def publish(
        self, subject: str, value: msgspec.Struct, headers: dict[str, str] | None = None
    ) -> None:
        """Publish to JetStream (acknowledged) when a stream holds the subject."""
        data = encode(value)
        payloads.check(self.identity.role, subject, data, headers)
        if provisioning.in_stream(subject):
            await self.js.publish(subject, data, headers=headers or None)
        else:
            await self.nc.publish(subject, data, headers=headers or None)

    async def js_publish(
        self, subject: str, value: msgspec.Struct, headers: dict[str, str]
    ) -> js_api.PubAck:
        """Publish to JetStream and return its acknowledgement (stream sequence, duplicate)."""
        data = encode(value)
        payloads.check(self.identity.role, subject, data, headers)
        return await self.js.publish(subject, data, headers=headers)

    async def request(
        self,
        subject: str,
        value: msgspec.Struct,
        reply_kind: type[T],
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> T:
        data = encode(value)
        payloads.check(self.identity.role, subject, data, headers)
        try:
            msg = await self.nc.request(subject, data, timeout=timeout, headers=headers)
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

        With ``sender``, only its requests are answered (see :func:`intake.foreign`).

        At most ``max_inflight`` requests (over every subject this bus serves) run
        at once; at the limit the next message waits in the client (NATS delivers
        a subscription's messages one callback at a time) instead of piling up
        tasks. :meth:`stop_serving` lets the running ones finish.
        """

        async def on_msg(msg: Msg) -> None:
            try:
                if foreign(msg, subject, sender):
                    return
                value = decode_or_skip(msg.data, kind, subject)
                if value is None:
                    return
                reply = await handler(value, dict(msg.headers or {}))
                if msg.reply:
                    await self._respond(msg, encode(reply))
            finally:
                self._slots.release()

        async def spawn(msg: Msg) -> None:
            await self._slots.acquire()
            task = asyncio.get_running_loop().create_task(on_msg(msg))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

        self._served.append(await self.nc.subscribe(subject, queue=queue, cb=spawn))
        await self.nc.flush()  # the server knows it: a request sent from now on finds us

    async def _respond(self, msg: Msg, data: bytes) -> None:
        """Answer ``msg``; an answer too large for this identity is not sent (logged and
        counted): the requester times out, as for any answer that never came."""
        try:
            payloads.check(self.identity.role, msg.reply, data)
        except payloads.PayloadTooLarge:
            return
        await msg.respond(data)

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
            if foreign(msg, subject, sender):
                return
            value = decode_or_skip(msg.data, kind, subject)
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
                    value = decode_or_skip(msg.data, kind, f"stream:{stream}", msg.subject)
                    if value is None:
                        await msg.ack()
                        continue
                    yield Delivery(msg.subject, value, dict(msg.headers or {}), msg)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


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
