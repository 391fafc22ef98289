"""What a ComputeDomain leaves on a `gpudra up` stack, for the e2e tests.

The node driver's files (CDI specs, checkpointed claims, domain folders), the
node label, and the history of API objects replayed from a resourceVersion: the
API server's watch replays every change since then, each with the etcd revision
it was written at, so the order of deletions across kinds can be read afterwards
without timing anything.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

from services.core.model import computedomain as cd
from services.local.stack import Stack
from services.local.stacknodes import StackNode
from services.preparer import checkpointfile


def domain_files(node: StackNode) -> list[str]:
    """The node driver's CDI specs, checkpointed claims and domain folders on ``node``."""
    found = [p.name for p in node.paths.cdi_root.glob("k8s.compute-domain.nvidia.com-*")]
    domains = node.paths.kubelet_root / "plugins" / cd.CD_DRIVER / "domains"
    found += [f"domain folder {p.name}" for p in domains.glob("*")]
    path = node.paths.kubelet_root / "plugins" / cd.CD_DRIVER / "checkpoint.json"
    if path.exists():
        found += list(checkpointfile.decode(path.read_bytes()).claims)
    return found


def node_label(stack: Stack, node: str) -> Any:
    """The node's ``resource.nvidia.com/computeDomain`` label (None without)."""
    labels = stack.api_get(f"/api/v1/nodes/{node}")["metadata"].get("labels", {})
    return labels.get(cd.DOMAIN_LABEL)


def current_revision(stack: Stack) -> int:
    """The API server's resourceVersion now (a list's: etcd's current revision)."""
    return int(stack.api_get("/api/v1/namespaces", limit="1")["metadata"]["resourceVersion"])


def history(stack: Stack, path: str, since: int) -> list[dict[str, Any]]:
    """Every watch event of the collection ``path`` after revision ``since``, oldest
    first (the stream closes after a second with nothing new)."""
    query = urllib.parse.urlencode(
        {"watch": "true", "resourceVersion": str(since), "timeoutSeconds": "1"}
    )
    cp = stack.cp
    request = urllib.request.Request(
        f"{cp.server}{path}?{query}", headers={"Authorization": f"Bearer {cp.token}"}
    )
    with urllib.request.urlopen(request, timeout=30, context=cp.ssl_context()) as stream:
        events = [json.loads(line) for line in stream if line.strip()]
    for event in events:
        if event["type"] == "ERROR":
            raise AssertionError(f"watch of {path} from {since}: {event['object']}")
    return events


def deleted_at(events: list[dict[str, Any]], name: str, *, gone: bool = False) -> int | None:
    """The revision at which object ``name`` was first marked deleted (deletionTimestamp
    set; with ``gone``: removed) in ``events``."""
    for event in events:
        meta = event["object"]["metadata"]
        marked = not gone and bool(meta.get("deletionTimestamp"))
        if meta["name"] == name and (event["type"] == "DELETED" or marked):
            return int(meta["resourceVersion"])
    return None
