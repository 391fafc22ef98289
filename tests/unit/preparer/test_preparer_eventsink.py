"""The preparer's claim event sink: every event is sent until the stream stores it, under
one ``Nats-Msg-Id`` however often it is sent. The claim trail (what numbers and stores
events) is replaced by a recorder here; tests/integration/core/test_bus_cluster.py kills the
stream's servers under the real one, tests/integration/core/test_claim_trail.py numbers events
on a real one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import BadRequestError, NoStreamResponseError, ServiceUnavailableError

from services.core.bus.claimtrail import ClaimTrail
from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent, ClaimRef
from services.preparer.eventsink import EventSink


@dataclass
class FlakyStream:
    """Fails the first publishes of each message id with ``failures``, then stores it."""

    failures: dict[str, list[Exception]] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)  # every attempt's message id
    stored: list[str] = field(default_factory=list)

    async def append(
        self, value: ClaimEvent, msg_id: str, headers: dict[str, str] | None = None
    ) -> ClaimEvent:
        self.sent.append(msg_id)
        pending = self.failures.get(value.claim.uid, [])
        if pending:
            raise pending.pop(0)
        if msg_id not in self.stored:  # the stream's duplicate window
            self.stored.append(msg_id)
        return value


def sink_on(stream: FlakyStream) -> EventSink:
    sink = EventSink(cast(Bus, None), linger=0)
    sink.trail = cast(ClaimTrail, stream)
    return sink


def event(uid: str, name: str = "prepared") -> ClaimEvent:
    return ClaimEvent(
        event=name,  # type: ignore[arg-type]
        claim=ClaimRef(uid=uid, namespace="ns", name="c"),
        node="n1",
        actor="preparer",
    )


async def test_events_not_stored_are_sent_again_under_the_same_id() -> None:
    stream = FlakyStream(
        failures={
            "a": [NatsTimeoutError(), NoStreamResponseError()],
            "b": [ServiceUnavailableError(code=503, description="electing")],
        }
    )
    sink = sink_on(stream)
    sink.start()
    for uid in ("a", "b", "c"):
        sink.emit(event(uid))
    await sink.close(timeout=30)

    assert len(stream.stored) == 3 and sink.unsent == 0
    assert [i.split("/")[:2] for i in stream.stored] == [["c", "prepared"], ["b", "prepared"],
                                                        ["a", "prepared"]]  # fmt: skip
    assert sorted(int(i.rsplit("-", 1)[1]) for i in stream.stored) == [1, 2, 3]
    assert stream.sent.count(next(i for i in stream.stored if i.startswith("a/"))) == 3


async def test_an_event_the_stream_refuses_for_good_is_dropped_not_retried() -> None:
    stream = FlakyStream(failures={"big": [BadRequestError(code=400, description="too large")]})
    sink = sink_on(stream)
    sink.start()
    sink.emit(event("big"))
    sink.emit(event("next"))
    await sink.close(timeout=30)
    assert [i.split("/")[0] for i in stream.stored] == ["next"]
    assert len(stream.sent) == 2 and sink.unsent == 0


async def test_ids_differ_between_emissions_and_between_processes() -> None:
    first, second = FlakyStream(), FlakyStream()
    for stream in (first, second):
        sink = sink_on(stream)
        sink.start()
        sink.emit(event("u"))
        sink.emit(event("u"))  # the kubelet prepared it again
        await sink.close(timeout=30)
    assert len(set(first.stored + second.stored)) == 4
