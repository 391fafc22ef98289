"""What `kubectl create` says when `gpudra webhook` refuses, behind a real kube-apiserver.

The API server calls the webhook by URL (services.local.admission) and turns its
answer into the user's error. An answer that is not an AdmissionReview (an HTTP
400 with text) reaches the user as "failed calling webhook ...: the server
rejected our request for an unknown reason": the webhook's reason is lost. So a
claim nested 4,000 deep (8 KB, which the API server stores) once came back with no
reason at all; the webhook now answers it with a denial that names the claim,
the config and why. Skipped where the control plane cannot be built.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.local import admission
from services.local.cluster import ControlPlane
from services.local.ports import free_port
from tests.helpers import badconfigs

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
REPO = Path(__file__).resolve().parents[3]
NS = "team"


def _wait_ready(proc: subprocess.Popen[bytes], port: int, ca: Path, log: Path) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "webhook not ready in 60 s"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(
    controlplane_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("webhook")
    certs = admission.issue(workdir)
    port = free_port()
    log = workdir / "webhook.log"
    argv = [sys.executable, "-m", "services.cli", "webhook", "--cert-file", str(certs.cert),
            "--key-file", str(certs.key), "--port", str(port),
            "--feature-gates", badconfigs.GATES]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, port, certs.ca, log)
        with ControlPlane(controlplane_binary) as cp:
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            url = f"https://127.0.0.1:{port}{admission.PATH}"
            cp.apply(admission.configuration(url, certs.ca.read_bytes()))
            yield cp
        assert proc.poll() is None, "the webhook died:\n" + log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def create(cp: ControlPlane, text: str) -> subprocess.CompletedProcess[str]:
    """``kubectl create`` as a user would run it: its exit status and what it printed."""
    argv = [*cp.command("kubectl"), "--kubeconfig", str(cp.kubeconfig), "create", "-f", "-"]
    return subprocess.run(argv, input=text, capture_output=True, text=True, timeout=60)


def test_a_claim_nested_4000_deep_is_refused_with_its_reason(cluster: ControlPlane) -> None:
    params = {"apiVersion": badconfigs.API, "kind": "GpuConfig", "deep": "DEEP"}
    text = json.dumps(badconfigs.claim(NS, "deep", params))
    text = text.replace('"DEEP"', "[" * 4000 + "]" * 4000)  # json.dumps would recurse
    done = create(cluster, text)
    assert done.returncode != 0
    assert "unknown reason" not in done.stderr, done.stderr
    assert (
        f"ResourceClaim {NS}/deep: config[0] (FromClaim): nested too deeply to read "
        "(more than about 1,000 levels)"
    ) in done.stderr, done.stderr
    assert cluster.get("resourceclaim", "deep", NS) is None


def test_a_refused_config_reaches_kubectl_with_the_field(cluster: ControlPlane) -> None:
    name, params, words = badconfigs.BAD[0]
    done = create(cluster, json.dumps(badconfigs.claim(NS, name, params)))
    assert done.returncode != 0 and words in done.stderr, done.stderr
