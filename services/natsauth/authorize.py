"""Who a connection is: a ServiceAccount token -> one bus identity, or a refusal.

The order of checks is the order of trust: the token's claimed role (its
audience) means nothing until the API server has confirmed the token for that
audience; the account it names must be granted that role; a node role takes its
node from the pod the token is bound to, never from anything the client says; the
admin role is only for a pod of the provision Job while it runs (:mod:`.adminpod`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from services.core.bus.access import NODE_ROLES, AccessError, Identity, Role
from services.core.bus.natsjwt import unverified_claims
from services.natsauth import grants as g
from services.natsauth.adminpod import ProvisionJob
from services.natsauth.tokenreview import Reviewer


@dataclass(frozen=True)
class Decision:
    """An identity and until when it holds, or the reason for a refusal."""

    identity: Identity | None = None
    expires: int = 0  # the token's expiry: the server drops the connection then
    reason: str = ""
    role: str = ""  # the role asked for, for metrics ("" if none could be read)


class Authorizer:
    def __init__(
        self,
        reviewer: Reviewer,
        grants: Mapping[g.Account, frozenset[Role]],
        audience: str,
        admin: ProvisionJob | None = None,
    ) -> None:
        self.reviewer = reviewer
        self.grants = grants
        self.audience = audience
        self.admin = admin  # None: nobody is admin

    async def decide(self, token: str, *, now: float | None = None) -> Decision:
        if not token:
            return Decision(reason="no token: connect with --nats-token-file")
        claims = unverified_claims(token)
        if claims is None:
            return Decision(reason="the token is not a JWT")
        auds = claims.get("aud")
        named = [str(a) for a in auds] if isinstance(auds, list) else [str(auds)]
        role = g.role_of_audiences(self.audience, named)
        if role is None:
            return Decision(reason=f"the token names no single {self.audience}:<role> audience")
        return await self._review(token, role, claims, time.time() if now is None else now)

    async def _review(
        self, token: str, role: Role, claims: dict[str, object], now: float
    ) -> Decision:
        wanted = g.audience(self.audience, role)
        review = await self.reviewer.review(token, wanted)

        def refuse(reason: str) -> Decision:
            return Decision(reason=reason, role=role.value)

        if not review.authenticated or wanted not in review.audiences:
            return refuse(f"the API server refused the token for {wanted}: {review.error}")
        account = g.account_of(review.username)
        if account is None or role not in self.grants.get(account, frozenset()):
            return refuse(f"{review.username} may not be {role.value}")
        expires = claims.get("exp")
        if not isinstance(expires, int) or expires <= now:
            return refuse("the token has no expiry or has expired")
        if role in NODE_ROLES and not review.node:
            return refuse("a node role needs a token bound to a pod on a node")
        if role is Role.ADMIN:
            why = "no provision Job is configured: nobody may be admin"
            if self.admin is not None:
                why = await self.admin.refusal(account.namespace, review.pod, review.pod_uid)
            if why:
                return refuse(why)
        try:
            identity = Identity(role, review.node if role in NODE_ROLES else "")
        except AccessError as exc:
            return refuse(str(exc))
        return Decision(identity=identity, expires=expires, role=role.value)
