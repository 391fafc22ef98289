"""The chart's webhook as real helm renders it: the configuration, its CA, the certificate."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from services.core.model import computedomain as cd
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


@pytest.mark.parametrize("compute_domains", [True, False])
def test_the_webhook_looks_up_compute_domains_with_its_own_list_only_right(
    chart_helm: Helm, compute_domains: bool
) -> None:
    """With ComputeDomains a channel or daemon claim's domain is looked up
    (services/webhook/domains.py): its account may list ComputeDomains and nothing else,
    and it is told the driver's namespace and the controller's account as the chart
    names them; without, it has no API token at all."""
    docs = render(chart_helm, **{"webhook.enabled": True,
                                 "computeDomains.enabled": compute_domains})  # fmt: skip
    spec = one(docs, "Deployment", "g-gpudra-webhook")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    assert spec["automountServiceAccountToken"] is compute_domains
    assert env["GPUDRA_COMPUTE_DOMAINS"] == str(compute_domains).lower()
    if not compute_domains:
        assert "g-gpudra-webhook" not in roles and "GPUDRA_NAMESPACE" not in env
        return
    assert roles["g-gpudra-webhook"]["rules"] == [
        {"apiGroups": [cd.GROUP], "resources": [cd.PLURAL], "verbs": ["list"]}
    ]
    binding = one(docs, "ClusterRoleBinding", "g-gpudra-webhook")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "g-gpudra-webhook",
                                    "namespace": "gpu"}]  # fmt: skip
    assert env["GPUDRA_NAMESPACE"] == "gpu"
    one(docs, "ServiceAccount", env["GPUDRA_DOMAINS_ACCOUNT"])  # the controller's, rendered
    controller = one(docs, "Deployment", "g-gpudra-domains")["spec"]["template"]["spec"]
    assert controller["serviceAccountName"] == env["GPUDRA_DOMAINS_ACCOUNT"]


@pytest.mark.parametrize("webhook", [True, False])
def test_the_compute_domain_claims_policy_names_the_models_classes_and_the_controller(
    chart_helm: Helm, webhook: bool
) -> None:
    """Rendered with ComputeDomains, webhook or not (what needs no lookup holds without
    it); tried on a real API server by tests/e2e/deploy/test_chart_domain_claims.py."""
    docs = render(chart_helm, **{"webhook.enabled": webhook})
    policy = one(docs, "ValidatingAdmissionPolicy", "g-gpudra-compute-domain-claims")["spec"]
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "g-gpudra-compute-domain-claims")
    assert binding["spec"] == {"policyName": "g-gpudra-compute-domain-claims",
                               "validationActions": ["Deny"]}  # fmt: skip
    text = str(policy)
    for name in (cd.CHANNEL_CLASS, cd.DAEMON_CLASS, cd.CHANNEL_CONFIG, cd.DAEMON_CONFIG,
                 cd.CD_DRIVER):  # fmt: skip
        assert f"'{name}'" in text, name
    rules = [v["expression"] for v in policy["validations"]]
    assert "request.namespace == 'gpu'" in rules[1]
    assert "request.userInfo.username == 'system:serviceaccount:gpu:g-gpudra-domains'" in rules[2]
    off = render(chart_helm, **{"computeDomains.enabled": False})
    assert not [d for d in off if d["metadata"]["name"] == "g-gpudra-compute-domain-claims"]
