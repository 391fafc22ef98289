"""Prepare and unprepare ``compute-domain.nvidia.com`` claims, checkpointed like GPU claims.

A channel claim, in order:

1. the claim checked against the API server like every claim (identity,
   allocated here to this driver, reserved for a pod on this node), each device
   of ours a ``channel-N`` or ``daemon-0``, its config strictly decoded
   (services.core.model.computedomain.config_for): no side effect yet, and any error
   here fails only this claim;
2. the domain exists in the claim's namespace (gate.py, permanent errors);
3. checkpoint ``PrepareStarted`` with the domain's UID, then the node label
   (so a crash between the two still knows whose label it is);
4. the wait for this node's IMEX daemon to say Ready, within the kubelet's
   deadline. A timeout keeps ``PrepareStarted`` and the label: the daemon is
   coming, the kubelet's retry finds it Ready; the kubelet's unprepare undoes both;
5. the claim's CDI spec (edits.py), then ``PrepareCompleted``.

A daemon claim needs its domain (in any namespace: it lives in the driver's),
gets the domain's directory under the plugin directory and the daemon's edits.

Unprepare removes the spec and the entry; the last channel entry of a domain
on this node takes the label off (only if it names that domain), the last daemon
entry the domain's folder. An unknown
claim's unprepare succeeds. Operations on one claim run one at a time; the
label's check-and-set runs under one node-wide lock, the readiness wait outside it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from services.core.kube.client import ApiError
from services.core.kube.resource import DeviceRequestAllocationResult
from services.core.model import cliques, domainnode
from services.core.model import computedomain as cd
from services.core.model import featuregates as fg
from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import ClaimRef, PreparedDevice
from services.preparer import transaction, verify
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    ClaimEntry,
    GroupState,
    PreparedDeviceState,
)
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.claims import ClaimSource
from services.preparer.computedomain import edits
from services.preparer.computedomain.gate import Domain, DomainGate
from services.preparer.computedomain.nodefacts import NodeFacts
from services.preparer.fsutil import atomic_write, remove
from services.preparer.inventory import InventoryView
from services.preparer.keylocks import KeyedLocks

log = logging.getLogger(__name__)
T = TypeVar("T")

CLASS = "claim"
KIND = f"{edits.VENDOR}/{CLASS}"
CDI_VERSION = "0.5.0"  # device names start with the claim UID (may be a digit)
SPEC_MODE, DIR_MODE = 0o644, 0o755
READY_MARGIN_S = 0.5  # answer this long before the kubelet's deadline
DEFAULT_WAIT_S = 45.0  # no deadline given: the reference's retry budget


class DomainClaimError(ClaimRefused, ValueError):
    """A claim-level refusal with its reason."""


@dataclass(frozen=True)
class _Planned:
    result: DeviceRequestAllocationResult
    kind: cd.DeviceType
    config: cd.ComputeDomainConfig
    origin: str


def spec_path(root: Path, uid: str) -> Path:
    return root / f"{edits.VENDOR}-{CLASS}_{uid}.yaml"


def domain_of(entry: ClaimEntry) -> str:
    """The domain UID a checkpoint entry's config names ("" if none)."""
    for group in entry.groups:
        uid = group.config.get("domainID")
        if isinstance(uid, str):
            return uid
    return ""


def holds_channel(entry: ClaimEntry) -> bool:
    return any(d.kind == cd.CHANNEL_TYPE for d in entry.devices) or any(
        g.kind == cd.CHANNEL_CONFIG for g in entry.groups
    )


class DomainEngine:
    def __init__(
        self,
        node: str,
        store: CheckpointStore,
        claims: ClaimSource,
        gate: DomainGate | None,
        inventory: InventoryView,
        cdi_root: Path,
        plugin_dir: Path,
        facts: NodeFacts,
        gates: fg.FeatureGates | None = None,
    ) -> None:
        """``gate`` None: no API server, so every prepare is refused (unprepares still work)."""
        self.node = node
        self.store = store
        self.claims = claims
        self.gate = gate
        self.inventory = inventory
        self.cdi_root = cdi_root
        self.plugin_dir = plugin_dir
        self.facts = facts
        self.gates = gates or fg.FeatureGates()
        self._claim_locks = KeyedLocks()
        self._node_lock = asyncio.Lock()  # the label's check-and-set, the checkpoint's view

    # ------------------------------------------------------------ start-up

    async def recover(self) -> dict[str, int]:
        """Specs no completed entry vouches for are removed (a crash mid-prepare)."""
        removed = 0
        if self.cdi_root.is_dir():
            prefix, suffix = f"{edits.VENDOR}-{CLASS}_", ".yaml"
            for path in self.cdi_root.iterdir():
                name = path.name
                if not (name.startswith(prefix) and name.endswith(suffix)):
                    continue
                entry = self.store.claims.get(name[len(prefix) : -len(suffix)])
                if entry is None or entry.state != PREPARE_COMPLETED:
                    removed += remove(path)
        return {"claims": len(self.store.claims), "orphan_specs_removed": removed}

    # ------------------------------------------------------------ prepare

    async def prepare(self, ref: ClaimRef, deadline: float | None = None) -> list[PreparedDevice]:
        """The claim's devices, under its lock; a ClaimRefused says why it cannot be."""
        async with self._claim_locks.hold(ref.uid):
            return await self._refused_by_api(self._prepare(ref, deadline))

    @staticmethod
    async def _refused_by_api(work: Awaitable[T], what: str = "the API server refused") -> T:
        """The API server's refusal (a ComputeDomain read, a label write) fails the claim."""
        try:
            return await work
        except ApiError as exc:
            raise DomainClaimError(f"{what}: {exc}") from exc

    async def _prepare(self, ref: ClaimRef, deadline: float | None) -> list[PreparedDevice]:
        entry = self.store.claims.get(ref.uid)
        if entry is not None and entry.state == PREPARE_COMPLETED:
            return transaction.reply_devices(entry)
        if self.gate is None:
            raise DomainClaimError(
                "cannot be prepared: this preparer has no API server to read ComputeDomains "
                "and label the node from (give --kubeconfig, or run it in a pod)"
            )
        claim = await self.claims.get(ref, deadline)
        allocation = claim.status.allocation if claim.status else None
        assert allocation is not None  # ClaimSource checked it
        planned = _plan(verify.our_results(claim, cd.CD_DRIVER), allocation.devices)
        domain_uid = _one_domain(planned)
        channel = any(p.kind == cd.CHANNEL_TYPE for p in planned)
        if channel:
            domain = await self.gate.domain(domain_uid, ref.namespace)
        else:
            domain = await self.gate.find(domain_uid)
        started = transaction.started(ref, allocation, [_group(p) for p in planned])
        clique = self._clique_id()  # a fabric in error refuses before anything is done
        if channel:
            await self._admit(ref, started, domain, deadline)
        devices = [self._device(ref.uid, p, domain, clique) for p in planned]
        spec = {"cdiVersion": CDI_VERSION, "kind": KIND,
                "devices": [{"name": f"{ref.uid}-{d.name}", "containerEdits": e}
                            for d, e in devices]}  # fmt: skip

        def put_spec_in_place() -> None:
            _ensure_dir(self.cdi_root)
            atomic_write(
                spec_path(self.cdi_root, ref.uid), msgspec.json.encode(spec), mode=SPEC_MODE
            )

        completed = await transaction.complete(
            self.store, ref.uid, started, put_spec_in_place, devices=[d for d, _ in devices]
        )
        return transaction.reply_devices(completed)

    async def _admit(
        self, ref: ClaimRef, started: ClaimEntry, domain: Domain, deadline: float | None
    ) -> None:
        """Checkpoint, label, wait: the label is never placed without an entry naming it."""
        assert self.gate is not None
        async with self._node_lock:
            await self.store.put(ref.uid, started)
            try:
                await self.gate.label(domain)
            except Exception:
                await self.store.remove(ref.uid)
                raise
        left = DEFAULT_WAIT_S if deadline is None else deadline - time.time() - READY_MARGIN_S
        await self.gate.ready(domain, max(left, 0.1))

    def _clique_id(self) -> str:
        """The node's clique from its inventory, once the node may serve the driver at all
        (services.core.model.domainnode: a fabric in error with CrashOnNVLinkFabricErrors, a
        driver too old for IMEXDaemonsWithDNSNames refuse every claim here, as the
        reference's plugin refuses to start)."""
        inv = self.inventory.current
        if inv is None:
            raise DomainClaimError("no inventory for this node yet (is discovery running?)")
        why = domainnode.refusal(inv, self.gates)
        if why:
            raise DomainClaimError(why)
        strict = self.gates.enabled(fg.CRASH_ON_NVLINK_FABRIC_ERRORS)
        return cliques.node_clique_id(inv.gpus, strict=strict)

    def _device(
        self, uid: str, p: _Planned, domain: Domain, clique: str
    ) -> tuple[PreparedDeviceState, dict[str, Any]]:
        if isinstance(p.config, cd.ComputeDomainChannelConfig):
            major = self.facts.imex_major() if clique else 0
            container = edits.channel_edits(p.config.mode, clique, major)
        else:
            host_dir = self._domain_dir(domain.uid)
            host_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            cap = self.facts.fabric_cap() if clique else None
            caps_major = self.facts.caps_major() if clique else 0
            ref = edits.DomainRef(domain.uid, domain.name, domain.namespace)
            container = edits.daemon_edits(ref, clique, str(host_dir), cap, caps_major)
        state = PreparedDeviceState(
            name=p.result.device,
            kind=p.kind,
            requests=[p.result.request],
            pool=p.result.pool,
            cdi_device_ids=[edits.cdi_device_id(uid, p.result.device)],
        )
        return state, container

    # ------------------------------------------------------------ unprepare

    def _delete_spec(self, uid: str) -> None:
        remove(spec_path(self.cdi_root, uid))

    async def unprepare(self, ref: ClaimRef) -> None:
        """Under the claim's lock; a label's removal refused fails it: the kubelet retries."""
        async with self._claim_locks.hold(ref.uid):
            await self._refused_by_api(self._unprepare(ref), "node label not removed")

    async def _unprepare(self, ref: ClaimRef) -> None:
        entry = self.store.claims.get(ref.uid)
        if entry is None:
            remove(spec_path(self.cdi_root, ref.uid))  # a stray spec is still ours to remove
            return
        async with self._node_lock:
            domain, channel = domain_of(entry), holds_channel(entry)
            # The domain's last claim of this kind here (channel or daemon)?
            last = bool(domain) and not any(
                uid != ref.uid and holds_channel(e) == channel and domain_of(e) == domain
                for uid, e in self.store.claims.items()
            )
            if channel and last:
                if self.gate is None:
                    raise DomainClaimError(
                        f"cannot remove the node label of ComputeDomain {domain}: no API server"
                    )
                await self.gate.unlabel(domain)
            await self.store.remove(ref.uid, before=lambda: self._delete_spec(ref.uid))
            if not channel and last:
                # The domain's last daemon here: its folder goes with it (a later daemon
                # claim makes it again; its wrapper writes the IMEX config afresh).
                shutil.rmtree(self._domain_dir(domain), ignore_errors=True)
        self.claims.forget(ref)

    def _domain_dir(self, uid: str) -> Path:
        """``<plugin dir>/domains/<uid>``; a UID is one plain path component."""
        if not uid or "/" in uid or uid in (".", ".."):
            raise DomainClaimError(f"ComputeDomain UID {uid!r} is not a plain name")
        return self.plugin_dir / "domains" / uid


def _plan(results: Sequence[DeviceRequestAllocationResult], devices: Any) -> list[_Planned]:
    configs = devices.config if devices is not None else None
    planned = []
    for r in results:
        try:
            kind = cd.device_type(r.device)
        except ValueError as exc:
            raise DomainClaimError(str(exc)) from None
        config, origin = cd.config_for(configs, r.request, kind)
        planned.append(_Planned(r, kind, config, origin))
    return planned


def _one_domain(planned: Sequence[_Planned]) -> str:
    uids = sorted({p.config.domain_id for p in planned})
    if len(uids) != 1:
        raise DomainClaimError(
            f"the claim's devices name {len(uids)} ComputeDomains ({', '.join(uids)}); "
            "one claim belongs to one domain"
        )
    return uids[0]


def _group(p: _Planned) -> GroupState:
    return GroupState(kind=p.config.kind, origin=p.origin, config=msgspec.to_builtins(p.config))


def _ensure_dir(root: Path) -> None:
    if not root.is_dir():
        root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
