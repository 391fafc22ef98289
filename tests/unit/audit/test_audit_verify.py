"""``gpudra audit --verify``'s rules on hand-written trails (services/audit/verify.py)."""

from __future__ import annotations

from services.audit.verify import ClaimTrail, check
from services.core.model.schemas import ClaimEvent, ClaimEventName, ClaimRef

CLAIM = ClaimRef(uid="u-1", namespace="ns", name="shared")


def trail(*steps: tuple[ClaimEventName, str]) -> ClaimTrail:
    t = ClaimTrail(CLAIM.uid, CLAIM.namespace, CLAIM.name)
    for seq, (event, node) in enumerate(steps, start=1):
        t.add(ClaimEvent(event=event, claim=CLAIM, node=node, actor="test", seq=seq))
    return t


def test_two_prepares_at_once_each_answered_is_complete() -> None:
    """A real kubelet syncing two pods of a shared claim asks twice at once."""
    found = check(
        trail(
            ("allocated", ""),
            ("reserved", ""),
            ("prepare.requested", "n1"),
            ("prepare.requested", "n1"),
            ("prepared", "n1"),
            ("prepared", "n1"),
            ("unprepare.requested", "n1"),
            ("unprepared", "n1"),
            ("released", ""),
            ("deleted", ""),
        )
    )
    assert found == []


def test_an_answer_without_a_request_and_a_request_never_answered() -> None:
    found = check(
        trail(
            ("allocated", ""),
            ("prepare.requested", "n1"),
            ("prepare.requested", "n1"),
            ("prepared", "n1"),
            ("prepared", "n2"),
            ("unprepare.requested", "n1"),
            ("unprepared", "n1"),
            ("deleted", ""),
        )
    )
    assert found == [
        "event 5 'prepared' on n2 answers no 'prepare.requested'",
        "event 3 'prepare.requested' on n1 never answered",
        "prepared on n2 (event 5) and never unprepared",
    ]
