"""The controller's writes to the API server for one domain: create, tear down, sweep.

Everything is found again by label (``resource.nvidia.com/computeDomain=<uid>``),
never by remembered state, so a restarted controller picks up where it was. An
object of ours is never confused with a user's: a ResourceClaimTemplate that has
the workload template's name but not this domain's label is left alone and the
domain reports the conflict.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from services.core.kube.client import ApiError, KubeApi
from services.core.model import computedomain as cd
from services.domains import objects
from services.domains.model import ComputeDomain, Meta

log = logging.getLogger(__name__)
NODES = "/api/v1/nodes"


class Conflict(RuntimeError):
    """An object in the way of the domain's own (another owner, another domain)."""


class _Obj(msgspec.Struct):
    metadata: Meta


def _meta(body: bytes | msgspec.Raw) -> Meta:
    return msgspec.json.decode(body, type=_Obj).metadata


def _selector(uid: str | None = None) -> dict[str, str]:
    return {"labelSelector": cd.DOMAIN_LABEL if uid is None else f"{cd.DOMAIN_LABEL}={uid}"}


class KubeObjects:
    """Creates and removes the objects of each domain (see :mod:`services.domains.objects`)."""

    def __init__(self, api: KubeApi, settings: objects.DaemonSettings) -> None:
        self.api = api
        self.settings = settings

    def _paths(self, domain: ComputeDomain) -> list[tuple[str, str, str]]:
        """(collection path, name, kind) of the domain's objects, in creation order."""
        own = self.settings.namespace
        name = cd.daemon_name(domain.uid)
        return [
            (objects.RCT_PATH.format(ns=own), name, "ResourceClaimTemplate"),
            (objects.DS_PATH.format(ns=own), name, "DaemonSet"),
            (
                objects.RCT_PATH.format(ns=domain.metadata.namespace),
                domain.spec.channel.resource_claim_template.name,
                "ResourceClaimTemplate",
            ),
        ]

    # ---------------------------------------------------------------- creation

    async def ensure(self, domain: ComputeDomain) -> None:
        """The finalizer, then the daemon template, DaemonSet and workload template."""
        await self._add_finalizer(domain)
        bodies = [
            objects.daemon_template(domain, self.settings),
            objects.daemon_set(domain, self.settings),
            objects.workload_template(domain),
        ]
        for (path, name, kind), body in zip(self._paths(domain), bodies, strict=True):
            await self._create(domain, path, name, kind, body)

    async def _add_finalizer(self, domain: ComputeDomain) -> None:
        meta = domain.metadata
        if cd.FINALIZER in meta.finalizers:
            return
        body = {"metadata": {"finalizers": [*meta.finalizers, cd.FINALIZER],
                             "resourceVersion": meta.resource_version}}  # fmt: skip
        await self.api.patch(cd.domains_path(meta.namespace, meta.name), body)

    async def _create(
        self, domain: ComputeDomain, path: str, name: str, kind: str, body: dict[str, Any]
    ) -> None:
        try:
            await self.api.create(path, body)
            log.info("created", extra={"domain": domain.key, "kind": kind, "object": name})
            return
        except ApiError as exc:
            if exc.status != 409:
                raise
        existing = _meta(await self.api.get(f"{path}/{name}"))
        owner = existing.labels.get(cd.DOMAIN_LABEL)
        if owner != domain.uid:
            whose = f"ComputeDomain {owner}" if owner else "no ComputeDomain"
            raise Conflict(
                f"{kind} {existing.namespace}/{name} already exists and belongs to {whose}; "
                "rename it or choose another spec.channel.resourceClaimTemplate.name"
            )

    # ---------------------------------------------------------------- deletion

    async def teardown(self, domain: ComputeDomain) -> bool:
        """One pass of the reference's order; True once everything is gone.

        Delete the workload template, then the DaemonSet and daemon template; take
        the domain's label off every node; lift our finalizer from those objects
        and check each is gone. The caller then removes the domain's own finalizer.
        """
        paths = self._paths(domain)
        for path, name, _ in [paths[2], paths[1], paths[0]]:
            await self._delete_if_ours(domain.uid, f"{path}/{name}")
        await self.unlabel_nodes(domain.uid)
        gone = True
        for path, name, _ in paths:
            gone &= await self._release(domain.uid, f"{path}/{name}")
        return gone

    async def _delete_if_ours(self, uid: str, path: str) -> None:
        try:
            meta = _meta(await self.api.get(path))
            if meta.labels.get(cd.DOMAIN_LABEL) != uid or meta.deletion_timestamp:
                return
            await self.api.delete(path, {"propagationPolicy": "Background"})
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def _release(self, uid: str, path: str) -> bool:
        """Drop our finalizer from a deleted object of ours; True if it no longer exists."""
        try:
            meta = _meta(await self.api.get(path))
        except ApiError as exc:
            if exc.not_found:
                return True
            raise
        if meta.labels.get(cd.DOMAIN_LABEL) != uid:
            return True  # not ours (a user's object of the same name): not in the way
        if meta.deletion_timestamp and cd.FINALIZER in meta.finalizers:
            rest = [f for f in meta.finalizers if f != cd.FINALIZER]
            body = {"metadata": {"finalizers": rest, "resourceVersion": meta.resource_version}}
            try:
                await self.api.patch(path, body)
            except ApiError as exc:
                if not exc.not_found:
                    raise
        return False

    async def unlabel_nodes(self, uid: str) -> list[str]:
        """Take ``resource.nvidia.com/computeDomain=<uid>`` off every node that has it."""
        listing = await self.api.list(NODES, _selector(uid))
        names = [_meta(raw).name for raw in listing.items]
        for name in names:
            body = {"metadata": {"labels": {cd.DOMAIN_LABEL: None}}}
            try:
                await self.api.patch(f"{NODES}/{name}", body)
            except ApiError as exc:
                if not exc.not_found:
                    raise
        return names

    async def remove_finalizer(self, domain: ComputeDomain) -> None:
        meta = domain.metadata
        rest = [f for f in meta.finalizers if f != cd.FINALIZER]
        body = {"metadata": {"finalizers": rest, "resourceVersion": meta.resource_version}}
        await self.api.patch(cd.domains_path(meta.namespace, meta.name), body)

    # ---------------------------------------------------------------- orphans

    async def orphans(self, live: set[str]) -> set[str]:
        """UIDs named by our labels on templates, DaemonSets or nodes with no live domain."""
        found: set[str] = set()
        collections = [
            "/apis/resource.k8s.io/v1/resourceclaimtemplates",
            objects.DS_PATH.format(ns=self.settings.namespace),
            NODES,
        ]
        for path in collections:
            listing = await self.api.list(path, _selector())
            found |= {_meta(raw).labels.get(cd.DOMAIN_LABEL, "") for raw in listing.items}
        return {uid for uid in found if uid and uid not in live}

    async def sweep(self, uid: str) -> bool:
        """Remove every object and label of a domain that no longer exists."""
        for path, kind in (
            ("/apis/resource.k8s.io/v1/resourceclaimtemplates", "ResourceClaimTemplate"),
            (objects.DS_PATH.format(ns=self.settings.namespace), "DaemonSet"),
        ):
            listing = await self.api.list(path, _selector(uid))
            for raw in listing.items:
                meta = _meta(raw)
                where = objects.RCT_PATH if kind == "ResourceClaimTemplate" else objects.DS_PATH
                one = f"{where.format(ns=meta.namespace)}/{meta.name}"
                await self._delete_if_ours(uid, one)
                await self._release(uid, one)
                log.info("orphan removed", extra={"uid": uid, "kind": kind, "object": meta.name})
        await self.unlabel_nodes(uid)
        return not await self.orphans(set()) & {uid}
