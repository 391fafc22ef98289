"""How ``gpudra audit`` prints events: JSON lines (for tools) or a table (for people)."""

from __future__ import annotations

import datetime

import msgspec

from services.audit.replay import Stored, Unreadable

TABLE_HEADER = (
    f"{'TIME':23} {'#':>3} {'EVENT':19} {'NAMESPACE/CLAIM':32} {'NODE':16} {'WHO':24} "
    "DEVICES / ERROR"
)


def json_line(item: Stored | Unreadable) -> str:
    """One event as one JSON object: the payload plus where the stream stored it."""
    if isinstance(item, Unreadable):
        body = {"stream_seq": item.stream_seq, "subject": item.subject, "unreadable": item.error}
        return msgspec.json.encode(body).decode()
    payload = msgspec.to_builtins(item.event)
    where = {"stream_seq": item.stream_seq, "subject": item.subject}
    return msgspec.json.encode({**where, **payload}).decode()


def table_row(item: Stored | Unreadable) -> str:
    if isinstance(item, Unreadable):
        return (
            f"{'?':23} {'?':>3} {'(unreadable)':19} {item.subject:32} {'':16} {'':24} {item.error}"
        )
    e = item.event
    when = datetime.datetime.fromtimestamp(e.timestamp, datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S.%f"
    )[:23]
    who = f"{e.actor} {e.instance}".strip()
    if e.error:
        what = e.error
    else:
        what = ", ".join(
            f"{d.device}" + (f" ({d.gpu_uuid})" if d.gpu_uuid else "") for d in e.devices
        )
        if e.pods:
            what = (what + "; " if what else "") + "for " + ", ".join(p.name for p in e.pods)
    claim = f"{e.claim.namespace}/{e.claim.name}"
    return f"{when:23} {e.seq:>3} {e.event:19} {claim:32} {e.node or '-':16} {who:24} {what}"
