"""Where the preparer learns a claim, and the checks that it may be prepared on this node.

The API server is the authority on a claim; the ``claims`` bucket, which the
allocator's claim watcher fills before the kubelet asks, is a cache that anyone
able to write the bus could forge (issue 9). So, with an API server:

- the claims of every pod bound to this node are read from the API server when
  the node's pod watch first sees the pod (:meth:`ClaimSource.on_pod`), before
  the kubelet asks, from the API server's watch cache (it spares etcd a read; the
  copy is checked like any other): a prepare finds the API server's copy in
  memory (when the kubelet was faster than the watch, the prepare's own read is
  kept instead: the claim is not read twice);
- a prepare checks that copy (:mod:`services.preparer.verify`: UID, allocation
  on this node, reserved for a pod running here, from the pod watch); a copy
  that fails (one the cache had not caught up with, say), or none at all, costs
  one fresh GET of the claim before refusing;
- the bucket's copy is only compared with it: a difference is logged and
  counted (a stale or rewritten entry), never used.

Without an API server nothing can be checked against it: prepares are refused,
unless the operator said ``--trust-claims-bucket`` (a simulated node whose bus
is trusted), where the bucket's copy is checked alone (UID, allocation on this
node; no pod). Claim identities come from the kubelet but end up in file
names, subjects and (KEP-5304) container paths, so they are validated strictly
first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import TYPE_CHECKING, Protocol

import msgspec
from prometheus_client import Counter

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.bus.failures import unavailable
from services.core.kit import limits, supervisor
from services.core.kit.backoff import Backoff
from services.core.kube.pods import Pod
from services.core.kube.resource import ResourceClaim, ResourceClaimConsumerReference
from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import ClaimRef, SchemaError
from services.preparer import verify
from services.preparer.pods import PodLookupError

if TYPE_CHECKING:
    from services.core.kube.client import KubeApi
    from services.preparer.pods import NodePods

log = logging.getLogger(__name__)

BUCKET_MISMATCHES = Counter(
    "gpudra_preparer_claims_bucket_mismatches_total",
    "Prepares whose claims bucket entry had another allocation than the API server's claim "
    "(stale or rewritten; the API server's was used).",
)
PREFETCH_CONCURRENCY = 8  # GETs of claims of newly seen pods at once
MAX_POD_LOOKUPS = 4  # GETs of reserving pods the watch has not seen, per claim check
CACHED = {"resourceVersion": "0"}  # a GET the API server answers from its watch cache

_RFC4122 = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ClaimError(ClaimRefused, ValueError):
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
    async def get_claim(
        self, namespace: str, name: str, *, cached: bool = False
    ) -> ResourceClaim | None: ...


class KubernetesReader:
    """GET resource.k8s.io/v1 resourceclaims through the one client in services.core.kube.client."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def get_claim(
        self, namespace: str, name: str, *, cached: bool = False
    ) -> ResourceClaim | None:
        """``cached``: from the API server's watch cache (``resourceVersion=0``), which
        spares etcd a read but may lag it by a few milliseconds; for reads ahead, whose
        copy is read again fresh when it does not pass."""
        from services.core.kube import client as kube

        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        try:
            body = await self.api.get(path, CACHED if cached else None)
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
    """A claim, checked to be preparable on this node; see the module docstring.

    ``api`` and ``pods`` go together (the API server's claims, this node's pods);
    without them the bucket is read only when ``trust_bucket`` says so.
    In trusted-bucket mode, a bucket that cannot answer (its stream electing a
    leader after a server died, or without quorum) is read again until shortly
    before the kubelet's deadline; then the claim fails with an error that says so.
    """

    def __init__(
        self,
        bus: Bus,
        node: str,
        api: ApiReader | None = None,
        pods: NodePods | None = None,
        *,
        trust_bucket: bool = False,
        driver: str = verify.DRIVER,
    ) -> None:
        """``driver``: the claims' driver (the allocation must hold devices of it here).
        Only the first source built on ``pods`` reads claims ahead from its watch."""
        if (api is None) != (pods is None):
            raise ValueError("the API server's claims and the pod watch go together")
        self.driver = driver
        self.bus = bus
        self.node = node
        self.api = api
        self.pods = pods
        self.trust_bucket = trust_bucket and api is None
        self._cache: dict[str, ResourceClaim] = {}  # uid -> the bucket's copy (mirror)
        self._copies: dict[str, ResourceClaim] = {}  # "ns/name" -> the API server's copy
        self._users: dict[str, set[str]] = {}  # "ns/name" -> uids of this node's pods naming it
        self._fetching: dict[str, asyncio.Task[ResourceClaim | None]] = {}
        self._reading: dict[str, int] = {}  # "ns/name" -> prepares reading it from the API now
        self._limit = asyncio.Semaphore(PREFETCH_CONCURRENCY)
        if pods is not None and pods.on_change is None:
            pods.on_change = self.on_pod

    # ------------------------------------------------------------ the bucket's copies

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
        await supervisor.cancel_and_wait(list(self._fetching.values()))

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

    # ------------------------------------------------------------ the API server's copies

    async def on_pod(self, old: Pod | None, new: Pod | None) -> None:
        """The pod watch's hook: read the claims of a pod newly bound here, before the kubelet
        asks; forget them when no pod of this node names them any more."""
        if new is None:
            if old is not None:
                self._drop_user(old)
            return
        if new.terminal() or new.metadata.deletion_timestamp is not None:
            return
        uid = new.metadata.uid or ""
        for name in new.claim_names():
            key = f"{new.metadata.namespace}/{name}"
            users = self._users.setdefault(key, set())
            if uid not in users:
                users.add(uid)
                if key not in self._reading:  # a prepare reading it now stands for the
                    self._prefetch(key)  # read ahead: its copy is kept

    def _drop_user(self, pod: Pod) -> None:
        for name in pod.claim_names():
            key = f"{pod.metadata.namespace}/{name}"
            users = self._users.get(key)
            if users is not None:
                users.discard(pod.metadata.uid or "")
                if not users:
                    del self._users[key]
                    self._copies.pop(key, None)

    def _prefetch(self, key: str) -> None:
        task = asyncio.get_running_loop().create_task(self._fetch_copy(key))
        self._fetching[key] = task

        def done(finished: asyncio.Task[ResourceClaim | None]) -> None:
            if self._fetching.get(key) is finished:
                del self._fetching[key]

        task.add_done_callback(done)

    async def _fetch_copy(self, key: str) -> ResourceClaim | None:
        namespace, name = key.split("/", 1)
        assert self.api is not None
        async with self._limit:
            try:
                claim = await self.api.get_claim(namespace, name, cached=True)
            except ClaimError as exc:  # the prepare will ask again
                log.info("could not read a pod's claim ahead", extra={"error": str(exc)})
                return None
        if claim is not None and key in self._users:
            self._copies[key] = claim
        return claim

    async def _api_copy(self, ref: ClaimRef) -> tuple[ResourceClaim | None, bool]:
        """The API server's claim: the copy read ahead (False) or read now (True)."""
        key = f"{ref.namespace}/{ref.name}"
        ahead = self._fetching.get(key)
        if ahead is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(ahead)
        copy = self._copies.get(key)
        if copy is not None and copy.metadata.uid == ref.uid:
            return copy, False
        return await self._fetch_now(ref), True

    async def _fetch_now(self, ref: ClaimRef) -> ResourceClaim | None:
        """The claim read for a prepare; kept as the copy if a pod of this node names it by
        the time it arrives (the kubelet may call before the pod watch sees the pod: then
        the watch's read ahead is not made, this read is)."""
        assert self.api is not None
        key = f"{ref.namespace}/{ref.name}"
        self._reading[key] = self._reading.get(key, 0) + 1
        try:
            claim = await self.api.get_claim(ref.namespace, ref.name)
        finally:
            if self._reading[key] == 1:
                del self._reading[key]
            else:
                self._reading[key] -= 1
        if claim is not None and key in self._users:
            self._copies[key] = claim
        return claim

    def copy_of(self, namespace: str, name: str, uid: str) -> ResourceClaim | None:
        """The API server's copy of that claim this source holds (read ahead or at its
        prepare), if any: what the claim's status writer starts from instead of a GET."""
        copy = self._copies.get(f"{namespace}/{name}")
        return copy if copy is not None and copy.metadata.uid == uid else None

    def forget(self, ref: ClaimRef) -> None:
        """The claim was unprepared: a later prepare reads it afresh (it may be reallocated)."""
        key = f"{ref.namespace}/{ref.name}"
        copy = self._copies.get(key)
        if copy is not None and copy.metadata.uid == ref.uid:
            del self._copies[key]

    # ------------------------------------------------------------ the checks

    async def get(self, ref: ClaimRef, deadline: float | None = None) -> ResourceClaim:
        """The claim ``ref`` names, checked; :class:`ClaimError` says why it may not be used.

        ``deadline`` (unix time, the kubelet's) bounds how long an unavailable
        bucket is waited for in trusted-bucket mode."""
        if self.api is None:
            return await self._trusted_bucket(ref, deadline)
        claim, fresh = await self._api_copy(ref)
        problem = await self._problem(ref, claim)
        if problem is not None and not fresh:  # the copy read ahead may be stale: ask once more
            claim = await self._fetch_now(ref)
            problem = await self._problem(ref, claim)
        if problem is not None:
            raise ClaimError(f"claim {describe(ref)}: {problem}")
        assert claim is not None
        self._compare_with_bucket(ref, claim)
        return claim

    async def _problem(self, ref: ClaimRef, claim: ResourceClaim | None) -> str | None:
        if claim is None:
            return "not found in the API server"
        return (
            verify.identity(claim, ref)
            or verify.allocation(claim, self.node, self.driver)
            or await self._reserved_here(ref, claim)
        )

    async def _reserved_here(self, ref: ClaimRef, claim: ResourceClaim) -> str | None:
        """c: some reserving pod runs on this node; pods the watch has not seen (just bound,
        or elsewhere) are read from the API server, at most MAX_POD_LOOKUPS of them, the
        newest reservations first (the kubelet's pod was reserved last)."""
        assert self.pods is not None
        consumers = verify.reserving_pods(claim)
        if not consumers:
            return verify.not_reserved(claim)
        unseen: list[ResourceClaimConsumerReference] = []
        reasons: list[str] = []
        for c in consumers:
            pod = self.pods.seen(ref.namespace, c.name)
            if pod is None or pod.metadata.uid != c.uid:
                unseen.append(c)
                continue
            reason = verify.pod_mismatch(pod, c, ref.namespace, self.node)
            if reason is None:
                return None
            reasons.append(reason)
        for i, c in enumerate(reversed(unseen)):  # newest first: the pod being started
            if i == MAX_POD_LOOKUPS:
                reasons.append(f"{len(unseen) - i} more pod(s) not seen here, not looked up")
                break
            pod = await self._get_pod(ref, c.name)
            reason = verify.pod_mismatch(pod, c, ref.namespace, self.node)
            if reason is None:
                return None
            reasons.append(reason)
        return f"the claim is reserved for no pod on this node {self.node!r}: " + "; ".join(reasons)

    async def _get_pod(self, ref: ClaimRef, name: str) -> Pod | None:
        assert self.pods is not None
        try:
            return await self.pods.get(ref.namespace, name)
        except PodLookupError as exc:
            raise ClaimError(
                f"claim {describe(ref)}: could not read its pod {ref.namespace}/{name} "
                f"from the API server: {exc}"
            ) from exc

    def _compare_with_bucket(self, ref: ClaimRef, claim: ResourceClaim) -> None:
        """A bucket entry with another allocation is stale or forged: say so, never use it."""
        mirrored = self._cache.get(ref.uid)
        if mirrored is None or claim.status is None:
            return
        if (mirrored.status.allocation if mirrored.status else None) != claim.status.allocation:
            BUCKET_MISMATCHES.inc()
            log.warning(
                "the claims bucket holds another allocation than the API server for this claim "
                "(stale or rewritten); the API server's is used",
                extra={"claim": describe(ref), "uid": ref.uid},
            )

    async def _trusted_bucket(self, ref: ClaimRef, deadline: float | None) -> ResourceClaim:
        who = f"claim {describe(ref)}"
        if not self.trust_bucket:
            raise ClaimError(
                f"{who}: cannot be checked: this preparer has no API server to read the claim "
                "and its pod from (give --kubeconfig, or run it in a pod with its service "
                "account; --trust-claims-bucket only where every writer of the bus is trusted)"
            )
        claim = await self._from_bucket(ref, deadline)
        if claim is None:
            raise ClaimError(f"{who}: not found in the claims bucket")
        problem = verify.identity(claim, ref) or verify.allocation(claim, self.node, self.driver)
        if problem is not None:
            raise ClaimError(f"{who}: {problem}")
        return claim

    def alive_holders(self, ref: ClaimRef) -> list[str]:
        """Reserving pods the pod watch still shows alive on this node (for unprepare's log).

        From the copies in memory only (API server's, else the bucket's): no API call."""
        if self.pods is None:
            return []
        claim = self._copies.get(f"{ref.namespace}/{ref.name}") or self._cache.get(ref.uid)
        if claim is None or claim.metadata.uid != ref.uid:
            return []
        return [
            f"{ref.namespace}/{c.name}"
            for c in verify.reserving_pods(claim)
            if verify.running_here(self.pods.seen(ref.namespace, c.name), c)
        ]
