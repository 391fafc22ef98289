"""The auth callout's decision (services/natsauth/authorize.py) on TokenReview answers as
the API server gives them; tests/e2e/natsauth/test_nats_auth.py asks the real API server."""

from __future__ import annotations

import base64
import json

import pytest

from services.core.bus.access import Identity, Role
from services.natsauth import grants as g
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
