"""The chart's metrics and tracing settings as real helm renders them (skipped without
helm: ``GPUDRA_HELM`` or ``helm`` on PATH; tests/unit/test_deploy_chart.py reads the
templates as text everywhere)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "gpudra"
WORKLOADS = ("DaemonSet", "Deployment")


def render(*sets: str) -> list[dict[str, Any]]:
    helm = os.environ.get("GPUDRA_HELM") or shutil.which("helm")
    if not helm:
        pytest.skip("helm not installed (set GPUDRA_HELM or put helm on PATH)")
    argv = [helm, "template", "g", str(CHART), "--kube-version", "1.35.0"]
    for value in sets:
        argv += ["--set", value]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for doc in docs:
        if doc["kind"] in WORKLOADS and doc["metadata"]["name"] != "g-gpudra-nats-auth":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                found[c["name"]] = c
    return found


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_each_process_gets_its_metrics_port_and_a_podmonitor_finds_them_all() -> None:
    docs = render("metrics.podMonitor.enabled=true")
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


def test_metrics_off_leaves_no_port_monitor_or_variable() -> None:
    docs = render("metrics.enabled=false", "metrics.podMonitor.enabled=true")
    assert not [d for d in docs if d["kind"] == "PodMonitor" or "metrics" in d["metadata"]["name"]]
    for container in containers(docs).values():
        assert "ports" not in container and "GPUDRA_METRICS_PORT" not in env(container)


def test_otlp_settings_become_the_standard_variables_only_when_an_endpoint_is_set() -> None:
    for container in containers(render()).values():
        assert not [n for n in env(container) if n.startswith("OTEL_")]
    docs = render("otlp.endpoint=https://otel:4317", "otlp.headersSecret=otlp-auth",
                  "otlp.certificate=/etc/otel/ca.crt", "otlp.samplerArg=0.25")  # fmt: skip
    for name, container in containers(docs).items():
        got = env(container)
        assert got["OTEL_EXPORTER_OTLP_ENDPOINT"] == "https://otel:4317"
        assert got["OTEL_EXPORTER_OTLP_CERTIFICATE"] == "/etc/otel/ca.crt"
        assert got["OTEL_EXPORTER_OTLP_HEADERS"] == {
            "secretKeyRef": {"name": "otlp-auth", "key": "headers"}
        }
        assert got["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert got["OTEL_SERVICE_NAME"] == f"gpudra-{name}"
