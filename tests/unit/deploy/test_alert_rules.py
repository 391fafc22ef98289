"""The chart's alert rules (deploy/chart/gpudra/files/alerts.yaml), checked by Debian's
promtool and evaluated by its rule tests (alerts_test.yaml beside this file: each alert
fires on a failing series and stays quiet on a healthy one); every alert has a firing
case there, says what to do, is in docs/operations.md, and watches only metrics some
gpudra process exports."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import yaml
from prometheus_client import REGISTRY

# Every module that registers a metric an alert reads (imported: registered).
import services.allocator.watcher.metrics
import services.core.bus.usage
import services.kubeletplugin.metrics  # noqa: F401
from services.local import REPO
from services.local.prometheus import RULES
from tests.helpers.prometheus import promtool_binary

RULE_TESTS = REPO / "tests" / "unit" / "deploy" / "alerts_test.yaml"
SEVERITIES = {"warning", "critical"}


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rule_file() -> None:
    proc = subprocess.run(
        [str(promtool_binary()), "check", "rules", str(RULES)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_each_alert_fires_on_its_failing_series_and_not_on_a_healthy_one() -> None:
    proc = subprocess.run(
        [str(promtool_binary()), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_case_in_the_rule_tests() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in rules()}


def test_every_alert_says_how_bad_what_and_what_to_do_and_is_documented() -> None:
    operations = (REPO / "docs" / "operations.md").read_text()
    start = operations.index("\n## Alerts\n")
    alerts = operations[start : operations.index("\n## ", start + 1)]
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert re.fullmatch(r"\d+[mh]", rule["for"]), name
        assert set(rule["annotations"]) == {"summary", "description"}, name
        assert "docs/operations.md#alerts" in rule["annotations"]["description"], name
        assert f"`{name}`" in alerts, f"{name} is not in docs/operations.md's Alerts"


def exported_names() -> set[str]:
    """Every sample name gpudra's registered families may expose."""
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        names.update(family.name + s for s in suffixes.get(family.type, []))
    return names


def test_alerts_read_only_metrics_that_gpudra_exports() -> None:
    exported = exported_names()
    for rule in rules():
        used = set(re.findall(r"\bgpudra_[a-z_]+", rule["expr"]))
        assert used and used <= exported, (rule["alert"], sorted(used - exported))
