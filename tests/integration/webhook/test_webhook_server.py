"""The real `gpudra webhook` process over TLS: verdicts, bad requests, certificates.

Every bad request gets its own specific HTTP error and the process keeps
serving; a certificate that has expired stops it before it listens, saying so.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.local import admission
from services.local.ports import free_port
from tests.helpers import badconfigs

REPO = Path(__file__).resolve().parents[3]


def command(certs: admission.Certs, port: int) -> list[str]:
    return [
        sys.executable, "-m", "services.cli", "webhook",
        "--cert-file", str(certs.cert), "--key-file", str(certs.key),
        "--port", str(port), "--feature-gates", badconfigs.GATES,
    ]  # fmt: skip


class Client:
    def __init__(self, port: int, ca: Path) -> None:
        self.base = f"https://127.0.0.1:{port}"
        self.ctx = ssl.create_default_context(cafile=str(ca))

    def call(
        self, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> tuple[int, str]:
        request = urllib.request.Request(
            self.base + path, data=body, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.ctx) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Client]:
    certs = admission.issue(tmp_path)
    port = free_port()
    log = open(tmp_path / "webhook.log", "wb")
    proc = subprocess.Popen(command(certs, port), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    client = Client(port, certs.ca)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "webhook.log").read_text()
            try:
                if client.call("/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "webhook not ready in 60 s"
            time.sleep(0.1)
        yield client
        assert proc.poll() is None, "the webhook died"
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


def review(obj: dict[str, Any]) -> bytes:
    version = obj["apiVersion"].split("/")[1]
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "7c9e",
                "kind": {"group": "resource.k8s.io", "version": version, "kind": obj["kind"]},
                "operation": "CREATE",
                "namespace": obj["metadata"]["namespace"],
                "name": obj["metadata"]["name"],
                "object": obj,
            },
        }
    ).encode()


def test_verdicts_and_bad_requests(webhook: Client) -> None:
    path = "/validate-resource-claim-parameters"
    name, params, words = badconfigs.BAD[2]
    status, text = webhook.call(path, review(badconfigs.claim("team", name, params, "v1beta1")))
    assert status == 200
    answer = json.loads(text)["response"]
    assert answer["uid"] == "7c9e" and answer["allowed"] is False
    assert words in answer["status"]["message"] and answer["status"]["code"] == 422

    good = {"apiVersion": badconfigs.API, "kind": "GpuConfig"}
    status, text = webhook.call(path, review(badconfigs.claim("team", "ok", good)))
    assert status == 200 and json.loads(text)["response"] == {"uid": "7c9e", "allowed": True}

    assert webhook.call(path, b"{}", "text/plain") == (
        415,
        "content type text/plain; expected application/json\n",
    )
    status, text = webhook.call(path, b"{broken")
    assert status == 400 and text.startswith("body is not JSON")
    status, text = webhook.call(path, b'{"apiVersion": "v1", "kind": "Pod"}')
    assert status == 400 and "unsupported review v1/Pod" in text
    status, text = webhook.call(path, b"x" * (5 * 2**20))
    assert status == 413
    # Still serving after all of that.
    assert webhook.call("/readyz") == (200, "ok\n")


def test_an_expired_certificate_stops_it_before_it_listens(tmp_path: Path) -> None:
    past = dt.datetime(2021, 3, 1, tzinfo=dt.UTC)
    certs = admission.issue(tmp_path, not_before=past, not_after=past + dt.timedelta(days=90))
    proc = subprocess.run(
        command(certs, free_port()), cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert f"gpudra webhook: serving certificate {certs.cert} expired at 2021-05-30" in proc.stderr
