"""Appending to a claim's audit trail: numbered, ordered events per claim and node.

A claim's events on one node (the allocator's and that node's preparer's),
whoever emits them, are numbered 1, 2, 3, ... in the order the ``CLAIMS``
stream stores them; so are its events about no node (``pending``, the
``deleted`` of a claim never allocated). An auditor who finds a number missing
knows an event was lost, and one who sorts by stream sequence reads the
claim's life in the order it happened on the bus, even when several processes
wrote it.

The numbering is kept over ``dra.claim.<ns>.<claim>.<uid>.<node>.>``, where
only the allocator and that node's preparer may publish (the server enforces
it, services/core/bus/access.py): another node, whatever it stores about the
claim on its own subjects, cannot move or break the count. The stream itself
keeps the count, so it survives any emitter's restart and needs no
coordination between them: an event is published with the number after the
last stored one and with JetStream's ``Nats-Expected-Last-Subject-Sequence``
over those subjects, so the server refuses it when another emitter got there
first; the emitter then reads the new last event and tries again. The last
number is remembered, so an emitter alone on a claim pays one round trip per
event.

Every event's ``Nats-Msg-Id`` ends in a tag only this process can compute
(:func:`message_id`): JetStream drops a message whose id it stored in the
last two minutes on *any* subject, so an id others could guess is an event
others could erase before it is sent. The tag is the same for every resend of
one event: one sent again after a lost acknowledgement either is refused as
out of date while the last event is that very message (stored: done), or is
dropped as a duplicate.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
from collections import OrderedDict
from dataclasses import dataclass

import msgspec
from nats.js.errors import APIError, NotFoundError

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent, decode

log = logging.getLogger(__name__)

SEQ_HEADER = "Gpudra-Claim-Seq"
MSG_ID = "Nats-Msg-Id"
EXPECTED = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed expectation
MAX_CONFLICTS = 50  # other emitters overtaking us this often on one claim is a bug
REMEMBERED_CLAIMS = 4096
_ID_KEY = secrets.token_bytes(32)  # this process's alone: nobody else computes its ids


class TrailError(RuntimeError):
    """The event could not be numbered (others kept overtaking it, or the stream
    holds a claim event this build cannot read)."""


def instance_name() -> str:
    """This process: its pod (``POD_NAME``, set by the chart) or host, and its pid."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}/{os.getpid()}"


def message_id(msg_id: str) -> str:
    """The ``Nats-Msg-Id`` of the event its emitter calls ``msg_id``: that id and a keyed
    hash of it (this process's random key). Every resend of the event in this process
    carries the same one, and no other identity can compute it, even one that reads
    every id stored so far."""
    tag = hashlib.blake2b(msg_id.encode(), key=_ID_KEY, digest_size=12).hexdigest()
    return f"{msg_id}/{tag}"


@dataclass(frozen=True, slots=True)
class _Last:
    stream_seq: int  # 0: the claim has no event yet
    claim_seq: int
    msg_id: str = ""


class ClaimTrail:
    """Appends events to their claim's trail in the ``CLAIMS`` stream, numbered per node."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        # claim uid -> node -> its last event there; claims least recently used first
        self._last: OrderedDict[str, dict[str, _Last]] = OrderedDict()

    async def append(
        self, event: ClaimEvent, msg_id: str, headers: dict[str, str] | None = None
    ) -> ClaimEvent:
        """Store ``event`` as its claim's next event on its node; return it with its number.

        ``msg_id`` names this event for its resends (unique per event of this emitter).
        Errors that say the bus is unavailable propagate (the caller retries with the
        same ``msg_id``); a refusal for any other reason too.
        """
        ref = event.claim
        strand = subjects.claim_node_trail(ref.namespace, ref.name, ref.uid, event.node)
        subject = subjects.claim_event(ref.namespace, ref.name, ref.uid, event.node, event.event)
        sent_id = message_id(msg_id)
        last = self._recall(ref.uid, event.node) or await self._read_last(strand)
        for _ in range(MAX_CONFLICTS):
            numbered = msgspec.structs.replace(event, seq=last.claim_seq + 1)
            sent = {
                **(headers or {}),
                MSG_ID: sent_id,
                EXPECTED: str(last.stream_seq),
                EXPECTED_SUBJECT: strand,
                SEQ_HEADER: str(numbered.seq),
            }
            try:
                ack = await self.bus.js_publish(subject, numbered, sent)
            except APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise
                self._forget(ref.uid, event.node)
                last = await self._read_last(strand)
                if last.msg_id == sent_id:  # ours, stored before its ack was lost
                    self._remember(ref.uid, event.node, last)
                    return msgspec.structs.replace(event, seq=last.claim_seq)
                continue
            if ack.duplicate:  # stored before, under another number: read it next time
                self._forget(ref.uid, event.node)
            else:
                self._remember(ref.uid, event.node, _Last(ack.seq, numbered.seq, sent_id))
            return numbered
        raise TrailError(f"claim {ref.uid}: overtaken {MAX_CONFLICTS} times while numbering")

    async def last_event(
        self, namespace: str, name: str, uid: str, node: str = subjects.NO_NODE
    ) -> ClaimEvent | None:
        """The claim's last stored event on ``node`` (None: none yet). By default its
        events about no node, which only the allocator may publish."""
        strand = subjects.claim_node_trail(namespace, name, uid, node)
        try:
            msg = await self.bus.js.get_last_msg(subjects.CLAIMS_STREAM, strand)
        except NotFoundError:
            return None
        return decode(msg.data or b"", ClaimEvent)

    async def _read_last(self, strand: str) -> _Last:
        try:
            msg = await self.bus.js.get_last_msg(subjects.CLAIMS_STREAM, strand)
        except NotFoundError:
            return _Last(0, 0)
        headers = msg.headers or {}
        number = headers.get(SEQ_HEADER, "")
        if not number.isdigit():
            raise TrailError(f"the last event on {strand} (stream seq {msg.seq}) has no number")
        return _Last(int(msg.seq or 0), int(number), headers.get(MSG_ID, ""))

    def _recall(self, uid: str, node: str) -> _Last | None:
        return self._last.get(uid, {}).get(node)

    def _remember(self, uid: str, node: str, last: _Last) -> None:
        self._last.setdefault(uid, {})[node] = last
        self._last.move_to_end(uid)
        while len(self._last) > REMEMBERED_CLAIMS:
            self._last.popitem(last=False)

    def _forget(self, uid: str, node: str) -> None:
        self._last.get(uid, {}).pop(node, None)

    def forget(self, uid: str) -> None:
        """The claim is gone: its counts need not be kept (they are read again if needed)."""
        self._last.pop(uid, None)
