"""Is every claim's trail complete? The checks behind ``gpudra audit --verify``.

A claim's events are numbered 1, 2, 3, ... by the stream
(services/core/bus/claimtrail.py), so a lost event is a missing number. Beyond the
numbers, a trail must make sense as a life:

* it is closed: the claim's ``deleted`` event is there;
* the allocator's own events come in the order it saw them happen:
  ``reserved`` and ``released`` after an ``allocated``;
* every ``prepare.requested`` / ``unprepare.requested`` on a node is answered
  later on that node (``prepared`` or ``prepare.failed``, ``unprepared`` or
  ``unprepare.failed``), each answer closing the oldest open request (a real
  kubelet may ask twice at once: two pods of a shared claim);
* what was prepared on a node was unprepared there later.

The allocator and the preparers watch different things (the API server, the
kubelet), so the order between their events is what the stream stored, never
checked against a rule: ``deleted`` may precede the node's last ``unprepared``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from services.core.model.schemas import ClaimEvent

ANSWERS = {
    "prepare.requested": ("prepared", "prepare.failed"),
    "unprepare.requested": ("unprepared", "unprepare.failed"),
}


@dataclass
class ClaimTrail:
    """One claim's events as replayed, by number."""

    uid: str
    namespace: str
    name: str
    events: dict[int, ClaimEvent] = field(default_factory=dict)
    repeated: list[int] = field(default_factory=list)  # numbers stored twice

    def add(self, event: ClaimEvent) -> None:
        if event.seq in self.events:
            self.repeated.append(event.seq)
        self.events[event.seq] = event

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class Report:
    complete: list[ClaimTrail]
    problems: dict[str, list[str]]  # claim label -> what is wrong

    @property
    def ok(self) -> bool:
        return not self.problems


def collect(events: Iterable[ClaimEvent]) -> dict[str, ClaimTrail]:
    trails: dict[str, ClaimTrail] = {}
    for event in events:
        ref = event.claim
        trail = trails.setdefault(ref.uid, ClaimTrail(ref.uid, ref.namespace, ref.name))
        trail.add(event)
    return trails


def verify(trails: Iterable[ClaimTrail], *, from_start: bool = True) -> Report:
    """Check each trail; with ``from_start`` False (a replay from a time) a trail may
    begin past number 1."""
    complete: list[ClaimTrail] = []
    problems: dict[str, list[str]] = {}
    for trail in trails:
        found = check(trail, from_start=from_start)
        if found:
            problems[trail.label] = found
        else:
            complete.append(trail)
    return Report(complete, problems)


def check(trail: ClaimTrail, *, from_start: bool = True) -> list[str]:
    """What is wrong with one claim's trail (empty: complete)."""
    found = _numbering(trail, from_start)
    ordered = [trail.events[n] for n in sorted(trail.events)]
    names = [e.event for e in ordered]
    if "deleted" not in names:
        found.append(f"not closed: no 'deleted' event (last: {names[-1]!r})")
    found += _allocator_order(names)
    found += _answers(ordered)
    return found


def _numbering(trail: ClaimTrail, from_start: bool) -> list[str]:
    numbers = sorted(trail.events)
    if 0 in numbers:
        return ["events without a number (emitted by a build before per-claim numbering)"]
    first = 1 if from_start else numbers[0]
    missing = sorted(set(range(first, numbers[-1] + 1)) - set(numbers))
    found = [f"events {_ranges(missing)} missing"] if missing else []
    if trail.repeated:
        found.append(f"numbers stored twice: {_ranges(sorted(set(trail.repeated)))}")
    return found


def _allocator_order(names: Sequence[str]) -> list[str]:
    found: list[str] = []
    allocated = False
    for i, name in enumerate(names):
        if name == "allocated":
            allocated = True
        elif name in ("reserved", "released") and not allocated:
            found.append(f"event {i + 1} {name!r} before any 'allocated'")
        if name == "released":
            allocated = False
    return found


def _answers(ordered: list[ClaimEvent]) -> list[str]:
    found: list[str] = []
    # (node, request) -> numbers of the open requests, oldest first: a real kubelet
    # asks for a shared claim once per pod, and may do so for two pods at once.
    asked: dict[tuple[str, str], list[int]] = {}
    prepared: dict[str, int] = {}  # node -> number of a prepare not undone yet
    for event in ordered:
        if event.event in ANSWERS:
            asked.setdefault((event.node, event.event), []).append(event.seq)
            continue
        for request, answers in ANSWERS.items():
            if event.event in answers:
                open_requests = asked.get((event.node, request))
                if not open_requests:
                    found.append(f"event {event.seq} {event.event!r} on {event.node} answers no "
                                 f"{request!r}")  # fmt: skip
                else:
                    open_requests.pop(0)
        if event.event == "prepared":
            prepared.setdefault(event.node, event.seq)
        elif event.event == "unprepared":
            prepared.pop(event.node, None)
    unanswered = [(seq, node, request) for (node, request), seqs in asked.items() for seq in seqs]
    for seq, node, request in sorted(unanswered):
        found.append(f"event {seq} {request!r} on {node} never answered")
    for node, seq in sorted(prepared.items(), key=lambda kv: kv[1]):
        found.append(f"prepared on {node} (event {seq}) and never unprepared")
    return found


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``1-3, 7``."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)
