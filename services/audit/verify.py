"""Is every claim's trail complete, and its own? The checks behind ``gpudra audit --verify``.

Each event is judged as its subject places it (services/audit/provenance.py):
claim, node and event are the subject's, which only the allocator (its own
events, any node) or that node's preparer may publish; a payload that says
otherwise is reported. A claim's trail is then

* its own: a preparer's events count only on a node the allocator's
  ``allocated`` events (or the ``claims`` bucket, for a live claim) name;
  another node's events about the claim are reported, and judged no further;
* numbered: its events on each node (and those about no node) are numbered
  1, 2, 3, ... by the stream (services/core/bus/claimtrail.py), so a lost event
  is a missing number; numbers older than the stream's window are said to be
  gone, not lost;
* closed: the claim's ``deleted`` event is there;
* in order: the allocator's ``reserved`` and ``released`` after an ``allocated``;
* answered: every ``prepare.requested`` / ``unprepare.requested`` on a node is
  answered later on that node (``prepared`` or ``prepare.failed``,
  ``unprepared`` or ``unprepare.failed``), each answer closing the oldest open
  request (a real kubelet may ask twice at once: two pods of a shared claim);
  what was prepared on a node was unprepared there later.

The allocator and the preparers watch different things (the API server, the
kubelet), so the order between their events is the stream's, never checked
against a rule: ``deleted`` may precede the node's last ``unprepared``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from services.audit.provenance import Placed

ANSWERS = {
    "prepare.requested": ("prepared", "prepare.failed"),
    "unprepare.requested": ("unprepared", "unprepare.failed"),
}


@dataclass
class ClaimTrail:
    """One claim's events as replayed, in the order the stream stored them."""

    uid: str
    namespace: str
    name: str
    events: list[Placed] = field(default_factory=list)

    def add(self, event: Placed) -> None:
        self.events.append(event)

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class Context:
    """What the judge knows beyond the trails.

    ``from_start``: the replay began at the stream's start (not ``--since``), so a
    trail must begin at number 1. ``live``: uid -> node of every claim the ``claims``
    bucket (written by the allocator alone) holds now. ``window_begins``: the stream's
    first sequence when it no longer holds its first events (1: it holds them all).
    """

    from_start: bool = True
    live: Mapping[str, str] = field(default_factory=dict)
    window_begins: int = 1


@dataclass(frozen=True)
class Report:
    complete: list[ClaimTrail]
    problems: dict[str, list[str]]  # claim label -> what is wrong
    foreign: Counter[str] = field(default_factory=Counter)  # node -> events about others' claims
    untraced: list[tuple[str, str]] = field(default_factory=list)  # live (uid, node), no event

    @property
    def ok(self) -> bool:
        return not self.problems and not self.untraced


def collect(events: Iterable[Placed]) -> dict[tuple[str, str, str], ClaimTrail]:
    """Trails by the claim their subjects name (namespace, name and uid)."""
    trails: dict[tuple[str, str, str], ClaimTrail] = {}
    for event in events:
        key = (event.namespace, event.name, event.uid)
        trails.setdefault(key, ClaimTrail(event.uid, event.namespace, event.name)).add(event)
    return trails


def verify(trails: Iterable[ClaimTrail], context: Context | None = None) -> Report:
    """Check each trail, and that every live claim's trail reaches back into the window."""
    context = context or Context()
    complete: list[ClaimTrail] = []
    problems: dict[str, list[str]] = {}
    foreign: Counter[str] = Counter()
    traced: set[str] = set()
    for trail in trails:
        found, others = _judge(trail, context)
        traced.add(trail.uid)
        foreign.update({node: len(events) for node, events in others.items()})
        if found:
            problems[trail.label] = found
        else:
            complete.append(trail)
    untraced = []
    if context.from_start and context.window_begins > 1:  # else it may be still on its way
        untraced = sorted((u, n) for u, n in context.live.items() if u not in traced)
    return Report(complete, problems, foreign, untraced)


def check(trail: ClaimTrail, context: Context | None = None) -> list[str]:
    """What is wrong with one claim's trail (empty: complete)."""
    return _judge(trail, context or Context())[0]


def _judge(trail: ClaimTrail, context: Context) -> tuple[list[str], dict[str, list[Placed]]]:
    found = [
        f"event {e.seq} {e.event!r} {e.where}: its payload says {', '.join(e.disagrees)}"
        for e in trail.events
        if e.disagrees
    ]
    own, others = _split(trail, context)
    found += _foreign(trail, context, others)
    if own:
        found += _numbering(own, context)
        found += _begun_before_window(trail.uid, own, context)
        names = [e.event for e in own]
        if "deleted" not in names:
            found.append(f"not closed: no 'deleted' event (last: {names[-1]!r})")
        found += _allocator_order(own)
        found += _answers(own)
    return found, others


def _allowed_nodes(trail: ClaimTrail, context: Context) -> set[str] | None:
    """Nodes whose preparer may speak of this claim (None: not known from what was read)."""
    nodes = {e.node for e in trail.events if e.event == "allocated"}
    if trail.uid in context.live:
        nodes.add(context.live[trail.uid])
    return nodes if nodes or context.from_start else None


def _split(trail: ClaimTrail, context: Context) -> tuple[list[Placed], dict[str, list[Placed]]]:
    """The events of the claim's own emitters, and the other nodes' by node."""
    allowed = _allowed_nodes(trail, context)
    own: list[Placed] = []
    others: dict[str, list[Placed]] = {}
    for event in trail.events:
        if event.by_allocator or allowed is None or event.node in allowed:
            own.append(event)
        else:
            others.setdefault(event.node, []).append(event)
    return own, others


def _foreign(trail: ClaimTrail, context: Context, others: dict[str, list[Placed]]) -> list[str]:
    allowed = sorted(_allowed_nodes(trail, context) or ())
    if allowed:
        where = f"allocated to {', '.join(allowed)} only"
    elif context.window_begins > 1:
        where = f"never allocated in the stream's window (from stream seq {context.window_begins})"
    else:
        where = "never allocated"
    return [
        f"events on {node} from {node}'s preparer, but the claim was {where} "
        f"({len(events)} at stream seq {_ranges([e.stream_seq for e in events])})"
        for node, events in sorted(others.items())
    ]


def _numbering(own: list[Placed], context: Context) -> list[str]:
    """Each node's numbers (and those about no node) without a gap or a repeat."""
    found: list[str] = []
    strands: dict[str, list[Placed]] = {}
    for event in own:
        strands.setdefault(event.node, []).append(event)
    for events in strands.values():
        where = events[0].where
        numbers = [e.seq for e in events]
        if 0 in numbers:
            found.append(f"events without a number {where} (emitted by a build before numbering)")
            continue
        present = sorted(set(numbers))
        lead = list(range(1 if context.from_start else present[0], present[0]))
        if lead and context.window_begins > 1:
            found.append(f"events {_ranges(lead)} {where} are older than the stream's window "
                         f"(it begins at stream seq {context.window_begins}): gone")  # fmt: skip
            lead = []
        missing = lead + sorted(set(range(present[0], present[-1] + 1)) - set(present))
        if missing:
            found.append(f"events {_ranges(missing)} missing {where}")
        repeated = sorted(n for n, count in Counter(numbers).items() if count > 1)
        if repeated:
            found.append(f"numbers stored twice {where}: {_ranges(repeated)}")
    return found


def _begun_before_window(uid: str, own: list[Placed], context: Context) -> list[str]:
    """A live claim whose ``allocated`` on its node the window no longer holds, though
    its numbers there look whole: all of its first events aged out, and the next one
    was numbered 1 again (the stream no longer knew the count)."""
    node = context.live.get(uid)
    if node is None or context.window_begins <= 1 or not context.from_start:
        return []
    there = [e for e in own if e.node == node]
    if any(e.event == "allocated" for e in there) or (there and there[0].seq > 1):
        return []  # whole, or its missing first numbers are already reported
    return [f"its 'allocated' event on {node} is older than the stream's window (it begins "
            f"at stream seq {context.window_begins}): the events before are gone"]  # fmt: skip


def _allocator_order(own: Sequence[Placed]) -> list[str]:
    """``reserved`` and ``released`` after an ``allocated`` on their node, when the
    trail holds that node's events from number 1 (else it may be older than them)."""
    found: list[str] = []
    allocated = False
    whole = {e.node for e in own if e.seq == 1}
    for event in own:
        if event.event == "allocated":
            allocated = True
        elif event.event in ("reserved", "released") and not allocated and event.node in whole:
            found.append(f"event {event.seq} {event.event!r} {event.where} before any 'allocated'")
        if event.event == "released":
            allocated = False
    return found


def _answers(own: Sequence[Placed]) -> list[str]:
    found: list[str] = []
    # (node, request) -> numbers of the open requests, oldest first: a real kubelet
    # asks for a shared claim once per pod, and may do so for two pods at once.
    asked: dict[tuple[str, str], list[int]] = {}
    prepared: dict[str, int] = {}  # node -> number of a prepare not undone yet
    for event in own:
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
    numbers = sorted(numbers)
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
