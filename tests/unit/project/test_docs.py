"""docs/ stays true: every bus name and versioned schema in the code is on docs/bus.md,
and no document points outside the repository."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import msgspec

from services.core.bus import subjects
from services.core.model import schemas

REPO = Path(__file__).resolve().parents[3]
BUS_DOC = (REPO / "docs" / "bus.md").read_text()


def test_every_stream_bucket_and_subject_root_is_documented() -> None:
    names = {
        value
        for name, value in vars(subjects).items()
        if name.endswith(("_STREAM", "_BUCKET", "_ROOT")) and isinstance(value, str)
    }
    assert names, "no names found in services.core.bus.subjects"
    missing = sorted(n for n in names if f"`{n}" not in BUS_DOC)
    assert not missing, f"docs/bus.md does not mention {missing}"


def test_every_claim_event_is_documented() -> None:
    events = typing.get_args(schemas.ClaimEventName)
    assert events
    missing = [e for e in events if f"| `{e}` |" not in BUS_DOC]
    assert not missing, f"docs/bus.md does not list claim events {missing}"


def test_every_versioned_schema_is_documented() -> None:
    versioned = [
        name
        for name, obj in vars(schemas).items()
        if isinstance(obj, type)
        and issubclass(obj, msgspec.Struct)
        and "schema_version" in obj.__struct_fields__
    ]
    assert len(versioned) >= 8
    missing = [name for name in versioned if f"`{name}`" not in BUS_DOC]
    assert not missing, f"docs/bus.md does not describe {missing}"


def test_no_document_points_outside_the_repository() -> None:
    documents = [REPO / "README.md", REPO / "CONTRIBUTING.md", *REPO.glob("docs/**/*.md")]
    for doc in documents:
        text = doc.read_text()
        assert "../shared" not in text, f"{doc.name} points outside the repository"
        for target in re.findall(r"\]\(([^)#]+)", text):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"
