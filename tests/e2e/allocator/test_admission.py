"""Admission and extended resources against the real kube-apiserver and scheduler.

One stack (services.local.stack) with `gpudra webhook` behind a
ValidatingWebhookConfiguration (URL + caBundle), resource.k8s.io v1beta1 and
v1beta2 served beside v1, and Kubernetes' ``DRAExtendedResource`` gate on in
the API server, scheduler, controller manager and kubelet-dra.

- Each of ten bad opaque configs is refused by ``kubectl apply`` with a message
  naming the claim, the config index, the field and the request; then, the
  webhook configuration deleted, the same ten claims are admitted and each pod
  is refused by the preparer with the same words.
- A pod asking ``nvidia.com/gpu: 2`` in its limits (no resourceClaims) runs with
  two GPUs from our slices; the claim the scheduler made for it has the same
  event trail (allocated, reserved, prepared) and trace (in Jaeger, its id
  derived from the claim UID) as any other claim.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.model.schemas import ClaimEvent, decode
from services.core.telemetry import tracing
from services.local import admission
from services.local.jaeger import JaegerError, build_jaeger, wait_for_trace
from services.local.stack import DEMO_KUBE_GATES, Stack
from tests.helpers import badconfigs
from tests.helpers.bus import connect
from tests.helpers.stackrun import started_stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NS = "admission"
CDI_KIND = "k8s.gpu.nvidia.com/claim"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Stack]:
    try:
        build_jaeger()  # `make e2e` built it; without a toolchain only a cached one will do
    except JaegerError as exc:
        if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
            pytest.skip(f"no Go toolchain and no cached Jaeger binary: {exc}")
        raise
    s = Stack(
        binary=controlplane_binary,
        webhook=True,
        kube_feature_gates=DEMO_KUBE_GATES,
        jaeger=True,
        pending_threshold=1.0,
        prepare_timeout=6.0,
    )
    s.cp.runtime_config.update({"resource.k8s.io/v1beta1": True, "resource.k8s.io/v1beta2": True})
    with started_stack(request, s):
        s.cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield s


def kubectl_apply(stack: Stack, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *stack.cp.command("kubectl"),
            "--kubeconfig",
            str(stack.cp.kubeconfig),
            "apply",
            "-f",
            "-",
        ],
        input=json.dumps(obj),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": NS, "name": name},
        "spec": {
            "containers": [
                {"name": "ctr", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def admitted(stack: Stack, obj: dict[str, Any]) -> bool:
    return kubectl_apply(stack, obj).returncode == 0


def prepare_failure(stack: Stack, name: str) -> str:
    """The message of the pod's ResourcesPrepared=False condition (kubelet-dra), if any."""
    got = stack.cp.kubectl_json("get", "pod", "-n", NS, name)
    for cond in got["status"].get("conditions", []):
        if cond["type"] == "gpudra.dev/ResourcesPrepared" and cond["status"] == "False":
            return str(cond.get("message", ""))
    return ""


#: Every served version of resource.k8s.io is judged: the cases spread over them.
VERSIONS = ["v1", "v1beta2", "v1beta1", "v1", "v1beta2", "v1beta1", "v1", "v1", "v1", "v1"]
CASES = [(*case, version) for case, version in zip(badconfigs.BAD, VERSIONS, strict=True)]
DENIALS: dict[str, str] = {}  # case -> the field-specific part of the denial


@pytest.mark.parametrize(("name", "params", "words", "version"), CASES, ids=[c[0] for c in CASES])
def test_kubectl_apply_of_a_bad_config_is_refused_at_admission(
    stack: Stack, name: str, params: dict[str, Any], words: str, version: str
) -> None:
    proc = kubectl_apply(stack, badconfigs.claim(NS, f"bad-{name}", params, version))
    assert proc.returncode != 0, proc.stdout
    prefix = (
        f'admission webhook "{admission.WEBHOOK}" denied the request: '
        f"ResourceClaim {NS}/bad-{name}: 1 config failed to validate: config[0] (FromClaim)"
    )
    assert prefix in proc.stderr, proc.stderr
    assert words in proc.stderr and proc.stderr.rstrip().endswith("(requests: gpu)")
    detail = proc.stderr.split(prefix, 1)[1].rstrip().removesuffix(" (requests: gpu)")
    DENIALS[name] = "config[0] (FromClaim)" + detail
    assert stack.cp.kubectl("get", "resourceclaim", "-n", NS, f"bad-{name}", check=False) == ""


def test_a_bad_template_is_refused_too(stack: Stack) -> None:
    inner = badconfigs.claim(NS, "t", badconfigs.BAD[0][1])
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": NS, "name": "bad-template"},
        "spec": {"spec": inner["spec"]},
    }
    proc = kubectl_apply(stack, template)
    assert proc.returncode != 0
    assert f"ResourceClaimTemplate {NS}/bad-template: 1 config failed" in proc.stderr


def test_good_claims_are_admitted(stack: Stack) -> None:
    good = {"apiVersion": badconfigs.API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    for version in ("v1", "v1beta2", "v1beta1"):
        proc = kubectl_apply(stack, badconfigs.claim(NS, f"good-{version}", good, version))
        assert proc.returncode == 0, proc.stderr
    stack.cp.kubectl("delete", "resourceclaims", "-n", NS, "--all", "--wait=false")


def test_with_the_webhook_off_the_preparer_refuses_the_same_ten_in_the_same_words(
    stack: Stack,
) -> None:
    assert len(DENIALS) == len(badconfigs.BAD), "the admission tests run first"
    stack.cp.kubectl("delete", "validatingwebhookconfiguration", admission.NAME)
    for name, params, _ in badconfigs.BAD:
        bad = badconfigs.claim(NS, f"bad-{name}", params)
        wait(
            functools.partial(admitted, stack, bad),
            f"claim bad-{name} admitted once the webhook configuration is gone",
        )
        stack.cp.apply(pod(f"pod-{name}", f"bad-{name}"))
    for name, _, _ in badconfigs.BAD:
        message = wait(
            functools.partial(prepare_failure, stack, f"pod-{name}"),
            f"pod-{name} refused at prepare",
        )
        assert DENIALS[name] in message, (DENIALS[name], message)
    stack.cp.kubectl("delete", "pods", "-n", NS, "--all", "--wait=false")


def claim_events(stack: Stack, uid: str) -> list[ClaimEvent]:
    async def read() -> list[ClaimEvent]:
        bus = await connect(stack.nats, Role.AUDITOR, name="e2e-admission")
        try:
            sub = await bus.js.subscribe(
                subjects.claim_events_all(), stream=subjects.CLAIMS_STREAM, ordered_consumer=True
            )
            found: list[ClaimEvent] = []
            while True:
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except nats.errors.TimeoutError:
                    return found
                event = decode(msg.data, ClaimEvent)
                if event.claim.uid == uid:
                    found.append(event)
        finally:
            await bus.close()

    return asyncio.run(read())


def test_a_device_plugin_style_pod_gets_two_gpus_from_our_slices(stack: Stack) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": NS, "name": "two-gpus"},
        "spec": {
            "containers": [
                {
                    "name": "ctr",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }
            ]
        },
    }
    stack.cp.apply(manifest)

    def running() -> Any:
        got = stack.cp.kubectl_json("get", "pod", "-n", NS, "two-gpus")
        return got if got["status"].get("phase") == "Running" else None

    got = wait(running, "the nvidia.com/gpu: 2 pod Running")
    extended = got["status"]["extendedResourceClaimStatus"]
    assert extended["requestMappings"] == [
        {
            "containerName": "ctr",
            "requestName": "container-0-request-0",
            "resourceName": "nvidia.com/gpu",
        }
    ]
    claim = stack.cp.kubectl_json("get", "resourceclaim", "-n", NS, extended["resourceClaimName"])
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and {r["driver"] for r in results} == {"gpu.nvidia.com"}
    node = got["spec"]["nodeName"]
    assert {r["pool"] for r in results} == {node}
    ours = {d["name"] for s in stack.slices(node) for d in s["spec"].get("devices", [])}
    assert {r["device"] for r in results} <= ours
    uid = claim["metadata"]["uid"]
    cdi = json.loads(got["metadata"]["annotations"]["gpudra.dev/cdi-devices"])
    assert sorted(cdi["ctr"]) == sorted(f"{CDI_KIND}={uid}-{r['device']}" for r in results)

    # Audited and traced like any other claim: its trail, in its own trace.
    events = wait(
        lambda: (
            (found := claim_events(stack, uid))
            and {"allocated", "reserved", "prepared"} <= {e.event for e in found}
            and found
        ),
        "the extended-resource claim's trail",
    )
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    trace_hex = tracing.claim_trace_hex(uid)
    assert {e.trace_id for e in events if e.trace_id} == {trace_hex}
    assert stack.jaeger is not None
    wanted = {
        "allocator.claim.allocated",
        "allocator.claim.reserved",
        "process dra.node.{node}.prepare",  # the span name is the subject pattern
    }
    trace = wait_for_trace(
        stack.jaeger, trace_hex, lambda t: wanted <= {s["operationName"] for s in t["spans"]}
    )
    assert trace["traceID"] == trace_hex
    prepared = next(e for e in events if e.event == "prepared")
    assert prepared.node == node and sorted(d.device for d in prepared.devices) == sorted(
        r["device"] for r in results
    )


def test_a_device_plugin_style_pod_that_cannot_fit_is_explained_on_the_pod(stack: Stack) -> None:
    """Nine GPUs on no node: the scheduler makes no claim; gpudra explains the one it would."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": NS, "name": "nine-gpus"},
        "spec": {
            "containers": [
                {
                    "name": "ctr",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "9"}},
                }
            ]
        },
    }
    stack.cp.apply(manifest)

    def explanation() -> str:
        events = stack.cp.kubectl_json("get", "events", "-n", NS)["items"]
        for event in events:
            involved = event["involvedObject"]
            if (involved.get("kind"), involved.get("name")) == ("Pod", "nine-gpus") and (
                event.get("source") or {}
            ).get("component") == "gpudra-allocator":
                return str(event["message"])
        return ""

    message = wait(explanation, "gpudra's explanation on the nine-GPU pod")
    assert message.startswith(
        "extended resources (as the scheduler's claim nine-gpus-extended-resources would ask them):"
    ), message
    assert "container-0-request-0" in message, message
    got = stack.cp.kubectl_json("get", "pod", "-n", NS, "nine-gpus")
    assert not got["spec"].get("nodeName") and "extendedResourceClaimStatus" not in got["status"]
