"""The ComputeDomain controller's loop: domains from the API server, members from the bus.

Three inputs mark work: the ComputeDomain informer (objects to create or tear
down), the ``domains`` bucket's member and index keys (indices to give, a status
to write). Two workers drain the marks: one reconciles objects, one writes
statuses (and, with ComputeDomainCliques, the clique objects: cliques.py), several
domains' changes at once after ``batch_s`` (a daemon joining rewrites one status, not
one per peer). A periodic sweep removes what a deleted domain left behind
(templates, DaemonSets, node labels, clique objects, bucket keys). Where the
API server has binding conditions, a claim informer feeds the binder
(services/domains/binding.py), which tells the scheduler when a channel claim's
node is Ready in its domain.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import msgspec

from services.core.bus import subjects
from services.core.bus.client import Bus, KvUpdate
from services.core.kube import claimstatus
from services.core.kube.client import ApiError, KubeApi
from services.core.kube.informer import Informer
from services.core.model import computedomain as cd
from services.core.model.schemas import DomainIndex, DomainMember, DomainStatusEvent
from services.domains import metrics
from services.domains.binding import CLAIMS_PATH, Binder, BoundClaim
from services.domains.cliques import CliqueObjects
from services.domains.events import DomainEvents
from services.domains.kubeobjects import Conflict, KubeObjects
from services.domains.membership import Membership, domain_status
from services.domains.model import ComputeDomain, DomainStatus, Listed
from services.domains.objects import DaemonSettings

log = logging.getLogger(__name__)
BUCKET = subjects.DOMAINS_BUCKET


@dataclass
class ControllerConfig:
    daemon: DaemonSettings
    batch_s: float = 0.1  # status writes wait this long to take several changes at once
    retry_s: float = 2.0
    sweep_s: float = 600.0
    # Channel claims' binding conditions (binding.py): auto (Kubernetes 1.36+), on, off.
    binding_conditions: str = "auto"
    # ComputeDomainClique objects from the membership (the gate ComputeDomainCliques).
    cliques: bool = True


class Controller:
    def __init__(self, api: KubeApi, bus: Bus, config: ControllerConfig) -> None:
        self.api, self.bus, self.config = api, bus, config
        self.kube = KubeObjects(api, config.daemon)
        self.events = DomainEvents(api)
        self.membership = Membership(max_nodes=config.daemon.max_nodes)
        self.informer: Informer[ComputeDomain] = Informer(
            api, "computedomains", cd.domains_path(), ComputeDomain, on_change=self._on_domain
        )
        self._objects: set[str] = set()  # domain keys (namespace/name) to reconcile
        self._statuses: set[str] = set()  # domain UIDs whose status to write
        self._wake_objects = asyncio.Event()
        self._wake_statuses = asyncio.Event()
        self.written: dict[str, DomainStatus] = {}  # uid -> the status last written
        self.binder = Binder(api, self.by_uid, self.member, self.events, config.retry_s)
        self.claims: Informer[BoundClaim] = Informer(
            api, "resourceclaims", CLAIMS_PATH, BoundClaim, on_change=self.binder.claim_changed
        )
        self.binder.claim_of = lambda key: self.claims.items.get(key)
        self.binding: bool | None = None  # decided at start (binding_conditions)
        self.cliques = CliqueObjects(api, config.daemon.namespace) if config.cliques else None

    # ---------------------------------------------------------------- inputs

    async def _on_domain(self, old: ComputeDomain | None, new: ComputeDomain | None) -> None:
        domain = new or old
        assert domain is not None
        self._mark_objects(domain.key)
        self.binder.domain_changed(domain.uid)
        if new is not None:
            if new.status != self.written.get(new.uid):
                self.written.pop(new.uid, None)  # someone else wrote it: write ours again
            self._mark_status(new.uid)

    def _mark_objects(self, key: str) -> None:
        self._objects.add(key)
        self._wake_objects.set()

    def _mark_status(self, uid: str) -> None:
        self._statuses.add(uid)
        self._wake_statuses.set()

    def by_uid(self, uid: str) -> ComputeDomain | None:
        return next((d for d in self.informer.items.values() if d.uid == uid), None)

    def member(self, uid: str, node: str) -> DomainMember | None:
        return self.membership.members.get(uid, {}).get(node)

    async def load_membership(self) -> None:
        """Every key of the bucket, before anything is decided (indices stay unique); one
        read per kind, with the keys and the decoding of the watches that follow."""
        for update in await self.bus.kv_values(BUCKET, DomainMember, f"*.{subjects.MEMBER}.*"):
            self._apply(update, member=True)
        for index in await self.bus.kv_values(BUCKET, DomainIndex, f"*.{subjects.INDEX}.*"):
            self._apply(index, member=False)

    async def follow_members(self) -> None:
        async for update in self.bus.watch_kv(BUCKET, DomainMember, f"*.{subjects.MEMBER}.*"):
            self._apply(update, member=True)

    async def follow_indices(self) -> None:
        async for update in self.bus.watch_kv(BUCKET, DomainIndex, f"*.{subjects.INDEX}.*"):
            self._apply(update, member=False)

    def _apply(self, update: KvUpdate[DomainMember] | KvUpdate[DomainIndex], member: bool) -> None:
        """The one way a bucket value enters the membership: a value whose own domain and
        node are not its key's is ignored (a daemon may write only its own key, but the
        value inside it is its word), at start as on every change."""
        parsed = subjects.parse_domain_key(update.key)
        if parsed is None:
            return
        uid, _, node = parsed
        value = update.value
        if value is not None and (value.domain_uid != uid or value.node != node):
            log.warning("bucket value under another key: ignored", extra={"key": update.key})
            return
        if member:
            assert value is None or isinstance(value, DomainMember)
            self.membership.set_member(uid, node, value)
            self.binder.member_changed(uid, node)
        else:
            assert value is None or isinstance(value, DomainIndex)
            self.membership.set_index(uid, node, value)
        metrics.MEMBERS.set(sum(len(m) for m in self.membership.members.values()))
        self._mark_status(uid)

    # ---------------------------------------------------------------- objects

    async def reconcile_objects(self) -> None:
        while True:
            await self._wake_objects.wait()
            self._wake_objects.clear()
            keys, self._objects = self._objects, set()
            for key in sorted(keys):
                domain = self.informer.items.get(key)
                if domain is not None and not await self._reconcile(domain):
                    loop = asyncio.get_running_loop()
                    loop.call_later(self.config.retry_s, self._mark_objects, key)

    async def _reconcile(self, domain: ComputeDomain) -> bool:
        """One pass over one domain; False to try again later."""
        try:
            if domain.deleting:
                done = await self._tear_down(domain)
                metrics.RECONCILES.labels(result="ok" if done else "retry").inc()
                return done
            await self.kube.ensure(domain)
        except Conflict as exc:
            metrics.RECONCILES.labels(result="conflict").inc()
            await self.events.warn(domain, "ObjectConflict", str(exc))
        except ApiError as exc:
            metrics.RECONCILES.labels(result="retry").inc()
            log.warning("reconcile failed", extra={"domain": domain.key, "error": str(exc)})
            return not exc.retryable
        except Exception:  # one domain's bug must not stop the others: log it, retry later
            metrics.RECONCILES.labels(result="error").inc()
            log.exception("reconcile raised", extra={"domain": domain.key})
            return False
        metrics.RECONCILES.labels(result="ok").inc()
        return True

    async def _tear_down(self, domain: ComputeDomain) -> bool:
        if cd.FINALIZER not in domain.metadata.finalizers:
            return True
        if not await self.kube.teardown(domain):
            return False  # objects still going: look again
        if self.cliques is not None:
            await self.cliques.remove_all(domain.uid)
        await self._drop_keys(domain.uid)
        await self.kube.remove_finalizer(domain)
        log.info("domain removed", extra={"domain": domain.key, "uid": domain.uid})
        return True

    async def _drop_keys(self, uid: str) -> None:
        for node in sorted(self.membership.members.get(uid, {})):
            await self.bus.kv_delete(BUCKET, subjects.domain_member_key(uid, node))
        for node in sorted(self.membership.indices.get(uid, {})):
            await self.bus.kv_delete(BUCKET, subjects.domain_index_key(uid, node))
        self.membership.forget(uid)
        self.written.pop(uid, None)
        self.events.forget(uid)

    # ---------------------------------------------------------------- statuses

    async def write_statuses(self) -> None:
        while True:
            await self._wake_statuses.wait()
            await asyncio.sleep(self.config.batch_s)
            self._wake_statuses.clear()
            uids, self._statuses = self._statuses, set()
            for uid in sorted(uids):
                try:
                    await self._status(uid)
                except ApiError as exc:
                    log.warning("status not written", extra={"uid": uid, "error": str(exc)})
                    asyncio.get_running_loop().call_later(
                        self.config.retry_s, self._mark_status, uid
                    )

    async def _status(self, uid: str) -> None:
        for change in self.membership.index_changes(uid):
            key = subjects.domain_index_key(change.uid, change.node)
            if change.index is None:
                await self.bus.kv_delete(BUCKET, key)
            else:
                await self.bus.kv_put(BUCKET, key, change.index)
            self.membership.set_index(change.uid, change.node, change.index)
        domain = self.by_uid(uid)
        if domain is None or domain.deleting:
            return
        status = domain_status(domain.spec.num_nodes, self.membership.nodes(uid))
        await self._report_failures(domain, uid)
        if not (
            self.written.get(uid) == status
            or (self.written.get(uid) is None and domain.status == status)
        ):
            await self._write_status(domain, status)
        if self.cliques is not None:
            try:
                await self.cliques.sync(uid, self.membership)
            except ApiError as exc:  # never holds the status back (a CRD not installed)
                log.warning("clique objects not written", extra={"uid": uid, "error": str(exc)})
                asyncio.get_running_loop().call_later(self.config.retry_s, self._mark_status, uid)

    async def _write_status(self, domain: ComputeDomain, status: DomainStatus) -> None:
        uid = domain.uid
        meta = domain.metadata
        body = {"status": msgspec.to_builtins(status)}
        await self.api.patch(f"{cd.domains_path(meta.namespace, meta.name)}/status", body)
        self.written[uid] = status
        metrics.STATUS_WRITES.inc()
        await self.bus.publish(subjects.domain_status(uid), _event(domain, status))
        log.info("status written", extra={"domain": domain.key, "status": status.status,
                                          "nodes": len(status.nodes)})  # fmt: skip

    async def _report_failures(self, domain: ComputeDomain, uid: str) -> None:
        for node, member in sorted(self.membership.members.get(uid, {}).items()):
            if member.status == "Failed":
                why = member.reason or "no reason given"
                await self.events.warn(domain, "IMEXDaemonFailed", f"node {node}: {why}")

    # ---------------------------------------------------------------- orphans

    async def _say_synced(self) -> None:
        await self.informer.synced.wait()
        log.info("domain controller synced", extra={"domains": len(self.informer.items)})

    async def sweep_forever(self) -> None:
        await self.informer.synced.wait()
        while True:
            try:
                await self.sweep()
            except ApiError as exc:
                log.warning("orphan sweep failed", extra={"error": str(exc)})
            await asyncio.sleep(self.config.sweep_s)

    async def sweep(self) -> set[str]:
        """Remove everything of domains that no longer exist; returns their UIDs."""
        live = {d.uid for d in self.informer.items.values()}
        gone = await self.kube.orphans(live) | (self.membership.domains() - live)
        if self.cliques is not None:
            gone |= await self.cliques.orphans(live)
        if gone:  # the informer may not have seen a domain whose daemon already joined
            gone -= await self._listed_uids()
        for uid in sorted(gone):
            await self.kube.sweep(uid)
            if self.cliques is not None:
                await self.cliques.remove_all(uid)
            await self._drop_keys(uid)
            metrics.SWEPT.inc()
            log.info("orphaned domain swept", extra={"uid": uid})
        return gone

    async def _listed_uids(self) -> set[str]:
        """Every domain's UID in a fresh list read after the candidates (unreadable ones too)."""
        listing = await self.api.list(cd.domains_path(), {})
        return {msgspec.json.decode(raw, type=Listed).metadata.uid for raw in listing.items}

    # ---------------------------------------------------------------- binding conditions

    async def decide_binding(self) -> bool:
        """Whether to follow claims: ``binding_conditions`` on, or auto on a 1.36+ server."""
        return await claimstatus.decide(self.api, self.config.binding_conditions)

    async def follow_claims(self) -> None:
        """Claims, once the domains are known (a claim of a domain not seen yet would
        otherwise be failed as naming none)."""
        self.binding = await self.decide_binding()
        log.info("binding conditions", extra={"on": self.binding,
                                              "mode": self.config.binding_conditions})  # fmt: skip
        if not self.binding:
            return
        await self.informer.synced.wait()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.claims.run())
            group.create_task(self.binder.run())

    async def run(self) -> None:
        await self.load_membership()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.follow_claims())
            group.create_task(self._say_synced())
            group.create_task(self.informer.run())
            group.create_task(self.follow_members())
            group.create_task(self.follow_indices())
            group.create_task(self.reconcile_objects())
            group.create_task(self.write_statuses())
            group.create_task(self.sweep_forever())


def _event(domain: ComputeDomain, status: DomainStatus) -> DomainStatusEvent:
    return DomainStatusEvent(
        domain_uid=domain.uid,
        namespace=domain.metadata.namespace,
        name=domain.metadata.name,
        status="Ready" if status.status == cd.READY else "NotReady",
        ready_nodes=[n.name for n in status.nodes if n.status == cd.READY],
        not_ready_nodes=[n.name for n in status.nodes if n.status != cd.READY],
    )
