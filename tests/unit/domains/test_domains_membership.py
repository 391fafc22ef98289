"""The controller's membership rules: indices per clique, kept across changes; status."""

from __future__ import annotations

import pytest

from services.core.bus import subjects
from services.core.model.schemas import DomainMember, DomainNodeState
from services.domains.membership import Membership, domain_status
from services.domains.model import DomainNode

UID = "d-1"


def member(node: str, clique: str = "c.1", status: DomainNodeState = "Ready") -> DomainMember:
    return DomainMember(
        domain_uid=UID,
        node=node,
        ip_address="10.0.0.1",
        clique_id=clique,
        status=status,
    )


def settle(m: Membership) -> dict[str, int]:
    for change in m.index_changes(UID):
        m.set_index(change.uid, change.node, change.index)
    return {n.name: n.index for n in m.nodes(UID)}


def test_indices_are_the_lowest_free_and_stay_when_others_come_and_go() -> None:
    m = Membership()
    for node in ("a", "b", "c"):
        m.set_member(UID, node, member(node))
    assert settle(m) == {"a": 0, "b": 1, "c": 2}
    m.set_member(UID, "b", None)  # b leaves: its index is freed, nobody else moves
    assert settle(m) == {"a": 0, "c": 2}
    m.set_member(UID, "d", member("d"))
    assert settle(m) == {"a": 0, "c": 2, "d": 1}
    m.set_member(UID, "a", member("a", status="NotReady"))  # a restarts: same index
    assert settle(m) == {"a": 0, "c": 2, "d": 1}
    assert m.index_changes(UID) == []  # settled: nothing more to write


def test_each_clique_counts_on_its_own_and_a_full_one_gives_no_index() -> None:
    m = Membership(max_nodes=2)
    for node, clique in (("a", "c.1"), ("b", "c.1"), ("x", "c.2"), ("z", "c.1")):
        m.set_member(UID, node, member(node, clique))
    assert settle(m) == {"a": 0, "b": 1, "x": 0, "z": -1}
    assert {n.name: n.status for n in m.nodes(UID)}["z"] == "NotReady"  # no index: not Ready
    m.set_member(UID, "b", member("b", "c.2"))  # moved to another clique: a new index there
    assert settle(m) == {"a": 0, "b": 1, "x": 0, "z": 1}


def test_nodes_outside_a_fabric_get_minus_one_and_keep_their_readiness() -> None:
    m = Membership()
    m.set_member(UID, "plain", member("plain", clique=""))
    assert settle(m) == {"plain": -1}
    assert m.nodes(UID)[0].status == "Ready"


@pytest.mark.parametrize(
    ("num_nodes", "states", "want"),
    [
        (0, [], "Ready"),  # as the reference: nothing asked, nothing missing
        (2, ["Ready"], "NotReady"),
        (2, ["Ready", "Ready"], "Ready"),
        (2, ["Ready", "Failed"], "NotReady"),
        (0, ["Ready", "NotReady"], "NotReady"),
    ],
)
def test_domain_status_follows_the_reference(num_nodes: int, states: list[str], want: str) -> None:
    nodes = [DomainNode(name=f"n{i}", ip_address="", clique_id="", index=-1, status=s)
             for i, s in enumerate(states)]  # fmt: skip
    assert domain_status(num_nodes, nodes).status == want


@pytest.mark.parametrize(
    "key",
    ["d.member", "d.other.n", "d.member.n.x", "", "d.member.=ZZ", "=.index.=E2=82"],
)
def test_keys_that_are_not_ours_are_refused(key: str) -> None:
    assert subjects.parse_domain_key(key) is None


def test_keys_round_trip_hostile_names() -> None:
    uid, node = "u.*>", "node with space.x"
    assert subjects.parse_domain_key(subjects.domain_member_key(uid, node)) == (uid, "member", node)
    assert subjects.parse_domain_key(subjects.domain_index_key(uid, node)) == (uid, "index", node)
    assert subjects.domain_keys(uid).endswith(".>") and "*" not in subjects.domain_keys(uid)[:-2]
