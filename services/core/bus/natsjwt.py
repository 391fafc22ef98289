"""NATS JWT v2: what nats-server and an auth callout service say to each other.

In a cluster nats-server does not know gpudra's identities; it asks the auth
callout service (``gpudra nats-auth``) about each new connection with an
*authorization request* JWT (signed by the server's own nkey) and takes the
*authorization response* JWT that comes back (signed by the issuer account
key the server trusts), which carries a *user* JWT with the connection's
permissions. The shapes follow github.com/nats-io/jwt/v2 (claims.go,
authorization_claims.go, user_claims.go, types.go):

- header ``{"typ":"JWT","alg":"ed25519-nkey"}``; the signature is ed25519 over
  ``base64url(header).base64url(claims)`` by the key whose public nkey is ``iss``;
- ``jti`` is base32 (no padding) of SHA-512/256 over the standard claims
  (aud, exp, iat, iss, name, nbf, sub; jti left out), as nats-io/jwt hashes them;
- the specific part sits under ``nats`` with ``type`` and ``version: 2``.

Only the standard library, :mod:`nkeys` (seeds, signing) and PyNaCl, which nkeys
signs with (verifying with a public nkey), are used: not :mod:`cryptography`,
whose bundled OpenSSL costs every process that talks to the bus about 10 MB.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from services.core.bus.access import Permissions

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
VERSION = 2
REQUEST = "authorization_request"
RESPONSE = "authorization_response"
USER = "user"
NO_LIMIT = -1
#: Prefix bytes of public nkeys (nkeys.PREFIX_BYTE_*), by their first letter.
PREFIXES = {
    "A": nkeys.PREFIX_BYTE_ACCOUNT,
    "N": nkeys.PREFIX_BYTE_SERVER,
    "U": nkeys.PREFIX_BYTE_USER,
    "O": nkeys.PREFIX_BYTE_OPERATOR,
}
#: The standard claims, in nats-io/jwt's ClaimsData field order (the jti hash depends on it).
_STANDARD = ("aud", "exp", "jti", "iat", "iss", "name", "nbf", "sub")


class JwtError(ValueError):
    """A JWT that is malformed, of the wrong kind, badly signed or expired."""


@dataclass(frozen=True)
class Signer:
    """An nkey that signs JWTs: the auth callout's issuer account key."""

    seed: str

    def __post_init__(self) -> None:
        try:
            nkeys.from_seed(bytearray(self.seed.encode()))
        except Exception as exc:  # nkeys raises its own types and binascii's
            raise JwtError("not an nkey seed") from exc

    @property
    def public_key(self) -> str:
        return bytes(self._pair().public_key).decode()

    def sign(self, data: bytes) -> bytes:
        return bytes(self._pair().sign(data))

    def _pair(self) -> Any:
        return nkeys.from_seed(bytearray(self.seed.encode()))

    def __repr__(self) -> str:  # the seed never reaches a log line
        return f"Signer({self.public_key})"


def new_account_seed() -> str:
    """A fresh account nkey seed (``SA...``): what an auth callout issuer signs with."""
    import os

    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)).decode()


def encode(claims: dict[str, Any], signer: Signer, *, now: float | None = None) -> str:
    """Sign ``claims`` as ``signer``: sets iss, iat and jti as nats-io/jwt does."""
    body = {k: v for k, v in claims.items() if k not in ("iss", "iat", "jti")}
    body["iss"] = signer.public_key
    body["iat"] = int(time.time() if now is None else now)
    body["jti"] = claims_hash(body)
    head = _b64(_json(HEADER))
    payload = _b64(_json(body))
    signature = signer.sign(f"{head}.{payload}".encode())
    return f"{head}.{payload}.{_b64(signature)}"


def claims_hash(claims: dict[str, Any]) -> str:
    """nats-io/jwt's jti: base32 of SHA-512/256 over the standard claims (jti empty)."""
    standard = {k: claims[k] for k in _STANDARD if k != "jti" and claims.get(k)}
    digest = hashlib.new("sha512_256", _json(standard)).digest()
    return base64.b32encode(digest).decode().rstrip("=")


def decode(
    token: str, *, kind: str, issuer_prefix: str, now: float | None = None
) -> dict[str, Any]:
    """The claims of ``token`` once its signature by ``iss`` verifies, it is of ``kind``,
    its issuer a public nkey starting with ``issuer_prefix`` and it has not expired."""
    parts = token.split(".")
    if len(parts) != 3:
        raise JwtError("a JWT has three parts")
    header, claims = _load(parts[0]), _load(parts[1])
    if header.get("alg") != HEADER["alg"]:
        raise JwtError(f"algorithm {header.get('alg')!r}, want {HEADER['alg']!r}")
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != kind:
        raise JwtError(f"not an {kind} JWT")
    issuer = claims.get("iss")
    if not isinstance(issuer, str) or not issuer.startswith(issuer_prefix):
        raise JwtError(f"issuer {issuer!r} is not a public nkey starting with {issuer_prefix}")
    verify(issuer, f"{parts[0]}.{parts[1]}".encode(), _unb64(parts[2]))
    expires = claims.get("exp")
    if isinstance(expires, int) and expires and (time.time() if now is None else now) > expires:
        raise JwtError("expired")
    return claims


def verify(public_key: str, data: bytes, signature: bytes) -> None:
    """Check an ed25519 signature by a public nkey (its prefix byte and CRC included)."""
    raw = public_key_bytes(public_key)
    try:
        VerifyKey(raw).verify(data, signature)
    except (BadSignatureError, ValueError):  # ValueError: not 64 bytes
        raise JwtError(f"bad signature by {public_key}") from None


def public_key_bytes(public_key: str) -> bytes:
    """The 32 raw bytes of a public nkey, after checking its prefix and CRC16."""
    try:
        raw = base64.b32decode(public_key + "=" * (-len(public_key) % 8))
    except (binascii.Error, ValueError):
        raise JwtError(f"{public_key!r} is not a public nkey") from None
    prefix = PREFIXES.get(public_key[:1])
    body, crc = raw[:-2], raw[-2:]
    if len(raw) != 35 or prefix is None or body[0] != prefix:
        raise JwtError(f"{public_key!r} is not a public nkey")
    if bytes(nkeys.crc16_checksum(body)) != crc:
        raise JwtError(f"{public_key!r}: checksum mismatch")
    return bytes(body[1:])


def jwt_permissions(perms: Permissions) -> dict[str, Any]:
    """:class:`services.core.bus.access.Permissions` in a user JWT's shape (pub, sub; no
    ``resp``: nobody answers onto a reply subject it was handed),
    the same rules the static configuration gives nats-server."""
    out: dict[str, Any] = {
        "pub": {"allow": list(perms.publish), "deny": list(perms.publish_deny)},
        "sub": {"allow": list(perms.subscribe)},
    }
    return out


def user_claims(
    user_nkey: str,
    perms: Permissions,
    *,
    account: str,
    name: str,
    expires: int,
    payload: int = NO_LIMIT,
) -> dict[str, Any]:
    """A user JWT's claims: ``account`` (aud) is where nats-server places the user;
    ``payload`` the largest message it may publish (services.core.bus.payloads)."""
    return {
        "aud": account,
        "exp": expires,
        "name": name,
        "sub": user_nkey,
        "nats": {
            **jwt_permissions(perms),
            "subs": NO_LIMIT,
            "data": NO_LIMIT,
            "payload": payload,
            "type": USER,
            "version": VERSION,
        },
    }


def response_claims(
    user_nkey: str, server_id: str, *, user_jwt: str = "", error: str = ""
) -> dict[str, Any]:
    """An authorization response: for the requested user nkey, to the asking server."""
    answer = {"jwt": user_jwt} if user_jwt else {"error": error or "not authorized"}
    return {
        "aud": server_id,
        "sub": user_nkey,
        "nats": {**answer, "type": RESPONSE, "version": VERSION},
    }


@dataclass(frozen=True)
class AuthRequest:
    """What a server asks about one connection (the parts we use)."""

    server_id: str  # the server's public nkey: the response's audience
    user_nkey: str  # the key the server made for this connection: the user JWT's subject
    token: str  # the client's auth_token: a Kubernetes ServiceAccount token
    client_name: str
    client_host: str


def auth_request(token: str, *, now: float | None = None) -> AuthRequest:
    """Decode and verify an authorization request from nats-server."""
    claims = decode(token, kind=REQUEST, issuer_prefix="N", now=now)
    nats = claims["nats"]
    server = nats.get("server_id") or {}
    client = nats.get("client_info") or {}
    opts = nats.get("connect_opts") or {}
    user_nkey = nats.get("user_nkey", "")
    if not isinstance(user_nkey, str) or not user_nkey.startswith("U"):
        raise JwtError("the request names no user nkey")
    return AuthRequest(
        server_id=str(server.get("id", "")),
        user_nkey=user_nkey,
        token=str(opts.get("auth_token", "")),
        client_name=str(client.get("name", "")),
        client_host=str(client.get("host", "")),
    )


def unverified_claims(token: str) -> dict[str, object] | None:
    """A JWT's payload, unverified: for what only schedules or routes, never for trust
    (the auth callout picks the audience to ask the API server for; a client learns when
    its own token expires)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        return _load(parts[1])
    except JwtError:
        return None


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise JwtError("not base64url") from None


def _load(part: str) -> dict[str, Any]:
    try:
        value = json.loads(_unb64(part))
    except ValueError:
        raise JwtError("not JSON") from None
    if not isinstance(value, dict):
        raise JwtError("not a JSON object")
    return value
