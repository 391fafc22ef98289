"""Judge one admission request: every opaque config of ours, as prepare would.

ResourceClaims carry their configs at ``spec.devices.config``, templates at
``spec.spec.devices.config``; the layout is the same in resource.k8s.io v1,
v1beta2 and v1beta1, so no conversion is needed to read them. Each entry is
judged by :func:`services.core.model.configs.check_opaque` under the name prepare
gives it (``config[i] (FromClaim)``: a claim's configs follow its classes'
in the allocation, and our DeviceClasses carry none), so the denial and
prepare's error say the same words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from services.core.kit import limits
from services.core.model import configs
from services.core.model import featuregates as fg
from services.webhook.review import AdmissionRequest

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")
#: kind -> where its device configs live in the object
CONFIG_PATHS: dict[str, tuple[str, ...]] = {
    "ResourceClaim": ("spec", "devices", "config"),
    "ResourceClaimTemplate": ("spec", "spec", "devices", "config"),
}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    code: int = 200  # 422 for an invalid config, 400 for a request we cannot judge


def _not_judged(request: AdmissionRequest) -> Verdict | None:
    """The verdict on a review with nothing to judge: not ours, or not a write."""
    kind = request.kind
    if kind.group != GROUP or kind.version not in VERSIONS or kind.kind not in CONFIG_PATHS:
        return Verdict(
            False,
            f"gpudra webhook judges {', '.join(CONFIG_PATHS)} of {GROUP} "
            f"{'/'.join(VERSIONS)}, got {kind.group or 'core'}/{kind.version} {kind.kind}",
            400,
        )
    if request.operation not in ("CREATE", "UPDATE"):
        return Verdict(True)
    return None


def admit(request: AdmissionRequest, gates: fg.FeatureGates) -> Verdict:
    skipped = _not_judged(request)
    if skipped is not None:
        return skipped
    kind = request.kind
    what = f"{kind.kind} {_name(request)}"
    if request.object is None:
        return Verdict(False, f"{what}: {request.operation} without an object", 400)
    path = CONFIG_PATHS[kind.kind]
    try:
        entries = _entries(request.object, path)
        if request.operation == "UPDATE" and request.old_object is not None:
            if entries == _entries(request.old_object, path):
                # Nothing new to judge: a claim admitted before this webhook (or
                # under other gates) must still get its finalizers removed.
                return Verdict(True)
    except ValueError as exc:
        return Verdict(False, f"{what}: {exc}", 400)
    errors = judge(entries, gates)
    if not errors:
        return Verdict(True)
    count = f"{len(errors)} config{'s' if len(errors) > 1 else ''}"
    return Verdict(False, f"{what}: {count} failed to validate: {'; '.join(errors)}", 422)


def too_deep(request: AdmissionRequest, body: bytes) -> Verdict:
    """A review whose object is nested too deeply to read (review.TooDeep): denied with the
    config that is, found in the raw body without recursion; an UPDATE that leaves the
    configs as they were is admitted as :func:`admit` would (finalizers must come off)."""
    skipped = _not_judged(request)
    if skipped is not None:
        return skipped
    what = f"{request.kind.kind} {_name(request)}"
    path = CONFIG_PATHS[request.kind.kind]
    raw = _member(body, "request")  # each split is a pass in Python: about 2 s per 5 MB
    entries = _raw_entries(raw, "object", path)
    if request.operation == "UPDATE" and entries == _raw_entries(raw, "oldObject", path):
        return Verdict(True)
    index = next((i for i, raw in enumerate(entries or ()) if _too_deep(raw)), None)
    where = f"{what}: config[{index}] (FromClaim)" if index is not None else what
    return Verdict(False, str(limits.too_deep(where)), 422)


def _raw_entries(request: bytes | None, member: str, path: Sequence[str]) -> list[bytes] | None:
    """The config entries of the request's ``member`` object as raw JSON, split without
    recursion; None where the path is missing or not what it should be."""
    raw = request
    for key in (member, *path):
        raw = _member(raw, key)
    return limits.elements(raw) if raw is not None and raw.startswith(b"[") else None


def _member(raw: bytes | None, key: str) -> bytes | None:
    if raw is None or not raw.lstrip().startswith(b"{"):
        return None
    try:
        return limits.members(raw).get(key)
    except ValueError:
        return None


def _too_deep(raw: bytes) -> bool:
    try:
        msgspec.json.decode(raw)
    except RecursionError:
        return True
    except msgspec.DecodeError:
        return False
    return False


def judge(entries: Sequence[Any], gates: fg.FeatureGates) -> list[str]:
    """One message per refused config: prepare's words, plus the requests it names."""
    errors: list[str] = []
    for index, entry in enumerate(entries):
        origin = f"config[{index}] (FromClaim)"
        if not isinstance(entry, dict):
            errors.append(f"{origin}: must be an object, got {type(entry).__name__}")
            continue
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict):
            continue  # not opaque: the API server's own validation judges it
        try:
            configs.check_opaque(
                str(opaque.get("driver", "")), opaque.get("parameters"), origin, gates
            )
        except configs.ConfigError as exc:
            requests = entry.get("requests") or []
            named = f" (requests: {', '.join(map(str, requests))})" if requests else ""
            errors.append(f"{exc}{named}")
    return errors


def _entries(obj: dict[str, Any], path: Sequence[str]) -> list[Any]:
    node: Any = obj
    walked = ""
    for key in path:
        walked = f"{walked}.{key}" if walked else key
        if node is None:
            return []
        if not isinstance(node, dict):
            raise ValueError(f"{walked}: expected an object, got {type(node).__name__}")
        node = node.get(key)
    if node is None:
        return []
    if not isinstance(node, list):
        raise ValueError(f"{'.'.join(path)}: expected a list, got {type(node).__name__}")
    return node


def _name(request: AdmissionRequest) -> str:
    meta = (request.object or {}).get("metadata") or {}
    name = request.name or meta.get("name") or f"{meta.get('generateName', '')}<generated>"
    namespace = request.namespace or meta.get("namespace") or ""
    return f"{namespace}/{name}" if namespace else str(name)
