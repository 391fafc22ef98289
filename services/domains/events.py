"""Kubernetes Events on a ComputeDomain: why it is not Ready, in ``kubectl describe``.

The CRD has no conditions (the reference's neither), so a daemon that cannot start
(#289) or a template name that is taken would otherwise be invisible to the user.
Each distinct (reason, message) is posted once per domain; a failure to post is
logged, never fatal.
"""

from __future__ import annotations

import hashlib
import logging
import time

from services.core.kube.client import ApiError, KubeApi
from services.core.model import computedomain as cd
from services.domains.model import ComputeDomain

log = logging.getLogger(__name__)
COMPONENT = "gpudra-domains"


class DomainEvents:
    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.posted: dict[str, set[str]] = {}  # uid -> reason:message already posted

    def forget(self, uid: str) -> None:
        self.posted.pop(uid, None)

    async def warn(self, domain: ComputeDomain, reason: str, message: str) -> None:
        seen = self.posted.setdefault(domain.uid, set())
        key = f"{reason}:{message}"
        if key in seen:
            return
        meta = domain.metadata
        digest = hashlib.sha256(f"{domain.uid}/{key}".encode()).hexdigest()[:10]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.name}.{digest}", "namespace": meta.namespace},
            "involvedObject": {
                "apiVersion": f"{cd.GROUP}/{cd.VERSION}",
                "kind": cd.KIND,
                "namespace": meta.namespace,
                "name": meta.name,
                "uid": domain.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": COMPONENT},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.api.create(f"/api/v1/namespaces/{meta.namespace}/events", body)
        except ApiError as exc:
            if not exc.conflict:
                log.warning("event not posted", extra={"domain": domain.key, "error": str(exc)})
                return
        seen.add(key)
        extra = {"domain": domain.key, "reason": reason, "why": message}
        log.warning("domain problem", extra=extra)
