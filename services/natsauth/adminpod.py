"""Who may be admin: a pod of the chart's provision Job while it runs, nobody else.

The admin identity creates the streams and buckets and changes their limits; it
may publish anything but the purges and deletions. Granted to the provision Job's
ServiceAccount alone, any token of that account was admin for as long as the token
lived: whoever could mint one (``kubectl create token``) or had kept one could set
``CLAIMS`` to ``max_msgs=1`` long after the install. Now the token must be bound to
a pod (the API server's ``pod-name`` and ``pod-uid``), and that pod must still be
Pending or Running, not being deleted, and controlled by a Job whose name starts
with the configured prefix (``<release>-provision-``: one Job per release
revision) and which has not finished. Once the install's or an upgrade's Job is
done, nobody is admin until the next one runs.

RBAC: ``get`` on pods and jobs in the release's namespace (the chart's
``rbac.namespacedRules.nats-auth``).
"""

from __future__ import annotations

import msgspec

from services.core.kube.client import ApiError, KubeApi

RUNNING = ("Pending", "Running")
FINISHED = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")


class _Owner(msgspec.Struct, rename="camel"):
    kind: str = ""
    name: str = ""
    uid: str = ""
    api_version: str = ""
    controller: bool = False


class _Meta(msgspec.Struct, rename="camel"):
    uid: str = ""
    deletion_timestamp: str | None = None
    owner_references: list[_Owner] = []


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""


class _Status(msgspec.Struct):
    phase: str = ""
    conditions: list[_Condition] = []


class _Object(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: _Status = msgspec.field(default_factory=_Status)


class ProvisionJob:
    """Says why a token's pod may not be admin ("" when it may)."""

    def __init__(self, api: KubeApi, prefix: str) -> None:
        self.api = api
        self.prefix = prefix

    async def refusal(self, namespace: str, pod: str, pod_uid: str) -> str:
        if not self.prefix:
            return "no --admin-job-prefix is set: nobody may be admin"
        if not pod:
            return "admin needs a token bound to a pod of the provision Job"
        try:
            found = await self._get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
        except ApiError as exc:
            return f"pod {pod}: {exc}"
        why = self._pod_refusal(found, pod, pod_uid)
        if why:
            return why
        owner = _controller(found)
        assert owner is not None  # _pod_refusal checked it
        return await self._job_refusal(namespace, owner)

    def _pod_refusal(self, found: _Object, pod: str, pod_uid: str) -> str:
        if pod_uid and found.metadata.uid != pod_uid:
            return f"pod {pod} is not the one the token is bound to"
        if found.metadata.deletion_timestamp or found.status.phase not in RUNNING:
            deleted = found.metadata.deletion_timestamp
            state = "being deleted" if deleted else found.status.phase or "in no phase"
            return f"pod {pod} is {state}: its provision Job is done"
        owner = _controller(found)
        if owner is None or not owner.name.startswith(self.prefix):
            return f"pod {pod} is no pod of a Job {self.prefix}*"
        return ""

    async def _job_refusal(self, namespace: str, owner: _Owner) -> str:
        try:
            job = await self._get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{owner.name}")
        except ApiError as exc:
            return f"Job {owner.name}: {exc}"
        if job.metadata.uid != owner.uid:
            return f"Job {owner.name} is not the pod's owner"
        if any(c.type in FINISHED and c.status == "True" for c in job.status.conditions):
            return f"Job {owner.name} has finished"
        return ""

    async def _get(self, path: str) -> _Object:
        try:
            return msgspec.json.decode(await self.api.get(path), type=_Object)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ApiError(200, f"undecodable answer: {exc}") from None


def _controller(found: _Object) -> _Owner | None:
    for owner in found.metadata.owner_references:
        if owner.controller and owner.kind == "Job" and owner.api_version == "batch/v1":
            return owner
    return None
