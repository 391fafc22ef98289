"""Where a stored claim event comes from: its subject, never its payload.

A payload says whatever its publisher wrote. The subject
``dra.claim.<ns>.<claim>.<uid>.<node>.<event>`` is checked by the server
against the publisher's grants (services/core/bus/access.py): an allocator
event may be published by the allocator alone (on any node's token), a
preparer event on ``<node>`` by that node's preparer alone. So the claim, the
node and the event an auditor judges are the subject's, and the identity that
stored the event is the one its subject allows; a payload that says otherwise
(another node, event, claim or actor) is reported, not believed. A node's
preparer could once "delete" another node's claim by saying so in a payload
on its own subject.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from services.audit.replay import Stored
from services.core.bus import subjects
from services.core.bus.access import ALLOCATOR_EVENTS, PREPARER_EVENTS, Role
from services.core.bus.claimtrail import SEQ_HEADER
from services.core.model.schemas import ClaimEvent

_ROOT = subjects.CLAIM_ROOT.split(".")


@dataclass(frozen=True, slots=True)
class Placed:
    """One stored event as its subject places it: claim, node and event from the subject."""

    stream_seq: int
    namespace: str
    name: str
    uid: str
    node: str  # "" for an event about no node
    event: str
    seq: int  # its number among the claim's events on its node
    payload: ClaimEvent
    disagrees: tuple[str, ...] = ()  # what the payload says otherwise

    @property
    def by_allocator(self) -> bool:
        return self.event in ALLOCATOR_EVENTS

    @property
    def emitter(self) -> str:
        """The identity alone allowed to publish on this event's subject."""
        return Role.ALLOCATOR.value if self.by_allocator else f"{self.node}'s preparer"

    @property
    def where(self) -> str:
        return f"on {self.node}" if self.node else "about no node"


class Unplaceable(ValueError):
    """A subject in ``CLAIMS`` that no identity may publish a claim event on."""


def place(stored: Stored) -> Placed:
    """The event as its subject says; raises :class:`Unplaceable` for a foreign subject."""
    namespace, name, uid, node, event = parse(stored.subject)
    payload = stored.event
    placed = Placed(stored.stream_seq, namespace, name, uid, node, event, payload.seq, payload)
    disagrees = _disagreements(placed, stored.headers.get(SEQ_HEADER, ""))
    return replace(placed, disagrees=disagrees) if disagrees else placed


def parse(subject: str) -> tuple[str, str, str, str, str]:
    """``(namespace, claim, uid, node, event)`` of a claim event subject."""
    tokens = subject.split(".")
    event = ".".join(tokens[6:])
    if tokens[:2] != _ROOT or len(tokens) < 7:
        raise Unplaceable(f"not a claim event subject: {subject!r}")
    if event not in ALLOCATOR_EVENTS and event not in PREPARER_EVENTS:
        raise Unplaceable(f"no identity may publish event {event!r}: {subject!r}")
    try:
        namespace, name, uid, node = (subjects.unescape_token(t) for t in tokens[2:6])
    except (ValueError, IndexError, UnicodeDecodeError):
        raise Unplaceable(f"a token that is not escaped: {subject!r}") from None
    if event in PREPARER_EVENTS and not node:
        raise Unplaceable(f"a preparer event about no node: {subject!r}")
    return namespace, name, uid, node, event


def _disagreements(placed: Placed, header_seq: str) -> tuple[str, ...]:
    """What the payload (and the number header) says that its subject does not."""
    said = placed.payload
    claim = (said.claim.namespace, said.claim.name, said.claim.uid)
    actor = Role.ALLOCATOR.value if placed.by_allocator else Role.PREPARER.value
    found = [
        f"event {said.event!r}" if said.event != placed.event else "",
        f"node {said.node!r}" if said.node != placed.node else "",
        f"claim {'/'.join(claim)}" if claim != (placed.namespace, placed.name, placed.uid) else "",
        f"actor {said.actor!r}" if said.actor != actor else "",
        f"number {header_seq} in its header" if header_seq != str(said.seq) else "",
    ]
    return tuple(f for f in found if f)
