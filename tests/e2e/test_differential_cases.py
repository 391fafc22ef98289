"""Differential test on hand-written cases: ``gpudra allocate`` against
``reference-allocator`` (kube-apiserver 1.35's validation, then kube-scheduler's
allocator) on every class of input where they once disagreed
(tests/helpers/diffcases.py).

For each case both tools must exit alike; on exit 2 both must name the same
field error (the fragment the case is about), on exit 0 give each claim the
same status, the status the case expects, and, when allocated, the same
devices. Each documented deviation (an upstream 1.35 bug, docs/differences.md)
is shown instead: the reference gives the buggy outcome, gpudra the right one.
"""

from __future__ import annotations

import io
import json
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from services.cli import main as gpudra
from tests.helpers.diffcases import (
    ANY_CLASS,
    CASES,
    DEVIATIONS,
    Case,
    Deviation,
    base,
    claim,
    exactly,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reference(controlplane_binary: Path) -> Path:
    return controlplane_binary.parent / "reference-allocator"


def _args(path: Path, gates: str) -> list[str]:
    return ["-f", str(path), "-o", "json", *(["--feature-gates", gates] if gates else [])]


def _ours(path: Path, gates: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = gpudra(["allocate", *_args(path, gates)])
    return code, out.getvalue(), err.getvalue()


def _claims(stdout: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads(stdout)["claims"]}


def _devices(entry: dict[str, Any]) -> list[str]:
    allocation = entry.get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]


def _both(
    name: str, items: list[dict[str, Any]], gates: str, reference: Path, tmp_path: Path
) -> tuple[int, str, str, subprocess.CompletedProcess[str]]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    ref = subprocess.run(
        [str(reference), *_args(path, gates)], capture_output=True, text=True, timeout=60
    )
    code, stdout, stderr = _ours(path, gates)
    return code, stdout, stderr, ref


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_tools_agree(case: Case, reference: Path, tmp_path: Path) -> None:
    items = base() + case.objects
    code, stdout, stderr, ref = _both(case.name, items, case.gates, reference, tmp_path)
    assert (code, ref.returncode) == (case.rc, case.rc), (stderr, ref.stderr)
    if case.rc == 2:
        assert case.says in ref.stderr, ref.stderr
        assert case.says in stderr, stderr
        return
    ours, theirs = _claims(stdout), _claims(ref.stdout)
    got = {name: entry["status"] for name, entry in ours.items()}
    assert got == {name: entry["status"] for name, entry in theirs.items()}, (ours, theirs)
    assert got == case.statuses, ours
    for name, entry in ours.items():
        assert _devices(entry) == _devices(theirs[name]), (name, entry, theirs[name])


@pytest.mark.parametrize("deviation", DEVIATIONS, ids=[d.name for d in DEVIATIONS])
def test_documented_deviations(deviation: Deviation, reference: Path, tmp_path: Path) -> None:
    """Each upstream 1.35 bug docs/differences.md lists: the reference shows it, we do not."""
    name, objects, gates = deviation.name, deviation.objects, deviation.gates
    code, stdout, stderr, ref = _both(name, [ANY_CLASS, *objects], gates, reference, tmp_path)
    assert (code, ref.returncode) == (0, 0), (stderr, ref.stderr)
    theirs = {n: e["status"] for n, e in _claims(ref.stdout).items()}
    ours = {n: e["status"] for n, e in _claims(stdout).items()}
    assert theirs == deviation.reference, ref.stdout
    assert ours == deviation.ours, stdout


def test_a_compact_json_file_of_a_buffer_multiple_is_read_whole(
    reference: Path, tmp_path: Path
) -> None:
    """reference-allocator once read a one-line JSON file of 12288 bytes as nothing
    (the YAML reader's 4096-byte buffer): every claim must still be reported."""
    items = [*base(), claim(exactly())]
    document = {"apiVersion": "v1", "kind": "List", "items": items}
    text = json.dumps(document)
    items[-1]["metadata"]["annotations"] = {"pad": "x" * (8192 - len(text) - 28)}
    text = json.dumps(document)
    assert len(text) == 8192, len(text)
    path = tmp_path / "compact.json"
    path.write_text(text)
    ref = subprocess.run(
        [str(reference), "-f", str(path), "-o", "json"], capture_output=True, text=True
    )
    code, stdout, stderr = _ours(path, "")
    assert (code, ref.returncode) == (0, 0), (stderr, ref.stderr)
    assert list(_claims(stdout)) == list(_claims(ref.stdout)) == ["c"]
