"""A channel claim's way into its ComputeDomain on this node: the reference's steps 2 to 4.

1. The domain must exist and be in the claim's namespace (a permanent error
   otherwise: "ComputeDomain not found", "the ResourceClaim's namespace is
   different than the ComputeDomain's namespace").
2. The node is labelled ``resource.nvidia.com/computeDomain=<uid>``, which brings
   the domain's IMEX daemon here; a node already labelled for another domain
   refuses ("label already exists for a different ComputeDomain"): one domain per
   node. The label is written with the node's resourceVersion, so two claims of
   two domains racing for one node cannot both win.
3. Readiness. Where the reference fails the prepare ("current node not ready in
   ComputeDomain") and the kubelet retries, this waits for the node's member key
   to say Ready, up to the kubelet's deadline, and then fails with the daemon's
   own reason.

Called by the node driver's prepare (services/preparer/computedomain/engine.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kube.client import ApiError, KubeApi
from services.core.model import computedomain as cd
from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import DomainMember

log = logging.getLogger(__name__)


class GateError(ClaimRefused):
    """Why a channel claim cannot be prepared here; ``permanent``: retrying cannot help."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class Domain:
    uid: str
    namespace: str
    name: str


class DomainGate:
    def __init__(self, api: KubeApi, bus: Bus, node: str) -> None:
        self.api, self.bus, self.node = api, bus, node

    async def find(self, uid: str) -> Domain:
        """The domain with this UID, in any namespace (a daemon claim lives in the driver's)."""
        listing = await self.api.list(cd.domains_path(), {})
        for raw in listing.items:
            meta = json.loads(bytes(raw)).get("metadata", {})
            if meta.get("uid") == uid:
                return Domain(uid, meta.get("namespace", ""), meta.get("name", ""))
        raise GateError(f"ComputeDomain not found: {uid}", permanent=True)

    async def domain(self, uid: str, claim_namespace: str) -> Domain:
        """The domain a channel claim names, which must be in the claim's namespace."""
        found = await self.find(uid)
        if found.namespace != claim_namespace:
            raise GateError(
                "the ResourceClaim's namespace is different than the ComputeDomain's "
                f"namespace ({claim_namespace} != {found.namespace})",
                permanent=True,
            )
        return found

    async def label(self, domain: Domain) -> None:
        path = f"/api/v1/nodes/{self.node}"
        node = json.loads(await self.api.get(path))["metadata"]
        have = node.get("labels", {}).get(cd.DOMAIN_LABEL, "")
        if have == domain.uid:
            return
        if have:
            raise GateError(
                f"label already exists for a different ComputeDomain ({have}): node {self.node} "
                f"serves one ComputeDomain at a time, {domain.namespace}/{domain.name} must wait",
                permanent=False,
            )
        body = {"metadata": {"labels": {cd.DOMAIN_LABEL: domain.uid},
                             "resourceVersion": node["resourceVersion"]}}  # fmt: skip
        try:
            await self.api.patch(path, body)
        except ApiError as exc:
            if exc.conflict:  # someone labelled it meanwhile: look again
                raise GateError(f"node {self.node} changed meanwhile", permanent=False) from exc
            raise

    async def unlabel(self, uid: str) -> None:
        """Take the label off, but only if it names this domain."""
        path = f"/api/v1/nodes/{self.node}"
        node = json.loads(await self.api.get(path))["metadata"]
        if node.get("labels", {}).get(cd.DOMAIN_LABEL) != uid:
            return
        body = {"metadata": {"labels": {cd.DOMAIN_LABEL: None},
                             "resourceVersion": node["resourceVersion"]}}  # fmt: skip
        await self.api.patch(path, body)

    async def ready(self, domain: Domain, timeout_s: float) -> None:
        """Wait until this node's daemon says Ready; GateError with its reason after timeout."""
        key = subjects.domain_member_key(domain.uid, self.node)
        last: DomainMember | None = None

        async def watch() -> None:
            nonlocal last
            async for update in self.bus.watch_kv(subjects.DOMAINS_BUCKET, DomainMember, key):
                last = update.value
                if last is not None and last.status == cd.READY:
                    return

        try:
            await asyncio.wait_for(watch(), timeout_s)
        except TimeoutError:
            why = "its IMEX daemon has not joined"
            if last is not None:
                why = f"its IMEX daemon is {last.status}: {last.reason or 'no reason given'}"
            raise GateError(
                f"current node not ready in ComputeDomain {domain.namespace}/{domain.name} "
                f"after {timeout_s:g}s ({why})",
                permanent=False,
            ) from None

    async def admit(self, uid: str, claim_namespace: str, timeout_s: float) -> Domain:
        """All three steps for one channel claim."""
        domain = await self.domain(uid, claim_namespace)
        await self.label(domain)
        await self.ready(domain, timeout_s)
        return domain
