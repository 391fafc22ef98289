"""Differential test: ``gpudra allocate --kube-version 1.N`` against that release's
``reference-allocator`` (upstream k8s.io/dynamic-resource-allocation/structured of
1.37, 1.35 and 1.34) on seeded generated scenarios.

Scenarios (test_differential_scenarios.py) are grouped into batches, one set of
Kubernetes feature gates per batch: every set the release accepts over the gates
that change allocation (tests/helpers/scenarios.py ``gate_sets``: 288 for 1.37,
144 for 1.35 with DRADeviceTaintRules, 64 for 1.34, whose seeded runs keep
DRAConsumableCapacity off; locked gates fixed, dependent gates together), each
in turn, 576 scenarios for 1.37 and 1.35, 128 for 1.34, and
written into one input file per batch; each allocator runs once per batch (ours
in process through the CLI's entry point, the reference as its binary, at the
same time). For every claim both must give the same status; every allocation of
either must pass the independent checker; and as each node's devices sit in one
pool (or, where the release orders pools itself, in pools of a known order), both
must choose the same node, devices and whole allocation (share IDs, random in
both, by presence).

Reproduce: ``GPUDRA_DIFF_SEED=<seed> pytest tests/e2e/allocator/test_differential_allocator.py``;
``GPUDRA_DIFF_SCENARIOS_1_37=<n>`` (and ``_1_35``, ...) change how many scenarios run,
``GPUDRA_DIFF_MINORS=37,35,36,34`` which releases.
A failure prints the seed, the scenario, and the file with its objects.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from services.cli import main as gpudra
from tests.helpers.diffminors import minors
from tests.helpers.scenarios import Scenario, check, gate_sets, generate

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("GPUDRA_DIFF_SEED", "20261122"))
# minor -> scenarios per gate set: every accepted gate set gets its own batch. 1.36 runs
# on request (GPUDRA_DIFF_MINORS=37,35,34,36), one scenario per gate set.
PER_BATCH = {37: 2, 35: 4, 36: 1, 34: 2}
MINORS = minors()


def _count(minor: int) -> int:
    default = PER_BATCH[minor] * len(gate_sets(minor))
    return int(os.environ.get(f"GPUDRA_DIFF_SCENARIOS_1_{minor}", str(default)))


BATCHES = [
    (minor, batch)
    for minor in MINORS
    for batch in range((_count(minor) + PER_BATCH[minor] - 1) // PER_BATCH[minor])
]


def _batch(minor: int, batch: int) -> tuple[str, list[Scenario]]:
    sets = gate_sets(minor)
    gates = sets[batch % len(sets)]
    size = PER_BATCH[minor]
    indices = range(batch * size, min(_count(minor), (batch + 1) * size))
    return gates, [generate(SEED, i, gates, minor) for i in indices]


def _write(path: Path, scenarios: list[Scenario]) -> Path:
    items = [obj for sc in scenarios for obj in sc.objects()]
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def _args(path: Path, gates: str) -> list[str]:
    return ["-f", str(path), "-o", "json", *(["--feature-gates", gates] if gates else [])]


def _ours(path: Path, gates: str, minor: int) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = gpudra(["allocate", "--kube-version", f"1.{minor}", *_args(path, gates)])
    assert code == 0, f"gpudra allocate exited {code}: {err.getvalue()}"
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def _by_claim(document: dict[str, Any], namespace: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in document["claims"] if c["namespace"] == namespace}


def _choice(entry: dict[str, Any]) -> str:
    """Node and the whole allocation (results with every field, configs, node selector);
    a share ID is random in both, so only its presence counts."""
    allocation = json.loads(json.dumps(entry.get("allocation")))
    for result in ((allocation or {}).get("devices") or {}).get("results") or []:
        if result.get("shareID"):
            result["shareID"] = "<random>"
    return json.dumps({"node": entry.get("node"), "allocation": allocation}, sort_keys=True)


def _compare(sc: Scenario, ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    mine, ref = _by_claim(ours, sc.namespace), _by_claim(theirs, sc.namespace)
    if set(mine) != set(ref):
        return [f"claims reported: ours {sorted(mine)}, reference {sorted(ref)}"]
    problems = []
    for name in mine:
        a, b = mine[name], ref[name]
        if a["status"] != b["status"]:
            problems.append(
                f"{name}: ours {a['status']} ({a.get('error') or ''}), reference {b['status']} "
                f"({b.get('error') or b.get('explanation') or ''})"
            )
        elif a["status"] == "allocated" and _choice(a) != _choice(b):
            problems.append(f"{name}: ours chose {_choice(a)}, reference {_choice(b)}")
        elif a["status"] == "unschedulable":
            problems += _explained(name, a, b)
    problems += [f"ours: {p}" for p in check(sc, mine)]
    problems += [f"reference: {p}" for p in check(sc, ref)]
    return problems


def _explained(name: str, ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Our explanation of an unschedulable claim names a cause and, where the
    scheduler tried nodes ("0/N nodes are available"), as many nodes."""
    explanation = ours.get("explanation") or {}
    if not (explanation.get("requests") or explanation.get("claim")):
        return [f"{name}: unschedulable without a cause: {explanation}"]
    tried = re.match(r"0/(\d+) nodes are available", theirs.get("explanation") or "")
    if tried and int(tried.group(1)) != explanation.get("nodes"):
        return [f"{name}: explained over {explanation.get('nodes')} nodes, tried {tried.group(1)}"]
    return []


@pytest.fixture(scope="module")
def references(controlplane_for: Callable[[int], Path]) -> Callable[[int], Path]:
    return lambda minor: controlplane_for(minor).parent / "reference-allocator"


@pytest.mark.parametrize(("minor", "batch"), BATCHES, ids=[f"1.{m}-{b}" for m, b in BATCHES])
def test_allocators_agree(
    minor: int, batch: int, references: Callable[[int], Path], tmp_path: Path
) -> None:
    gates, scenarios = _batch(minor, batch)
    path = _write(tmp_path / f"batch-{minor}-{batch}.json", scenarios)
    proc = subprocess.Popen(
        [str(references(minor)), *_args(path, gates)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        ours = _ours(path, gates, minor)  # meanwhile, on the other core
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"reference-allocator exited {proc.returncode}: {stderr.decode()}"
    theirs = json.loads(stdout)

    failures = []
    for sc in scenarios:
        problems = _compare(sc, ours, theirs)
        if problems:
            single = _write(tmp_path / f"scenario-{sc.index:03d}.json", [sc])
            failures.append(
                f"seed {SEED}, Kubernetes 1.{minor}, scenario {sc.index} (gates "
                f"{gates or 'defaults'}), input {single}:\n  " + "\n  ".join(problems)
            )
    counts: dict[str, int] = {}
    for entry in ours["claims"]:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    shown = gates or "default gates"
    print(f"1.{minor} batch {batch} ({shown}): {len(scenarios)} scenarios, {counts}")
    assert not failures, "\n".join(failures)
