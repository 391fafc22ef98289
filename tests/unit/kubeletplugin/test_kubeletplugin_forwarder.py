"""How the front turns one kubelet call into one preparer request, and every failure into
per-claim errors. The bus is replaced by a recorder here; tests/integration drives the
real one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from services.core.bus.client import Bus
from services.core.bus.failures import RequestFailed, RequestTimeout
from services.core.model.schemas import (
    ClaimRef,
    ClaimResult,
    NodeReply,
    PreparedDevice,
    SchemaError,
)
from services.core.telemetry import tracing
from services.kubeletplugin.forwarder import Forwarder, Timing, screen_claims
from tests.helpers.tracing import attr, named, recording

SEND = "send dra.node.{node}.prepare"
KUBELET_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
DEVICE = PreparedDevice(
    request_names=["gpu"],
    pool_name="node-a",
    device_name="gpu-0",
    cdi_device_ids=["k8s.gpu.nvidia.com/claim=u1-gpu-0"],
)


def ref(uid: str, namespace: str = "ns", name: str = "c") -> ClaimRef:
    return ClaimRef(uid=uid, namespace=namespace, name=name)


@dataclass
class RecordingBus:
    """Answers like the preparer would, or raises what the real bus raises."""

    reply: NodeReply | None = None
    error: Exception | None = None
    first_errors: list[Exception] = field(default_factory=list)  # raised by the first calls
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def request(self, subject, value, reply_kind, timeout, headers=None):
        self.calls.append(
            {"subject": subject, "value": value, "timeout": timeout, "headers": headers}
        )
        if self.first_errors:
            raise self.first_errors.pop(0)
        if self.error is not None:
            raise self.error
        return self.reply or NodeReply(claims={c.uid: ClaimResult() for c in value.claims})


def forwarder(bus: RecordingBus, node: str = "node-a", no_preparer: float = 0.2) -> Forwarder:
    return Forwarder(
        cast(Bus, bus), node, Timing(default=45.0, margin=0.5, no_preparer=no_preparer)
    )


def test_duplicates_are_sent_once_and_conflicts_refused() -> None:
    results, send = screen_claims(
        [ref("u1"), ref("u1"), ref("u2", name="a"), ref("u2", name="b"), ref("u3")]
    )
    assert [c.uid for c in send] == ["u1", "u3"]
    assert set(results) == {"u2"}
    assert "u2 is listed for both ns/a and ns/b" in results["u2"].error


@pytest.mark.parametrize(
    ("claim", "missing"),
    [(ref(""), "uid"), (ref("u", namespace=""), "namespace"), (ref("u", name=""), "name")],
)
def test_claims_with_empty_identity_get_an_error(claim: ClaimRef, missing: str) -> None:
    results, send = screen_claims([claim])
    assert send == []
    assert f"empty {missing}" in results[claim.uid].error


@pytest.mark.parametrize(
    ("remaining", "budget"),
    [(None, 45.0), (100.0, 45.0), (45.0, 44.5), (2.0, 1.8), (0.1, 0.09), (0.0, 0.0)],
)
def test_budget_leaves_a_margin_before_the_kubelet_deadline(
    remaining: float | None, budget: float
) -> None:
    assert Timing(default=45.0, margin=0.5).budget(remaining) == pytest.approx(budget)


async def test_request_carries_node_claims_and_deadline() -> None:
    bus = RecordingBus()
    results = await forwarder(bus, node="rack.1 gpu").prepare([ref("u1"), ref("u2")], 10.0)
    assert results == {"u1": ClaimResult(), "u2": ClaimResult()}
    [call] = bus.calls
    assert call["subject"] == "dra.node.rack=2E1=20gpu.prepare"  # escaped, one token
    assert call["timeout"] == pytest.approx(9.5)
    assert call["value"].node == "rack.1 gpu"
    assert call["value"].deadline == pytest.approx(time.time() + 9.5, abs=0.5)


async def test_unprepare_uses_its_own_subject() -> None:
    bus = RecordingBus()
    await forwarder(bus).unprepare([ref("u1")], None)
    assert bus.calls[0]["subject"] == "dra.node.node-a.unprepare"
    assert bus.calls[0]["timeout"] == 45.0


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RequestTimeout("late"), "the preparer of node 'node-a' did not answer within 9.5s"),
        (RequestFailed("none"), "no preparer is serving node 'node-a'"),
        (SchemaError("invalid NodeReply: bad"), "reply could not be decoded: invalid NodeReply"),
        (ConnectionError("nats gone"), "ConnectionError: nats gone"),
    ],
)
async def test_every_failure_becomes_an_error_on_each_claim(error: Exception, reason: str) -> None:
    bus = RecordingBus(error=error)
    results = await forwarder(bus).prepare([ref("u1"), ref("u2")], 10.0)
    assert set(results) == {"u1", "u2"}
    for result in results.values():
        assert result.devices == []
        assert result.error.startswith("prepare failed: ")
        assert reason in result.error


async def test_a_preparer_that_subscribes_again_soon_gets_the_request() -> None:
    # Its NATS server died; it is reconnecting to another: nobody listens for a moment.
    bus = RecordingBus(first_errors=[RequestFailed("none"), RequestFailed("none")])
    results = await forwarder(bus, no_preparer=3.0).prepare([ref("u1")], 10.0)
    assert results == {"u1": ClaimResult()}
    assert len(bus.calls) == 3
    assert bus.calls[2]["timeout"] < bus.calls[0]["timeout"] <= 9.5  # within one budget


async def test_nobody_listening_is_an_error_after_the_wait() -> None:
    bus = RecordingBus(error=RequestFailed("none"))
    started = time.monotonic()
    results = await forwarder(bus, no_preparer=0.3).prepare([ref("u1")], 10.0)
    assert 0.1 < time.monotonic() - started < 0.3
    assert "no preparer is serving node 'node-a'" in results["u1"].error
    assert len(bus.calls) >= 2


async def test_a_late_preparer_is_not_asked_again() -> None:
    bus = RecordingBus(error=RequestTimeout("late"))
    await forwarder(bus, no_preparer=3.0).prepare([ref("u1")], 10.0)
    assert len(bus.calls) == 1  # it may still be working on the first


async def test_a_claim_missing_from_the_reply_gets_an_error() -> None:
    bus = RecordingBus(reply=NodeReply(claims={"u1": ClaimResult(), "stray": ClaimResult()}))
    results = await forwarder(bus).prepare([ref("u1"), ref("u2")], 10.0)
    assert set(results) == {"u1", "u2"}  # nothing the kubelet did not ask about
    assert results["u1"] == ClaimResult()
    assert results["u2"].error == "the preparer returned no result for claim u2"


async def test_no_time_left_means_no_request() -> None:
    bus = RecordingBus()
    results = await forwarder(bus).prepare([ref("u1")], 0.0)
    assert bus.calls == []
    assert "deadline leaves no time" in results["u1"].error


async def test_nothing_valid_to_send_means_no_request() -> None:
    bus = RecordingBus()
    assert await forwarder(bus).prepare([], 10.0) == {}
    results = await forwarder(bus).prepare([ref("")], 10.0)
    assert bus.calls == [] and "empty uid" in results[""].error


async def test_one_span_per_claim_in_its_trace_with_the_kubelet_linked() -> None:
    """A kubelet call with two claims: each claim gets its own CLIENT span of the NATS
    request in its own trace, whose context goes to the preparer under the claim's UID;
    the kubelet's context is a link, not a parent."""
    tracer, exporter = recording()
    bus = RecordingBus(reply=NodeReply(claims={"u1": ClaimResult(devices=[DEVICE])}))
    fwd = Forwarder(cast(Bus, bus), "node-a", tracer=tracer)
    kubelet = tracing.extract({"traceparent": KUBELET_TRACEPARENT})
    await fwd.prepare([ref("u1", name="one"), ref("u2", name="two")], 10.0, kubelet)

    spans = exporter.get_finished_spans()
    assert len(spans) == 2  # one per claim, nothing else
    sends = {attr(s, tracing.ATTR_UID): s for s in named(spans, SEND)}
    assert set(sends) == {"u1", "u2"}
    sent = bus.calls[0]["value"].traceparents
    for uid, name in (("u1", "one"), ("u2", "two")):
        span = sends[uid]
        assert span.kind == SpanKind.CLIENT and span.parent is None  # a root: no dead link
        assert span.context.trace_id == tracing.claim_trace_id(uid)
        assert attr(span, tracing.ATTR_NAME) == name and attr(span, tracing.ATTR_NODE) == "node-a"
        assert attr(span, "messaging.system") == "nats"
        assert attr(span, "messaging.destination.name") == "dra.node.node-a.prepare"
        assert attr(span, "rpc.method") == "NodePrepareResources"
        [link] = span.links
        assert f"{link.context.trace_id:032x}" == KUBELET_TRACEPARENT.split("-")[1]
        _, trace_id, span_id, _ = sent[uid].split("-")
        assert (int(trace_id, 16), int(span_id, 16)) == (
            span.context.trace_id,
            span.context.span_id,
        )
    ok, failed = sends["u1"], sends["u2"]
    assert attr(ok, tracing.ATTR_OUTCOME) == "ok"
    assert attr(ok, tracing.ATTR_DEVICES) == ("gpu-0",)
    assert attr(ok, tracing.ATTR_CDI_IDS) == ("k8s.gpu.nvidia.com/claim=u1-gpu-0",)
    assert attr(failed, tracing.ATTR_OUTCOME) == "error"  # the reply had no result for it
    assert failed.status.status_code == StatusCode.ERROR
    assert bus.calls[0]["headers"] is None  # contexts travel per claim, in the request


async def test_a_claim_without_kubelet_context_has_no_link_and_spans_stay_off_without_sdk() -> None:
    tracer, exporter = recording()
    bus = RecordingBus()
    await Forwarder(cast(Bus, bus), "node-a", tracer=tracer).unprepare([ref("u1")], 10.0)
    [call] = named(exporter.get_finished_spans(), "send dra.node.{node}.unprepare")
    assert call.links == () or list(call.links) == []
    assert attr(call, tracing.ATTR_OUTCOME) == "ok"
    plain = RecordingBus()  # the global no-op tracer: nothing recorded, nothing sent
    await forwarder(plain).unprepare([ref("u1")], 10.0)
    assert plain.calls[0]["value"].traceparents == {}
