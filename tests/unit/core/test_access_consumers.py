"""Which consumers each identity may create: its own few names, on the streams it reads.

The server enforces the permissions (tests/integration/core/test_bus_quotas.py);
here the table itself: no service identity may use the legacy ephemeral or durable
creation subjects, pull or ack, and its consumer names are its own.
"""

from __future__ import annotations

import re

import pytest

from services.core.bus import slots
from services.core.bus.access import NODE_ROLES, Identity, Role

SERVICES = [r for r in Role if r not in (Role.ADMIN, Role.AUDITOR)]
CREATE = re.compile(r"^\$JS\.API\.CONSUMER\.(CREATE|DELETE|INFO)\.([^.]+)\.([^.]+)$")


def who(role: Role, node: str = "n1") -> Identity:
    return Identity(role, node if role in NODE_ROLES else "")


@pytest.mark.parametrize("role", SERVICES)
def test_a_service_creates_consumers_only_under_its_own_names(role: Role) -> None:
    identity = who(role)
    allowed = identity.permissions().publish
    for subject in allowed:
        assert "DURABLE" not in subject and "MSG.NEXT" not in subject, subject
        assert not subject.startswith("$JS.ACK."), subject
        if subject.startswith("$JS.API.CONSUMER."):
            found = CREATE.match(subject)
            assert found, f"{subject}: not one named consumer"
            assert found[3] in slots.consumer_names(identity.name), subject
    per_stream: dict[str, int] = {}
    for subject in allowed:
        if (found := CREATE.match(subject)) and found[1] == "CREATE":
            per_stream[found[2]] = per_stream.get(found[2], 0) + 1
    assert per_stream and set(per_stream.values()) == {slots.SLOTS}


def test_no_two_identities_share_a_consumer_name() -> None:
    identities = {who(role, node) for role in Role for node in ("n1", "n2", "a.long.name" * 25)}
    flat = [n for identity in identities for n in slots.consumer_names(identity.name)]
    assert len(set(flat)) == len(flat)
    assert all(len(n) <= 64 and "." not in n for n in flat)


def test_only_the_auditor_replays_claims_with_consumers_of_any_name() -> None:
    auditor = Identity(Role.AUDITOR).permissions().publish
    assert "$JS.API.CONSUMER.DURABLE.CREATE.CLAIMS.>" in auditor
    assert not any("DURABLE" in s for s in auditor if ".CLAIMS." not in s)
