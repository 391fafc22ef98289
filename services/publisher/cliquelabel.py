"""The node label ``nvidia.com/gpu.clique`` from the inventory's NVLink fabric facts.

GPU Feature Discovery sets this label in the reference's clusters, and its newer
kubelet plugin can set it itself (``gpuCliqueLabelEnabled``); gpudra's
publisher sets it when ``--gpu-clique-label`` is on, because it is the service
that already turns a node's inventory into API objects. A node outside a fabric
(or whose GPUs do not agree on one clique) loses the label rather than keep a
stale one, since a wrong clique puts a node into the wrong IMEX domain.
"""

from __future__ import annotations

import asyncio
import logging

from services.core.kube.client import ApiError, KubeApi
from services.core.model import cliques
from services.core.model.schemas import NodeInventory

log = logging.getLogger(__name__)


def wanted_label(inventory: NodeInventory, strict: bool = True) -> str | None:
    """The label's value for this inventory, None for "no label". ``strict`` is the
    CrashOnNVLinkFabricErrors gate: a GPU whose fabric reports an error then leaves the
    node unlabelled; without it that GPU is skipped, as the reference's plugin skips it
    when it computes the clique it labels."""
    try:
        clique = cliques.node_clique_id(inventory.gpus, strict=strict)
    except cliques.CliqueError as exc:
        log.warning(
            "no NVLink clique label for the node",
            extra={"node": inventory.node, "reason": str(exc)},
        )
        return None
    return clique or None


class CliqueLabeler:
    """Keeps each node's clique label equal to what its latest inventory says."""

    def __init__(self, api: KubeApi, retry_s: float = 5.0, strict: bool = True) -> None:
        self.api = api
        self.retry_s = retry_s
        self.strict = strict
        self._wanted: dict[str, str | None] = {}
        self._applied: dict[str, str | None] = {}
        self._wake = asyncio.Event()

    def set_inventory(self, node: str, inventory: NodeInventory | None) -> None:
        """A node's inventory changed; None (node gone) leaves its label alone."""
        if inventory is None:
            self._wanted.pop(node, None)
            self._applied.pop(node, None)
            return
        self._wanted[node] = wanted_label(inventory, self.strict)
        if self._applied.get(node, "") != self._wanted[node]:
            self._wake.set()

    async def run(self) -> None:
        """Apply pending labels until cancelled; a failed patch is retried later."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            failed = False
            for node, value in list(self._wanted.items()):
                if node in self._applied and self._applied[node] == value:
                    continue
                failed |= not await self._apply(node, value)
            if failed:
                asyncio.get_running_loop().call_later(self.retry_s, self._wake.set)

    async def _apply(self, node: str, value: str | None) -> bool:
        body = {"metadata": {"labels": {cliques.GPU_CLIQUE_LABEL: value}}}
        try:
            await self.api.patch(f"/api/v1/nodes/{node}", body)
        except ApiError as exc:
            if exc.not_found:
                log.info("no Node object for the clique label yet", extra={"node": node})
            else:
                log.warning("clique label failed", extra={"node": node, "error": str(exc)})
            return False
        self._applied[node] = value
        log.info("clique label set", extra={"node": node, "clique": value or "(removed)"})
        return True
