"""The pods bound to this node, as the preparer checks a claim's reservation against them.

A claim may be prepared here only if it is reserved for a pod that runs on this
node. The preparer learns those pods from a node-scoped watch (field selector
``spec.nodeName=<node>``, the same informer every service uses), so the check
costs no API call on the hot path. A pod bound a moment ago may reach the
kubelet before it reaches our watch: :meth:`NodePods.get` then asks the API
server for that one pod.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from services.core.kit import limits, supervisor
from services.core.kube.pods import Pod

if TYPE_CHECKING:
    from services.core.kube.client import KubeApi

log = logging.getLogger(__name__)

PODS_PATH = "/api/v1/pods"
TASK = "pod-watch"


class PodLookupError(Exception):
    """The API server could not say whether a pod exists (unreachable, unreadable answer)."""


PodChange = Callable[[Pod | None, Pod | None], Awaitable[None]]


class NodePods:
    """This node's pods, kept by a supervised watch; one pod from the API when not seen yet."""

    def __init__(self, api: KubeApi, node: str, on_change: PodChange | None = None) -> None:
        from services.core.kube.informer import Informer  # the client stays unloaded without an API

        self.api = api
        self.node = node
        self.on_change = on_change  # set by whoever follows the node's pods (ClaimSource)
        self.informer = Informer(
            api,
            "pods",
            PODS_PATH,
            Pod,
            params={"fieldSelector": f"spec.nodeName={node}"},
            on_change=self._changed,
        )

    async def _changed(self, old: Pod | None, new: Pod | None) -> None:
        if self.on_change is not None:
            await self.on_change(old, new)

    def follow(self) -> None:
        """Watch in the background (restarted with backoff if it fails)."""
        supervisor.current().spawn(TASK, self.informer.run)

    async def close(self) -> None:
        await supervisor.current().cancel(TASK)

    def seen(self, namespace: str, name: str) -> Pod | None:
        """The pod as the watch last saw it on this node (no API call)."""
        return self.informer.items.get(f"{namespace}/{name}")

    def pods(self) -> list[Pod]:
        return list(self.informer.items.values())

    async def get(self, namespace: str, name: str) -> Pod | None:
        """The pod from the API server (None: it does not exist)."""
        from services.core.kube.client import ApiError

        try:
            body = await self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as exc:
            if exc.not_found:
                return None
            raise PodLookupError(f"API server said {exc}") from exc
        try:
            return msgspec.json.decode(body, type=Pod)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise PodLookupError(f"unreadable Pod: {exc}") from exc
        except RecursionError as exc:
            raise PodLookupError(str(limits.too_deep(f"Pod {namespace}/{name}"))) from exc
