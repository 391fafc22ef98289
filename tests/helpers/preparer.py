"""A simulated GPU node for preparer tests: real processes, real NATS, real files.

``Node`` runs ``gpudra discovery --fleet ...`` (the simulated NVML and the
inventory), ``gpudra preparer`` and, for tests through the kubelet's socket,
``gpudra kubeletplugin``, each as a subprocess stopped by its PID, and an
in-memory API server (``services.local.apiserver``) that the preparer checks
claims and pods against. ``Node.put_claim`` does what the cluster would: the
claim reserved for a pod bound to the node, in the API server and in the
``claims`` bucket (as the allocator's watcher puts it there).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.bus.failures import RequestFailed
from services.core.kube.resource import (
    AllocationResult,
    DeviceAllocationConfiguration,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    ObjectMeta,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    ResourceClaimConsumerReference,
    ResourceClaimSpec,
    ResourceClaimStatus,
)
from services.core.model.schemas import ClaimRef, NodeInventory, NodeReply, NodeRequest
from services.local.apiserver import MemoryApiServer, Obj, pod_object
from services.local.natsserver import NatsCluster, NatsServer
from services.local.nodepaths import NodePaths
from services.preparer import cdicheck, checkpoint, checkpointfile
from tests.helpers.bus import connect

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.nvidia.com"
API = "resource.nvidia.com/v1beta1"


# ------------------------------------------------------------------ claims


def new_uid() -> str:
    return str(uuid.uuid4())


@dataclass
class Dev:
    """One allocated device: request name and device name (pool defaults to the node)."""

    request: str
    device: str
    pool: str | None = None
    admin: bool = False
    share: str | None = None  # a consumable share's shareID (KEP-5075)
    consumed: dict[str, str] | None = None  # its consumedCapacity


def opaque(params: Mapping[str, Any], source: str = "FromClaim", requests: Sequence[str] = ()):
    return DeviceAllocationConfiguration(
        source=source,  # type: ignore[arg-type]
        requests=list(requests) or None,
        opaque=OpaqueDeviceConfiguration(driver=DRIVER, parameters=dict(params)),
    )


def gpu_config(**sharing: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": API, "kind": "GpuConfig"}
    if sharing:
        out["sharing"] = sharing
    return out


def make_claim(
    node: str,
    devices: Iterable[Dev],
    *,
    uid: str | None = None,
    name: str = "claim",
    namespace: str = "default",
    configs: Sequence[DeviceAllocationConfiguration] = (),
    allocated: bool = True,
    annotations: Mapping[str, str] | None = None,
) -> ResourceClaim:
    results = [
        DeviceRequestAllocationResult(
            request=d.request,
            driver=DRIVER,
            pool=d.pool or node,
            device=d.device,
            admin_access=True if d.admin else None,
            share_id=d.share,
            consumed_capacity=d.consumed,
        )
        for d in devices
    ]
    allocation = AllocationResult(
        devices=DeviceAllocationResult(results=results, config=list(configs) or None)
    )
    return ResourceClaim(
        metadata=ObjectMeta(
            name=name,
            namespace=namespace,
            uid=uid or new_uid(),
            annotations=dict(annotations) if annotations else None,
        ),
        spec=ResourceClaimSpec(),
        status=ResourceClaimStatus(allocation=allocation if allocated else None),
    )


def pod_for(
    claim: ResourceClaim, node: str, *, name: str = "", phase: str = "Pending", uid: str = ""
) -> Obj:
    """A pod on ``node`` (``""``: unscheduled) that uses ``claim``; named after its UID."""
    return pod_object(
        name or f"pod-{claim.metadata.uid}",
        claim.metadata.namespace or "default",
        node,
        [claim.metadata.name],
        uid=uid or None,
        phase=phase,
    )


def reserved(claim: ResourceClaim, *pods: Obj) -> ResourceClaim:
    """``claim`` with status.reservedFor naming ``pods`` (none: reserved for nobody)."""
    consumers = [
        ResourceClaimConsumerReference(
            resource="pods", name=p["metadata"]["name"], uid=p["metadata"]["uid"]
        )
        for p in pods
    ]
    status = claim.status or ResourceClaimStatus()
    return msgspec.structs.replace(
        claim, status=msgspec.structs.replace(status, reserved_for=consumers or None)
    )


def ref(claim: ResourceClaim) -> ClaimRef:
    return ClaimRef(
        uid=claim.metadata.uid or "",
        namespace=claim.metadata.namespace or "",
        name=claim.metadata.name,
    )


# ------------------------------------------------------------------ processes


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> int:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            return self.popen.wait()

    def wait(self, timeout: float = 30.0) -> int:
        """Its exit code; one still running after ``timeout`` is killed and its log shown."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
            raise AssertionError(
                f"{self.name} still running {timeout} s after it was told to stop:\n"
                + self.output()[-8000:]
            ) from None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Node:
    """One simulated node: directories, processes and the bus."""

    root: Path
    nats: NatsServer | NatsCluster
    bus: Bus
    name: str = "n1"
    fleet: str = "dgx-a100"
    procs: list[Proc] = field(default_factory=list)
    runs: int = 0
    front: Bus | None = None  # the test's requests come as the node's front (see request)
    api: MemoryApiServer = field(default_factory=MemoryApiServer)

    @property
    def paths(self) -> NodePaths:
        return NodePaths.under(self.root)

    @property
    def checkpoint_path(self) -> Path:
        return self.paths.plugin_dir / "checkpoint.json"

    @property
    def boot_id_file(self) -> Path:
        return self.root / "boot_id"

    def _spawn(self, name: str, args: list[str], env: Mapping[str, str] | None = None) -> Proc:
        self.runs += 1
        log = self.root / f"{name}-{self.runs}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "services.cli", *args],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    async def start_discovery(self) -> Proc:
        proc = self._spawn(
            "discovery",
            ["discovery", "--node-name", self.name, "--fleet", self.fleet,
             *self.nats.client_argv(Role.DISCOVERY, self.name), "--rescan-interval", "60"],
        )  # fmt: skip
        await self.wait_for(lambda inv: inv is not None, "the first inventory", proc)
        return proc

    async def inventory(self) -> NodeInventory | None:
        got = await self.bus.kv_get(
            subjects.INVENTORY_BUCKET, subjects.inventory_key(self.name), NodeInventory
        )
        return got[0] if got else None

    async def wait_for(self, check: Any, what: str, proc: Proc | None = None, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            inv = await self.inventory()
            if check(inv):
                return inv
            if proc is not None and not proc.alive():
                raise AssertionError(f"{proc.name} exited waiting for {what}:\n{proc.output()}")
            await asyncio.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    async def start_api(self) -> Path:
        """The node's API server (once); its kubeconfig."""
        if not self.api.started:
            await self.api.start()
        return self.api.kubeconfig(self.root / "kubeconfig")

    async def start_preparer(
        self,
        gates: str = "",
        env: Mapping[str, str] | None = None,
        ready: bool = True,
        claims: str = "api",
        extra: Sequence[str] = (),
    ) -> Proc:
        """``claims``: "api" (checked against the node's API server), "bucket"
        (--trust-claims-bucket) or "none" (no API server: prepares are refused)."""
        if not self.boot_id_file.exists():
            self.boot_id_file.write_text(new_uid() + "\n")
        flags = {
            "api": ["--kubeconfig", str(self.root / "kubeconfig")],
            "bucket": ["--trust-claims-bucket"],
            "none": [],
        }
        api = flags[claims]
        if claims == "api":
            await self.start_api()
        proc = self._spawn(
            "preparer",
            ["preparer", "--node-name", self.name, "--fleet", self.fleet,
             *self.nats.client_argv(Role.PREPARER, self.name),
             "--kubelet-root", str(self.paths.kubelet_root),
             "--cdi-root", str(self.paths.cdi_root), "--boot-id-file", str(self.boot_id_file),
             "--feature-gates", gates, *api, *extra],
            env=env,
        )  # fmt: skip
        if ready:
            await self.wait_preparer(proc)
        return proc

    async def wait_preparer(self, proc: Proc, timeout: float = 30.0) -> None:
        """Ready when it answers an unprepare of a claim it never saw."""
        probe = ClaimRef(uid=new_uid(), namespace="probe", name="probe")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise AssertionError(f"preparer exited {proc.popen.returncode}:\n{proc.output()}")
            try:
                reply = await self.request("unprepare", [probe], timeout=1.0)
            except RequestFailed:
                await asyncio.sleep(0.1)
                continue
            assert reply.claims[probe.uid].error == ""
            return
        raise AssertionError(f"preparer not ready within {timeout}s:\n{proc.output()}")

    def start_front(self, *extra: str, env: Mapping[str, str] | None = None) -> Proc:
        return self._spawn(
            "kubeletplugin",
            ["kubeletplugin", "--node-name", self.name, "--kubelet-root",
             str(self.paths.kubelet_root), *self.nats.client_argv(Role.FRONT, self.name), *extra],
            env=env,
        )  # fmt: skip

    def files(self) -> list[str]:
        """Every file the node's processes wrote (sockets, logs and NATS data aside)."""
        found = []
        for top in (self.paths.kubelet_root, self.paths.cdi_root):
            if top.is_dir():
                found += [
                    str(p.relative_to(self.root))
                    for p in sorted(top.rglob("*"))
                    if p.is_file() and not p.is_socket()
                ]
        return found

    async def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        if self.front is not None:
            await self.front.close()
            self.front = None

    async def close(self) -> None:
        """Stop the processes, then the API server."""
        await self.stop_all()
        await self.api.stop()

    # ------------------------------------------------------------ requests

    async def put_claim(
        self, claim: ResourceClaim, *, pod: bool = True, bucket: bool = True
    ) -> ResourceClaim:
        """As the cluster would have it: an allocated claim reserved for a pod bound here
        (``pod``, unless it names its own), in the API server and (``bucket``) the claims
        bucket. Returns the claim as stored."""
        status = claim.status
        if pod and status is not None and status.allocation and not status.reserved_for:
            user = pod_for(claim, self.name)
            claim = reserved(claim, user)
            self.api.put_claim(claim)
            self.api.put_pod(user)
        else:
            self.api.put_claim(claim)
        return await self.put_bucket(claim) if bucket else claim

    async def put_bucket(self, claim: ResourceClaim) -> ResourceClaim:
        """Only into the claims bucket (what a writer of the bus can do)."""
        uid = claim.metadata.uid or ""
        await self.bus.kv_put(subjects.CLAIMS_BUCKET, subjects.claim_key(self.name, uid), claim)
        return claim

    async def request(
        self, op: str, claims: Sequence[ClaimRef], timeout: float = 30.0
    ) -> NodeReply:
        route = subjects.node_prepare if op == "prepare" else subjects.node_unprepare
        subject = route(self.name)
        request = NodeRequest(node=self.name, claims=list(claims), deadline=time.time() + timeout)
        if self.front is None:  # the preparer answers only its node's front
            self.front = await connect(self.nats, Role.FRONT, self.name, name="test-front")
        return await self.front.request(subject, request, NodeReply, timeout)

    async def prepare(self, *claims: ResourceClaim) -> NodeReply:
        return await self.request("prepare", [ref(c) for c in claims])

    async def unprepare(self, *claims: ResourceClaim) -> NodeReply:
        return await self.request("unprepare", [ref(c) for c in claims])

    # ------------------------------------------------------------ what is on disk

    def cdi_files(self) -> list[Path]:
        return sorted(self.paths.cdi_root.glob("*.yaml")) if self.paths.cdi_root.is_dir() else []

    def checkpoint(self) -> checkpoint.CheckpointData:
        return checkpointfile.decode(self.checkpoint_path.read_bytes())

    def sim_host(self) -> dict[str, Any]:
        path = self.paths.plugin_dir / "simulated-host.json"
        return json.loads(path.read_text()) if path.exists() else {}

    async def mig_uuids(self) -> list[str]:
        inv = await self.inventory()
        return sorted(m.uuid for g in inv.gpus for m in g.mig_devices) if inv else []


# ------------------------------------------------------------------ CDI checks


def validate_cdi_file(path: Path) -> dict[str, Any]:
    """Load one spec and apply the container runtimes' CDI checks; returns the spec."""
    spec = yaml.safe_load(path.read_text())
    found = cdicheck.problems(spec)
    assert not found, f"{path.name}: " + "; ".join(found)
    return spec  # type: ignore[no-any-return]
