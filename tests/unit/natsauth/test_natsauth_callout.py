"""The auth callout's answers (services/natsauth/service.py), from a server-signed request
to the signed response and user JWT; the real nats-server takes them in tests/e2e."""

from __future__ import annotations

import os
import time

import nkeys

from services.core.bus import natsjwt, payloads
from services.core.bus.access import Identity, Role
from services.core.bus.natsauth import new_seed, public_key
from services.natsauth.authorize import Decision
from services.natsauth.service import Callout

USER = public_key(new_seed())


class Fixed:
    def __init__(self, decision: Decision | Exception) -> None:
        self.decision = decision
        self.tokens: list[str] = []

    async def decide(self, token: str) -> Decision:
        self.tokens.append(token)
        if isinstance(self.decision, Exception):
            raise self.decision
        return self.decision


def _server() -> natsjwt.Signer:
    return natsjwt.Signer(
        bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_SERVER)).decode()
    )


def _request(server: natsjwt.Signer, token: str = "tok") -> bytes:
    claims = {"sub": "AISSUER", "aud": "nats-authorization-request", "exp": int(time.time()) + 5,
              "nats": {"type": "authorization_request", "version": 2, "user_nkey": USER,
                       "server_id": {"id": server.public_key, "name": "n", "host": "h"},
                       "client_info": {"name": "preparer.n1", "host": "10.0.0.1"},
                       "connect_opts": {"auth_token": token, "protocol": 1}}}  # fmt: skip
    return natsjwt.encode(claims, server).encode()


def _callout(decision: Decision | Exception) -> tuple[Callout, natsjwt.Signer, Fixed]:
    issuer = natsjwt.Signer(natsjwt.new_account_seed())
    fixed = Fixed(decision)
    return Callout(fixed, issuer, account="GPUDRA", max_inflight=4), issuer, fixed  # type: ignore[arg-type]


async def test_an_allowed_connection_gets_its_identitys_user_jwt() -> None:
    who = Identity(Role.PREPARER, "n1")
    callout, issuer, fixed = _callout(Decision(identity=who, expires=int(time.time()) + 600))
    server = _server()
    answer = await callout.answer(_request(server))
    assert answer is not None and fixed.tokens == ["tok"]
    response = natsjwt.decode(answer.decode(), kind="authorization_response", issuer_prefix="A")
    assert (response["iss"], response["aud"], response["sub"]) == (
        issuer.public_key, server.public_key, USER
    )  # fmt: skip
    user = natsjwt.decode(response["nats"]["jwt"], kind="user", issuer_prefix="A")
    assert (user["sub"], user["aud"], user["name"]) == (USER, "GPUDRA", "preparer.n1")
    assert user["nats"]["sub"]["allow"] == list(who.permissions().subscribe)
    assert user["nats"]["payload"] == payloads.limit(Role.PREPARER) == 512 * 1024
    assert "tok" not in answer.decode()  # the token is not echoed back


async def test_a_refusal_and_an_internal_error_are_signed_errors() -> None:
    failed = "the auth service failed on this request"
    for decision, reason in ((Decision(reason="nope"), "nope"), (RuntimeError("boom"), failed)):
        callout, _, _ = _callout(decision)
        answer = await callout.answer(_request(_server()))
        assert answer is not None
        response = natsjwt.decode(answer.decode(), kind="authorization_response",
                                  issuer_prefix="A")  # fmt: skip
        assert response["nats"] == {"error": reason, "type": "authorization_response",
                                    "version": 2}  # fmt: skip


async def test_a_request_not_signed_by_a_server_gets_no_answer() -> None:
    callout, _, fixed = _callout(Decision(reason="unused"))
    forged = _request(natsjwt.Signer(natsjwt.new_account_seed()))
    assert await callout.answer(forged) is None and fixed.tokens == []
    assert await callout.answer(b"garbage") is None
