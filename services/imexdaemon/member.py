"""The daemon's own key in the ``domains`` bucket, written with compare-and-set.

Only this node's daemon writes ``<uid>.member.<node>``; compare-and-set on the
key's revision means a stale writer (an old pod of the same node still shutting
down) can never overwrite the newer one's word without first reading it.

The key is this node's word in the domain: deleted or rewritten by someone else
(the admin identity may; the controller may remove it), the controller would
count the node out and its peers drop it. The daemon notices (its watch of the
domain's members, or :meth:`MemberKey.guard` where it watches none) and puts its
word back, logged and counted (``gpudra_imexdaemon_member_repairs_total``).
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from nats.js.errors import KeyWrongLastSequenceError
from prometheus_client import Counter

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import DomainMember, DomainNodeState, SchemaError, encode, now

log = logging.getLogger(__name__)
BUCKET = subjects.DOMAINS_BUCKET
CHECK_S = 10.0  # how often :meth:`MemberKey.guard` compares the key with our word
REPAIRS = Counter(
    "gpudra_imexdaemon_member_repairs_total",
    "Times this daemon's member key was found deleted or rewritten by someone else, and put back.",
    ["reason"],
)


class MemberKey:
    def __init__(self, bus: Bus, member: DomainMember) -> None:
        self.bus = bus
        self.member = member
        self.key = subjects.domain_member_key(member.domain_uid, member.node)
        self.revision = 0
        self._writing: DomainMember | None = None  # sent, not yet acknowledged
        self._lock = asyncio.Lock()

    async def set(self, status: DomainNodeState, reason: str = "") -> bool:
        """Write our status if it changed; True when written."""
        async with self._lock:
            if self.revision and (self.member.status, self.member.reason) == (status, reason):
                return False
            new = msgspec.structs.replace(
                self.member, status=status, reason=reason, updated_at=now()
            )
            await self._write(new)
            log.info("membership written", extra={"status": status, "reason": reason})
            return True

    async def _write(self, new: DomainMember) -> None:
        kv = await self.bus.kv(BUCKET)
        self._writing = new
        try:
            for _ in range(5):
                try:
                    if self.revision:
                        self.revision = int(
                            await kv.update(self.key, encode(new), last=self.revision)
                        )
                    else:
                        self.revision = int(await kv.create(self.key, encode(new)))
                    self.member = new
                    return
                except KeyWrongLastSequenceError:
                    got = await self.bus.kv_get(BUCKET, self.key, DomainMember)
                    stored, revision = got or (None, 0)
                    self._report(self.foreign(stored, revision))
                    self.revision = revision  # someone else (our old self): take it over
        finally:
            self._writing = None
        raise RuntimeError(f"could not write {self.key}: it keeps changing under us")

    def foreign(self, stored: DomainMember | None, revision: int = 0) -> str:
        """Why ``stored``, our key's value at ``revision`` (0: unknown), is not our word (""
        when it is, when we have not joined, when it is no newer than our last write (a
        watch catching up), or when it is a newer daemon's of this node: a pod replacing
        us)."""
        if not self.revision or 0 < revision <= self.revision:
            return ""
        if stored is None:
            return "deleted"
        if stored in (self.member, self._writing):
            return ""
        mine = self.member
        newer = stored.updated_at > mine.updated_at and stored.pod != mine.pod
        if newer and (stored.node, stored.domain_uid) == (mine.node, mine.domain_uid):
            return ""
        return "rewritten"

    async def repair(self, stored: DomainMember | None, revision: int = 0) -> None:
        """Put our word back if ``stored`` (just read or seen, at ``revision``) is not it."""
        async with self._lock:
            why = self.foreign(stored, revision)
            if not why:
                return
            self._report(why)
            self.revision = revision if stored is not None else 0  # (re)created over a deletion
            await self._write(msgspec.structs.replace(self.member, updated_at=now()))

    def _report(self, why: str) -> None:
        if why:
            REPAIRS.labels(reason=why).inc()
            log.warning("the member key was %s by someone else; putting it back", why,
                        extra={"key": self.key})  # fmt: skip

    async def guard(self, interval: float = CHECK_S) -> None:
        """Forever: every ``interval`` read our key and put our word back if it is not."""
        while True:
            await asyncio.sleep(interval)
            try:
                found = await self.bus.kv_get(BUCKET, self.key, DomainMember)
            except SchemaError:
                found = None  # unreadable: not our word
            except Exception as exc:  # the bus is away: the next check tries again
                log.warning("could not read the member key", extra={"error": str(exc)})
                continue
            await self.repair(*(found or (None, 0)))

    async def leave(self) -> None:
        async with self._lock:
            await self.bus.kv_delete(BUCKET, self.key)
            self.revision = 0
