from __future__ import annotations

import pytest

from services.core import subjects


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
    subject = subjects.claim_event("evil.node.>", "prepared")
    assert subject.split(".")[:2] == ["dra", "claim"]
    assert len(subject.split(".")) == 4
    assert subjects.node_prepare("n*1") == "dra.node.n=2A1.prepare"


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
