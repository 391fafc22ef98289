"""Where the API server is and how to authenticate to it: a kubeconfig, or the pod's own.

What every gpudra process needs from a kubeconfig is small: the server, its CA
(file, data, or ``insecure-skip-tls-verify``, ``tls-server-name``), and a bearer
token (``token``, ``tokenFile``), a client certificate and key (file or data) or
basic auth. Reading that here keeps the Kubernetes client library (tens of MB of
generated models) out of every process. Kubeconfigs that need a program to
produce credentials (``exec``, ``auth-provider``) are handed to
kubernetes-asyncio's loader, imported only then.

In a pod (no kubeconfig): ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the service
account's token and CA; the token file is read again every minute, as client-go
does, because bound service account tokens are rotated.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0


class KubeconfigError(ValueError):
    """A kubeconfig that does not say how to reach the API server; the message names the field."""


HeaderSource = Callable[[], Awaitable[dict[str, str]]]


@dataclass
class Endpoint:
    """The API server's base URL, the TLS context for it, and the auth headers per request."""

    server: str
    ssl: ssl.SSLContext | bool = True  # False: plain http (or verification off)
    static_headers: dict[str, str] = field(default_factory=dict)
    dynamic_headers: HeaderSource | None = None  # a token that changes (file, exec)

    async def headers(self) -> dict[str, str]:
        if self.dynamic_headers is None:
            return self.static_headers
        return {**self.static_headers, **await self.dynamic_headers()}


class _TokenFile:
    """A bearer token read from a file, again after ``TOKEN_REREAD_S``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token = ""
        self._read_at = -TOKEN_REREAD_S

    async def __call__(self) -> dict[str, str]:
        now = time.monotonic()
        if now - self._read_at >= TOKEN_REREAD_S:
            self._token = self.path.read_text().strip()
            self._read_at = now
        return {"Authorization": f"Bearer {self._token}"}


async def load(kubeconfig: str | None) -> Endpoint:
    """The endpoint from ``kubeconfig`` (a path), or in-cluster when empty."""
    if not kubeconfig:
        return in_cluster()
    path = Path(kubeconfig)
    return await from_dict(_read(path), path.parent, str(path))


def _read(path: Path) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KubeconfigError(f"kubeconfig {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a mapping")
    return doc


async def from_dict(doc: dict[str, Any], base: Path, source: str = "kubeconfig") -> Endpoint:
    """The endpoint a parsed kubeconfig's current context names (relative paths from ``base``)."""
    context_name = doc.get("current-context") or ""
    context = _named(doc, "contexts", context_name, source).get("context") or {}
    cluster = _named(doc, "clusters", context.get("cluster", ""), source).get("cluster") or {}
    users = doc.get("users") or []
    user_name = context.get("user", "")
    user = _named(doc, "users", user_name, source).get("user") or {} if users else {}
    if user.get("exec") or user.get("auth-provider"):
        return await _through_kubernetes_asyncio(source)
    server = cluster.get("server") or ""
    if not server:
        raise KubeconfigError(f"{source}: cluster {context.get('cluster')!r} has no server")
    where = f"{source}: cluster {context.get('cluster')!r}"
    tls = (
        _client_context(cluster, user, base, source, where) if server.startswith("https") else False
    )
    endpoint = Endpoint(server.rstrip("/"), tls)
    if user.get("token"):
        endpoint.static_headers["Authorization"] = f"Bearer {user['token']}"
    elif user.get("tokenFile"):
        endpoint.dynamic_headers = _TokenFile(_path(base, user["tokenFile"]))
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password', '')}".encode()
        endpoint.static_headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    return endpoint


def in_cluster(root: Path = SERVICE_ACCOUNT, environ: dict[str, str] | None = None) -> Endpoint:
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeconfigError("no kubeconfig and not in a pod (KUBERNETES_SERVICE_HOST/PORT unset)")
    if ":" in host:
        host = f"[{host}]"  # IPv6
    ca = root / "ca.crt"
    if not ca.is_file():
        raise KubeconfigError(f"in-cluster: no service account CA at {ca}")
    tls = ssl.create_default_context(cafile=str(ca))
    return Endpoint(f"https://{host}:{port}", tls, dynamic_headers=_TokenFile(root / "token"))


def _named(doc: dict[str, Any], kind: str, name: str, source: str) -> dict[str, Any]:
    entries = doc.get(kind) or []
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    if len(entries) == 1 and not name and isinstance(entries[0], dict):
        return entries[0]
    raise KubeconfigError(f"{source}: no {kind[:-1]} named {name!r} (in {kind})")


def _path(base: Path, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else base / path


def _client_context(
    cluster: dict[str, Any], user: dict[str, Any], base: Path, source: str, where: str
) -> ssl.SSLContext:
    if cluster.get("insecure-skip-tls-verify"):
        tls = ssl.create_default_context()
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        tls = ssl.create_default_context(
            cadata=_b64(
                cluster["certificate-authority-data"], f"{where} certificate-authority-data"
            )
        )
    elif cluster.get("certificate-authority"):
        tls = ssl.create_default_context(cafile=str(_path(base, cluster["certificate-authority"])))
    else:
        tls = ssl.create_default_context()
    written: list[str] = []  # ``*-data`` in private temp files, removed once loaded
    try:
        cert = _material(user, "client-certificate", base, source, written)
        key = _material(user, "client-key", base, source, written)
        if cert and key:
            tls.load_cert_chain(cert, key)
        elif cert or key:
            raise KubeconfigError(
                f"{source}: a client certificate needs its key (and the other way)"
            )
    finally:
        for tmp in written:
            os.unlink(tmp)
    return tls


def _material(user: dict[str, Any], name: str, base: Path, source: str, written: list[str]) -> str:
    """A PEM file's path: the ``name`` path, or ``name-data`` written to a private temp file
    (load_cert_chain reads paths only; it is added to ``written``)."""
    if user.get(f"{name}-data"):
        data = _b64(user[f"{name}-data"], f"{source}: user {name}-data")
        fd, tmp = tempfile.mkstemp(prefix="gpudra-kube-", suffix=".pem")
        written.append(tmp)
        with os.fdopen(fd, "w") as out:
            out.write(data)
        return tmp
    return str(_path(base, user[name])) if user.get(name) else ""


def _b64(value: str, what: str) -> str:
    try:
        text = base64.b64decode(value, validate=True).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise KubeconfigError(f"{what}: not base64 PEM: {exc}") from exc
    if "-----BEGIN" not in text:
        raise KubeconfigError(f"{what}: not base64 PEM (no BEGIN line)")
    return text


async def _through_kubernetes_asyncio(source: str) -> Endpoint:
    """``exec`` / ``auth-provider`` credentials: kubernetes-asyncio runs them (imported now)."""
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    await config.load_kube_config(config_file=source, client_configuration=cfg)
    host = str(cfg.host or "")
    tls: ssl.SSLContext | bool = False
    if host.startswith("https"):
        context = ssl.create_default_context(cafile=cfg.ssl_ca_cert if cfg.verify_ssl else None)
        if not cfg.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cfg.cert_file and cfg.key_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
        tls = context

    async def token() -> dict[str, str]:
        value = await cfg.get_api_key_with_prefix("BearerToken")  # "Bearer ...", refreshed
        return {"Authorization": value} if value else {}

    return Endpoint(host.rstrip("/"), tls, dynamic_headers=token)
