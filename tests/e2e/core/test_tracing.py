"""One trace per claim life, as a real Jaeger v2 shows it.

A stack with one simulated node (dgx-h100) whose every gpudra process exports
its spans to Jaeger (services/local/jaeger: built from the Go module proxy,
cached). It runs examples of examples/ (a GPU from a template, time-slicing,
MPS, a claim that cannot be satisfied) and a claim whose config the preparer
refuses (the kubelet retries it), deletes them, and asks Jaeger's query API
what an SRE would: for each claim UID, searched in any service, exactly one
trace, the claim's, holding every operation of its life with the claim's
identity, devices, GPUs, CDI ids, sharing mode and outcome, and no reference
to a span that is not in it; a failed prepare found by ``gpudra.outcome=error``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.telemetry import tracing
from services.local import REPO, demo, demoexamples, demoreport
from services.local.jaeger import Jaeger, JaegerError, build_jaeger, wait_for_trace
from services.local.pki import make_pki
from services.local.stack import Stack
from services.local.stacknodes import NodeSpec

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NODE = "gpu-node-h100"
EXAMPLES = ("01-single-gpu-template.yaml", "09-time-slicing-long.yaml", "10-mps-limits.yaml")
PENDING_EXAMPLE = "11-unsatisfiable.yaml"
SERVICES = ("gpudra-allocator", "gpudra-kubeletplugin", "gpudra-preparer")
PREPARE = "process dra.node.{node}.prepare"
UNPREPARE = "process dra.node.{node}.unprepare"
SEND = "send dra.node.{node}.prepare"
LIFE = (
    "allocator.claim.allocated",
    "allocator.claim.reserved",
    SEND,
    PREPARE,
    "send dra.node.{node}.unprepare",
    UNPREPARE,
    "allocator.claim.released",
    "allocator.claim.deleted",
)
BROKEN = """
apiVersion: v1
kind: Namespace
metadata: {name: broken-config}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: broken-config, name: bogus-sharing}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
    config:
    - requests: ["gpu"]
      opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing: {strategy: Bogus}
---
apiVersion: v1
kind: Pod
metadata: {namespace: broken-config, name: never-starts}
spec:
  containers:
  - name: c
    image: registry.k8s.io/pause:3.10
    resources:
      claims: [{name: gpu}]
  resourceClaims:
  - {name: gpu, resourceClaimName: bogus-sharing}
"""


@pytest.fixture(scope="module")
def stack(controlplane_binary: Path) -> Iterator[Stack]:
    try:
        build_jaeger()  # `make e2e` built it; without a toolchain only a cached one will do
    except JaegerError as exc:
        if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
            pytest.skip(f"no Go toolchain and no cached Jaeger binary: {exc}")
        raise
    s = Stack(
        [NodeSpec(NODE, "dgx-h100")],
        binary=controlplane_binary,
        pending_threshold=1.0,
        prepare_timeout=6.0,
        jaeger=True,
    )
    try:
        s.start()
        yield s
    finally:
        s.stop()
        s.cleanup()


def claim_uid(stack: Stack, namespace: str, pod: str | None = None, name: str = "") -> str:
    """The UID of ``name``, or of the pod's first claim."""
    if pod is not None:
        status = stack.api_get(f"/api/v1/namespaces/{namespace}/pods/{pod}")["status"]
        name = status["resourceClaimStatuses"][0]["resourceClaimName"]
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    return str(stack.api_get(path)["metadata"]["uid"])


def operations(trace: dict[str, Any]) -> list[str]:
    return [s["operationName"] for s in trace["spans"]]


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span["tags"]}


def has_life(trace: dict[str, Any]) -> bool:
    return set(LIFE) <= set(operations(trace))


def spans_named(trace: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [s for s in trace["spans"] if s["operationName"] == name]


def listed(value: Any) -> list[str]:
    """A span attribute holding a list, as Jaeger stores it (a JSON array string)."""
    return list(json.loads(value)) if isinstance(value, str) else list(value)


def assert_no_dead_links(trace: dict[str, Any]) -> None:
    ids = {s["spanID"] for s in trace["spans"]}
    for span in trace["spans"]:
        for ref in span.get("references") or []:
            assert ref["traceID"] == trace["traceID"], (span["operationName"], ref)
            assert ref["spanID"] in ids, (span["operationName"], ref)
    assert not any(s.get("warnings") for s in trace["spans"]), [
        (s["operationName"], s["warnings"]) for s in trace["spans"] if s.get("warnings")
    ]


def assert_found_by_uid_in_every_service(jaeger: Jaeger, uid: str) -> None:
    for service in SERVICES:
        found = jaeger.find(service, {tracing.ATTR_UID: uid})
        assert [t["traceID"] for t in found] == [tracing.claim_trace_hex(uid)], service


def test_one_trace_per_claim_life_in_jaeger(stack: Stack) -> None:
    jaeger = stack.jaeger
    assert jaeger is not None
    examples = [demoexamples.load_example(demoexamples.EXAMPLES_DIR / name) for name in EXAMPLES]
    pending = demoexamples.load_example(demoexamples.EXAMPLES_DIR / PENDING_EXAMPLE)
    demo.apply_examples(stack, [*examples, pending])
    stack.cp.apply(BROKEN)
    result = demo.wait_for_examples(stack, [*examples, pending], timeout=90)
    assert result.ok, demoreport.describe_result(result, [*examples, pending])

    uids = {
        "single-gpu": claim_uid(stack, "single-gpu", pod="cuda"),
        "time-slicing": claim_uid(stack, "time-slicing", pod="batch"),
        "mps": claim_uid(stack, "mps", pod=examples[2].pods[0].name),
    }
    broken = claim_uid(stack, "broken-config", name="bogus-sharing")
    unsatisfiable = claim_uid(stack, "unsatisfiable", name="two-big-gpus")

    # The refused config: the kubelet retries; every attempt is in the claim's one trace.
    failed = wait_for_trace(
        jaeger,
        tracing.claim_trace_hex(broken),
        lambda t: len(spans_named(t, PREPARE)) >= 2,
        timeout=90,
    )
    for span in spans_named(failed, PREPARE):
        assert tags(span)[tracing.ATTR_OUTCOME] == "error"
        assert tags(span).get("error") is True or tags(span).get("otel.status_code") == "ERROR"
    errors = jaeger.find("gpudra-preparer", {tracing.ATTR_OUTCOME: "error"})
    assert tracing.claim_trace_hex(broken) in {t["traceID"] for t in errors}
    assert not {tracing.claim_trace_hex(u) for u in uids.values()} & {t["traceID"] for t in errors}

    # The pending claim: its explanation is a span event in its own trace.
    waiting = wait_for_trace(
        jaeger,
        tracing.claim_trace_hex(unsatisfiable),
        lambda t: bool(spans_named(t, "allocator.explain")),
    )
    explain = spans_named(waiting, "allocator.explain")[0]
    assert tags(explain)[tracing.ATTR_OUTCOME] == "pending"
    [event] = [log for log in explain["logs"] if {"key": "event", "type": "string",
               "value": "pending"} in log["fields"]]  # fmt: skip
    fields = {f["key"]: f["value"] for f in event["fields"]}
    assert "needs 2, 0 candidate device(s)" in fields["gpudra.pending.message"]
    assert fields["gpudra.pending.reason"] == "Unschedulable"

    # The whole life: delete them, then every operation is in each claim's trace.
    for namespace in ("single-gpu", "time-slicing", "mps", "broken-config"):
        stack.cp.kubectl("delete", "namespace", namespace, "--wait=false")
    sharing = {"single-gpu": "Exclusive", "time-slicing": "TimeSlicing", "mps": "MPS"}
    for example, uid in uids.items():
        trace = wait_for_trace(jaeger, tracing.claim_trace_hex(uid), has_life, timeout=90)
        assert_no_dead_links(trace)
        assert_found_by_uid_in_every_service(jaeger, uid)
        services = {trace["processes"][s["processID"]]["serviceName"] for s in trace["spans"]}
        assert set(SERVICES) <= services, example
        for span in trace["spans"]:
            if span["operationName"] in LIFE:
                t = tags(span)
                assert t[tracing.ATTR_UID] == uid, span["operationName"]
                assert t[tracing.ATTR_NAMESPACE] == example, span["operationName"]
                assert t[tracing.ATTR_NODE] == NODE, span["operationName"]
                assert t[tracing.ATTR_OUTCOME] == "ok", span["operationName"]
        [prepared] = spans_named(trace, PREPARE)
        t = tags(prepared)
        devices = listed(t[tracing.ATTR_DEVICES])
        assert len(devices) == 1 and devices[0].startswith("gpu-"), t
        assert listed(t[tracing.ATTR_CDI_IDS]) == [f"k8s.gpu.nvidia.com/claim={uid}-{devices[0]}"]
        assert len(listed(t[tracing.ATTR_GPU_UUIDS])) == 1
        assert t[tracing.ATTR_SHARING] == sharing[example]
        allocated = tags(spans_named(trace, "allocator.claim.allocated")[0])
        assert listed(allocated[tracing.ATTR_GPU_UUIDS]) == listed(t[tracing.ATTR_GPU_UUIDS])
        [send] = spans_named(trace, SEND)
        assert listed(tags(send)[tracing.ATTR_CDI_IDS]) == listed(t[tracing.ATTR_CDI_IDS])
        assert prepared["references"][0]["spanID"] == send["spanID"]  # client -> server
        assert tags(send)["messaging.system"] == "nats"
        assert tags(send)["span.kind"] == "client" and tags(prepared)["span.kind"] == "server"

    # Discovery's scans and the publisher's syncs are traces of their own.
    [scan] = [
        s for t in jaeger.find("gpudra-discovery") for s in t["spans"]
        if s["operationName"] == "discovery.scan"
    ][:1]  # fmt: skip
    assert tags(scan)[tracing.ATTR_NODE] == NODE and tags(scan)["gpudra.gpus"] == 8
    synced = [
        tags(s) for t in jaeger.find("gpudra-publisher") for s in t["spans"]
        if s["operationName"] == "publisher.reconcile"
    ]  # fmt: skip
    assert any(t.get("gpudra.slices.created", 0) > 0 for t in synced), synced

    # The allocator's lifecycle log lines carry the claim's trace id.
    lines = [
        json.loads(line)
        for line in (stack.logs_dir / "allocator.log").read_text().splitlines()
        if line.startswith("{") and '"claim event"' in line
    ]
    assert lines and all(line["trace_id"] == tracing.claim_trace_hex(line["uid"]) for line in lines)


SEND_ONE_SPAN = """
from services.core.telemetry import tracing
assert tracing.setup("envcheck")
with tracing.claim_span(tracing.tracer("t"), "envcheck", "uid-of-{case}"):
    pass
tracing.shutdown()
"""


@pytest.mark.parametrize("case", ["grpc", "http/protobuf", "grpc-tls"])
def test_standard_otel_variables_reach_a_real_jaeger(tmp_path: Path, case: str) -> None:
    """A process configured only by OTEL_* variables (protocol, endpoint, headers, a TLS
    CA) exports to Jaeger; the span is found in the claim's trace."""
    try:
        build_jaeger()
    except JaegerError as exc:
        pytest.skip(f"no Jaeger binary: {exc}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    tls = None
    if case == "grpc-tls":
        make_pki(tmp_path / "pki")
        tls = (tmp_path / "pki" / "apiserver.crt", tmp_path / "pki" / "apiserver.key")
        env["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"] = str(tmp_path / "pki" / "ca.crt")
    with Jaeger(tmp_path / "jaeger", tls=tls) as jaeger:
        http = case == "http/protobuf"
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = jaeger.otlp_http if http else jaeger.otlp_grpc
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf" if http else "grpc"
        env["OTEL_EXPORTER_OTLP_HEADERS"] = "x-gpudra-test=1"
        code = SEND_ONE_SPAN.format(case=case)
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        trace = wait_for_trace(
            jaeger, tracing.claim_trace_hex(f"uid-of-{case}"), lambda t: True, timeout=30
        )
        assert operations(trace) == ["envcheck"]
        assert trace["processes"][trace["spans"][0]["processID"]]["serviceName"] == (
            "gpudra-envcheck"
        )


def test_an_unknown_otlp_protocol_stops_a_service_with_the_variable_named(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "udp",
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "discovery", "--node-name", "n1",
         "--fleet", "dgx-h100"],
        env=env, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in done.stderr and "'udp'" in done.stderr
