"""Ordered push consumers under the identity's own consumer names.

Every KV watch and key listing reads its bucket's stream through one: each
message of a subject filter once, in stream order. nats-py's ordered consumers
create theirs through the legacy ephemeral API, which no identity may use any more
(:mod:`services.core.bus.slots`); these take one of the identity's names instead,
asking the server to *create* it (a name another process of the same identity holds
is refused, and the next one tried), and delete their consumer when stopped.

A consumer is made again from the next stream sequence whenever a message was
missed (a consumer sequence out of order, a heartbeat that counts more than
arrived) or nothing, not even a heartbeat, came for :data:`LOST_AFTER_S` (a server
restarted and took it along). Messages that another identity's consumer pushed to
our deliver subject are not ours: they are dropped and counted.

When the server refuses a consumer (every name held, the stream's consumer limit,
no answer while permissions or the server say no) the refusal is logged, counted
(``gpudra_bus_consumer_refusals_total``) and asked again with backoff until it
is granted: a watch waits for its consumer, it never fails a service over it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api
from prometheus_client import Counter

from services.core.bus import slots
from services.core.bus.failures import NotProvisioned
from services.core.kit.backoff import Backoff

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
LOST_AFTER_S = 3 * HEARTBEAT_S
REQUEST_S = 5.0
EXISTS = 10148  # JSConsumerAlreadyExistsErr: another process holds the name
NO_STREAM = 10059  # JSStreamNotFoundErr
LIMIT = 10026  # JSMaximumConsumersLimitErr
FLOW_CONTROL = "$JS.FC."
STATUS, DESCRIPTION = api.Header.STATUS.value, api.Header.DESCRIPTION.value
STALLED, LAST_CONSUMER = api.Header.CONSUMER_STALLED.value, api.Header.LAST_CONSUMER.value

REFUSALS = Counter(
    "gpudra_bus_consumer_refusals_total",
    "Consumers the server did not grant (every name of the identity held, the stream's "
    "limit, no answer): each asked again with backoff.",
    ["stream", "reason"],
)
RESETS = Counter(
    "gpudra_bus_consumer_resets_total",
    "Ordered consumers made again from the next message: one was missed, or the consumer lost.",
    ["stream", "reason"],
)
FOREIGN = Counter(
    "gpudra_bus_consumer_foreign_deliveries_total",
    "Messages on a consumer's deliver subject that its consumer did not send (dropped).",
    ["stream"],
)

#: Deletions of our consumers still on their way, awaited before a connection drains.
_DELETING: set[asyncio.Future[None]] = set()


class Refused(Exception):
    """The server did not create a consumer; ``reason`` is a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass
class Names:
    """The identity's consumer names this process does not hold, per stream."""

    identity: str
    held: dict[str, set[str]] = field(default_factory=dict)

    def candidates(self, stream: str) -> list[str]:
        """The free names, in a random order: processes of one identity rarely collide."""
        held = self.held.setdefault(stream, set())
        free = [n for n in slots.consumer_names(self.identity) if n not in held]
        random.shuffle(free)
        return free

    def take(self, stream: str, name: str) -> None:
        self.held.setdefault(stream, set()).add(name)

    def give(self, stream: str, name: str) -> None:
        self.held.setdefault(stream, set()).discard(name)


@dataclass(frozen=True)
class Start:
    """Where a consumer begins: ``policy`` (api.DeliverPolicy), headers only or not."""

    policy: api.DeliverPolicy = api.DeliverPolicy.LAST_PER_SUBJECT
    headers_only: bool = False


class OrderedConsumer:
    """One stream filter's messages, each once, in stream order (see the module)."""

    def __init__(
        self, nc: Client, names: Names, stream: str, subject: str, start: Start = Start()
    ) -> None:
        self.nc, self.names, self.stream, self.subject = nc, names, stream, subject
        self.start = start
        self.name = ""
        self.pending = 0  # messages the server had for us when the consumer was made
        self._sub: Subscription | None = None
        self._sseq = 0  # the stream sequence of the last message taken
        self._dseq = 0  # the consumer sequence of the last message taken
        self._backoff = Backoff(first=0.5)

    async def open(self) -> None:
        """Make the consumer (waiting, with backoff, while the server refuses it).

        Made to the end even when the caller is cancelled meanwhile (nats-py's requests
        can swallow a cancel, CPython gh-86296, and the caller would then wait on a
        consumer nobody asked for); one made for nobody is closed at once."""
        opening = asyncio.ensure_future(self._open())
        try:
            await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(self._orphaned)
            _track(opening)
            raise

    def _orphaned(self, opening: asyncio.Future[None]) -> None:
        if not opening.cancelled() and opening.exception() is None:
            _track(asyncio.ensure_future(self.close()))

    async def _open(self) -> None:
        while True:
            try:
                await self._make()
                self._backoff.reset()
                return
            except Refused as exc:
                delay = self._backoff.next()
                REFUSALS.labels(stream=self.stream, reason=exc.reason).inc()
                log.warning("consumer refused; asking again", extra={
                    "stream": self.stream, "error": str(exc), "retry_s": delay})  # fmt: skip
                await asyncio.sleep(delay)

    async def next(self, timeout: float | None = None) -> Msg | None:
        """The next message (None after ``timeout`` without one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = LOST_AFTER_S
            if deadline is not None:
                wait = min(wait, max(deadline - time.monotonic(), 0.0))
            msg = await self._receive(wait)
            if msg is None:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                await self._reset("nothing arrived, not even a heartbeat")
                continue
            if await self._take(msg):
                return msg

    @property
    def taken(self) -> int:
        """Messages of the current consumer taken so far (its consumer sequence)."""
        return self._dseq

    async def info(self) -> api.ConsumerInfo:
        """The consumer's state as the server has it now."""
        reply = await self.nc.request(
            f"$JS.API.CONSUMER.INFO.{self.stream}.{self.name}", b"", timeout=REQUEST_S
        )
        info: api.ConsumerInfo = api.ConsumerInfo.from_response(json.loads(reply.data))
        return info

    async def close(self) -> None:
        """Stop receiving; the consumer is deleted in the background (see settle)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            finally:
                self._forget()

    # ------------------------------------------------------------ making it

    async def _make(self) -> None:
        failures: list[str] = []
        for name in self.names.candidates(self.stream):
            inbox = self.nc.new_inbox()
            sub = await self.nc.subscribe(inbox)
            self.names.take(self.stream, name)
            try:
                created = await self._create(name, inbox)
            except Refused as exc:
                await sub.unsubscribe()
                self.names.give(self.stream, name)
                if exc.reason != "name held":
                    raise
                failures.append(name)
                continue
            except BaseException:  # cancelled or failed mid-way: it may exist now
                await asyncio.shield(sub.unsubscribe())
                self._delete_later(name)
                raise
            self.name, self._sub = name, sub
            self.pending = created.num_pending or 0
            self._dseq = 0
            return
        raise Refused("every name held", f"{len(failures)} names of this identity in use")

    async def _create(self, name: str, inbox: str) -> api.ConsumerInfo:
        config = api.ConsumerConfig(
            name=name,
            deliver_subject=inbox,
            filter_subject=self.subject,
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=HEARTBEAT_S,
            headers_only=self.start.headers_only or None,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=slots.INACTIVE_S,
            deliver_policy=self.start.policy,
        )
        if self._sseq:  # made again: from the message after the last one taken
            config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = self._sseq + 1
        body = {"stream_name": self.stream, "config": config.as_dict(), "action": "create"}
        try:
            reply = await self.nc.request(
                f"$JS.API.CONSUMER.CREATE.{self.stream}.{name}",
                json.dumps(body).encode(),
                timeout=REQUEST_S,
            )
        except (TimeoutError, NatsTimeoutError) as exc:  # a refused publish is never answered
            raise Refused("no answer", str(exc) or "timed out") from None
        answer = json.loads(reply.data)
        error = answer.get("error")
        if not error:
            info: api.ConsumerInfo = api.ConsumerInfo.from_response(answer)
            return info
        code, text = error.get("err_code", 0), error.get("description", "")
        if code == NO_STREAM:
            raise NotProvisioned(f"stream {self.stream!r} does not exist: {text}")
        reason = {EXISTS: "name held", LIMIT: "stream limit"}.get(code, "refused")
        raise Refused(reason, f"{text} ({code})")

    # ------------------------------------------------------------ receiving

    async def _receive(self, timeout: float) -> Msg | None:
        """The next message, or None after ``timeout``.

        nats-py's next_msg waits in a task of its own under ``wait_for``, which
        returns a message that arrives with a cancel and drops the cancel (CPython
        gh-86296): a watch cancelled just then went on waiting. A cancel requested
        while we waited is raised here whatever next_msg returned."""
        assert self._sub is not None, "open() first"
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        try:
            msg: Msg | None = await self._sub.next_msg(timeout=max(timeout, 0.001))
        except (TimeoutError, NatsTimeoutError):
            msg = None
        if task is not None and task.cancelling() > asked:
            raise asyncio.CancelledError
        return msg

    async def _take(self, msg: Msg) -> bool:
        """True for a data message in order; handles control messages and gaps."""
        headers = msg.headers or {}
        if not msg.data and headers.get(STATUS) == "100":
            await self._control(msg, headers)
            return False
        try:
            meta = msg.metadata
        except Exception:  # no JetStream reply: not from any consumer
            meta = None
        if meta is None or (meta.stream, meta.consumer) != (self.stream, self.name):
            FOREIGN.labels(stream=self.stream).inc()
            return False
        if meta.sequence.consumer != self._dseq + 1:
            await self._reset("a message was missed")
            return False
        self._dseq, self._sseq = meta.sequence.consumer, meta.sequence.stream
        return True

    async def _control(self, msg: Msg, headers: dict[str, str]) -> None:
        """Flow control (answered once everything before it is taken) and heartbeats.
        Answers go only to flow-control subjects: whoever may publish into our inbox
        cannot make us publish elsewhere."""
        if headers.get(DESCRIPTION, "").startswith("Flow"):
            if (msg.reply or "").startswith(FLOW_CONTROL):
                await self.nc.publish(msg.reply)
            return
        if (stalled := headers.get(STALLED, "")).startswith(FLOW_CONTROL):
            await self.nc.publish(stalled)
        last = headers.get(LAST_CONSUMER, "")
        if last.isdigit() and int(last) != self._dseq:
            await self._reset("a heartbeat counted a message that never came")

    async def _reset(self, why: str) -> None:
        RESETS.labels(stream=self.stream, reason=why).inc()
        log.info("consumer made again", extra={"stream": self.stream, "reason": why,
                                               "from_sequence": self._sseq + 1})  # fmt: skip
        await self.close()
        await self.open()

    # ------------------------------------------------------------ letting go

    def _forget(self) -> None:
        name, self.name = self.name, ""
        if name:
            self._delete_later(name)

    def _delete_later(self, name: str) -> None:
        _track(asyncio.get_running_loop().create_task(self._delete(name)))

    async def _delete(self, name: str) -> None:
        """Delete our consumer and free its name; one we cannot delete (the server is away)
        is gone on its own after ``slots.INACTIVE_S``, and its name is free again then."""
        try:
            await self.nc.request(
                f"$JS.API.CONSUMER.DELETE.{self.stream}.{name}", b"", timeout=REQUEST_S
            )
        except Exception:
            await asyncio.sleep(slots.INACTIVE_S)
        self.names.give(self.stream, name)


def _track(task: asyncio.Future[None]) -> None:
    _DELETING.add(task)
    task.add_done_callback(_DELETING.discard)


async def settle(timeout: float = 5.0) -> None:
    """Let this loop's consumer closes and deletions finish (before its connection drains)."""
    loop = asyncio.get_running_loop()
    for _ in range(3):  # an orphaned opening starts a close, a close a deletion
        mine = {t for t in _DELETING if t.get_loop() is loop}
        if not mine:
            return
        _, late = await asyncio.wait(mine, timeout=timeout)
        for task in late:
            task.cancel()
