"""``gpudra audit --verify``'s rules on hand-written trails (services/audit/verify.py),
each event placed by its subject (services/audit/provenance.py)."""

from __future__ import annotations

import pytest

from services.audit.provenance import Placed, Unplaceable, parse, place
from services.audit.replay import Stored
from services.audit.verify import ClaimTrail, Context, check, collect, verify
from services.core.bus import subjects
from services.core.bus.access import ALLOCATOR_EVENTS
from services.core.bus.claimtrail import SEQ_HEADER
from services.core.model.schemas import ClaimEvent, ClaimEventName, ClaimRef

CLAIM = ClaimRef(uid="u-1", namespace="ns", name="shared")


def stored(
    n: int, name: ClaimEventName, node: str, seq: int, payload: ClaimEvent | None = None
) -> Stored:
    actor = "allocator" if name in ALLOCATOR_EVENTS else "preparer"
    said = payload or ClaimEvent(event=name, claim=CLAIM, node=node, actor=actor, seq=seq)
    subject = subjects.claim_event(CLAIM.namespace, CLAIM.name, CLAIM.uid, node, name)
    return Stored(n, subject, said, {SEQ_HEADER: str(said.seq)})


def trail(*steps: tuple[ClaimEventName, str]) -> ClaimTrail:
    """Events in stream order, each numbered after the last one on its node."""
    t = ClaimTrail(CLAIM.uid, CLAIM.namespace, CLAIM.name)
    last: dict[str, int] = {}
    for n, (name, node) in enumerate(steps, start=1):
        last[node] = last.get(node, 0) + 1
        t.add(place(stored(n, name, node, last[node])))
    return t


def test_two_prepares_at_once_each_answered_is_complete() -> None:
    """A real kubelet syncing two pods of a shared claim asks twice at once."""
    found = check(
        trail(
            ("allocated", "n1"),
            ("reserved", "n1"),
            ("prepare.requested", "n1"),
            ("prepare.requested", "n1"),
            ("prepared", "n1"),
            ("prepared", "n1"),
            ("unprepare.requested", "n1"),
            ("unprepared", "n1"),
            ("released", "n1"),
            ("deleted", "n1"),
        )
    )
    assert found == []


def test_an_answer_without_a_request_and_a_request_never_answered() -> None:
    found = check(
        trail(
            ("allocated", "n1"),
            ("allocated", "n2"),
            ("prepare.requested", "n1"),
            ("prepare.requested", "n1"),
            ("prepared", "n1"),
            ("prepared", "n2"),
            ("unprepare.requested", "n1"),
            ("unprepared", "n1"),
            ("deleted", "n1"),
        )
    )
    assert found == [
        "event 2 'prepared' on n2 answers no 'prepare.requested'",
        "event 3 'prepare.requested' on n1 never answered",
        "prepared on n2 (event 2) and never unprepared",
    ]


def test_each_node_is_numbered_on_its_own_and_pending_events_about_no_node() -> None:
    """A claim pending, then allocated to n1: two numberings, both whole."""
    t = trail(("pending", ""), ("pending", ""), ("allocated", "n1"), ("deleted", "n1"))
    assert [(e.node, e.seq) for e in t.events] == [("", 1), ("", 2), ("n1", 1), ("n1", 2)]
    assert check(t) == []
    t.events.pop(1)
    t.events.pop(1)  # number 1 on n1 lost: n1 begins at 2
    assert check(t) == ["events 1 missing on n1"]


def test_a_payload_that_contradicts_its_subject_is_reported_not_believed() -> None:
    t = trail(("allocated", "n1"), ("reserved", "n1"))
    lie = ClaimEvent(event="deleted", claim=CLAIM, node="n1", actor="allocator", seq=1)
    t.add(place(stored(3, "unprepared", "n2", 1, payload=lie)))
    found = check(t)
    assert found[0] == (
        "event 1 'unprepared' on n2: its payload says event 'deleted', node 'n1', actor 'allocator'"
    )
    assert "events on n2 from n2's preparer, but the claim was allocated to n1 only " in found[1]
    assert "not closed: no 'deleted' event (last: 'reserved')" in found  # the lie closed nothing


def test_a_nodes_events_about_a_claim_never_allocated_to_it_are_foreign() -> None:
    fake = trail(("prepare.requested", "n2"), ("prepared", "n2"))
    report = verify([fake])
    assert report.problems == {
        "ns/shared (u-1)": [
            "events on n2 from n2's preparer, but the claim was never allocated "
            "(2 at stream seq 1-2)"
        ]
    }
    assert report.foreign == {"n2": 2}
    # A live claim's node counts even when its 'allocated' is no longer in the stream.
    assert verify([fake], Context(live={"u-1": "n2"})).foreign == {}


def test_a_window_that_no_longer_reaches_back_says_so() -> None:
    t = trail(("allocated", "n1"), ("reserved", "n1"), ("deleted", "n1"))
    t.events.pop(0)
    aged = Context(live={"u-1": "n1", "gone": "n1"}, window_begins=40)
    report = verify([t], aged)
    assert report.problems == {
        "ns/shared (u-1)": [
            "events 1 on n1 are older than the stream's window (it begins at stream seq 40): gone"
        ]
    }
    assert report.untraced == [("gone", "n1")]
    assert verify([t], Context(live={"gone": "n1"})).untraced == []  # nothing aged out


def test_collect_keys_trails_by_the_claim_their_subjects_name() -> None:
    other = ClaimEvent(event="prepared", claim=CLAIM, node="n2", actor="preparer", seq=1)
    subject = subjects.claim_event("elsewhere", "x", CLAIM.uid, "n2", "prepared")
    placed = [place(stored(1, "allocated", "n1", 1)), place(Stored(2, subject, other, {}))]
    assert sorted(collect(placed)) == [("elsewhere", "x", "u-1"), ("ns", "shared", "u-1")]
    assert placed[1].disagrees == ("claim ns/shared/u-1", "number  in its header")


@pytest.mark.parametrize(
    "subject",
    [
        "dra.claim.n1.prepared",  # an earlier build's
        "dra.claim.ns.c.u.n1.bogus",
        "dra.claim.ns.c.u.=.prepared",  # a preparer event about no node
        "dra.claim.ns.c.u.=ZZ.prepared",
    ],
)
def test_subjects_no_identity_may_publish_on_are_unplaceable(subject: str) -> None:
    with pytest.raises(Unplaceable):
        parse(subject)


def test_placed_events_name_their_emitter() -> None:
    allocated = place(stored(1, "allocated", "n1", 1))
    prepared = place(stored(2, "prepared", "n.1", 1))
    assert (allocated.emitter, prepared.emitter, prepared.node) == (
        "allocator",
        "n.1's preparer",
        "n.1",
    )
    assert isinstance(prepared, Placed) and prepared.disagrees == ()


def test_a_live_claim_numbered_again_after_its_events_aged_out_is_reported() -> None:
    """Every event of a claim on n1 left the window; the next one is number 1 again."""
    t = trail(("unprepare.requested", "n1"), ("unprepared", "n1"))
    aged = Context(live={"u-1": "n1"}, window_begins=40)
    assert (
        "its 'allocated' event on n1 is older than the stream's window (it begins at stream "
        "seq 40): the events before are gone"
    ) in check(t, aged)
    assert check(t, Context(live={"u-1": "n1"})) == ["not closed: no 'deleted' event (last: "
                                                     "'unprepared')"]  # fmt: skip
