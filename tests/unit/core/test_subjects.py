from __future__ import annotations

import pytest

from services.core.bus import subjects


@pytest.mark.parametrize(
    "raw",
    ["node-1", "a.b", "*", ">", "with space", "tab\there", "x=y", "", "ü", "../etc", "a/b"],
)
def test_escape_is_one_literal_token_and_reversible(raw: str) -> None:
    token = subjects.escape_token(raw)
    assert token
    for bad in (".", "*", ">", " ", "\t", "/"):
        assert bad not in token
    assert subjects.unescape_token(token) == raw


def test_escape_is_injective_on_lookalikes() -> None:
    names = ["a.b", "a=2Eb", "a_b", "a-b", "a b"]
    assert len({subjects.escape_token(n) for n in names}) == len(names)


def test_subjects_keep_user_names_in_one_token() -> None:
    subject = subjects.claim_event("ns.*", "c >", "u.1", "evil.node.>", "prepared")
    assert subject.split(".")[:2] == ["dra", "claim"]
    assert len(subject.split(".")) == 7
    assert [subjects.unescape_token(t) for t in subject.split(".")[2:6]] == [
        "ns.*",
        "c >",
        "u.1",
        "evil.node.>",
    ]
    assert subjects.node_prepare("n*1") == "dra.node.n=2A1.prepare"
    domain = "compute-domain.nvidia.com"  # its own subjects, never under the GPU driver's
    assert subjects.node_prepare("n.>", domain) == "dra.node.n=2E=3E.domain.prepare"
    assert subjects.node_unprepare("n1", domain) == "dra.node.n1.domain.unprepare"
    assert not subjects.matches(subjects.node_prepare("*"), subjects.node_prepare("n1", domain))


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("dra.node.n1.prepare", "dra.node.n1.prepare", True),
        ("dra.node.n1.prepare", "dra.claim.n2.prepared", False),
        ("dra.claim.>", "dra.claim.n1.prepare.requested", True),
        ("dra.claim.>", "dra.claim", False),
        ("dra.*.n1", "dra.health.n1", True),
        ("dra.*.n1", "dra.health.n1.x", False),
        ("dra.*", "dra", False),
    ],
)
def test_matches_follows_nats_wildcards(pattern: str, subject: str, expected: bool) -> None:
    assert subjects.matches(pattern, subject) is expected


def test_claim_event_filters_match_exactly_the_names_given() -> None:
    one = subjects.claim_event("ns", "c.1", "u", "n1", "prepare.requested")
    pending = subjects.claim_event("ns", "c.1", "u", subjects.NO_NODE, "pending")
    other = subjects.claim_event("ns2", "c", "u2", "n2", "prepared")
    assert subjects.matches(subjects.claim_events(), one)
    assert subjects.matches(subjects.claim_events(namespace="ns"), one)
    assert not subjects.matches(subjects.claim_events(namespace="ns"), other)
    assert subjects.matches(subjects.claim_events(name="c.1"), one)
    assert not subjects.matches(subjects.claim_events(name="c"), one)  # no prefix match
    assert subjects.matches(subjects.claim_events(node="n1"), one)
    assert not subjects.matches(subjects.claim_events(node="n1"), pending)
    assert subjects.matches(subjects.claim_events(event="prepare.requested"), one)
    assert not subjects.matches(subjects.claim_events(event="prepare"), one)
    assert subjects.matches(subjects.claim_events(event="pending"), pending)
    assert subjects.matches(subjects.claim_trail("ns", "c.1", "u"), pending)
    assert not subjects.matches(subjects.claim_trail("ns", "c.1", "u"), other)
    assert subjects.matches(subjects.claim_event_publishers("n1", "prepare.requested"), one)
    assert not subjects.matches(subjects.claim_event_publishers("n2", "prepare.requested"), one)
