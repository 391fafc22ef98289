"""The Helm chart (deploy/chart/gpudra) without helm: what can be checked from its files.

The RBAC rules live only in values.yaml (templates/rbac.yaml renders them with
toYaml), so the least-privilege table below is checked against them directly.
DeviceClasses are plain YAML. Containers are checked against the real
``gpudra`` command: each runs a sub-command that exists, and each GPUDRA_*
variable it sets is one of that sub-command's flags.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli import build_parser
from services.core import nvidia, resource

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "chart" / "gpudra"
TEMPLATES = CHART / "templates"

# Exactly the API calls each component's code makes (see values.yaml for which call needs what).
LEAST_PRIVILEGE: dict[str, set[tuple[str, str, str]]] = {
    "publisher": {
        *(("resource.k8s.io", "resourceslices", v) for v in ("list", "watch", "create")),
        *(("resource.k8s.io", "resourceslices", v) for v in ("update", "delete")),
        ("", "nodes", "get"),
    },
    "allocator": {
        *(
            ("resource.k8s.io", r, v)
            for r in ("resourceclaims", "deviceclasses", "resourceslices")
            for v in ("list", "watch")
        ),
        *(("", r, v) for r in ("pods", "nodes") for v in ("list", "watch")),
        *(("", "events", v) for v in ("create", "get", "patch")),
    },
    "preparer": {
        ("resource.k8s.io", "resourceclaims", "get"),
        *(("", "pods", v) for v in ("get", "list", "watch")),
    },
    "kubeletplugin": set(),
    "discovery": set(),
}
NEVER = {"*", "escalate", "bind", "impersonate", "deletecollection"}


def _values() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(values, dict)
    return values


def _grants(rules: list[dict[str, list[str]]]) -> set[tuple[str, str, str]]:
    return {
        (group, res, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }


def _template_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(TEMPLATES.iterdir())}


def test_chart_metadata_matches_the_distribution() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert (chart["apiVersion"], chart["name"], chart["type"]) == ("v2", "gpudra", "application")
    assert chart["appVersion"] == project["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])


def test_rbac_rules_are_exactly_the_least_privilege_table() -> None:
    rules = _values()["rbac"]["rules"]
    assert set(rules) == set(LEAST_PRIVILEGE)
    for component, expected in LEAST_PRIVILEGE.items():
        assert _grants(rules[component] or []) == expected, component
    for component_rules in rules.values():
        for rule in component_rules or []:
            assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames tricks
            words = {*rule["apiGroups"], *rule["resources"], *rule["verbs"]}
            assert not words & NEVER and not any("*" in w for w in words), rule


def test_templates_grant_nothing_beyond_values() -> None:
    texts = _template_texts()
    for name, text in texts.items():
        assert "verbs:" not in text, f"{name} declares RBAC rules of its own"
    assert "toYaml $rules" in texts["rbac.yaml"] and ".Values.rbac.rules" in texts["rbac.yaml"]


def test_each_workload_runs_as_a_component_with_rules_and_every_role_is_used() -> None:
    used = set()
    for text in _template_texts().values():
        used |= set(re.findall(r"serviceAccountName: \{\{ \$full \}\}-(\w+)", text))
    with_rules = {c for c, r in _values()["rbac"]["rules"].items() if r}
    assert used == with_rules == {"publisher", "allocator", "preparer"}
    node = _template_texts()["node.yaml"]
    # The node pod carries the preparer's account; only the preparer mounts the token.
    assert "automountServiceAccountToken: false" in node
    assert node.count("mountPath: /var/run/secrets/kubernetes.io/serviceaccount") == 1
    preparer = node[node.index('args: ["preparer"]') : node.index('args: ["kubeletplugin"]')]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in preparer


def test_device_classes_are_the_models_and_the_deploy_file() -> None:
    models = [resource.to_builtins(c) for c in nvidia.device_classes()]
    in_chart = list(yaml.safe_load_all((TEMPLATES / "deviceclasses.yaml").read_text()))
    deploy_file = list(yaml.safe_load_all((REPO / "deploy" / "deviceclasses.yaml").read_text()))
    assert in_chart == deploy_file == models


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _env_flags(text: str) -> set[str]:
    """``GPUDRA_FOO_BAR`` -> ``--foo-bar`` for every variable set in ``text``."""
    names = re.findall(r"- name: GPUDRA_([A-Z0-9_]+)", text)
    return {"--" + n.lower().replace("_", "-") for n in names}


def _helper(name: str) -> str:
    helpers = (TEMPLATES / "_helpers.tpl").read_text()
    start = helpers.index(f'{{{{- define "{name}" -}}}}')
    return helpers[start : helpers.index("{{- end -}}\n\n", start)]


@pytest.mark.parametrize("template", ["node.yaml", "controllers.yaml"])
def test_containers_run_real_subcommands_with_real_flags(template: str) -> None:
    commands = _subcommands()
    text = (TEMPLATES / template).read_text()
    starts = [(m.start(), m[1]) for m in re.finditer(r'args: \["([a-z]+)"\]', text)]
    assert starts, "no containers found"
    common = _env_flags(_helper("gpudra.commonEnv"))
    assert common == {
        "--nats-url", "--nats-replicas", "--log-level", "--feature-gates", "--max-inflight"
    }  # fmt: skip
    for i, (start, command) in enumerate(starts):
        assert command in commands, f"gpudra has no sub-command {command!r}"
        flags = set(commands[command]._option_string_actions)
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        block = text[start:end]
        assert 'include "gpudra.commonEnv"' in block
        assert common | _env_flags(block) <= flags, command
        if 'include "gpudra.nodeNameEnv"' in block:
            assert "--node-name" in flags, command


def test_only_gpudra_components_may_reach_the_nats_client_port() -> None:
    """Any pod could otherwise take any GPU through the bus."""
    text = (TEMPLATES / "networkpolicy.yaml").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["networkPolicy"]["enabled"] is True
    assert "policyTypes: [Ingress]" in text
    clients, routes = text.split("- ports:")[1:3]
    assert "port: client" in clients
    assert "values: [node, publisher, allocator]" in clients
    assert "app.kubernetes.io/instance, operator: In" in clients
    assert "port: cluster" in routes and '(list . "nats")' in routes
    assert "monitor" not in text.split("ingress:")[1]  # nobody may reach the monitoring port
