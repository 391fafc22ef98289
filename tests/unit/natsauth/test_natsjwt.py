"""NATS JWT v2 encoding and checking (services/core/bus/natsjwt.py); the real nats-server
takes these JWTs in tests/e2e/natsauth/test_nats_auth.py."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from services.core.bus import natsjwt
from services.core.bus.access import NODE_ROLES, Identity, Role
from services.core.bus.natsauth import authorization, new_seed, public_key

NOW = 1_800_000_000
FORGED = b'{"nats":{"type":"user"},"iss":"AAAA"}'


def _signer(prefix: str = "A") -> natsjwt.Signer:
    if prefix == "A":
        return natsjwt.Signer(natsjwt.new_account_seed())
    return natsjwt.Signer(new_seed())


def _pad(text: str) -> str:
    return text + "=" * (-len(text) % 4)


def _parts(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    h, p, s = token.split(".")
    pad = _pad
    return (
        json.loads(base64.urlsafe_b64decode(pad(h))),
        json.loads(base64.urlsafe_b64decode(pad(p))),
        base64.urlsafe_b64decode(pad(s)),
    )


def test_a_user_jwt_has_the_v2_header_claims_and_jti_hash() -> None:
    signer = _signer()
    user = public_key(new_seed())
    perms = Identity(Role.PREPARER, "n1").permissions()
    claims = natsjwt.user_claims(user, perms, account="GPUDRA", name="preparer.n1", expires=NOW)
    token = natsjwt.encode(claims, signer, now=NOW - 60)
    header, body, signature = _parts(token)
    assert header == {"typ": "JWT", "alg": "ed25519-nkey"}
    assert (body["iss"], body["sub"], body["aud"], body["iat"]) == (
        signer.public_key, user, "GPUDRA", NOW - 60
    )  # fmt: skip
    assert body["nats"]["type"] == "user" and body["nats"]["version"] == 2
    assert body["jti"] == natsjwt.claims_hash(body) and len(body["jti"]) == 52
    assert len(signature) == 64
    assert natsjwt.decode(token, kind="user", issuer_prefix="A", now=NOW - 1) == body


def test_user_permissions_are_the_static_configurations() -> None:
    """One place for the rules: the user JWT says what the static config says."""
    for role in Role:
        identity = Identity(role, "n1" if role in NODE_ROLES else "")
        static = authorization({identity: "UKEY"})["users"][0]["permissions"]
        jwt = natsjwt.jwt_permissions(identity.permissions())
        assert jwt["pub"] == static["publish"]
        assert jwt["sub"] == static["subscribe"]
        assert "resp" not in jwt and "allow_responses" not in static  # explicit replies only


@pytest.mark.parametrize(
    "tamper, error",
    [
        (lambda t: t.rsplit(".", 1)[0] + "." + natsjwt._b64(b"x" * 64), "bad signature"),
        (lambda t: t.rsplit(".", 1)[0] + "." + natsjwt._b64(b"x" * 10), "bad signature"),
        (lambda t: t.rsplit(".", 1)[0] + ".", "bad signature"),
        (lambda t: t.split(".", 1)[0] + "." + natsjwt._b64(FORGED) + ".xxxx", "public nkey"),
        (lambda t: "garbage", "three parts"),
        (lambda t: "a.b.c", "not JSON"),
    ],
)  # fmt: skip
def test_tampered_or_garbage_tokens_are_refused(tamper, error) -> None:
    signer = _signer()
    claims = natsjwt.user_claims(public_key(new_seed()), Identity(Role.ALLOCATOR).permissions(),
                                 account="GPUDRA", name="allocator", expires=NOW)  # fmt: skip
    token = natsjwt.encode(claims, signer, now=NOW)
    with pytest.raises(natsjwt.JwtError, match=error):
        natsjwt.decode(tamper(token), kind="user", issuer_prefix="A", now=NOW)


def test_the_kind_the_issuer_prefix_and_the_expiry_are_checked() -> None:
    signer = _signer()
    claims = natsjwt.response_claims(public_key(new_seed()), "NSERVER", error="no")
    token = natsjwt.encode({**claims, "exp": NOW}, signer, now=NOW - 10)
    assert natsjwt.decode(token, kind="authorization_response", issuer_prefix="A", now=NOW)
    with pytest.raises(natsjwt.JwtError, match="not an user"):
        natsjwt.decode(token, kind="user", issuer_prefix="A", now=NOW)
    with pytest.raises(natsjwt.JwtError, match="starting with N"):
        natsjwt.decode(token, kind="authorization_response", issuer_prefix="N", now=NOW)
    with pytest.raises(natsjwt.JwtError, match="expired"):
        natsjwt.decode(token, kind="authorization_response", issuer_prefix="A", now=NOW + 1)


def test_a_request_signed_by_a_user_key_is_not_a_servers() -> None:
    """Only a server (N...) signs authorization requests; a client's key cannot pose as one."""
    claims = {"sub": "A", "nats": {"type": "authorization_request", "user_nkey": "U1"}}
    token = natsjwt.encode(claims, _signer("U"), now=time.time())
    with pytest.raises(natsjwt.JwtError, match="starting with N"):
        natsjwt.auth_request(token)


def test_public_nkeys_are_checked_for_prefix_and_checksum() -> None:
    key = public_key(new_seed())
    assert len(natsjwt.public_key_bytes(key)) == 32
    broken = key[:-1] + ("A" if key[-1] != "A" else "B")
    with pytest.raises(natsjwt.JwtError):
        natsjwt.public_key_bytes(broken)
    with pytest.raises(natsjwt.JwtError):
        natsjwt.public_key_bytes("S" + key[1:])


def test_a_signer_never_shows_its_seed() -> None:
    signer = _signer()
    assert signer.seed not in repr(signer) and signer.public_key in repr(signer)
    with pytest.raises(natsjwt.JwtError):
        natsjwt.Signer("not a seed")
