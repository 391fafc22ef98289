"""Reading a kubeconfig without the Kubernetes client library: what each field gives."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.core.kube import kubeconfig
from services.core.kube.kubeconfig import KubeconfigError


def write(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "other", "cluster": {"server": "https://wrong"}},
                     {"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed CA, a client certificate and its key (openssl)."""
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=test", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return d


async def test_token_and_server_of_the_current_context(tmp_path: Path) -> None:
    path = write(tmp_path, {"server": "http://127.0.0.1:6443/"}, {"token": "abc"})
    endpoint = await kubeconfig.load(path)
    assert endpoint.server == "http://127.0.0.1:6443"
    assert endpoint.ssl is False
    assert await endpoint.headers() == {"Authorization": "Bearer abc"}


async def test_ca_file_client_certificate_data_and_token_file(
    tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client key and certificate are loaded from private temp files that are gone
    once loaded: a key left in /tmp outlives the process (one per process had been)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    (tmp_path / "token").write_text("from-file\n")
    cert = base64.b64encode((pki / "cert.pem").read_bytes()).decode()
    key = base64.b64encode((pki / "key.pem").read_bytes()).decode()
    cluster = {"server": "https://127.0.0.1:6443", "certificate-authority": str(pki / "cert.pem")}
    user = {"client-certificate-data": cert, "client-key-data": key, "tokenFile": "token"}
    endpoint = await kubeconfig.load(write(tmp_path, cluster, user))
    assert isinstance(endpoint.ssl, ssl.SSLContext)
    assert endpoint.ssl.verify_mode == ssl.CERT_REQUIRED
    assert len(endpoint.ssl.get_ca_certs()) == 1
    assert await endpoint.headers() == {"Authorization": "Bearer from-file"}  # relative path
    assert list(temp.iterdir()) == []
    with pytest.raises(KubeconfigError, match="needs its key"):
        await kubeconfig.load(write(tmp_path, cluster, {"client-certificate-data": cert}))
    assert list(temp.iterdir()) == []


async def test_insecure_and_basic_auth(tmp_path: Path) -> None:
    cluster = {"server": "https://h", "insecure-skip-tls-verify": True}
    endpoint = await kubeconfig.load(write(tmp_path, cluster, {"username": "a", "password": "b"}))
    assert isinstance(endpoint.ssl, ssl.SSLContext) and endpoint.ssl.verify_mode == ssl.CERT_NONE
    assert endpoint.static_headers == {"Authorization": "Basic YTpi"}


@pytest.mark.parametrize(
    ("cluster", "user", "message"),
    [
        ({}, {"token": "t"}, "cluster 'c' has no server"),
        ({"server": "https://h"}, {"client-key": "k.pem"}, "client certificate needs its key"),
        ({"server": "https://h", "certificate-authority-data": "%%"}, {}, "not base64 PEM"),
    ],
)
async def test_what_is_wrong_is_named(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], message: str
) -> None:
    with pytest.raises(KubeconfigError, match=message):
        await kubeconfig.load(write(tmp_path, cluster, user))
    with pytest.raises(KubeconfigError, match=r"[Nn]o such file"):
        await kubeconfig.load(str(tmp_path / "absent"))


async def test_in_cluster_uses_the_service_account_and_rereads_its_token(
    tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ca.crt").write_bytes((pki / "cert.pem").read_bytes())
    (tmp_path / "token").write_text("one")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    endpoint = kubeconfig.in_cluster(tmp_path, env)
    assert endpoint.server == "https://10.0.0.1:443"
    assert await endpoint.headers() == {"Authorization": "Bearer one"}
    (tmp_path / "token").write_text("two")  # rotated
    monkeypatch.setattr(kubeconfig, "TOKEN_REREAD_S", 0.0)
    endpoint = kubeconfig.in_cluster(tmp_path, env)
    await endpoint.headers()
    (tmp_path / "token").write_text("three")
    assert await endpoint.headers() == {"Authorization": "Bearer three"}
    with pytest.raises(KubeconfigError, match="not in a pod"):
        kubeconfig.in_cluster(tmp_path, {})


def test_no_process_imports_the_kubernetes_client_for_a_plain_kubeconfig(tmp_path: Path) -> None:
    path = write(tmp_path, {"server": "http://127.0.0.1:1"}, {"token": "t"})
    code = (
        "import asyncio, sys\n"
        "from services.core.kube import client as kube\n"
        f"api = asyncio.run(kube.http_api({path!r}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('kubernetes')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True,
        cwd=Path(__file__).resolve().parents[3],
    ).stdout  # fmt: skip
    assert out.strip() == "[]"
