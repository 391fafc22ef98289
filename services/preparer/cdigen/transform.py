"""The toolkit's spec transforms: simplify (dedupe, drop per-device copies of
common edits, sort) and the driver-root -> host-root rewrite of host paths.

The preparer sees the driver at ``--driver-root`` (the chart mounts the host's
driver root at ``/driver-root``); the runtime that reads the spec runs on the
host, so every host path under the driver root is rewritten to
``--host-driver-root``, exactly as the reference's ``transformroot`` does.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

EDIT_KEYS = ("env", "deviceNodes", "mounts", "hooks")


def _key(entity: Any) -> str | bytes:
    """An entity's identity: the string itself, or its JSON with sorted keys."""
    return entity if isinstance(entity, str) else msgspec.json.encode(entity, order="sorted")


def dedupe(edits: dict[str, Any]) -> None:
    for k in EDIT_KEYS:
        if k in edits:
            edits[k] = _first_of_each(edits[k])


def _first_of_each(entities: list[Any]) -> list[Any]:
    seen: set[str | bytes] = set()
    out = []
    for e in entities:
        k = _key(e)
        if k not in seen:
            seen.add(k)
            out.append(e)
    return out


def _depth(path: str) -> int:
    return os.path.normpath(path).count("/")


def sort_edits(edits: dict[str, Any]) -> None:
    if "deviceNodes" in edits:
        edits["deviceNodes"].sort(key=lambda n: (_depth(n["path"]), n["path"]))
    if "mounts" in edits:
        edits["mounts"].sort(key=lambda m: (_depth(m["containerPath"]), m["containerPath"]))


def keys(edits: dict[str, Any]) -> frozenset[str | bytes]:
    """Identities of every entity in ``edits`` (the toolkit compares them as JSON)."""
    return frozenset(_key(e) for k in EDIT_KEYS for e in edits.get(k, []))


def without(edits: dict[str, Any], common: frozenset[str | bytes]) -> dict[str, Any]:
    """``edits`` less what ``common`` has; unchanged when nothing would be left (a device
    must have edits)."""
    kept = {k: [e for e in edits[k] if _key(e) not in common] for k in EDIT_KEYS if k in edits}
    return {k: v for k, v in kept.items() if v} if any(kept.values()) else edits


def host_root(edits: dict[str, Any], root: str, target: str) -> None:
    """Rewrite host paths under ``root`` to ``target`` (transformroot, relative to the host)."""
    if root == target:
        return
    for node in edits.get("deviceNodes", []):
        node["hostPath"] = _rewrite(node.get("hostPath") or node["path"], root, target)
    for hook in edits.get("hooks", []):
        if hook["hookName"] != "startContainer":
            hook["path"] = _rewrite(hook["path"], root, target)
    for mount in edits.get("mounts", []):
        mount["hostPath"] = _rewrite(mount["hostPath"], root, target)


def _rewrite(path: str, root: str, target: str) -> str:
    """``path`` under ``root`` moved to ``target``. Whole path components only: the
    toolkit compares plain string prefixes, so for it a root ``/d`` would also take
    ``/dev/...``; no real driver root is a prefix of another path that way."""
    base = root.rstrip("/")
    if base and path != base and not path.startswith(base + "/"):
        return path
    return os.path.normpath(os.path.join(target, path[len(base) :].lstrip("/")))
