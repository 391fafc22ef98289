"""The scenario table: each YAML file in allocator_scenarios/ is run through ``gpudra allocate``.

A scenario lists Kubernetes objects (and optionally slices rendered by our own
publisher for a simulated fleet), the allocate arguments, and what each claim
must come out as. The expectations were written from the upstream rules
(k8s.io/dynamic-resource-allocation/structured, 1.35), not from our output.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli import main

SCENARIOS = sorted((Path(__file__).parent / "allocator_scenarios").glob("*.yaml"))
_RENDERED: dict[tuple[str, str, str], list[Any]] = {}


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def _rendered(fleet: str, node: str, gates: str) -> list[Any]:
    """ResourceSlices from our publisher's renderer (``gpudra slices``)."""
    key = (fleet, node, gates)
    if key not in _RENDERED:
        argv = ["slices", "--fleet", fleet, "--node", node, "-o", "yaml"]
        code, text = _run([*argv, "--feature-gates", gates] if gates else argv)
        assert code == 0, text
        _RENDERED[key] = [d for d in yaml.safe_load_all(text) if d]
    return _RENDERED[key]


def _devices(claim: dict[str, Any]) -> list[str]:
    results = ((claim.get("allocation") or {}).get("devices") or {}).get("results") or []
    return [f"{r['request']}={r['pool']}/{r['device']}" for r in results]


def _explanation_text(claim: dict[str, Any]) -> str:
    return json.dumps(claim.get("explanation"))


def _check(claim: dict[str, Any], want: dict[str, Any]) -> None:
    name = claim["name"]
    assert claim["status"] == want["status"], (name, claim["error"], claim["explanation"])
    if "node" in want:
        assert claim["node"] == want["node"], name
    if "devices" in want:
        assert _devices(claim) == want["devices"], name
    if "device_count" in want:
        assert len(_devices(claim)) == want["device_count"], name
    for fragment in want.get("error_contains", []):
        assert fragment in (claim["error"] or ""), (name, claim["error"])
    for fragment in want.get("explanation_contains", []):
        assert fragment in _explanation_text(claim), (name, claim["explanation"])
    allocation = claim.get("allocation") or {}
    if "config" in want:
        configs = (allocation.get("devices") or {}).get("config") or []
        got = [{"source": c["source"], "requests": c.get("requests")} for c in configs]
        assert got == want["config"], name
    if "nodeSelector" in want:
        assert allocation.get("nodeSelector") == want["nodeSelector"], name
    results = (allocation.get("devices") or {}).get("results") or []
    for key in ("adminAccess", "tolerations", "consumedCapacity"):
        if key in want:
            assert [r.get(key) for r in results] == want[key], (name, key)
    if want.get("shareID"):
        assert results and all(len(r.get("shareID", "")) == 36 for r in results), name


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path, tmp_path: Path) -> None:
    scenario = yaml.safe_load(path.read_text())
    objects = list(scenario.get("objects") or [])
    for render in scenario.get("render") or []:
        objects = _rendered(render["fleet"], render["node"], render.get("gates", "")) + objects
    inputs = tmp_path / "inputs.yaml"
    inputs.write_text(yaml.safe_dump_all(objects))
    argv = ["allocate", "-f", str(inputs), "-o", "json", *scenario.get("args", [])]
    code, out = _run(argv)
    assert code == 0, out
    claims = json.loads(out)["claims"]
    expected = scenario["expect"]
    assert [c["name"] for c in claims] == [w["claim"] for w in expected]
    for claim, want in zip(claims, expected, strict=True):
        _check(claim, want)
