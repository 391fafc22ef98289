"""The daemon's own key in the ``domains`` bucket, written with compare-and-set.

Only this node's daemon writes ``<uid>.member.<node>``; compare-and-set on the
key's revision means a stale writer (an old pod of the same node still shutting
down) can never overwrite the newer one's word without first reading it.
"""

from __future__ import annotations

import logging

import msgspec
from nats.js.errors import KeyWrongLastSequenceError

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import DomainMember, DomainNodeState, encode, now

log = logging.getLogger(__name__)
BUCKET = subjects.DOMAINS_BUCKET


class MemberKey:
    def __init__(self, bus: Bus, member: DomainMember) -> None:
        self.bus = bus
        self.member = member
        self.key = subjects.domain_member_key(member.domain_uid, member.node)
        self.revision = 0

    async def set(self, status: DomainNodeState, reason: str = "") -> bool:
        """Write our status if it changed; True when written."""
        if self.revision and (self.member.status, self.member.reason) == (status, reason):
            return False
        new = msgspec.structs.replace(self.member, status=status, reason=reason, updated_at=now())
        kv = await self.bus.kv(BUCKET)
        for _ in range(5):
            try:
                if self.revision:
                    self.revision = int(await kv.update(self.key, encode(new), last=self.revision))
                else:
                    self.revision = int(await kv.create(self.key, encode(new)))
                self.member = new
                log.info("membership written", extra={"status": status, "reason": reason})
                return True
            except KeyWrongLastSequenceError:
                got = await self.bus.kv_get(BUCKET, self.key, DomainMember)
                self.revision = got[1] if got else 0  # someone else (our old self): take it over
        raise RuntimeError(f"could not write {self.key}: it keeps changing under us")

    async def leave(self) -> None:
        await self.bus.kv_delete(BUCKET, self.key)
        self.revision = 0
