"""How full each stream and bucket is against its limit, as gauges an operator alerts on.

A bucket refuses a value once it holds its ``max_bytes``, and ``CLAIMS`` refuses new
events once full (:mod:`services.core.bus.retention`): a stream near its limit is an
outage on its way. The server has the figures (``$JS.API.STREAM.INFO.<stream>``, which
every identity may ask of the streams it reads); :func:`watch` asks them every
``interval`` and exports them per stream:

- ``gpudra_bus_stream_bytes`` and ``gpudra_bus_stream_max_bytes`` (the limit; the
  alert divides one by the other),
- ``gpudra_bus_stream_messages``,
- ``gpudra_bus_stream_first_sequence`` and ``gpudra_bus_stream_first_timestamp_seconds``:
  the oldest message the stream still holds (for ``CLAIMS``, how far back the audit
  trail reaches).

Each stream is watched by the process that owns it, once per cluster: the allocator
``CLAIMS`` and the ``claims`` bucket, the publisher the buckets it reads, the
ComputeDomain controller ``domains``. The raw reply is read, not nats-py's
``StreamInfo``, which drops the oldest message's time.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge

from services.core.bus.access import JS_API
from services.core.bus.client import Bus

log = logging.getLogger(__name__)

INTERVAL_S = 30.0
TIMEOUT_S = 5.0

BYTES = Gauge("gpudra_bus_stream_bytes", "Bytes a stream (or bucket) holds.", ["stream"])
MAX_BYTES = Gauge(
    "gpudra_bus_stream_max_bytes",
    "A stream's (or bucket's) size limit in bytes; -1: none. Buckets and CLAIMS refuse "
    "writes at it, HEALTH and INVENTORY drop their oldest messages.",
    ["stream"],
)
MESSAGES = Gauge("gpudra_bus_stream_messages", "Messages a stream (or bucket) holds.", ["stream"])
FIRST_SEQUENCE = Gauge(
    "gpudra_bus_stream_first_sequence",
    "Sequence number of the oldest message a stream holds (above 1: older ones are gone).",
    ["stream"],
)
FIRST_TIMESTAMP = Gauge(
    "gpudra_bus_stream_first_timestamp_seconds",
    "When the oldest message a stream holds was stored (Unix time); absent while it is empty.",
    ["stream"],
)


def bucket(name: str) -> str:
    """The stream that holds bucket ``name``."""
    return f"KV_{name}"


@dataclass(frozen=True)
class StreamUsage:
    """One stream's state and size limit as the server reports them."""

    stream: str
    messages: int
    bytes: int
    max_bytes: int  # -1: no limit
    first_seq: int
    last_seq: int
    first_time: float | None  # None while empty

    @property
    def dropped(self) -> int:
        """How many of the stream's first messages it no longer holds."""
        return self.first_seq - 1 if self.messages else self.last_seq


def parse(stream: str, reply: dict[str, Any]) -> StreamUsage:
    """A ``STREAM.INFO`` reply (its JSON); ValueError for an error reply."""
    if "error" in reply:
        error = reply["error"]
        raise ValueError(f"stream info of {stream}: {error.get('description', error)}")
    state, config = reply.get("state") or {}, reply.get("config") or {}
    messages = int(state.get("messages") or 0)
    return StreamUsage(
        stream=stream,
        messages=messages,
        bytes=int(state.get("bytes") or 0),
        max_bytes=int(config.get("max_bytes") or -1),
        first_seq=int(state.get("first_seq") or 0),
        last_seq=int(state.get("last_seq") or 0),
        first_time=_timestamp(state.get("first_ts")) if messages else None,
    )


def _timestamp(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def read(bus: Bus, stream: str, timeout: float = TIMEOUT_S) -> StreamUsage:
    msg = await bus.nc.request(f"{JS_API}.STREAM.INFO.{stream}", b"", timeout=timeout)
    return parse(stream, json.loads(msg.data))


def record(usage: StreamUsage) -> None:
    """Set the stream's gauges."""
    stream = usage.stream
    BYTES.labels(stream).set(usage.bytes)
    MAX_BYTES.labels(stream).set(usage.max_bytes)
    MESSAGES.labels(stream).set(usage.messages)
    FIRST_SEQUENCE.labels(stream).set(usage.first_seq)
    if usage.first_time is not None:
        FIRST_TIMESTAMP.labels(stream).set(usage.first_time)
    else:
        try:
            FIRST_TIMESTAMP.remove(stream)
        except KeyError:
            pass


async def watch(
    bus: Bus,
    streams: Sequence[str],
    interval: float = INTERVAL_S,
    then: Callable[[StreamUsage], None] | None = None,
    timeout: float = TIMEOUT_S,
) -> None:
    """Read and record each stream's usage every ``interval`` s, handing each reading to
    ``then``; a stream the bus does not answer for keeps its last figures (logged)."""
    while True:
        for stream in streams:
            try:
                usage = await read(bus, stream, timeout)
            except Exception as exc:  # the bus is away, or the stream is not provisioned
                log.warning(
                    "cannot read a stream's usage", extra={"stream": stream, "error": str(exc)}
                )
                continue
            record(usage)
            if then is not None:
                then(usage)
        await asyncio.sleep(interval)
