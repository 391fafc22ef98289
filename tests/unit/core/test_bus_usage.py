"""A stream's usage as the server's ``STREAM.INFO`` reply says it, and the gauges it sets
(``gpudra_bus_stream_*``, which the chart's bus alerts divide). The reply is read raw:
nats-py's StreamInfo drops the oldest message's time. tests/integration/core/test_bus_usage.py
reads real replies with each owner's identity."""

from __future__ import annotations

import datetime

import pytest
from prometheus_client import REGISTRY

from services.core.bus import usage

# What nats-server 2.x answers for a stream that has dropped its first 41 messages.
REPLY = {
    "type": "io.nats.jetstream.api.v1.stream_info_response",
    "config": {"name": "CLAIMS", "max_bytes": 1073741824, "max_age": 2592000000000000},
    "state": {
        "messages": 9,
        "bytes": 4096,
        "first_seq": 42,
        "first_ts": "2026-01-02T03:04:05.123456789Z",
        "last_seq": 50,
        "last_ts": "2026-01-02T04:00:00Z",
        "consumer_count": 0,
    },
}
FIRST = datetime.datetime(2026, 1, 2, 3, 4, 5, 123456, datetime.UTC).timestamp()


def sample(name: str, stream: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"stream": stream})


def test_a_reply_gives_fill_limit_and_the_oldest_message_kept() -> None:
    got = usage.parse("CLAIMS", REPLY)
    assert (got.messages, got.bytes, got.max_bytes) == (9, 4096, 1 << 30)
    assert (got.first_seq, got.last_seq, got.dropped) == (42, 50, 41)
    assert got.first_time == pytest.approx(FIRST)


def test_an_empty_stream_has_no_oldest_message_and_may_have_dropped_all() -> None:
    empty = {"config": {"max_bytes": -1}, "state": {"messages": 0, "bytes": 0, "first_seq": 8,
             "first_ts": "0001-01-01T00:00:00Z", "last_seq": 7}}  # fmt: skip
    got = usage.parse("KV_x", empty)
    assert (got.first_time, got.dropped, got.max_bytes) == (None, 7, -1)
    never = usage.parse("KV_y", {"config": {}, "state": {"messages": 0, "first_seq": 0}})
    assert (never.dropped, never.max_bytes) == (0, -1)


def test_an_error_reply_is_an_error() -> None:
    with pytest.raises(ValueError, match="stream not found"):
        usage.parse("NOPE", {"error": {"code": 404, "description": "stream not found"}})


def test_recorded_gauges_and_the_first_time_goes_with_the_last_message() -> None:
    usage.record(usage.parse("TEST_USAGE", REPLY))
    assert sample("gpudra_bus_stream_bytes", "TEST_USAGE") == 4096
    assert sample("gpudra_bus_stream_max_bytes", "TEST_USAGE") == 1 << 30
    assert sample("gpudra_bus_stream_messages", "TEST_USAGE") == 9
    assert sample("gpudra_bus_stream_first_sequence", "TEST_USAGE") == 42
    assert sample("gpudra_bus_stream_first_timestamp_seconds", "TEST_USAGE") == pytest.approx(FIRST)
    emptied = {"config": {"max_bytes": 1 << 30}, "state": {"messages": 0, "first_seq": 51,
               "last_seq": 50}}  # fmt: skip
    usage.record(usage.parse("TEST_USAGE", emptied))
    assert sample("gpudra_bus_stream_first_timestamp_seconds", "TEST_USAGE") is None
    assert sample("gpudra_bus_stream_messages", "TEST_USAGE") == 0
