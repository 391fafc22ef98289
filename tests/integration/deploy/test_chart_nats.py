"""The chart's NATS configuration, rendered by real helm and run by the real nats-server.

tests/unit/deploy/test_deploy_chart.py reads the templates as text; this renders them
(``helm template``) and starts nats-server with the rendered ``nats.conf``, its
included ``nats-auth.conf`` and the chart-made certificate, with only the paths
and ports moved to a temporary directory and free 127.0.0.1 ports. helm is the one
services/local/helm/build.sh builds (tests/helpers/helm.py).
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from services.core.bus import natsjwt
from services.core.bus.natsauth import new_seed, public_key
from services.local.natsserver import server_binary
from services.local.ports import free_port
from tests.helpers.helm import helm, one
from tests.helpers.natsauth import wait_for

NS = "gpu-system"


def _render(home: Path) -> list[dict[str, Any]]:
    return helm(home).template(namespace=NS)


@pytest.fixture
def rendered_server(tmp_path: Path) -> Iterator[tuple[int, Path, Path]]:
    """nats-server running the rendered configuration: (client port, CA file, log)."""
    docs = _render(tmp_path / "helm")
    config = one(docs, "ConfigMap", "gpudra-nats")["data"]
    secret = one(docs, "Secret", "gpudra-nats-tls")["data"]
    for key, value in secret.items():
        (tmp_path / key).write_bytes(base64.b64decode(value))
    port = free_port()
    moved = {
        "/etc/nats-tls": str(tmp_path),
        "/data": str(tmp_path / "js"),
        "0.0.0.0:4222": f"127.0.0.1:{port}",
        "0.0.0.0:6222": f"127.0.0.1:{free_port()}",
        "127.0.0.1:8222": f"127.0.0.1:{free_port()}",
    }
    conf = config["nats.conf"]
    for old, new in moved.items():
        assert old in conf
        conf = conf.replace(old, new)
    (tmp_path / "nats.conf").write_text(conf)
    (tmp_path / "nats-auth.conf").write_text(config["nats-auth.conf"])
    env = {
        **os.environ,
        "POD_NAME": "gpudra-nats-0",
        "GPUDRA_NATS_AUTH_ISSUER": natsjwt.Signer(natsjwt.new_account_seed()).public_key,
        "GPUDRA_NATS_AUTH_USER": public_key(new_seed()),
    }
    log = tmp_path / "nats.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [server_binary(), "-c", str(tmp_path / "nats.conf")],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: "Listening for client connections" in log.read_text(), 20, "nats-server")
        yield port, tmp_path / "ca.crt", log
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_rendered_config_runs_with_tls_for_the_service_name_and_the_callout(
    rendered_server: tuple[int, Path, Path],
) -> None:
    port, ca, log = rendered_server
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        info = raw.makefile("rb").readline()
        assert b'"tls_required":true' in info and b'"auth_required":true' in info
        with context.wrap_socket(raw, server_hostname=f"gpudra-nats.{NS}.svc") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    assert "[FTL]" not in log.read_text()


def test_the_chart_made_certificate_names_the_service_and_every_peer(tmp_path: Path) -> None:
    docs = _render(tmp_path)
    cert = x509.load_pem_x509_certificate(
        base64.b64decode(one(docs, "Secret", "gpudra-nats-tls")["data"]["tls.crt"])
    )
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    assert {f"gpudra-nats.{NS}.svc", f"*.gpudra-nats-headless.{NS}.svc"} <= dns
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in usages  # routes present it as clients
