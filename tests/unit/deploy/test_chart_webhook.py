"""The chart's webhook as real helm renders it: the configuration, its CA, the certificate."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from services.local import admission
from services.local.helm import Helm
from services.webhook import certs
from tests.helpers.helm import helm, one


@pytest.fixture(scope="module")
def chart_helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return helm(tmp_path_factory.mktemp("helm"))


def render(chart_helm: Helm, **values: object) -> list[dict[str, Any]]:
    return chart_helm.template(values, release="g", namespace="gpu")


def test_off_by_default(chart_helm: Helm) -> None:
    kinds = {d["kind"] for d in render(chart_helm)}
    assert "ValidatingWebhookConfiguration" not in kinds


def test_chart_made_certificate_is_servable_and_its_ca_is_the_bundle(
    chart_helm: Helm, tmp_path: Path
) -> None:
    docs = render(chart_helm, **{"webhook.enabled": True, "featureGates": {"MPSSupport": True}})
    config = one(docs, "ValidatingWebhookConfiguration", "g-gpudra-webhook")
    (hook,) = config["webhooks"]
    assert hook["name"] == admission.WEBHOOK and hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    assert hook["clientConfig"]["service"] == {
        "name": "g-gpudra-webhook", "namespace": "gpu", "path": admission.PATH, "port": 443,
    }  # fmt: skip
    (rule,) = hook["rules"]
    assert rule["apiVersions"] == admission.VERSIONS and rule["resources"] == admission.RESOURCES
    secret = one(docs, "Secret", "g-gpudra-webhook-tls")["data"]
    assert hook["clientConfig"]["caBundle"] == secret["ca.crt"]
    for key in ("tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(secret[key]))
    certs.check(tmp_path / "tls.crt", tmp_path / "tls.key")  # servable now
    deployment = one(docs, "Deployment", "g-gpudra-webhook")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["args"] == ["webhook"]
    assert env["GPUDRA_FEATURE_GATES"] == "MPSSupport=true"  # the nodes' gates
    assert env["GPUDRA_CERT_FILE"] == "/tls/tls.crt" and env["GPUDRA_KEY_FILE"] == "/tls/tls.key"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_cert_manager_issues_and_injects_and_the_policy_is_configurable(chart_helm: Helm) -> None:
    docs = render(
        chart_helm,
        **{
            "webhook.enabled": True,
            "webhook.failurePolicy": "Ignore",
            "webhook.tls.certManager.issuerRef": {"name": "ca", "kind": "ClusterIssuer"},
        },
    )
    config = one(docs, "ValidatingWebhookConfiguration", "g-gpudra-webhook")
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "gpu/g-gpudra-webhook"
    }
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and "caBundle" not in hook["clientConfig"]
    cert = one(docs, "Certificate", "g-gpudra-webhook")["spec"]
    assert cert["secretName"] == "g-gpudra-webhook-tls"
    assert "g-gpudra-webhook.gpu.svc" in cert["dnsNames"]
    assert not [
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("webhook-tls")
    ]
