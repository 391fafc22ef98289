"""Binding conditions of channel claims: a pod binds only where its IMEX domain is Ready.

Where the API server keeps them (Kubernetes 1.36+, DRADeviceBindingConditions and
DRAResourceClaimDeviceStatus), the publisher puts on every node's channel devices
``bindingConditions: [compute-domain.nvidia.com/IMEXDomainReady]`` and
``bindingFailureConditions: [compute-domain.nvidia.com/IMEXDomainFailed]``. The
scheduler allocates such a device, reserves the claim for the pod and then, in
PreBind, waits (it looks every 5 s, up to its bindingTimeout, 10 minutes by
default) until the claim's ``status.devices`` entry for the device says
IMEXDomainReady True; the pod's ``nodeName`` stays empty meanwhile. If
IMEXDomainFailed is True instead, it gives the node up: it unreserves the claim,
deallocates it and schedules the pod again. The scheduler and the API server never
set these conditions; this module does, for every allocated claim of ours whose
device carries them:

1. the channel's config names the domain (``config_for``), which must exist in the
   claim's namespace and not be going away; else Failed (``InvalidConfig``,
   ``ComputeDomainNotFound``, ``ComputeDomainDeleting``): the preparer would refuse
   the claim anyway, and the pod is better off pending with the reason than bound;
2. the allocated node is labelled ``resource.nvidia.com/computeDomain=<uid>`` with
   its resourceVersion, as the preparer does at prepare time (which is too late now:
   the pod is not on the node before the domain is Ready there), so the DaemonSet
   brings the domain's IMEX daemon there; a node labelled for another domain is
   Failed (``NodeServesAnotherComputeDomain``), so the scheduler tries elsewhere;
3. the node's member key in the bus's ``domains`` bucket: Ready gives IMEXDomainReady
   True; Failed (the daemon cannot run) gives IMEXDomainFailed True with the daemon's
   reason; otherwise IMEXDomainReady False with why (``IMEXDaemonNotJoined``,
   ``IMEXDaemonNotReady``), readable in ``kubectl get resourceclaim -o yaml``.

Once the condition is True the claim is the node's: its prepare finds the label and
the daemon Ready, and its unprepare removes the label with the node's last channel
claim of the domain. The label this module placed for a claim that never got there
(deallocated after a failure or a timeout, or deleted while waiting) is removed here
once no allocated channel claim of that domain is left on the node.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from services.core.kube import claimstatus
from services.core.kube.client import ApiError, KubeApi
from services.core.kube.resource import ResourceClaimStatus
from services.core.model import computedomain as cd
from services.core.model.opaque import ConfigError
from services.core.model.schemas import DomainMember
from services.domains import metrics
from services.domains.events import DomainEvents
from services.domains.model import ComputeDomain

log = logging.getLogger(__name__)
CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
NODES = "/api/v1/nodes"
LABEL_TRIES = 5

WAITING, READY, FAILED = "waiting", "ready", "failed"


class ClaimMeta(msgspec.Struct, rename="camel", kw_only=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""


class BoundClaim(msgspec.Struct, kw_only=True):
    """What the controller reads of a ResourceClaim: who it is and its status."""

    metadata: ClaimMeta = msgspec.field(default_factory=ClaimMeta)
    status: ResourceClaimStatus | None = None

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"


@dataclass(frozen=True)
class Channel:
    """An allocated channel claim of ours: where, of which domain, and whether the
    scheduler waits on our conditions for it."""

    key: str
    node: str
    domain_uid: str  # "" when the config does not say (``problem`` says why)
    problem: str
    devices: tuple[tuple[str, str, str | None], ...]  # conditioned: (pool, device, shareID)

    @property
    def conditioned(self) -> bool:
        return bool(self.devices)

    @property
    def place(self) -> tuple[str, str]:
        return (self.domain_uid, self.node)


@dataclass(frozen=True)
class Verdict:
    state: str  # waiting | ready | failed
    reason: str
    message: str


def allocated_node(status: ResourceClaimStatus) -> str:
    """The node a node-local allocation names (``metadata.name In [node]``), else ""."""
    selector = status.allocation.node_selector if status.allocation else None
    terms = selector.node_selector_terms if selector else []
    if len(terms) != 1 or terms[0].match_expressions:
        return ""
    fields = terms[0].match_fields or []
    if len(fields) != 1:
        return ""
    f = fields[0]
    if f.key != "metadata.name" or f.operator != "In" or len(f.values or []) != 1:
        return ""
    return (f.values or [""])[0]


def channel_of(claim: BoundClaim) -> Channel | None:
    """The claim as a channel claim of ours, or None (not allocated, not ours)."""
    status = claim.status
    allocation = status.allocation if status else None
    if status is None or allocation is None or allocation.devices is None:
        return None
    results = [
        r
        for r in allocation.devices.results or []
        if r.driver == cd.CD_DRIVER and r.device.startswith("channel-")
    ]
    if not results:
        return None
    node = allocated_node(status) or results[0].pool
    domain, problem = "", ""
    try:
        uids = {
            cd.config_for(allocation.devices.config, r.request, cd.CHANNEL_TYPE)[0].domain_id
            for r in results
        }
        if len(uids) == 1:
            domain = uids.pop()
        else:
            problem = f"the claim's channels name {len(uids)} ComputeDomains; one claim, one domain"
    except ConfigError as exc:
        problem = str(exc)
    conditioned = tuple(
        (r.pool, r.device, r.share_id)
        for r in results
        if cd.IMEX_DOMAIN_READY in (r.binding_conditions or [])
    )
    return Channel(claim.key, node, domain, problem, conditioned)


def settled(claim: BoundClaim, channel: Channel) -> bool:
    """Every conditioned device of ours already says IMEXDomainReady True."""
    entries = {
        claimstatus.key(e): e for e in (claim.status.devices if claim.status else None) or []
    }
    for pool, device, share in channel.devices:
        got = entries.get((cd.CD_DRIVER, pool, device, share or ""))
        conditions = (got or {}).get("conditions") or []
        if not any(c.get("type") == cd.IMEX_DOMAIN_READY and c.get("status") == "True"
                   for c in conditions):  # fmt: skip
            return False
    return True


def member_verdict(member: DomainMember | None, node: str) -> Verdict:
    if member is None:
        why = f"the ComputeDomain's IMEX daemon has not joined on node {node} yet"
        return Verdict(WAITING, "IMEXDaemonNotJoined", why)
    if member.status == cd.READY:
        return Verdict(READY, "IMEXDaemonReady", f"the IMEX daemon on node {node} is Ready")
    why = member.reason or "no reason given"
    if member.status == "Failed":
        return Verdict(FAILED, "IMEXDaemonFailed", f"the IMEX daemon on node {node} failed: {why}")
    return Verdict(WAITING, "IMEXDaemonNotReady",
                   f"the IMEX daemon on node {node} is {member.status}: {why}")  # fmt: skip


def entries_for(channel: Channel, verdict: Verdict, since: str) -> list[claimstatus.Entry]:
    """The status.devices entries of our conditioned devices for ``verdict``."""
    conditions = [
        claimstatus.condition(
            cd.IMEX_DOMAIN_READY, verdict.state == READY, verdict.reason, verdict.message, since
        )
    ]
    if verdict.state == FAILED:
        conditions.append(
            claimstatus.condition(
                cd.IMEX_DOMAIN_FAILED, True, verdict.reason, verdict.message, since
            )
        )
    return [
        claimstatus.entry(cd.CD_DRIVER, pool, device, conditions, share_id=share)
        for pool, device, share in channel.devices
    ]


class Binder:
    """Sets the binding conditions of channel claims; see the module's docstring.

    ``domain_of(uid)`` is the controller's view of the domains, ``member_of(uid,
    node)`` its view of the bucket; :meth:`claim_changed`, :meth:`member_changed` and
    :meth:`domain_changed` mark claims, :meth:`run` writes.
    """

    def __init__(
        self,
        api: KubeApi,
        domain_of: Callable[[str], ComputeDomain | None],
        member_of: Callable[[str, str], DomainMember | None],
        events: DomainEvents,
        retry_s: float = 2.0,
    ) -> None:
        self.api = api
        self.domain_of = domain_of
        self.member_of = member_of
        self.events = events
        self.retry_s = retry_s
        # The claims as the controller's informer holds them (set by the controller).
        self.claim_of: Callable[[str], BoundClaim | None] = lambda _key: None
        self.placed: dict[str, Channel] = {}  # every allocated channel claim of ours, by key
        self.waiting: set[str] = set()  # conditioned claims not settled yet
        self.releases: set[tuple[str, str]] = set()  # (domain, node) a conditioned claim left
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()

    # ---------------------------------------------------------------- inputs

    async def claim_changed(self, old: BoundClaim | None, new: BoundClaim | None) -> None:
        """The claim informer's handler (the informer keeps the claims themselves)."""
        claim = new or old
        assert claim is not None
        self._mark(claim.key)

    def member_changed(self, uid: str, node: str) -> None:
        for key in self.waiting:
            channel = self.placed.get(key)
            if channel is not None and channel.place == (uid, node):
                self._mark(key)

    def domain_changed(self, uid: str) -> None:
        for key in self.waiting:
            channel = self.placed.get(key)
            if channel is not None and channel.domain_uid == uid:
                self._mark(key)

    def _mark(self, key: str) -> None:
        self._dirty.add(key)
        self._wake.set()

    # ---------------------------------------------------------------- the worker

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            keys, self._dirty = self._dirty, set()
            for key in sorted(keys):
                try:
                    await self.reconcile(key)
                except ApiError as exc:
                    if exc.conflict or exc.not_found:
                        continue  # a newer claim (or none) is on its way from the informer
                    extra = {"claim": key, "error": str(exc)}
                    log.warning("binding condition not written", extra=extra)
                    asyncio.get_running_loop().call_later(self.retry_s, self._mark, key)
                except Exception:  # one claim's bug must not stop the others
                    log.exception("binding reconcile raised", extra={"claim": key})
                    asyncio.get_running_loop().call_later(self.retry_s, self._mark, key)

    async def reconcile(self, key: str) -> None:
        claim = self.claim_of(key)
        channel = channel_of(claim) if claim is not None else None
        before = self.placed.pop(key, None)
        if channel is not None:
            self.placed[key] = channel
        if (
            before is not None
            and before.conditioned
            and before.domain_uid
            and (channel is None or channel.place != before.place)
        ):
            self.releases.add(before.place)
        for place in sorted(self.releases):  # kept until done: a failed one is tried again
            await self._release(*place)
            self.releases.discard(place)
        if claim is None or channel is None or not channel.conditioned or settled(claim, channel):
            self.waiting.discard(key)
            return
        self.waiting.add(key)
        verdict = await self._verdict(claim, channel)
        await self._write(claim, channel, verdict)

    async def _verdict(self, claim: BoundClaim, channel: Channel) -> Verdict:
        if channel.problem:
            return Verdict(FAILED, "InvalidConfig", channel.problem)
        domain = self.domain_of(channel.domain_uid)
        if domain is None:
            return Verdict(FAILED, "ComputeDomainNotFound",
                           f"ComputeDomain not found: {channel.domain_uid}")  # fmt: skip
        if domain.metadata.namespace != claim.metadata.namespace:
            return Verdict(FAILED, "ComputeDomainInAnotherNamespace",
                           "the ResourceClaim's namespace is different than the ComputeDomain's "
                           f"namespace ({claim.metadata.namespace} != "
                           f"{domain.metadata.namespace})")  # fmt: skip
        if domain.deleting:
            return Verdict(FAILED, "ComputeDomainDeleting",
                           f"ComputeDomain {domain.key} is being deleted")  # fmt: skip
        owner = await self._label(channel.node, domain)
        if owner is None:
            return Verdict(FAILED, "NodeNotFound", f"node {channel.node} does not exist")
        if owner != domain.uid:
            message = (f"node {channel.node} serves ComputeDomain {owner}: one ComputeDomain "
                       f"per node, {domain.key} cannot run there now")  # fmt: skip
            await self.events.warn(domain, "NodeServesAnotherComputeDomain", message)
            return Verdict(FAILED, "NodeServesAnotherComputeDomain", message)
        return member_verdict(self.member_of(domain.uid, channel.node), channel.node)

    async def _write(self, claim: BoundClaim, channel: Channel, verdict: Verdict) -> None:
        status = claim.status
        current = status.devices if status else None
        wanted = claimstatus.merged(
            current, cd.CD_DRIVER, entries_for(channel, verdict, claimstatus.now())
        )
        if claimstatus.same(current, wanted):
            return
        meta = claim.metadata
        await claimstatus.write(self.api, meta.namespace, meta.name, uid=meta.uid,
                                resource_version=meta.resource_version, devices=wanted)  # fmt: skip
        metrics.BINDING_WRITES.labels(state=verdict.state).inc()
        log.info("binding condition written",
                 extra={"claim": claim.key, "node": channel.node, "domain": channel.domain_uid,
                        "state": verdict.state, "reason": verdict.reason})  # fmt: skip

    # ---------------------------------------------------------------- the node label

    async def _node(self, node: str) -> dict[str, str] | None:
        """The node's metadata (labels, resourceVersion) through a list: the controller may
        list and patch nodes, not get them."""
        listing = await self.api.list(NODES, {"fieldSelector": f"metadata.name={node}"})
        for raw in listing.items:
            meta = json.loads(bytes(raw)).get("metadata", {})
            labels = meta.get("labels") or {}
            return {"rv": meta.get("resourceVersion", ""), "label": labels.get(cd.DOMAIN_LABEL, "")}
        return None

    async def _label(self, node: str, domain: ComputeDomain) -> str | None:
        """Label ``node`` for ``domain`` unless another domain has it; returns the label's
        owner afterwards (None: no such node). Compare-and-set on the node's version."""
        for _ in range(LABEL_TRIES):
            got = await self._node(node)
            if got is None:
                return None
            if got["label"]:
                return got["label"]
            body = {"metadata": {"labels": {cd.DOMAIN_LABEL: domain.uid},
                                 "resourceVersion": got["rv"]}}  # fmt: skip
            try:
                await self.api.patch(f"{NODES}/{node}", body)
            except ApiError as exc:
                if exc.conflict:
                    continue  # the node changed meanwhile: look again
                if exc.not_found:
                    return None
                raise
            log.info(
                "node labelled for its channel claims", extra={"node": node, "domain": domain.uid}
            )
            return domain.uid
        raise ApiError(409, f"node {node} kept changing while being labelled")

    async def _release(self, domain_uid: str, node: str) -> None:
        """A conditioned claim left (domain, node): the last one takes the label it needed."""
        if any(c.place == (domain_uid, node) for c in self.placed.values()):
            return
        for _ in range(LABEL_TRIES):
            got = await self._node(node)
            if got is None or got["label"] != domain_uid:
                return
            body = {"metadata": {"labels": {cd.DOMAIN_LABEL: None}, "resourceVersion": got["rv"]}}
            try:
                await self.api.patch(f"{NODES}/{node}", body)
            except ApiError as exc:
                if exc.not_found:
                    return
                if exc.conflict:
                    continue  # the node changed meanwhile: look again
                raise
            log.info("node label removed: no channel claim of the domain is left there",
                     extra={"node": node, "domain": domain_uid})  # fmt: skip
            return
        raise ApiError(409, f"node {node} kept changing while its label was being removed")
