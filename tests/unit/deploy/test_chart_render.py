"""The chart as real helm renders it (helm from services/local/helm/build.sh, see
tests/helpers/helm.py): metrics, alert rules and tracing settings.
tests/unit/deploy/test_deploy_chart.py lints and renders the whole chart with default and
other values."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from services.local.helm import Helm
from services.local.prometheus import RULES
from tests.helpers.helm import CHART, helm

WORKLOADS = ("DaemonSet", "Deployment")


@pytest.fixture(scope="module")
def chart_helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return helm(tmp_path_factory.mktemp("helm"))


#: What a cluster with the Prometheus Operator serves (helm install finds it there).
OPERATOR = ("--api-versions", "monitoring.coreos.com/v1/PrometheusRule")


@pytest.fixture
def render(chart_helm: Helm) -> Any:
    def render(*extra: str, **values: object) -> list[dict[str, Any]]:
        return chart_helm.template(values, release="g", namespace="default", extra=extra)

    return render


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for doc in docs:
        if doc["kind"] in WORKLOADS and doc["metadata"]["name"] != "g-gpudra-nats-auth":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                found[c["name"]] = c
    return found


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_each_process_gets_its_metrics_port_and_a_podmonitor_finds_them_all(render: Any) -> None:
    docs = render(**{"metrics.podMonitor.enabled": True})
    ports = yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["ports"]
    named = {}
    for name, container in containers(docs).items():
        (port,) = container["ports"]
        assert port["containerPort"] == ports[name]
        assert env(container)["GPUDRA_METRICS_PORT"] == str(ports[name])
        assert env(container)["GPUDRA_METRICS_ADDRESS"] == "0.0.0.0"
        assert env(container)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        named[port["name"]] = name
    assert set(named.values()) == set(ports)
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == set(named)
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] != "g-gpudra-nats-auth":
            notes = doc["spec"]["template"]["metadata"]["annotations"]
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            assert notes["prometheus.io/port"] == str(ports[container["name"]])
    (policy,) = [d for d in docs if d["metadata"]["name"] == "g-gpudra-metrics"]
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} == set(ports.values())


def test_metrics_off_leaves_no_port_monitor_or_variable(render: Any) -> None:
    docs = render(**{"metrics.enabled": False, "metrics.podMonitor.enabled": True})
    assert not [d for d in docs if d["kind"] == "PodMonitor" or "metrics" in d["metadata"]["name"]]
    for container in containers(docs).values():
        assert "ports" not in container and "GPUDRA_METRICS_PORT" not in env(container)


def test_the_prometheus_rule_carries_exactly_the_rule_file_where_the_operator_is(
    render: Any,
) -> None:
    assert not [d for d in render() if d["kind"] == "PrometheusRule"]  # no Operator: no CRD
    docs = render(*OPERATOR, **{"metrics.prometheusRule.labels": {"release": "prometheus"}})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "g-gpudra"
    assert rule["metadata"]["namespace"] == "default"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())  # groups, word for word


def test_the_prometheus_rule_follows_its_switch_and_metrics(render: Any) -> None:
    for values in ({"metrics.prometheusRule.enabled": False}, {"metrics.enabled": False}):
        assert not [d for d in render(*OPERATOR, **values) if d["kind"] == "PrometheusRule"]


def test_the_podmonitor_labels_each_series_with_its_node(render: Any) -> None:
    docs = render(**{"metrics.podMonitor.enabled": True})
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
            endpoint["relabelings"]
        )


def test_otlp_settings_become_the_standard_variables_only_when_an_endpoint_is_set(
    render: Any,
) -> None:
    for container in containers(render()).values():
        assert not [n for n in env(container) if n.startswith("OTEL_")]
    otlp = {"endpoint": "https://otel:4317", "headersSecret": "otlp-auth",
            "certificate": "/etc/otel/ca.crt", "samplerArg": "0.25"}  # fmt: skip
    docs = render(**{f"otlp.{k}": v for k, v in otlp.items()})
    for name, container in containers(docs).items():
        got = env(container)
        assert got["OTEL_EXPORTER_OTLP_ENDPOINT"] == "https://otel:4317"
        assert got["OTEL_EXPORTER_OTLP_CERTIFICATE"] == "/etc/otel/ca.crt"
        assert got["OTEL_EXPORTER_OTLP_HEADERS"] == {
            "secretKeyRef": {"name": "otlp-auth", "key": "headers"}
        }
        assert got["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert got["OTEL_SERVICE_NAME"] == f"gpudra-{name}"
