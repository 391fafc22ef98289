"""The claim event trail survives the bus going away: the nats-server is killed while
the examples are being allocated and prepared, started again on its store, and
``gpudra audit --verify`` still finds every claim's trail complete (no event lost,
none out of order), the pending claim's closed by its deletion."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.local import demo, demoexamples
from services.local.stack import Stack
from tests.helpers.stackrun import started_stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def stack(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Stack]:
    s = Stack(binary=controlplane_binary, pending_threshold=1.0)
    with started_stack(request, s):
        yield s


def claims_allocated(stack: Stack, want: int) -> bool:
    listing = stack.api_get("/apis/resource.k8s.io/v1/resourceclaims")
    done = [c for c in listing["items"] if (c.get("status") or {}).get("allocation")]
    return len(done) >= want


def test_no_event_is_lost_when_the_nats_server_restarts_mid_demo(stack: Stack) -> None:
    examples = demoexamples.gpu_only(
        demoexamples.load_examples()
    )  # the two GPU demo nodes: no GB200
    demo.apply_examples(stack, examples)
    # Mid-demo: some claims allocated (their events on the bus), most pods not started.
    stack.wait_for(lambda: claims_allocated(stack, 2), "two claims allocated", timeout=120)
    stack.nats.kill()
    stack.nats.start()  # same port, same store: JetStream recovers the streams
    result = demo.wait_for_examples(stack, examples, timeout=240)
    assert result.ok, [
        (p.pod.namespace, p.pod.name, p.phase, p.problems) for p in result.pods if not p.ok
    ]
    assert stack.dead() == []  # every service rode out the restart
    demo.delete_examples(stack, examples, timeout=240)
    complete, said = demo.verify_trail(stack, wait=60.0)
    assert complete, "\n".join(said)
    assert f"{len(examples)} claims complete, 0 incomplete, 0 unreadable" in said[0], said

    # The trail of the pending claim: explained once per reason, closed by its deletion.
    argv = [sys.executable, "-m", "services.cli",
            *demo.audit_argv(stack, "--namespace", "unsatisfiable")[1:]]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, check=True)
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert [e["event"] for e in events][-1] == "deleted"
    pending = [e for e in events if e["event"] == "pending"]
    assert pending and len({e["error"] for e in pending}) == len(pending)  # each one news


def test_events_name_who_which_hardware_and_for_whom(stack: Stack) -> None:
    wanted = {
        "01-single-gpu-template.yaml",
        "07-mig-four-slices-one-gpu.yaml",
        "08-vfio-kubevirt.yaml",
    }
    examples = [e for e in demoexamples.load_examples() if e.name in wanted]
    assert len(examples) == len(wanted)
    demo.apply_examples(stack, examples)
    assert demo.wait_for_examples(stack, examples, timeout=240).ok

    def trail() -> list[dict[str, Any]] | None:
        """Every event, once each reserved claim's prepared event is stored (the preparer
        sends it after the kubelet's answer)."""
        argv = [sys.executable, "-m", "services.cli", *demo.audit_argv(stack)[1:]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
        events = [json.loads(line) for line in done.stdout.splitlines()]
        reserved = {e["claim"]["uid"] for e in events if e["event"] == "reserved"}
        prepared = {e["claim"]["uid"] for e in events if e["event"] == "prepared"}
        return events if reserved and reserved == prepared else None

    events: list[dict[str, Any]] = stack.wait_for(trail, "every claim's prepared event", timeout=60)
    assert len({e["claim"]["uid"] for e in events}) == len(examples)
    for event in events:
        assert event["instance"] and event["seq"] >= 1, event
        if event["event"] in ("allocated", "prepared"):
            assert event["devices"], event
            for device in event["devices"]:
                assert device["gpu_uuid"].startswith("GPU-"), event
                assert device["pci_bus_id"] or event["event"] == "allocated", event
                if "-mig-" in device["device"]:
                    assert device["uuid"].startswith("MIG-"), event
        if event["event"] == "prepared":
            assert all(d["cdi_device_ids"] for d in event["devices"]), event
        if event["event"] == "reserved":
            assert [p["resource"] for p in event["pods"]] == ["pods"], event
            assert event["pods"][0]["name"] and event["pods"][0]["uid"], event
