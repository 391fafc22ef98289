"""Kubernetes Events on claims: one Event object per claim, updated rather than duplicated.

The Event's name is derived from the claim's UID, so even after a restart the
same object is found (create answers 409) and patched: ``count`` grows,
``lastTimestamp``, ``reason``, ``type`` and ``message`` are replaced. A
token bucket caps the writes per second across all claims; the caller decides
how often one claim is explained.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from services.allocator.watcher import metrics
from services.core.kube.client import ApiError, KubeApi
from services.core.kube.resource import ResourceClaim

log = logging.getLogger(__name__)

COMPONENT = "gpudra-allocator"


def event_name(claim: ResourceClaim) -> str:
    """``<claim>.gpudra-<hash of uid>``: stable per claim, a DNS subdomain of <= 253 chars."""
    digest = hashlib.sha256((claim.metadata.uid or "").encode()).hexdigest()[:12]
    return f"{claim.metadata.name[:200].rstrip('.-')}.gpudra-{digest}"


def _timestamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class _Count(msgspec.Struct):
    count: int = 1


@dataclass(slots=True)
class _Posted:
    namespace: str
    name: str
    count: int


class ClaimEventRecorder:
    def __init__(
        self, api: KubeApi, rate: float = 5.0, burst: int = 20, instance: str | None = None
    ) -> None:
        self.api = api
        self.bucket = TokenBucket(rate, burst)
        self.instance = instance or socket.gethostname()
        self.posted: dict[str, _Posted] = {}  # claim uid -> its Event

    def forget(self, uid: str) -> None:
        self.posted.pop(uid, None)

    async def record(
        self,
        claim: ResourceClaim,
        reason: str,
        type_: str,
        message: str,
        on: dict[str, Any] | None = None,
    ) -> bool:
        """Create or update the claim's Event (about ``on``, an involvedObject, when the
        claim does not exist yet); False when rate-limited or the API failed."""
        if not self.bucket.take():
            metrics.K8S_EVENTS.labels(op="throttled").inc()
            return False
        uid = claim.metadata.uid or ""
        namespace = claim.metadata.namespace or "default"
        now = _timestamp(time.time())
        update = {"reason": reason, "type": type_, "message": message, "lastTimestamp": now}
        try:
            posted = self.posted.get(uid)
            if posted is not None:
                try:
                    await self.api.patch(
                        _path(posted.namespace, posted.name), {**update, "count": posted.count + 1}
                    )
                    posted.count += 1
                    metrics.K8S_EVENTS.labels(op="update").inc()
                    return True
                except ApiError as exc:
                    if not exc.not_found:  # expired (events have a TTL): create it again
                        raise
            posted = await self._create(claim, namespace, update, on)
            self.posted[uid] = posted
            return True
        except ApiError as exc:
            metrics.K8S_EVENTS.labels(op="failed").inc()
            log.warning(
                "could not write the claim's Event",
                extra={"claim": f"{namespace}/{claim.metadata.name}", "error": str(exc)},
            )
            return False

    async def _create(
        self,
        claim: ResourceClaim,
        namespace: str,
        update: dict[str, Any],
        on: dict[str, Any] | None = None,
    ) -> _Posted:
        name = event_name(claim)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": on
            or {
                "apiVersion": claim.api_version,
                "kind": "ResourceClaim",
                "namespace": namespace,
                "name": claim.metadata.name,
                "uid": claim.metadata.uid,
                "resourceVersion": claim.metadata.resource_version,
            },
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": update["lastTimestamp"],
            "count": 1,
            **update,
        }
        try:
            await self.api.create(_path(namespace, ""), body)
            metrics.K8S_EVENTS.labels(op="create").inc()
            return _Posted(namespace, name, 1)
        except ApiError as exc:
            if not exc.conflict:
                raise
        # Ours from before a restart: continue its count.
        existing = msgspec.json.decode(await self.api.get(_path(namespace, name)), type=_Count)
        count = existing.count + 1
        await self.api.patch(_path(namespace, name), {**update, "count": count})
        metrics.K8S_EVENTS.labels(op="update").inc()
        return _Posted(namespace, name, count)


def _path(namespace: str, name: str) -> str:
    base = f"/api/v1/namespaces/{namespace}/events"
    return f"{base}/{name}" if name else base
