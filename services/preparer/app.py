"""Wiring of the preparer process: bus, checkpoint, inventory, backend, engine, service."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from services.core.bus import subjects
from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.core.kube import resourceapi
from services.core.kube.resource import ResourceClaim
from services.core.model import featuregates as fg
from services.core.model import nvidia
from services.core.model.shares import DISABLED, SharesMode
from services.core.process.serve import Stack
from services.preparer import cdi, faults, rebuild, refcheckpoint
from services.preparer.checkpoint import CheckpointData
from services.preparer.checkpointfile import CheckpointError, default_path
from services.preparer.checkpointstore import (
    DEFAULT_RECOVERY,
    Adopt,
    CheckpointStore,
    LoadReport,
    Recovery,
    read_boot_id,
)
from services.preparer.claims import ClaimSource, KubernetesReader
from services.preparer.devices.base import DeviceOps
from services.preparer.engine import Engine
from services.preparer.engine import Settings as EngineSettings
from services.preparer.inventory import InventoryView
from services.preparer.pods import NodePods
from services.preparer.service import PreparerService

if TYPE_CHECKING:
    from services.core.kube.client import KubeApi

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True)
class Settings:
    node: str
    nats_url: str
    gates: fg.FeatureGates
    kubelet_root: Path
    cdi_root: Path
    simulated: bool
    driver_root: Path = Path("/")
    host_driver_root: str = ""  # "" : the driver root itself
    dev_root: str = ""  # "" : the driver root when it has /dev, else /
    hook_path: str = ""  # "" : /usr/bin/nvidia-cdi-hook under the host driver root
    kubeconfig: str = ""
    trust_claims_bucket: bool = False
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    faults: faults.Faults = field(default_factory=faults.Faults)
    checkpoint_recovery: Recovery = DEFAULT_RECOVERY
    shares: SharesMode = DISABLED
    compute_domains: bool = False  # also prepare compute-domain.nvidia.com claims
    claim_device_status: str = "auto"  # status.devices of GPU claims: auto (1.36+), on, off


def plugin_dir(kubelet_root: Path) -> Path:
    return kubelet_root / "plugins" / nvidia.DRIVER_NAME


LOCK_POLL_S = 0.5


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


async def hold_plugin_dir(directory: Path, stop: asyncio.Event) -> int | None:
    """One preparer per node: a second one would undo the first one's work at start-up.

    A second one waits here rather than exiting: in a rolling update the new node pod
    starts beside the old one (the kubelet plugin's sockets are per pod), and its
    preparer takes over the moment the old one stops. Exiting instead made the
    container back off (10, 20, 40... s) and the update wait minutes for it. The lock
    file is the node's own: flock, released by the kernel when its holder dies.
    None: asked to stop before the lock came free.
    """
    path = directory / "preparer.lock"
    fd = _open_lock(path)
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not waiting:
                log.warning(
                    "another preparer holds the node's lock: waiting for it to stop",
                    extra={"lock": str(path)},
                )
                waiting = True
        else:
            if waiting:
                log.info(
                    "the other preparer stopped: this one takes over", extra={"lock": str(path)}
                )
            return fd
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), LOCK_POLL_S)
        if stop.is_set():
            os.close(fd)
            return None


def _has_api(settings: Settings) -> bool:
    """A kubeconfig, or a pod with its service account's token mounted."""
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    return bool(settings.kubeconfig) or (in_cluster and SERVICE_ACCOUNT_TOKEN.exists())


async def _claim_source(
    settings: Settings, bus: Bus, stack: Stack
) -> tuple[ClaimSource, NodePods | None, KubeApi | None]:
    """Claims checked against the API server; see docs/security.md for the other two cases."""
    if settings.trust_claims_bucket:
        log.warning(
            "CLAIMS ARE NOT CHECKED AGAINST THE API SERVER (--trust-claims-bucket): whoever "
            "can write the claims bucket decides what this node prepares"
        )
        claims, pods, api = ClaimSource(bus, settings.node, trust_bucket=True), None, None
    elif not _has_api(settings):
        log.error(
            "no API server (no --kubeconfig, no service account token): every prepare will "
            "be refused, since no claim and no pod can be checked; unprepares still work"
        )
        claims, pods, api = ClaimSource(bus, settings.node), None, None
    else:
        api = resourceapi.versioned(await stack.kube(settings.kubeconfig))
        pods = NodePods(api, settings.node)
        claims = ClaimSource(bus, settings.node, KubernetesReader(api), pods)
    claims.follow()
    stack.closing(claims.close, "the claims mirror")
    if pods is not None:
        pods.follow()
        stack.closing(pods.close, "the node's pods")
    return claims, pods, api


def _backend(settings: Settings, bus: Bus, inventory: InventoryView, pdir: Path) -> DeviceOps:
    if settings.simulated:
        from services.preparer.devices.simulated import SimulatedOps

        return SimulatedOps(
            bus,
            settings.node,
            inventory,
            pdir,
            driver_root=None if settings.driver_root == Path("/") else settings.driver_root,
            host_driver_root=settings.host_driver_root,
            hook_path=settings.hook_path,
            dev_root=settings.dev_root,
        )
    from services.preparer.devices.real import RealOps

    host_root = settings.host_driver_root or str(settings.driver_root)
    return RealOps(
        pdir,
        driver_root=settings.driver_root,
        host_driver_root=host_root,
        dev_root=settings.dev_root,
        hook_path=settings.hook_path or os.path.join(host_root, "usr/bin/nvidia-cdi-hook"),
    )


def _check_cdi(ops: DeviceOps, inventory: InventoryView) -> None:
    """Find the driver installation at start-up, so the first prepare need not (the
    reference warms its spec cache too), and say what would fail every claim's CDI
    spec (each claim says it again)."""
    from services.preparer.cdigen.model import CdiGenError

    version = inventory.current.driver_version if inventory.current else ""
    try:
        ops.cdigen().common(version)
    except CdiGenError as exc:
        log.error("every prepare will fail until this is fixed: %s", exc)


async def start(settings: Settings, stack: Stack) -> int | None:
    """Everything the preparer serves with, each closed when it stops (services.core.
    process.serve: the domain service, the GPU service, then what they used)."""
    pdir = plugin_dir(settings.kubelet_root)
    lock_fd = await hold_plugin_dir(pdir, stack.stop)
    if lock_fd is None:
        return 0  # asked to stop while another preparer held the node
    stack.callback(os.close, lock_fd)
    name, identity = f"gpudra-preparer-{settings.node}", Identity(Role.PREPARER, settings.node)
    bus = await stack.bus(settings.nats_url, name=name, identity=identity)
    store = CheckpointStore(
        default_path(settings.kubelet_root, nvidia.DRIVER_NAME),
        read_boot_id(settings.boot_id_file),
    )
    inventory = InventoryView(bus, settings.node)
    await inventory.start()
    stack.closing(inventory.stop, "the inventory mirror")
    # Start-up clean-up compares the checkpoint with the node's devices: give discovery a moment.
    if inventory.current is None and not await inventory.wait_for(0, timeout=10):
        log.warning("no inventory for this node yet; stray MIG devices may survive clean-up")
    loaded = _load_checkpoint(settings, store, inventory)
    if loaded is None:
        return 1
    claims, pods, api = await _claim_source(settings, bus, stack)
    ops = _backend(settings, bus, inventory, pdir)
    stack.closing(ops.close, "the device backend")
    _check_cdi(ops, inventory)
    engine = Engine(
        EngineSettings(
            node=settings.node,
            gates=settings.gates,
            cdi_root=settings.cdi_root,
            plugin_dir=pdir,
            shares=settings.shares,
        ),
        store,
        claims,
        inventory,
        ops,
        settings.faults,
    )
    if loaded.quarantined is not None:
        await _rebuild(settings, store, inventory, ops, bus)
    report = await engine.recover()
    log.info("recovered", extra={"node": settings.node, **report})
    service = PreparerService(bus, engine, settings.node)
    if api is not None and settings.claim_device_status != "off":
        from services.preparer.devicestatus import DeviceStatusWriter

        service.device_status = DeviceStatusWriter(
            api, store, settings.claim_device_status, idle=service.idle, copy_of=claims.copy_of
        )
    stack.closing(service.close, "the GPU service")  # no new requests; running ones answer
    if settings.compute_domains:
        domains = await _domain_service(settings, bus, api, pods, inventory, service, stack)
        stack.closing(domains.close, "the compute-domain service")  # it owns the event sink
        await domains.start()
    await service.start()
    log.info(
        "preparer ready",
        extra={"node": settings.node, "claims": len(store.claims), "gates": settings.gates.spec()},
    )
    return None


def _load_checkpoint(
    settings: Settings, store: CheckpointStore, inventory: InventoryView
) -> LoadReport | None:
    """The checkpoint, adopted or quarantined as asked; None, after saying why on stderr,
    when it cannot be trusted and --checkpoint-recovery=refuse."""
    try:
        return store.load(
            adopt=_reference_adopter(settings, store, inventory),
            recovery=settings.checkpoint_recovery,
        )
    except CheckpointError as exc:
        print(
            f"gpudra preparer: {exc}\n(--checkpoint-recovery=refuse; start with "
            "--checkpoint-recovery=quarantine to set it aside and rebuild from the node, "
            "see docs/operations.md)",
            file=sys.stderr,
        )
        return None


async def _domain_service(
    settings: Settings,
    bus: Bus,
    api: KubeApi | None,
    pods: NodePods | None,
    inventory: InventoryView,
    gpu_service: PreparerService,
    stack: Stack,
) -> PreparerService:
    """The compute-domain.nvidia.com driver's engine and service: its own checkpoint
    and subjects, the GPU service's claim events. Its claims are checked as the GPU
    driver's are; its gate needs the API server even with a trusted claims bucket."""
    from services.core.model import computedomain as cd
    from services.preparer.computedomain.engine import DomainEngine
    from services.preparer.computedomain.gate import DomainGate
    from services.preparer.computedomain.nodefacts import NodeFacts

    if settings.trust_claims_bucket:
        claims = ClaimSource(bus, settings.node, trust_bucket=True, driver=cd.CD_DRIVER)
    elif api is not None and pods is not None:
        claims = ClaimSource(bus, settings.node, KubernetesReader(api), pods, driver=cd.CD_DRIVER)
    else:
        claims = ClaimSource(bus, settings.node, driver=cd.CD_DRIVER)
    gate_api = api
    if gate_api is None and _has_api(settings):
        gate_api = await stack.kube(settings.kubeconfig)
    store = CheckpointStore(
        default_path(settings.kubelet_root, cd.CD_DRIVER), read_boot_id(settings.boot_id_file)
    )
    store.load(recovery=settings.checkpoint_recovery)
    engine = DomainEngine(
        settings.node,
        store,
        claims,
        DomainGate(gate_api, bus, settings.node) if gate_api is not None else None,
        inventory,
        settings.cdi_root,
        settings.kubelet_root / "plugins" / cd.CD_DRIVER,
        NodeFacts(None if settings.simulated else Path("/proc")),
        settings.gates,
    )
    report = await engine.recover()
    log.info("compute-domain claims recovered", extra={"node": settings.node, **report})
    return PreparerService(
        bus, engine, settings.node, driver=cd.CD_DRIVER, events=gpu_service.events
    )


def _reference_adopter(
    settings: Settings, store: CheckpointStore, inventory: InventoryView
) -> Adopt:
    """Reads the reference driver's checkpoint (same path) into ours; see refcheckpoint."""

    def adopt(raw: bytes) -> CheckpointData | None:
        if not refcheckpoint.looks_like_reference(raw):
            return None
        found = refcheckpoint.read(raw, str(store.path))
        converted = refcheckpoint.convert(
            found,
            boot_id=store.boot_id,
            inventory=inventory.current,
            dynamic_mig=settings.gates.enabled(fg.DYNAMIC_MIG),
        )
        log.warning(
            "ADOPTING THE REFERENCE DRIVER'S CHECKPOINT: its claims stay prepared; "
            "the original is kept beside ours as checkpoint.json.reference-<time>",
            extra={"version": found.version, "claims": sorted(converted.data.claims)},
        )
        if converted.mps_deployments:
            log.warning(
                "the reference's MPS control daemons are Deployments gpudra cannot stop: "
                "delete them once their claims are unprepared",
                extra={"deployments": converted.mps_deployments},
            )
        return converted.data

    return adopt


async def _rebuild(
    settings: Settings, store: CheckpointStore, inventory: InventoryView, ops: DeviceOps, bus: Bus
) -> None:
    """After a quarantine: every claim whose CDI spec is on the node is taken as prepared."""
    daemons = await ops.mps_daemons()
    rebuilt = []
    for uid in cdi.claim_uids_on_disk(settings.cdi_root):
        if uid in store.claims:
            continue
        got = await bus.kv_get(
            subjects.CLAIMS_BUCKET, subjects.claim_key(settings.node, uid), ResourceClaim
        )
        entry = rebuild.rebuild_claim(
            uid,
            rebuild.spec_devices(settings.cdi_root, uid),
            node=settings.node,
            inventory=inventory.current,
            claim=got[0] if got else None,
            daemons=[d for d in daemons if d.daemon_id.startswith(f"{uid}-")],
            dynamic_mig=settings.gates.enabled(fg.DYNAMIC_MIG),
        )
        await store.put(uid, entry)
        rebuilt.append(uid)
    log.warning("claims rebuilt from their CDI specs on the node", extra={"claims": rebuilt})
