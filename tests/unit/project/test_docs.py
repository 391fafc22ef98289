"""docs/ stays true: every bus name and versioned schema in the code is on docs/bus.md,
docs/architecture.md draws the import contracts' layers and names only modules and
functions that exist, and no document points outside the repository."""

from __future__ import annotations

import ast
import re
import tomllib
import typing
from pathlib import Path

import msgspec
import pytest

from services.core.bus import subjects
from services.core.model import schemas

REPO = Path(__file__).resolve().parents[3]
BUS_DOC = (REPO / "docs" / "bus.md").read_text()
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text()
DIAGRAMS = re.findall(r"```mermaid\n(.*?)```", ARCHITECTURE, re.S)
MODULE = re.compile(r"[\w/]+\.py\b")  # services/-relative, or a sibling of one named
CALLED = re.compile(r"\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)\(\)")  # name() or Owner.name()


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


def test_the_layers_drawn_are_the_import_contracts() -> None:
    """The kernel's layers in the contract's order, and every independent service."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = project["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    services = next(c["modules"] for c in contracts if c["type"] == "independence")
    drawing = ARCHITECTURE.split("### Layers", 1)[1].split("```", 2)[1]
    assert re.findall(r"services\.core\.\w+", drawing) == layers
    words = set(drawing.split())
    missing = [m for m in services if m.removeprefix("services.") not in words]
    assert not missing, f"docs/architecture.md's layers leave out {missing}"


@pytest.mark.parametrize("diagram", DIAGRAMS, ids=lambda d: d.split("as ", 2)[1].split()[0])
def test_every_module_and_function_a_flow_diagram_names_exists(diagram: str) -> None:
    named = [m for m in MODULE.findall(diagram) if "/" in m]
    missing = [m for m in named if not (REPO / "services" / m).is_file()]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"
    near = {p for m in named for p in (REPO / "services" / m).parent.glob("*.py")}
    stems = {p.stem for p in near}
    bare = [m for m in MODULE.findall(diagram) if "/" not in m and m[:-3] not in stems]
    assert not bare, f"docs/architecture.md names modules beside none it names: {bare}"
    defined = set().union(*(_definitions(p) for p in near))
    unknown = sorted({n for n in CALLED.findall(diagram) if n not in defined})
    assert not unknown, f"docs/architecture.md names functions that do not exist: {unknown}"


def _definitions(path: Path) -> set[str]:
    """``f``, ``module.f``, ``Class`` and ``Class.method`` for what ``path`` defines."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names |= {node.name, f"{path.stem}.{node.name}"}
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    names |= {member.name, f"{node.name}.{member.name}"}
    return names
