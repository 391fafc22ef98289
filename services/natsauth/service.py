"""The auth callout loop: answer each nats-server's authorization request.

nats-server sends one request per new client connection on
``$SYS.REQ.USER.AUTH`` (in the AUTH account, where only this service lives)
and waits at most its auth timeout, so requests are answered concurrently,
each in its own task. A request that does not verify (not signed by a
server key) gets no answer: the server times out and refuses the client.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Counter

from services.core.bus import natsjwt, payloads
from services.core.kit import supervisor
from services.natsauth.authorize import Authorizer, Decision

log = logging.getLogger(__name__)

SUBJECT = "$SYS.REQ.USER.AUTH"
QUEUE = "gpudra-nats-auth"  # several replicas share the requests

DECISIONS = Counter(
    "gpudra_nats_auth_decisions_total",
    "Bus connections the auth callout allowed or refused, by the role asked for.",
    ["role", "result"],
)
UNVERIFIED = Counter(
    "gpudra_nats_auth_unverified_requests_total",
    "Authorization requests not signed by a server key: left unanswered.",
)


class Callout:
    def __init__(
        self, authorizer: Authorizer, signer: natsjwt.Signer, *, account: str, max_inflight: int
    ) -> None:
        self.authorizer = authorizer
        self.signer = signer
        self.account = account
        self._slots = asyncio.Semaphore(max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, nc: Client) -> Subscription:
        sub = await nc.subscribe(SUBJECT, queue=QUEUE, cb=self._on_request)
        await nc.flush()
        return sub

    async def _on_request(self, msg: Msg) -> None:
        task = asyncio.create_task(self._respond(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respond(self, msg: Msg) -> None:
        async with self._slots:
            answer = await self.answer(msg.data)
        if answer is not None and msg.reply:
            await msg.respond(answer)

    async def answer(self, data: bytes) -> bytes | None:
        """The signed response to one request (None: the request did not verify)."""
        try:
            request = natsjwt.auth_request(data.decode(errors="replace"))
        except natsjwt.JwtError as exc:
            UNVERIFIED.inc()
            log.warning("authorization request refused unanswered", extra={"reason": str(exc)})
            return None
        try:
            decision = await self.authorizer.decide(request.token)
        except Exception:  # fail closed: an error of ours refuses, and is logged
            log.exception("authorization failed", extra={"client": request.client_name})
            decision = Decision(reason="the auth service failed on this request")
        self._record(request, decision)
        claims = self._response(request, decision)
        return natsjwt.encode(claims, self.signer).encode()

    def _response(self, request: natsjwt.AuthRequest, decision: Decision) -> dict[str, object]:
        who = decision.identity
        if who is None:
            return natsjwt.response_claims(
                request.user_nkey, request.server_id, error=decision.reason
            )
        user = natsjwt.user_claims(
            request.user_nkey,
            who.permissions(),
            account=self.account,
            name=who.name,
            expires=decision.expires,
            payload=payloads.limit(who.role),
        )
        return natsjwt.response_claims(
            request.user_nkey, request.server_id, user_jwt=natsjwt.encode(user, self.signer)
        )

    def _record(self, request: natsjwt.AuthRequest, decision: Decision) -> None:
        where = {"client": request.client_name, "host": request.client_host}
        if decision.identity is None:
            DECISIONS.labels(decision.role or "unknown", "refused").inc()
            log.warning("connection refused", extra={**where, "reason": decision.reason})
            return
        DECISIONS.labels(decision.role, "allowed").inc()
        log.info("connection allowed", extra={**where, "identity": decision.identity.name})

    async def close(self) -> None:
        await supervisor.cancel_and_wait(list(self._tasks))
