"""What a received message must pass before a handler sees it: its subject and sender,
and its schema. A message that fails is logged with the reason, counted and skipped:
one bad message never stops a consumer."""

from __future__ import annotations

import logging
from typing import TypeVar

from nats.aio.msg import Msg

from services.core.bus import subjects
from services.core.bus.access import Identity
from services.core.model.schemas import SchemaError, decode
from services.core.telemetry.metrics import FOREIGN_MESSAGES, MALFORMED_MESSAGES

log = logging.getLogger(__name__)
T = TypeVar("T")


def foreign(msg: Msg, subject: str, sender: Identity | None) -> bool:
    """True (logged, counted) when ``msg`` is not ``sender``'s publish on ``subject``.

    Publish permissions say who may publish on a subject, but anyone allowed to
    create a JetStream push consumer can make the server deliver stored messages
    to any subject: those keep their stored subject and carry a ``$JS.ACK``
    reply. A real publish of ``sender`` carries a reply in its inbox (a request,
    or a JetStream publish awaiting its ack), where nobody else may publish.
    """
    reason = ""
    if not subjects.matches(subject, msg.subject):
        reason = f"subject {msg.subject!r}"
    elif sender is not None and not (msg.reply or "").startswith(sender.inbox_prefix + "."):
        reason = f"reply {msg.reply!r} is not in {sender.name}'s inbox"
    if not reason:
        return False
    FOREIGN_MESSAGES.labels(subject=subject).inc()
    log.warning("refusing a foreign message", extra={"subject": subject, "reason": reason})
    return True


def decode_or_skip(data: bytes, kind: type[T], source: str, where: str = "") -> T | None:
    """The decoded payload, or None after logging and counting why it was malformed."""
    try:
        return decode(data, kind)
    except SchemaError as exc:
        _malformed(source, f"{where}: {exc}" if where else str(exc))
        return None


def _malformed(source: str, reason: str) -> None:
    MALFORMED_MESSAGES.labels(source=source).inc()
    log.warning("skipping malformed message", extra={"source": source, "reason": reason})
