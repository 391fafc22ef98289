"""ComputeDomainClique objects (the gate ComputeDomainCliques, on by default), written
from the membership the controller keeps.

The reference keeps each clique's IMEX daemons in a ComputeDomainClique object in
the driver's namespace, ``<domain UID>.<clique ID>``, labelled with both (its daemons
write it, its plugin reads readiness from it). gpudra keeps membership on the bus
(services/domains/membership.py) and writes these objects as a view of it for the
tools that read them: the controller alone, one merge patch per clique and only when
its daemons changed, so no two writers ever meet on one object. A clique's entry is
each member of that clique that has an index (the daemons IMEX knows), in index
order, ``status`` Ready or NotReady (the CRD has no Failed: the domain's status and
Events say that). A clique left with no daemons, and every clique of a domain that
goes, is deleted; nothing in gpudra reads them back.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from services.core.kube.client import ApiError, KubeApi
from services.core.model import computedomain as cd
from services.domains.membership import Membership
from services.domains.model import Meta

log = logging.getLogger(__name__)
PLURAL = "computedomaincliques"


def cliques_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/{cd.GROUP}/{cd.VERSION}/namespaces/{namespace}/{PLURAL}"
    return path if name is None else f"{path}/{name}"


def clique_name(uid: str, clique: str) -> str:
    return f"{uid}.{clique}"


def wanted(uid: str, membership: Membership) -> dict[str, list[dict[str, Any]]]:
    """Clique ID -> its daemons as the objects list them."""
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    indices = membership.indices.get(uid, {})
    for node, member in membership.members.get(uid, {}).items():
        index = indices.get(node)
        if not member.clique_id or index is None or index.clique_id != member.clique_id:
            continue  # outside a fabric, or no index (yet, or the clique is full)
        entry = {
            "nodeName": node,
            "ipAddress": member.ip_address,
            "cliqueID": member.clique_id,
            "index": index.index,
            "status": cd.READY if member.status == cd.READY else cd.NOT_READY,
        }
        out.setdefault(member.clique_id, []).append((index.index, entry))
    return {clique: [e for _, e in sorted(found)] for clique, found in out.items()}


class _Obj(msgspec.Struct):
    metadata: Meta


class CliqueObjects:
    """Creates, updates and deletes the ComputeDomainClique objects of each domain."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        # uid -> clique -> the daemons last written (None: found in the API server, unread)
        self.written: dict[str, dict[str, list[dict[str, Any]] | None]] = {}

    async def sync(self, uid: str, membership: Membership) -> None:
        want = wanted(uid, membership)
        if uid not in self.written:  # first time since start: what an earlier run left
            prefix = f"{uid}."
            found = await self._list(f"{cd.DOMAIN_LABEL}={uid}")
            self.written[uid] = {
                m.name.removeprefix(prefix): None for m in found if m.name.startswith(prefix)
            }
        have = self.written[uid]
        for clique, daemons in sorted(want.items()):
            if have.get(clique) != daemons:
                await self._put(uid, clique, daemons)
                self.written.setdefault(uid, {})[clique] = daemons
        for clique in sorted(set(have) - set(want)):
            await self._delete(clique_name(uid, clique))
            self.written[uid].pop(clique, None)

    async def _put(self, uid: str, clique: str, daemons: list[dict[str, Any]]) -> None:
        name = clique_name(uid, clique)
        body = {
            "apiVersion": f"{cd.GROUP}/{cd.VERSION}",
            "kind": "ComputeDomainClique",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {cd.DOMAIN_LABEL: uid, cd.CLIQUE_LABEL: clique},
            },
            "daemons": daemons,
        }
        try:
            await self.api.create(cliques_path(self.namespace), body)
            log.info("clique created", extra={"clique": name, "daemons": len(daemons)})
            return
        except ApiError as exc:
            if exc.status != 409:
                raise
        await self.api.patch(cliques_path(self.namespace, name), {"daemons": daemons})
        log.info("clique updated", extra={"clique": name, "daemons": len(daemons)})

    async def _delete(self, name: str) -> None:
        try:
            await self.api.delete(cliques_path(self.namespace, name))
            log.info("clique deleted", extra={"clique": name})
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def remove_all(self, uid: str) -> None:
        """Every clique object of the domain, found by its label (after a restart too)."""
        for meta in await self._list(f"{cd.DOMAIN_LABEL}={uid}"):
            await self._delete(meta.name)
        self.written.pop(uid, None)

    async def orphans(self, live: set[str]) -> set[str]:
        """UIDs named by clique objects whose domain is not in ``live``."""
        found = {meta.labels.get(cd.DOMAIN_LABEL, "") for meta in await self._list(cd.DOMAIN_LABEL)}
        return {uid for uid in found if uid and uid not in live}

    async def _list(self, selector: str) -> list[Meta]:
        """The clique objects ``selector`` picks; none where the API server has no such
        resource (the CRD not installed: nothing of ours can exist, nothing holds a
        domain's deletion back)."""
        try:
            listing = await self.api.list(cliques_path(self.namespace), {"labelSelector": selector})
        except ApiError as exc:
            if exc.not_found:
                return []
            raise
        return [msgspec.json.decode(raw, type=_Obj).metadata for raw in listing.items]
