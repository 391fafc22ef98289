"""``gpudra audit --verify``: read the trail, judge it, say what is wrong (exit 1 if anything).

The verdicts are services/audit/verify.py's, on events placed by their
subjects (services/audit/provenance.py); the stream's window and the live
claims come from services/audit/window.py. Output: one summary line first
(tools read it), then what the auditor must know about the window (``WINDOW``,
``FULL``), which nodes spoke of claims not theirs (``FOREIGN``), and each
incomplete claim with its problems.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from dataclasses import dataclass, field

from services.audit import window
from services.audit.provenance import Placed, Unplaceable, place
from services.audit.replay import Filters, Stored, Unreadable, replay
from services.audit.verify import Context, Report, collect, verify
from services.core.bus.client import Bus


@dataclass
class _Read:
    placed: list[Placed] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    def take(self, item: Stored | Unreadable) -> None:
        if not isinstance(item, Stored):
            self.unreadable.append(f"stream seq {item.stream_seq}: {item.error}")
            return
        try:
            self.placed.append(place(item))
        except Unplaceable as exc:
            self.unreadable.append(f"stream seq {item.stream_seq}: {exc}")

    def complete(self, from_start: bool) -> bool:
        return verify(collect(self.placed).values(), Context(from_start=from_start)).ok


async def run(
    bus: Bus,
    filters: Filters,
    *,
    since: datetime.datetime | None,
    durable: str | None,
    wait: float,
) -> int:
    """Read the trail (and, with ``wait``, what arrives) until every claim is complete;
    print the verdict; 0 only if every trail is complete and the stream takes events."""
    from_start = since is None
    # The live claims first: the allocator writes a claim's key before its events, so
    # a claim allocated while the stream is read has its events read too, or none.
    live = await window.live_claims(bus) if from_start else {}
    read = await _read(bus, filters, since=since, durable=durable, wait=wait)
    state = await window.read_window(bus)
    begins = state.first_seq if state.dropped else 1
    report = verify(collect(read.placed).values(), Context(from_start, live, begins))
    untraced = await _untraced(bus, report, filters)
    print(f"{len(read.placed)} events, {len(report.complete)} claims complete, "
          f"{len(report.problems) + len(untraced)} incomplete, "
          f"{len(read.unreadable)} unreadable")  # fmt: skip
    first = min(read.placed, key=lambda p: p.stream_seq, default=None)
    for line in window.lines(state, first.payload.timestamp if first else None, from_start):
        print(line)
    _print_verdicts(report, untraced, read.unreadable)
    clean = not report.problems and not untraced and not read.unreadable
    return 0 if clean and not state.full else 1


async def _read(
    bus: Bus, filters: Filters, *, since: datetime.datetime | None, durable: str | None, wait: float
) -> _Read:
    read = _Read()
    source = replay(bus, filters, since=since, durable=durable, follow=wait > 0)

    async def reading() -> None:
        async for item in source:
            read.take(item)
            # Done once every trail is complete, but never before the stream's end as it
            # was: the first claims' trails may be complete before the last ones are read.
            if wait > 0 and not item.pending and read.complete(since is None):
                return

    # Closed here, while the bus is open: reading() may return with the replay suspended
    # mid-stream, and a replay left to the garbage collector unsubscribed its consumer
    # during the bus's drain (ConnectionDrainingError, printed at exit).
    async with contextlib.aclosing(source):
        try:
            await asyncio.wait_for(reading(), timeout=wait if wait > 0 else None)
        except TimeoutError:
            pass  # what arrived in time is judged
    return read


async def _untraced(bus: Bus, report: Report, filters: Filters) -> dict[str, str]:
    """Live claims none of whose events the window holds (label -> node), as filtered."""
    found: dict[str, str] = {}
    for uid, node in report.untraced:
        label = await window.label(bus, uid, node, filters)
        if label is not None:
            found[label] = node
    return found


def _print_verdicts(report: Report, untraced: dict[str, str], unreadable: list[str]) -> None:
    for node, count in sorted(report.foreign.items()):
        print(f"FOREIGN: {node}'s preparer stored {count} events about claims not allocated "
              f"to {node}")  # fmt: skip
    for claim, problems in sorted(report.problems.items()):
        print(f"INCOMPLETE {claim}:")
        for problem in problems:
            print(f"  - {problem}")
    for claim, node in sorted(untraced.items()):
        print(f"INCOMPLETE {claim}:")
        print(f"  - allocated to {node} (claims bucket), but none of its events is in the "
              "stream: its trail began before the stream's window")  # fmt: skip
    for problem in unreadable:
        print(f"UNREADABLE {problem}")
