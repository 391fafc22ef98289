"""Differential test on hand-written cases: ``gpudra allocate --kube-version 1.N``
against that release's ``reference-allocator`` (kube-apiserver's validation, then
kube-scheduler's allocator), for 1.37 and 1.35 (and 1.34 for the cases and
deviations that name it), on every class of input where they once disagreed and
every allocation feature 1.36/1.37 added (tests/helpers/diffcases.py).

For each case and release both tools must exit alike; on exit 2 both must name
the same field error (the fragment the case is about), on exit 0 give each claim
the same status, the status the case expects of that release, and, when
allocated, the same devices. Each documented deviation (an upstream bug,
docs/differences.md) is shown instead where that release has it: the reference
gives the buggy outcome, gpudra the right one; where the release fixed it, both
give the right one.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from services.cli import main as gpudra
from tests.helpers.diffcases import (
    ANY_CLASS,
    CASES,
    DEVIATIONS,
    MINORS,
    Case,
    Deviation,
    base,
    claim,
    exactly,
)

pytestmark = pytest.mark.e2e

# MINORS, then the releases only some cases and deviations name (1.34).
_NAMED = [m for c in CASES for m in c.minors] + [m for d in DEVIATIONS for m in d.minors]
RUN_MINORS = sorted({*MINORS, *_NAMED}, reverse=True)
CASE_PARAMS = [(minor, case) for minor in RUN_MINORS for case in CASES if minor in case.minors]
DEVIATION_PARAMS = [(minor, d) for minor in RUN_MINORS for d in DEVIATIONS if minor in d.minors]


@pytest.fixture(scope="module")
def references(controlplane_for: Callable[[int], Path]) -> Callable[[int], Path]:
    return lambda minor: controlplane_for(minor).parent / "reference-allocator"


def _args(path: Path, gates: str) -> list[str]:
    return ["-f", str(path), "-o", "json", *(["--feature-gates", gates] if gates else [])]


def _ours(path: Path, gates: str, minor: int = 37) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = gpudra(["allocate", "--kube-version", f"1.{minor}", *_args(path, gates)])
    return code, out.getvalue(), err.getvalue()


def _claims(stdout: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads(stdout)["claims"]}


def _devices(entry: dict[str, Any]) -> list[str]:
    allocation = entry.get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]


def _both(
    name: str,
    items: list[dict[str, Any]],
    gates: str,
    reference: Path,
    tmp_path: Path,
    minor: int,
) -> tuple[int, str, str, subprocess.CompletedProcess[str]]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    ref = subprocess.run(
        [str(reference), *_args(path, gates)], capture_output=True, text=True, timeout=60
    )
    code, stdout, stderr = _ours(path, gates, minor)
    return code, stdout, stderr, ref


@pytest.mark.parametrize(
    ("minor", "case"), CASE_PARAMS, ids=[f"1.{m}-{c.name}" for m, c in CASE_PARAMS]
)
def test_tools_agree(
    minor: int, case: Case, references: Callable[[int], Path], tmp_path: Path
) -> None:
    items = (base() if case.base else []) + case.objects
    gates = case.gates_for(minor)
    code, stdout, stderr, ref = _both(case.name, items, gates, references(minor), tmp_path, minor)
    assert (code, ref.returncode) == (case.rc, case.rc), (stderr, ref.stderr)
    if case.rc == 2:
        assert case.says in ref.stderr, ref.stderr
        assert case.says in stderr, stderr
        return
    ours, theirs = _claims(stdout), _claims(ref.stdout)
    got = {name: entry["status"] for name, entry in ours.items()}
    assert got == {name: entry["status"] for name, entry in theirs.items()}, (ours, theirs)
    assert got == case.statuses_for(minor), ours
    for name, entry in ours.items():
        assert _devices(entry) == _devices(theirs[name]), (name, entry, theirs[name])
        if case.compare_allocations:
            assert _allocation(entry) == _allocation(theirs[name]), (name, entry, theirs[name])
    if case.devices is not None:
        assert {n: _devices(e) for n, e in ours.items()} == case.devices_for(minor), ours


def _allocation(entry: dict[str, Any]) -> str:
    """The whole allocation, a share ID by presence."""
    allocation = json.loads(json.dumps(entry.get("allocation")))
    for result in ((allocation or {}).get("devices") or {}).get("results") or []:
        if result.get("shareID"):
            result["shareID"] = "<random>"
    return json.dumps(allocation, sort_keys=True)


@pytest.mark.parametrize(
    ("minor", "deviation"),
    DEVIATION_PARAMS,
    ids=[f"1.{m}-{d.name}" for m, d in DEVIATION_PARAMS],
)
def test_documented_deviations(
    minor: int, deviation: Deviation, references: Callable[[int], Path], tmp_path: Path
) -> None:
    """Each upstream bug docs/differences.md lists: the reference of a release that has it
    shows it, we do not; a release that fixed it agrees with us."""
    name, objects, gates = deviation.name, deviation.objects, deviation.gates
    code, stdout, stderr, ref = _both(
        name, [ANY_CLASS, *objects], gates, references(minor), tmp_path, minor
    )
    assert (code, ref.returncode) == (0, 0), (stderr, ref.stderr)
    theirs = {n: e["status"] for n, e in _claims(ref.stdout).items()}
    ours = {n: e["status"] for n, e in _claims(stdout).items()}
    assert theirs == deviation.reference_for(minor), ref.stdout
    assert ours == deviation.ours, stdout


def test_a_compact_json_file_of_a_buffer_multiple_is_read_whole(
    references: Callable[[int], Path], tmp_path: Path
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
        [str(references(37)), "-f", str(path), "-o", "json"], capture_output=True, text=True
    )
    code, stdout, stderr = _ours(path, "")
    assert (code, ref.returncode) == (0, 0), (stderr, ref.stderr)
    assert list(_claims(stdout)) == list(_claims(ref.stdout)) == ["c"]
