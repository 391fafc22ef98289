"""Where the preparer learns a claim's allocation, and the checks on the claim itself.

The allocator's claim watcher puts every allocated claim into the ``claims``
bucket (key ``<node>.<uid>``) before the kubelet asks, so a prepare needs no
API round trip; when the bucket has nothing, the claim is read from the API
server. Claim identities come from the kubelet but end up in file names,
subjects and (KEP-5304) container paths, so they are validated strictly first.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import TYPE_CHECKING, Protocol

import msgspec

from services.core import limits, subjects, supervisor
from services.core.backoff import Backoff
from services.core.bus import Bus, unavailable
from services.core.resource import ResourceClaim
from services.core.schemas import ClaimRef, SchemaError

if TYPE_CHECKING:
    from services.core.kube import KubeApi

log = logging.getLogger(__name__)

_RFC4122 = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ClaimError(ValueError):
    """A claim that cannot be prepared; the message names the claim and the reason."""


def describe(ref: ClaimRef) -> str:
    """``ns/name`` for messages; unsafe text is shown quoted, never interpreted."""
    if _DNS_LABEL.match(ref.namespace) and _DNS_SUBDOMAIN.match(ref.name):
        return f"{ref.namespace}/{ref.name}"
    return f"{ref.namespace!r}/{ref.name!r}"


def check_identity(ref: ClaimRef) -> None:
    """Refuse a UID, namespace or name that could escape into a path or a subject.

    UIDs are RFC 4122 (what the API server assigns) or, for hand-made test
    claims, a DNS label; namespaces are DNS labels; names DNS subdomains.
    """
    who = f"claim {describe(ref)}"
    if not ref.uid:
        raise ClaimError(f"{who}: uid is empty")
    if not (_RFC4122.match(ref.uid) or _DNS_LABEL.match(ref.uid)):
        raise ClaimError(
            f"{who}: uid {ref.uid!r} is not an RFC 4122 UUID or a DNS label "
            "(only [a-z0-9-] and hex UUIDs are accepted)"
        )
    if not _DNS_LABEL.match(ref.namespace):
        raise ClaimError(f"{who}: namespace {ref.namespace!r} is not a DNS label")
    if len(ref.name) > 253 or not _DNS_SUBDOMAIN.match(ref.name):
        raise ClaimError(f"{who}: name {ref.name!r} is not a DNS subdomain")


class ApiReader(Protocol):
    async def get_claim(self, namespace: str, name: str) -> ResourceClaim | None: ...


class KubernetesReader:
    """GET resource.k8s.io/v1 resourceclaims through the one client in services.core.kube.

    The client (and kubernetes-asyncio under it) is imported on first use: most
    prepares find their claim in the bucket, and the node process stays small.
    """

    def __init__(self, kubeconfig: str = "") -> None:
        self.kubeconfig = kubeconfig
        self._api: KubeApi | None = None

    async def get_claim(self, namespace: str, name: str) -> ResourceClaim | None:
        from services.core import kube

        if self._api is None:
            self._api = await kube.http_api(self.kubeconfig)
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        try:
            body = await self._api.get(path)
        except kube.ApiError as exc:
            if exc.not_found:
                return None
            raise ClaimError(f"claim {namespace}/{name}: API server said {exc}") from exc
        try:
            return msgspec.json.decode(body, type=ResourceClaim)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ClaimError(f"claim {namespace}/{name}: unreadable ResourceClaim: {exc}") from exc
        except RecursionError as exc:
            raise ClaimError(str(limits.too_deep(f"claim {namespace}/{name}"))) from exc

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()


#: Without a deadline from the kubelet, how long a claim read waits for the bucket.
DEFAULT_PATIENCE_S = 5.0


def patience(deadline: float | None) -> float:
    """Seconds a claim read may wait for an unavailable bucket: until a little before
    ``deadline`` (unix time), so that the answer still reaches the kubelet in time."""
    if deadline is None:
        return DEFAULT_PATIENCE_S
    remaining = deadline - time.time()
    return max(0.0, remaining - max(0.25, 0.1 * remaining))


class ClaimSource:
    """A claim's current object: the ``claims`` bucket first, then the API server.

    With :meth:`follow` running, this node's entries of the bucket are kept in
    memory as the allocator writes them, so a prepare reads its claim without
    a round trip; a claim not seen yet is read from the bucket directly. When
    the bucket cannot answer (its stream is electing a leader after a server
    died, or has lost quorum), the read is tried again until shortly before
    the kubelet's deadline, then fails with an error that says so: the kubelet
    gets an answer in time, and a failover that ends meanwhile fails nothing.
    """

    def __init__(self, bus: Bus, node: str, api: ApiReader | None = None) -> None:
        self.bus = bus
        self.node = node
        self.api = api
        self._cache: dict[str, ResourceClaim] = {}

    def follow(self) -> None:
        """Mirror this node's claims in the background (supervised: restarted if it fails)."""
        supervisor.current().spawn("claims-mirror", self._mirror)

    async def _mirror(self) -> None:
        prefix = subjects.claim_key(self.node, "")[:-1]  # "<node>." (the uid part escaped to "=")
        async for update in self.bus.watch_kv(subjects.CLAIMS_BUCKET, ResourceClaim, f"{prefix}>"):
            uid = subjects.unescape_token(update.key[len(prefix) :])
            if update.value is None:
                self._cache.pop(uid, None)
            else:
                self._cache[uid] = update.value

    async def close(self) -> None:
        await supervisor.current().cancel("claims-mirror")

    async def get(self, ref: ClaimRef, deadline: float | None = None) -> ResourceClaim:
        """The allocated claim ``ref`` names; :class:`ClaimError` when it cannot be used
        (or, ``deadline`` near, cannot be read)."""
        who = f"claim {describe(ref)}"
        claim = await self._from_bucket(ref, deadline)
        if claim is None and self.api is not None:
            claim = await self.api.get_claim(ref.namespace, ref.name)
        if claim is None:
            where = "the claims bucket" + (" or the API server" if self.api else "")
            raise ClaimError(f"{who}: not found in {where}")
        if claim.metadata.uid != ref.uid:
            raise ClaimError(
                f"{who}: claim was replaced (the kubelet asked for uid {ref.uid}, "
                f"the claim now has uid {claim.metadata.uid})"
            )
        if claim.status is None or claim.status.allocation is None:
            raise ClaimError(f"claim {describe(ref)} is not allocated")
        return claim

    async def _from_bucket(self, ref: ClaimRef, deadline: float | None) -> ResourceClaim | None:
        cached = self._cache.get(ref.uid)
        if cached is not None:
            return cached
        key = subjects.claim_key(self.node, ref.uid)
        started = time.monotonic()
        give_up = started + patience(deadline)
        backoff = Backoff(first=0.1, limit=1.0)
        while True:
            try:
                got = await asyncio.wait_for(
                    self.bus.kv_get(subjects.CLAIMS_BUCKET, key, ResourceClaim),
                    max(give_up - time.monotonic(), 0.1),
                )
            except SchemaError as exc:
                log.warning(
                    "unreadable claims bucket entry; asking the API server",
                    extra={"key": key, "error": str(exc)},
                )
                return None
            except Exception as exc:
                if not unavailable(exc):
                    raise
                cached = self._cache.get(ref.uid)  # the mirror may have it by now
                if cached is not None:
                    return cached
                if time.monotonic() + backoff.delay >= give_up:
                    raise ClaimError(
                        f"claim {describe(ref)}: the claims bucket cannot be read: JetStream "
                        f"did not answer for {time.monotonic() - started:.1f}s "
                        f"({type(exc).__name__}: {str(exc) or 'no answer'}); the NATS cluster is "
                        "electing a leader or has lost its quorum"
                    ) from exc
                log.info("claims bucket unavailable; reading again", extra={"key": key})
                await backoff.sleep()
                continue
            return got[0] if got else None
