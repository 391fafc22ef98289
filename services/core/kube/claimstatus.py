"""A ResourceClaim's ``status.devices`` (KEP-4817): one driver's entries, beside others'.

Each entry names one allocated device (driver, pool, device, and shareID for a
share) and carries its conditions and driver data. Entries belong to their
driver: a writer replaces its own driver's and keeps every other driver's as they
are, in one merge patch of the status subresource that carries the claim's UID and
resourceVersion as preconditions. A merge patch replaces the whole list, so the
preconditions are what make the read-modify-write safe: a 409 means "read again".

The API server authorizes such a write per driver whose entries changed, on the
synthetic subresource ``resourceclaims/driver`` named after the driver
(pkg/registry/resource/utils.go, AuthorizedForDeviceStatus): with the verb
``associated-node:patch`` for a ServiceAccount token bound to a pod on the claim's
allocated node, else ``arbitrary-node:patch`` (plus ``patch`` on
``resourceclaims/status`` itself). That granular check exists from Kubernetes 1.36
(DRAResourceClaimGranularStatusAuthorization); before it, ``patch`` on the status
subresource alone allowed any change to any claim's allocation, so gpudra neither
asks for that grant nor writes below :data:`GRANULAR_MINOR` unless told to.
A condition keeps its ``lastTransitionTime`` while its status stays the same
(as apimachinery's SetStatusCondition), so a rewrite of the same facts is no write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.core.kit.backoff import Backoff
from services.core.kube.client import ApiError, KubeApi, server_minor

#: The first Kubernetes minor that authorizes status.devices per driver and node.
GRANULAR_MINOR = 36
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"

log = logging.getLogger(__name__)

Entry = dict[str, Any]
Key = tuple[str, str, str, str]


def wanted(mode: str, minor: int) -> bool:
    """``--claim-device-status`` / ``--binding-conditions``: ``on``, ``off``, or ``auto``
    (from :data:`GRANULAR_MINOR`, where the writes are authorized per driver and node
    and the gates are on by default)."""
    return mode == "on" or (mode == "auto" and minor >= GRANULAR_MINOR)


async def decide(api: KubeApi, mode: str) -> bool:
    """:func:`wanted` for this API server: ``auto`` asks its version, again with backoff
    while it does not answer (a component starts and serves while the API server is
    away); a server without /version is taken for an old one."""
    if mode != "auto":
        return mode == "on"
    backoff = Backoff()
    while True:
        try:
            minor = await server_minor(api)
            break
        except ApiError as exc:
            if exc.not_found or not exc.retryable:  # no /version at all: not a Kubernetes one
                log.warning("API server version unreadable", extra={"error": str(exc)})
                return False
            log.warning("API server version unknown; retrying", extra={"error": str(exc)})
            await backoff.sleep()
    return wanted(mode, minor)


def status_path(namespace: str, name: str) -> str:
    return CLAIMS.format(ns=namespace, name=name) + "/status"


def key(entry: Mapping[str, Any]) -> Key:
    """What names an entry: (driver, pool, device, shareID or "")."""
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID") or ""),
    )


def now() -> str:
    """A condition's time: RFC 3339, whole seconds, UTC (metav1.Time's wire form)."""
    return stamp(time.time())


def stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def condition(kind: str, status: bool, reason: str, message: str, since: str) -> dict[str, str]:
    """One metav1.Condition: ``reason`` CamelCase, ``message`` at most 32 KiB."""
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since,
    }


def entry(
    driver: str,
    pool: str,
    device: str,
    conditions: Sequence[Mapping[str, str]],
    *,
    share_id: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> Entry:
    out: Entry = {"driver": driver, "pool": pool, "device": device}
    if share_id:
        out["shareID"] = share_id
    out["conditions"] = [dict(c) for c in conditions]
    if data:
        out["data"] = dict(data)
    return out


def _carry_times(old: Mapping[str, Any] | None, new: Entry) -> Entry:
    """``new`` with each condition's lastTransitionTime kept where its status did not change."""
    before = {c.get("type"): c for c in (old or {}).get("conditions") or []}
    conditions = []
    for cond in new.get("conditions") or []:
        prior = before.get(cond.get("type"))
        if prior is not None and prior.get("status") == cond.get("status"):
            cond = {**cond, "lastTransitionTime": prior.get("lastTransitionTime")}
        conditions.append(cond)
    return {**new, "conditions": conditions}


def merged(
    current: Iterable[Mapping[str, Any]] | None, driver: str, ours: Sequence[Entry]
) -> list[Entry]:
    """The list to write: every other driver's entries as they are, then ``ours`` (this
    driver's whole set: an entry of ours left out is removed)."""
    current = list(current or [])
    by_key = {key(e): e for e in current}
    others = [dict(e) for e in current if e.get("driver") != driver]
    return others + [_carry_times(by_key.get(key(e)), e) for e in ours]


def _comparable(entries: Iterable[Mapping[str, Any]]) -> list[tuple[Key, Any]]:
    out = []
    for e in entries:
        conditions = sorted(
            (tuple(sorted((k, str(v)) for k, v in c.items() if k != "observedGeneration"))
             for c in e.get("conditions") or []),
        )  # fmt: skip
        out.append((key(e), (conditions, e.get("data"), e.get("networkData"))))
    return sorted(out, key=lambda item: item[0])


def same(current: Iterable[Mapping[str, Any]] | None, wanted: Iterable[Mapping[str, Any]]) -> bool:
    """Whether writing ``wanted`` would change nothing (order aside)."""
    return _comparable(current or []) == _comparable(wanted)


def ours(current: Iterable[Mapping[str, Any]] | None, driver: str) -> list[Mapping[str, Any]]:
    return [e for e in current or [] if e.get("driver") == driver]


async def write(
    api: KubeApi,
    namespace: str,
    name: str,
    *,
    uid: str,
    resource_version: str,
    devices: Sequence[Entry],
) -> bytes:
    """Set ``status.devices`` of that claim incarnation, at that version (else 409)."""
    body = {
        "metadata": {"uid": uid, "resourceVersion": resource_version},
        "status": {"devices": list(devices) or None},
    }
    return await api.patch(status_path(namespace, name), body)
