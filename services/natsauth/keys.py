"""The auth service's two keys: the issuer (signs every user JWT) and its own login.

Both are nkey seeds. In a cluster ``gpudra nats-keygen`` (the chart's
pre-install/pre-upgrade hook) makes them once: the seeds go to a Secret that only
the auth service mounts, the public keys to a ConfigMap that nats-server reads
(``GPUDRA_NATS_AUTH_ISSUER``, ``GPUDRA_NATS_AUTH_USER``). An existing Secret is
kept; the ConfigMap is made to match it.
"""

from __future__ import annotations

import base64
import binascii
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from services.core.bus import natsjwt
from services.core.bus.natsauth import new_seed, public_key
from services.core.kube.client import ApiError, KubeApi

ISSUER_KEY = "issuer.nk"
USER_KEY = "user.nk"
LABELS = {"app.kubernetes.io/name": "gpudra", "app.kubernetes.io/component": "nats-auth"}


class KeysError(RuntimeError):
    """A seed file that is missing, readable by others, or not an nkey seed."""


@dataclass(frozen=True)
class Seeds:
    issuer: str  # account seed (SA...)
    user: str  # user seed (SU...)

    @classmethod
    def new(cls) -> Seeds:
        return cls(issuer=natsjwt.new_account_seed(), user=new_seed())

    def public(self) -> dict[str, str]:
        return {"issuer": natsjwt.Signer(self.issuer).public_key, "user": public_key(self.user)}


def load_signer(path: Path) -> natsjwt.Signer:
    """The issuer seed from ``path``, refused if anyone but its owner may read it."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise KeysError(f"{path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXO | stat.S_IWGRP):
        raise KeysError(f"{path}: readable or writable by others (mode {oct(mode & 0o777)})")
    try:
        signer = natsjwt.Signer(text)
    except natsjwt.JwtError as exc:
        raise KeysError(f"{path}: {exc}") from exc
    if not signer.public_key.startswith("A"):
        raise KeysError(f"{path}: not an account seed (SA...)")
    return signer


async def ensure(api: KubeApi, namespace: str, secret: str, configmap: str) -> dict[str, str]:
    """Make the Secret (seeds) unless it exists, and the ConfigMap (public keys) to match."""
    seeds = await _ensure_secret(api, namespace, secret)
    public = seeds.public()
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    body: dict[str, Any] = {"metadata": {"name": configmap, "labels": LABELS}, "data": public}
    try:
        current = msgspec.json.decode(await api.get(f"{path}/{configmap}"))
    except ApiError as exc:
        if not exc.not_found:
            raise
        await api.create(path, body)
        return public
    if current.get("data") != public:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await api.replace(f"{path}/{configmap}", body)
    return public


async def _ensure_secret(api: KubeApi, namespace: str, name: str) -> Seeds:
    path = f"/api/v1/namespaces/{namespace}/secrets"
    try:
        return _seeds(msgspec.json.decode(await api.get(f"{path}/{name}")))
    except ApiError as exc:
        if not exc.not_found:
            raise
    seeds = Seeds.new()
    data = {ISSUER_KEY: seeds.issuer, USER_KEY: seeds.user}
    body = {
        "metadata": {"name": name, "labels": LABELS},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    try:
        await api.create(path, body)
    except ApiError as exc:
        if not exc.conflict:  # made meanwhile by another run: take that one
            raise
        return _seeds(msgspec.json.decode(await api.get(f"{path}/{name}")))
    return seeds


def _seeds(secret: dict[str, Any]) -> Seeds:
    data = secret.get("data") or {}
    try:
        seeds = Seeds(
            issuer=base64.b64decode(data[ISSUER_KEY]).decode().strip(),
            user=base64.b64decode(data[USER_KEY]).decode().strip(),
        )
        seeds.public()
    except (KeyError, binascii.Error, UnicodeDecodeError, natsjwt.JwtError) as exc:
        raise KeysError(f"Secret {secret['metadata']['name']}: no valid {exc}") from exc
    except Exception as exc:  # nkeys' own errors on a bad user seed
        raise KeysError(f"Secret {secret['metadata']['name']}: bad seed") from exc
    return seeds
