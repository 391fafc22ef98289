"""The claim watcher (`gpudra allocator`) against the real API server and scheduler.

kube-scheduler allocates a claim from a ResourceSlice of our driver and
reserves it for a pod; the watcher, as its own process, must publish
``allocated`` and ``reserved`` to the CLAIMS stream and put the claim into the
``claims`` bucket; after the pod goes, ``released``; a claim deleted while the
watcher was down is reported ``deleted`` on restart and leaves the bucket. An
unsatisfiable claim with a waiting pod gets our explanation as one Kubernetes
Event, updated (count) rather than duplicated.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.kube.resource import ResourceClaim
from services.core.model.schemas import ClaimEvent
from services.local.cluster import ControlPlane
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect
from tests.helpers.events import stored_claim_events

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[3]
DRIVER = "gpu.nvidia.com"
NODE = "e2e-node-1"
THRESHOLD_S = 2.0


class Watcher:
    """``gpudra allocator`` as a process, stopped by PID."""

    def __init__(self, cp: ControlPlane, nats: NatsServer, log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                [
                    sys.executable, "-m", "services.cli", "allocator",
                    "--kubeconfig", str(cp.kubeconfig),
                    *nats.client_argv(Role.ALLOCATOR),
                    "--pending-threshold", f"{THRESHOLD_S}s",
                    "--log-level", "debug",
                ],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
        try:
            return self.popen.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            return self.popen.wait()


class Recorder:
    """Every ClaimEvent of one namespace, as a core subscriber sees the stream's subjects."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.events: list[tuple[str, ClaimEvent]] = []

    async def on_event(self, event: ClaimEvent, headers: dict[str, str]) -> None:
        if event.claim.namespace == self.namespace:
            self.events.append((event.event, event))

    def names(self, uid: str) -> list[str]:
        return [name for name, e in self.events if e.claim.uid == uid]


async def stored_names(bus: Bus, uid: str) -> list[str]:
    """The claim's events as the CLAIMS stream holds them.

    The watcher awaits the stream's ack for every event before it logs "claim
    watcher synced", so after that line this is complete: no waiting needed to
    prove that a restart published nothing again.
    """
    return [e.event for e in await stored_claim_events(bus) if e.claim.uid == uid]


async def eventually(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    client = await connect(nats_server, name="e2e-allocator")
    try:
        yield client
    finally:
        await client.close()


def _class_and_slice(suffix: str, devices: int) -> list[dict[str, Any]]:
    selector = (
        # Other tests' devices share the session's cluster and lack the attribute: an
        # unguarded lookup would be a CEL runtime error that aborts every allocation.
        f'device.driver == "{DRIVER}" && "watcherTest" in device.attributes["{DRIVER}"] && '
        f'device.attributes["{DRIVER}"].watcherTest == "{suffix}"'
    )
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"watcher-{suffix}"},
            "spec": {"selectors": [{"cel": {"expression": selector}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"watcher-{suffix}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": f"{NODE}-{suffix}", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": f"gpu-{i}",
                        "attributes": {
                            "type": {"string": "gpu"},
                            "watcherTest": {"string": suffix},
                        },
                        "capacity": {"memory": {"value": "80Gi"}},
                    }
                    for i in range(devices)
                ],
            },
        },
    ]


def _claim_and_pod(namespace: str, suffix: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": f"watcher-{suffix}", "count": count},
                        }
                    ]
                }
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "workload", "namespace": namespace},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/none",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "terminationGracePeriodSeconds": 0,
            },
        },
    ]


def _setup(cp: ControlPlane, suffix: str, devices: int) -> str:
    namespace = f"watcher-{suffix}"
    cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    cp.apply(_class_and_slice(suffix, devices))
    return namespace


async def _kv_claim(bus: Bus, node: str, uid: str) -> ResourceClaim | None:
    got = await bus.kv_get(subjects.CLAIMS_BUCKET, subjects.claim_key(node, uid), ResourceClaim)
    return got[0] if got else None


def _reserved(cp: ControlPlane, namespace: str) -> Any:
    claim = cp.get("resourceclaim", "gpu", namespace)
    return claim if claim and claim.get("status", {}).get("reservedFor") else None


async def test_lifecycle_events_and_claims_bucket(
    controlplane: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    cp = controlplane
    suffix = secrets.token_hex(3)
    namespace = _setup(cp, suffix, devices=2)
    recorder = Recorder(namespace)
    await bus.subscribe(subjects.claim_events_all(), ClaimEvent, recorder.on_event)
    watcher = Watcher(cp, nats_server, tmp_path / "allocator.log")
    try:
        cp.apply(_claim_and_pod(namespace, suffix, count=1))
        claim = await eventually(lambda: _reserved(cp, namespace), 60, "allocation + reservation")
        uid = claim["metadata"]["uid"]
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        await eventually(lambda: "reserved" in recorder.names(uid), 30, "allocated + reserved")
        assert recorder.names(uid) == ["allocated", "reserved"], watcher.output()
        allocated = next(e for n, e in recorder.events if n == "allocated")
        assert allocated.node == NODE
        assert allocated.actor == "allocator"
        assert (allocated.claim.name, allocated.claim.namespace) == ("gpu", namespace)
        assert [(d.request, d.pool, d.device) for d in allocated.devices] == [
            ("gpu", f"{NODE}-{suffix}", device)
        ]

        stored = await _kv_claim(bus, NODE, uid)
        assert stored is not None, watcher.output()
        assert stored.metadata.uid == uid
        assert stored.status is not None and stored.status.allocation is not None
        results = stored.status.allocation.devices.results  # type: ignore[union-attr]
        assert [(r.driver, r.device) for r in results or []] == [(DRIVER, device)]
        assert stored.status.reserved_for

        # The pod goes: the claim controller drops the reservation and deallocates.
        cp.kubectl("delete", "pod", "workload", "-n", namespace, "--grace-period=0", "--force")
        await eventually(lambda: "released" in recorder.names(uid), 60, "released")
        await eventually(
            lambda: (
                not (cp.get("resourceclaim", "gpu", namespace) or {})
                .get("status", {})
                .get("allocation")
            ),
            60,
            "deallocation",
        )
        await eventually(lambda: _kv_gone(bus, uid), 30, "the claim to leave the bucket")

        cp.kubectl("delete", "resourceclaim", "gpu", "-n", namespace)
        await eventually(lambda: "deleted" in recorder.names(uid), 30, "deleted")
        assert recorder.names(uid) == ["allocated", "reserved", "released", "deleted"]
        assert await _kv_claim(bus, NODE, uid) is None
    finally:
        watcher.stop()


async def _kv_gone(bus: Bus, uid: str) -> bool:
    return await _kv_claim(bus, NODE, uid) is None


async def test_restart_repeats_nothing_and_reports_deletions_it_missed(
    controlplane: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    cp = controlplane
    suffix = secrets.token_hex(3)
    namespace = _setup(cp, suffix, devices=1)
    recorder = Recorder(namespace)
    await bus.subscribe(subjects.claim_events_all(), ClaimEvent, recorder.on_event)
    watcher = Watcher(cp, nats_server, tmp_path / "allocator-1.log")
    try:
        cp.apply(_claim_and_pod(namespace, suffix, count=1))
        claim = await eventually(lambda: _reserved(cp, namespace), 60, "allocation + reservation")
        uid = claim["metadata"]["uid"]
        await eventually(lambda: _kv_claim(bus, NODE, uid), 30, "the claim in the bucket")
        both = ["allocated", "reserved"]
        await eventually(lambda: recorder.names(uid) == both, 30, "allocated and reserved")
        assert await stored_names(bus, uid) == both

        assert watcher.stop() == 0, watcher.output()
        watcher = Watcher(cp, nats_server, tmp_path / "allocator-2.log")
        await eventually(lambda: "claim watcher synced" in watcher.output(), 30, "a resync")
        assert await stored_names(bus, uid) == both, watcher.output()

        # Deleted while the watcher is down: reported once it is back.
        assert watcher.stop() == 0, watcher.output()
        cp.kubectl("delete", "pod", "workload", "-n", namespace, "--grace-period=0", "--force")
        cp.kubectl("delete", "resourceclaim", "gpu", "-n", namespace, "--wait=true")
        watcher = Watcher(cp, nats_server, tmp_path / "allocator-3.log")
        await eventually(lambda: "deleted" in recorder.names(uid), 30, "deleted after restart")
        await eventually(lambda: "claim watcher synced" in watcher.output(), 30, "a resync")
        assert await stored_names(bus, uid) == [*both, "deleted"], watcher.output()
        deleted = next(e for n, e in recorder.events if n == "deleted")
        assert deleted.node == NODE
        assert [d.device for d in deleted.devices] == ["gpu-0"]
        assert await _kv_claim(bus, NODE, uid) is None
    finally:
        watcher.stop()


async def test_unsatisfiable_claim_gets_one_explanation_event(
    controlplane: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    cp = controlplane
    suffix = secrets.token_hex(3)
    namespace = _setup(cp, suffix, devices=1)
    recorder = Recorder(namespace)
    await bus.subscribe(subjects.claim_events_all(), ClaimEvent, recorder.on_event)
    watcher = Watcher(cp, nats_server, tmp_path / "allocator.log")
    try:
        cp.apply(_claim_and_pod(namespace, suffix, count=3))  # one device exists
        claim = cp.get("resourceclaim", "gpu", namespace)
        uid = claim["metadata"]["uid"]

        def ours() -> list[dict[str, Any]]:
            events = cp.kubectl_json("get", "events", "-n", namespace)["items"]
            return [
                e
                for e in events
                if e["involvedObject"].get("uid") == uid
                and e.get("source", {}).get("component") == "gpudra-allocator"
            ]

        first = await eventually(ours, 60, "the explanation Event")
        assert len(first) == 1, first
        event = first[0]
        assert event["reason"] == "Unschedulable"
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "ResourceClaim"
        assert event["involvedObject"]["name"] == "gpu"
        assert "request gpu: needs 3, 1 candidate device(s)" in event["message"], event
        assert len(event["message"].encode()) <= 1024

        # Later threshold periods count the same Event object up.
        def counted_up() -> list[dict[str, Any]]:
            found = ours()
            return found if any(e.get("count", 1) >= 2 for e in found) else []

        later = await eventually(counted_up, 60, "the Event counted up")
        assert len(later) == 1, later
        assert later[0]["metadata"]["name"] == event["metadata"]["name"]
        assert later[0]["count"] >= 2, later[0]
        assert later[0]["lastTimestamp"] >= event["lastTimestamp"]

        # On the bus: one pending event, however many checks found the same reason.
        pending = [e for n, e in recorder.events if n == "pending" and e.claim.uid == uid]
        assert len(pending) == 1, watcher.output()
        assert pending[0].outcome == "error" and pending[0].seq == 1
        assert "needs 3" in pending[0].error
        assert not [n for n in recorder.names(uid) if n != "pending"]

        # Deleted while pending: its trail is closed.
        cp.kubectl("delete", "pod", "workload", "-n", namespace, "--wait=false")
        cp.kubectl("delete", "resourceclaim", "gpu", "-n", namespace, "--wait=false")
        await eventually(lambda: "deleted" in recorder.names(uid), 60, "the closing event")
        assert await stored_names(bus, uid) == ["pending", "deleted"]
        closing = [e for n, e in recorder.events if n == "deleted" and e.claim.uid == uid]
        assert closing[0].seq == 2 and closing[0].instance
    finally:
        watcher.stop()


def _deep_claim(namespace: str, suffix: str, depth: int = 4000) -> str:
    """A claim whose opaque parameters nest ``depth`` levels (8 KB): the API server stores it."""
    parameters = '{"x":' + "[" * depth + "1" + "]" * depth + "}"
    return (
        '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",'
        f'"metadata":{{"name":"deep","namespace":"{namespace}"}},'
        '"spec":{"devices":{"requests":[{"name":"gpu","exactly":'
        f'{{"deviceClassName":"watcher-{suffix}"}}}}],'
        f'"config":[{{"opaque":{{"driver":"{DRIVER}","parameters":{parameters}}}}}]}}}}}}'
    )


async def test_a_claim_nested_4000_deep_is_reported_on_itself_and_stops_nothing(
    controlplane: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    cp = controlplane
    suffix = secrets.token_hex(3)
    namespace = _setup(cp, suffix, devices=1)
    cp.kubectl("create", "-f", "-", input=_deep_claim(namespace, suffix))
    # (Python's json cannot read it back either: ask kubectl for the UID alone.)
    deep_uid = cp.kubectl("get", "resourceclaim", "deep", "-n", namespace,
                          "-o", "jsonpath={.metadata.uid}").strip()  # fmt: skip
    recorder = Recorder(namespace)
    await bus.subscribe(subjects.claim_events_all(), ClaimEvent, recorder.on_event)
    watcher = Watcher(cp, nats_server, tmp_path / "allocator-1.log")
    try:

        def reported() -> list[dict[str, Any]]:
            events = cp.kubectl_json("get", "events", "-n", namespace)["items"]
            return [
                e
                for e in events
                if e["involvedObject"].get("uid") == deep_uid and e["reason"] == "UnreadableClaim"
            ]

        (event,) = await eventually(reported, 60, "the UnreadableClaim Event")
        assert event["type"] == "Warning"
        assert "gpudra cannot read this claim" in event["message"]
        assert "nested too deeply" in event["message"]
        # Another claim in the same cluster is handled as usual, by the same process.
        cp.apply(_claim_and_pod(namespace, suffix, count=1))
        claim = await eventually(lambda: _reserved(cp, namespace), 60, "allocation + reservation")
        uid = claim["metadata"]["uid"]
        await eventually(lambda: "reserved" in recorder.names(uid), 30, "allocated + reserved")
        assert watcher.popen.poll() is None, watcher.output()
        # A restart relists the deep claim: no crash loop.
        assert watcher.stop() == 0, watcher.output()
        watcher = Watcher(cp, nats_server, tmp_path / "allocator-2.log")
        await eventually(lambda: "claim watcher synced" in watcher.output(), 30, "a resync")
        assert watcher.popen.poll() is None, watcher.output()
        assert recorder.names(deep_uid) == []
    finally:
        watcher.stop()


async def test_a_device_taint_rule_is_named_in_the_explanation(
    controlplane: ControlPlane, nats_server: NatsServer, tmp_path: Path
) -> None:
    """1.37 serves DeviceTaintRule as v1 and applies it by default (DRADeviceTaintRules
    GA): the scheduler leaves the pod pending, and so does the watcher's explanation,
    which names the rule."""
    cp = controlplane
    suffix = secrets.token_hex(3)
    namespace = _setup(cp, suffix, devices=1)
    rule = f"watcher-{suffix}-maintenance"
    cp.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": rule},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": f"{NODE}-{suffix}"},
                "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
            },
        }
    )
    watcher = Watcher(cp, nats_server, tmp_path / "allocator.log")
    try:
        cp.apply(_claim_and_pod(namespace, suffix, count=1))  # its one device is tainted
        uid = cp.get("resourceclaim", "gpu", namespace)["metadata"]["uid"]

        def explained() -> list[str]:
            events = cp.kubectl_json("get", "events", "-n", namespace)["items"]
            return [
                e["message"]
                for e in events
                if e["involvedObject"].get("uid") == uid
                and e.get("source", {}).get("component") == "gpudra-allocator"
            ]

        [message] = await eventually(explained, 60, "the explanation Event")
        assert f"from DeviceTaintRule {rule}" in message, message
        assert "example.com/maintenance" in message, message
        assert (
            not (cp.get("resourceclaim", "gpu", namespace) or {})
            .get("status", {})
            .get("allocation")
        ), "the scheduler allocated a device the rule taints"
    finally:
        watcher.stop()
        cp.kubectl("delete", "devicetaintrule", rule, "--wait=false")
