"""The auth callout's decision (services/natsauth/authorize.py) on TokenReview answers as
the API server gives them; tests/e2e/natsauth/test_nats_auth.py asks the real API server."""

from __future__ import annotations

import base64
import json

import pytest

from services.core.bus.access import Identity, Role
from services.core.kube.client import ApiError
from services.natsauth import grants as g
from services.natsauth.adminpod import ProvisionJob
from services.natsauth.authorize import Authorizer
from services.natsauth.tokenreview import Review

NOW = 1_800_000_000
NS = "gpu-system"
GRANTS = g.parse_grants(
    [f"discovery={NS}/gpudra-node,preparer={NS}/gpudra-node,kubeletplugin={NS}/gpudra-node",
     f"allocator={NS}/gpudra-allocator admin={NS}/gpudra-provision"]
)  # fmt: skip


def token(*audiences: str, exp: int = NOW + 3600) -> str:
    body = base64.urlsafe_b64encode(json.dumps({"aud": list(audiences), "exp": exp}).encode())
    return f"e30.{body.decode().rstrip('=')}.sig"


class Apiserver:
    """What the API server answers; records what it was asked."""

    def __init__(self, review: Review) -> None:
        self.answer = review
        self.asked: list[str] = []

    async def review(self, token: str, audience: str) -> Review:
        self.asked.append(audience)
        return self.answer


def sa(name: str, node: str = "", audiences: tuple[str, ...] = ()) -> Review:
    return Review(True, f"system:serviceaccount:{NS}:{name}", audiences, node=node)


async def decide(review: Review, tok: str):
    api = Apiserver(review)
    return await Authorizer(api, GRANTS, "gpudra-nats").decide(tok, now=NOW), api


async def test_a_node_token_becomes_that_nodes_preparer() -> None:
    review = sa("gpudra-node", "n2", ("gpudra-nats:preparer",))
    decision, api = await decide(review, token("gpudra-nats:preparer"))
    assert decision.identity == Identity(Role.PREPARER, "n2")
    assert decision.expires == NOW + 3600
    assert api.asked == ["gpudra-nats:preparer"]  # the role is asked for, never assumed


@pytest.mark.parametrize(
    "review, tok, reason",
    [
        (sa("gpudra-node", "n2", ("gpudra-nats:preparer",)), "", "no token"),
        (sa("gpudra-node", "n2", ("gpudra-nats:preparer",)), "garbage", "not a JWT"),
        (sa("gpudra-node", "n2"), token("kubernetes"), "no single"),
        (sa("gpudra-node", "n2"), token("gpudra-nats:preparer", "gpudra-nats:admin"), "no single"),
        (sa("gpudra-node", "n2"), token("gpudra-nats:root"), "no single"),
        (Review(False, error="token has expired"), token("gpudra-nats:preparer"), "expired"),
        (sa("gpudra-node", "n2", ("other",)), token("gpudra-nats:preparer"), "refused"),
        (sa("gpudra-node", "n2", ("gpudra-nats:admin",)), token("gpudra-nats:admin"),
         "may not be admin"),
        (sa("intruder", "n2", ("gpudra-nats:preparer",)), token("gpudra-nats:preparer"),
         "may not be preparer"),
        (Review(True, "alice", ("gpudra-nats:admin",)), token("gpudra-nats:admin"), "may not"),
        (sa("gpudra-node", "", ("gpudra-nats:preparer",)), token("gpudra-nats:preparer"),
         "bound to a pod on a node"),
        (sa("gpudra-node", "n2", ("gpudra-nats:preparer",)),
         token("gpudra-nats:preparer", exp=NOW), "expired"),
    ],
)  # fmt: skip
async def test_refusals(review: Review, tok: str, reason: str) -> None:
    decision, _ = await decide(review, tok)
    assert decision.identity is None and reason in decision.reason


async def test_cluster_roles_take_no_node_even_from_a_pod_bound_token() -> None:
    decision, _ = await decide(sa("gpudra-allocator", "n1", ("gpudra-nats:allocator",)),
                               token("gpudra-nats:allocator"))  # fmt: skip
    assert decision.identity == Identity(Role.ALLOCATOR)


@pytest.mark.parametrize("text", ["preparer", "preparer=ns", "preparer=/x", "root=ns/x", "a=b/c/d"])
def test_bad_grants_are_refused(text: str) -> None:
    with pytest.raises(g.GrantError):
        g.parse_grants([text])


def test_only_service_accounts_have_an_account() -> None:
    assert g.account_of("system:serviceaccount:ns:x") == g.Account("ns", "x")
    assert g.account_of("system:node:n1") is None
    assert g.account_of("system:serviceaccount:ns") is None


# ---------------------------------------------------------------- admin: the provision Job


Obj = dict[str, object]


class Objects:
    """The API server's pods and jobs, by path (the callout only GETs them)."""

    def __init__(self, pod: Obj | None, job: Obj | None) -> None:
        self.objects = {
            f"/api/v1/namespaces/{NS}/pods/provision-7-x2k4p": pod,
            f"/apis/batch/v1/namespaces/{NS}/jobs/gpudra-provision-7": job,
        }

    async def get(self, path: str) -> bytes:
        found = self.objects.get(path)
        if found is None:
            raise ApiError(404, "not found", "NotFound")
        return json.dumps(found).encode()


def _pod(phase: str = "Running", owner: str = "gpudra-provision-7", **meta: object) -> Obj:
    refs = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": "job-uid",
             "controller": True}]  # fmt: skip
    return {"metadata": {"uid": "pod-uid", "ownerReferences": refs, **meta},
            "status": {"phase": phase}}  # fmt: skip


def _job(*conditions: str, uid: str = "job-uid") -> Obj:
    done = [{"type": c, "status": "True"} for c in conditions]
    return {"metadata": {"uid": uid}, "status": {"conditions": done}}


def admin_review(pod: str = "provision-7-x2k4p", pod_uid: str = "pod-uid") -> Review:
    return Review(True, f"system:serviceaccount:{NS}:gpudra-provision", ("gpudra-nats:admin",),
                  pod=pod, pod_uid=pod_uid)  # fmt: skip


async def decide_admin(review: Review, objects: Objects | None, prefix: str = "gpudra-provision-"):
    job = ProvisionJob(objects, prefix) if objects is not None else None  # type: ignore[arg-type]
    authorizer = Authorizer(Apiserver(review), GRANTS, "gpudra-nats", job)
    return await authorizer.decide(token("gpudra-nats:admin"), now=NOW)


async def test_a_running_pod_of_the_provision_job_is_admin() -> None:
    decision = await decide_admin(admin_review(), Objects(_pod(), _job()))
    assert decision.identity == Identity(Role.ADMIN)
    pending = await decide_admin(admin_review(), Objects(_pod("Pending"), _job()))
    assert pending.identity == Identity(Role.ADMIN)


@pytest.mark.parametrize(
    "review, objects, prefix, reason",
    [
        (admin_review(pod="", pod_uid=""), Objects(_pod(), _job()), "gpudra-provision-",
         "bound to a pod of the provision Job"),  # kubectl create token: no pod
        (admin_review(), Objects(_pod("Succeeded"), _job("Complete")), "gpudra-provision-",
         "is Succeeded: its provision Job is done"),
        (admin_review(), Objects(_pod("Failed"), _job()), "gpudra-provision-", "is Failed"),
        (admin_review(), Objects(_pod(deletionTimestamp="2030-01-01T00:00:00Z"), _job()),
         "gpudra-provision-", "being deleted"),
        (admin_review(), Objects(_pod(), _job("Complete")), "gpudra-provision-",
         "has finished"),
        (admin_review(), Objects(_pod(), _job("Failed")), "gpudra-provision-", "has finished"),
        (admin_review(), Objects(_pod(), _job(uid="another")), "gpudra-provision-",
         "not the pod's owner"),
        (admin_review(), Objects(_pod(owner="mine"), _job()), "gpudra-provision-",
         "no pod of a Job gpudra-provision-*"),
        (admin_review(pod_uid="older"), Objects(_pod(), _job()), "gpudra-provision-",
         "not the one the token is bound to"),
        (admin_review(), Objects(None, _job()), "gpudra-provision-", "404"),
        (admin_review(), Objects(_pod(), None), "gpudra-provision-", "404"),
        (admin_review(), Objects(_pod(), _job()), "", "nobody may be admin"),
        (admin_review(), None, "", "nobody may be admin"),
    ],
)  # fmt: skip
async def test_admin_is_refused_outside_a_running_provision_job(
    review: Review, objects: Objects | None, prefix: str, reason: str
) -> None:
    decision = await decide_admin(review, objects, prefix)
    assert decision.identity is None and reason in decision.reason, decision.reason
