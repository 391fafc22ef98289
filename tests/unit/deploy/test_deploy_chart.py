"""The Helm chart (deploy/chart/gpudra) without helm: what can be checked from its files.

The RBAC rules live only in values.yaml (templates/rbac.yaml renders them with
toYaml), so the least-privilege table below is checked against them directly, and
again against what real helm renders (helm from services/local/helm/build.sh, see
tests/helpers/helm.py): `helm lint --strict` and `helm template` with the defaults
and other values users may set, each rendered object checked (RBAC, NetworkPolicies
evaluated against the pods' labels, security contexts, host paths, settings).
DeviceClasses are plain YAML. Containers are checked against the real
``gpudra`` command: each runs a sub-command that exists, and each GPUDRA_*
variable it sets is one of that sub-command's flags.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli import build_parser
from services.core.bus import retention
from services.core.bus.access import Role
from services.core.kube import resource
from services.core.model import cliques, computedomain, deviceclasses, nvidia
from services.domains import cli as domains_cli
from services.domains import objects as daemon_objects
from services.domains.objects import DaemonBus
from services.kubeletplugin.sockets import SocketPaths
from services.local.helm import KUBE_VERSION, Helm, HelmError, set_args
from services.natsauth.grants import role_of_audiences
from tests.helpers.helm import helm, objects_by_kind, one, pod_specs
from tests.helpers.imex import a_domain

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "chart" / "gpudra"
TEMPLATES = CHART / "templates"

# Exactly the API calls each component's code makes (see values.yaml for which call needs what).
LEAST_PRIVILEGE: dict[str, set[tuple[str, str, str]]] = {
    "publisher": {
        *(("resource.k8s.io", "resourceslices", v) for v in ("list", "watch", "create")),
        *(("resource.k8s.io", "resourceslices", v) for v in ("update", "delete")),
        ("", "nodes", "get"),
        ("", "nodes", "list"),  # every owner UID in one list at a full resync
    },
    "allocator": {
        *(
            ("resource.k8s.io", r, v)
            for r in ("resourceclaims", "deviceclasses", "resourceslices", "devicetaintrules")
            for v in ("list", "watch")
        ),
        *(("", r, v) for r in ("pods", "nodes") for v in ("list", "watch")),
        *(("", "events", v) for v in ("create", "get", "patch")),
    },
    "preparer": {
        ("resource.k8s.io", "resourceclaims", "get"),
        *(("", "pods", v) for v in ("get", "list", "watch")),
    },
    "domains": {
        *(("resource.nvidia.com", "computedomains", v) for v in ("list", "watch", "patch")),
        ("resource.nvidia.com", "computedomains/status", "patch"),
        *(
            ("resource.k8s.io", "resourceclaimtemplates", v)
            for v in ("get", "list", "create", "patch", "delete")
        ),
        *(("", "nodes", v) for v in ("list", "patch")),
        ("", "events", "create"),
    },
    "kubeletplugin": set(),
    "discovery": set(),
    "nats-auth": {("authentication.k8s.io", "tokenreviews", "create")},
    "provision": set(),
    # with webhook.enabled and computeDomains.enabled: a claim's ComputeDomain, by UID
    "webhook": {("resource.nvidia.com", "computedomains", "list")},
}
# What a component writes only in the release's namespace (a Role there, never a ClusterRole):
# the controller's IMEX DaemonSets and cliques, so its token makes no DaemonSet elsewhere.
NAMESPACED: dict[str, set[tuple[str, str, str]]] = {
    # admin only for a running pod of the release's provision Job (services/natsauth/adminpod.py)
    "nats-auth": {("", "pods", "get"), ("batch", "jobs", "get")},
    "domains": {
        *(("apps", "daemonsets", v) for v in ("get", "list", "create", "patch", "delete")),
        *(
            ("resource.nvidia.com", "computedomaincliques", v)
            for v in ("list", "create", "patch", "delete")
        ),
    },
}
# The nats-keygen hook's namespaced Role: (group, resource, verb, names) - create cannot be
# limited by name, everything else is limited to the two objects it makes.
KEYGEN = {
    ("", "secrets", "create", ()),
    ("", "configmaps", "create", ()),
    ("", "secrets", "get", ("auth", "auth-public")),
    ("", "configmaps", "get", ("auth", "auth-public")),
    ("", "configmaps", "update", ("auth-public",)),
}
NEVER = {"*", "escalate", "bind", "impersonate", "deletecollection"}
# Claim status writes (Kubernetes 1.36+, the chart's default KUBE_VERSION): each component
# only its own driver's status.devices entries, the preparer only on its own node's claims.
CLAIM_DEVICE_STATUS = {
    ("resource.k8s.io", "resourceclaims/status", "patch"),
    ("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"),
}
BINDING_CONDITIONS = {
    *(("resource.k8s.io", "resourceclaims", v) for v in ("list", "watch")),
    ("resource.k8s.io", "resourceclaims/status", "patch"),
    ("resource.k8s.io", "resourceclaims/driver", "arbitrary-node:patch"),
}
DRIVER_RULES = {"preparer": nvidia.DRIVER_NAME, "domains": computedomain.CD_DRIVER}


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
    namespaced = _values()["rbac"]["namespacedRules"]
    assert {c: _grants(r) for c, r in namespaced.items()} == NAMESPACED
    for component_rules in [*rules.values(), *namespaced.values()]:
        for rule in component_rules or []:
            assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames tricks
            words = {*rule["apiGroups"], *rule["resources"], *rule["verbs"]}
            assert not words & NEVER and not any("*" in w for w in words), rule


def test_templates_grant_nothing_beyond_values() -> None:
    texts = _template_texts()
    for name, text in texts.items():
        assert "verbs:" not in text, f"{name} declares RBAC rules of its own"
    assert "toYaml $rules" in texts["rbac.yaml"] and ".Values.rbac.rules" in texts["rbac.yaml"]
    assert ".Values.rbac.namespacedRules" in texts["rbac.yaml"]
    assert "tpl (toYaml $rules) $" in texts["rbac.yaml"] and "kind: Role\n" in texts["rbac.yaml"]


def test_the_keygen_hook_may_make_and_read_only_its_own_secret_and_configmap() -> None:
    hooks = _values()["rbac"]["hookRules"]
    assert set(hooks) == {"nats-keygen"}
    prefix = '{{ include "gpudra.fullname" . }}-nats-'
    granted = set()
    for rule in hooks["nats-keygen"]:
        names = tuple(n.removeprefix(prefix) for n in rule.get("resourceNames", []))
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                granted |= {(group, res, verb, names) for verb in rule["verbs"]}
    assert granted == KEYGEN
    job = (TEMPLATES / "nats-auth.yaml").read_text()
    assert (
        '"--secret", "{{ $full }}-nats-auth", "--configmap", "{{ $full }}-nats-auth-public"' in job
    )
    assert "helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded" in job


def test_each_workload_runs_as_its_own_account_and_only_components_with_rules_call_the_api() -> (
    None
):
    used = set()
    for text in _template_texts().values():
        used |= set(re.findall(r"serviceAccountName: \{\{ \$full \}\}-([\w-]+)", text))
    with_rules = {c for c, r in _values()["rbac"]["rules"].items() if r}
    assert used == {
        "publisher", "allocator", "preparer", "nats-auth", "provision", "nats-keygen", "webhook",
        "domains",
    }  # fmt: skip
    assert with_rules == {"publisher", "allocator", "preparer", "nats-auth", "domains", "webhook"}
    rbac = _template_texts()["rbac.yaml"]
    assert '$accounts := list "publisher" "allocator" "preparer" "domains"' in rbac
    assert '(list "nats-auth" "provision")' in rbac  # the bus identities without API rules
    node = _template_texts()["node.yaml"]
    # The node pod carries the preparer's account; only the preparer mounts the token.
    assert "automountServiceAccountToken: false" in node
    assert node.count("mountPath: /var/run/secrets/kubernetes.io/serviceaccount") == 1
    preparer = node[node.index('args: ["preparer"]') : node.index('args: ["kubeletplugin"]')]
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in preparer


def test_device_classes_are_the_models_and_the_deploy_file() -> None:
    classes = [*deviceclasses.device_classes(), *computedomain.device_classes()]
    models = [resource.to_builtins(c) for c in classes]
    in_chart = list(yaml.safe_load_all((TEMPLATES / "deviceclasses.yaml").read_text()))
    deploy_file = list(yaml.safe_load_all((REPO / "deploy" / "deviceclasses.yaml").read_text()))
    assert in_chart == deploy_file == models


def test_the_compute_domain_clique_crd_in_the_chart_is_the_deploy_file() -> None:
    in_chart = list(yaml.safe_load_all((CHART / "crds" / "computedomaincliques.yaml").read_text()))
    deploy_file = list(
        yaml.safe_load_all((REPO / "deploy" / "computedomaincliques.yaml").read_text())
    )
    assert in_chart == deploy_file
    (crd,) = deploy_file
    assert crd["metadata"]["name"] == "computedomaincliques.resource.nvidia.com"
    assert crd["spec"]["names"]["kind"] == "ComputeDomainClique"
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1beta1", True, True)
    daemons = version["schema"]["openAPIV3Schema"]["properties"]["daemons"]
    assert daemons["x-kubernetes-list-map-keys"] == ["nodeName"]
    assert daemons["items"]["required"] == ["nodeName", "ipAddress", "cliqueID"]
    assert daemons["items"]["properties"]["status"]["enum"] == ["Ready", "NotReady"]


def test_the_compute_domain_crd_in_the_chart_is_the_deploy_file() -> None:
    in_chart = list(yaml.safe_load_all((CHART / "crds" / "computedomains.yaml").read_text()))
    deploy_file = list(yaml.safe_load_all((REPO / "deploy" / "computedomains.yaml").read_text()))
    assert in_chart == deploy_file
    (crd,) = deploy_file
    assert crd["metadata"]["name"] == "computedomains.resource.nvidia.com"
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1beta1", True, True)
    # numNodes as in the reference's CRD (+kubebuilder:default:=0, Minimum=0, Optional).
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["channel"]
    num_nodes = spec["properties"]["numNodes"]
    assert (num_nodes["type"], num_nodes["default"], num_nodes["minimum"]) == ("integer", 0, 0)


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _env_flags(text: str) -> set[str]:
    """``GPUDRA_FOO_BAR`` -> ``--foo-bar`` for every variable set in ``text``."""
    names = re.findall(r"- name: GPUDRA_([A-Z0-9_]+)", text)
    return {"--" + n.lower().replace("_", "-") for n in names}


def _helper(name: str) -> str:
    helpers = (TEMPLATES / "_helpers.tpl").read_text() + "\n"
    start = helpers.index(f'{{{{- define "{name}" -}}}}')
    return helpers[start : helpers.index("{{- end -}}\n\n", start)]


@pytest.mark.parametrize("template", ["node.yaml", "controllers.yaml"])
def test_containers_run_real_subcommands_with_real_flags(template: str) -> None:
    commands = _subcommands()
    text = (TEMPLATES / template).read_text()
    starts = [(m.start(), m[1]) for m in re.finditer(r'args: \["([a-z-]+)"\]', text)]
    assert starts, "no containers found"
    common = _env_flags(_helper("gpudra.commonEnv") + _helper("gpudra.busEnv"))
    assert 'include "gpudra.busEnv"' in _helper("gpudra.commonEnv")
    assert common == {
        "--nats-url", "--nats-token-file", "--nats-ca", "--nats-replicas", "--log-level",
        "--feature-gates", "--max-inflight", "--consumable-shares"
    }  # fmt: skip
    for i, (start, command) in enumerate(starts):
        assert command in commands, f"gpudra has no sub-command {command!r}"
        flags = set(commands[command]._option_string_actions)
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        block = text[start:end]
        assert 'include "gpudra.commonEnv"' in block
        assert common | _env_flags(block) <= flags, command
        assert f'include "gpudra.observabilityEnv" (list . "{command}")' in block, command
        assert _env_flags(_helper("gpudra.observabilityEnv")) <= flags, command
        assert f'include "gpudra.metricsPort" (list . "{command}")' in block, command
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
    assert "values: [node, publisher, allocator, domains, nats-auth, provision]" in clients
    assert "app.kubernetes.io/instance, operator: In" in clients
    assert "port: cluster" in routes and '(list . "nats")' in routes
    assert "monitor" not in text.split("ingress:")[1]  # nobody may reach the monitoring port
    auth = text[text.index("name: {{ $full }}-nats-auth") :]
    assert '(list . "nats-auth")' in auth and "ingress: []" in auth  # it takes no connections


# The bus role each container connects as: its sub-command, but the provisioning Job's.
ROLE_OF = {"discovery": "discovery", "preparer": "preparer", "kubeletplugin": "kubeletplugin",
           "publisher": "publisher", "allocator": "allocator", "provision": "admin",
           "domains": "domains"}  # fmt: skip


def _containers(text: str) -> list[tuple[str, str]]:
    """(sub-command, the container's text up to the next container) for each container."""
    starts = [(m.start(), m[1]) for m in re.finditer(r'args: \["([a-z-]+)"', text)]
    if not starts:
        return []  # a document without containers (a ServiceAccount)
    ends = [s for s, _ in starts[1:]] + [len(text)]
    return [(cmd, text[start:end]) for (start, cmd), end in zip(starts, ends, strict=True)]


@pytest.mark.parametrize(
    "template", ["node.yaml", "controllers.yaml", "nats-auth.yaml", "domains.yaml"]
)
def test_each_bus_client_mounts_only_its_own_token_and_the_ca(template: str) -> None:
    """A token's audience names its role; a container that could read another's token
    could take that role, so each mounts only its own (and the CA, nothing else)."""
    text = (TEMPLATES / template).read_text()
    for command, block in _containers(text):
        if command in ("nats-auth", "nats-keygen"):
            continue  # the auth service logs in with its own nkey; keygen is no bus client
        role = ROLE_OF[command]
        assert 'include "gpudra.commonEnv"' in block or 'include "gpudra.busEnv"' in block
        mounts = re.findall(r'include "gpudra.natsMount" \(list \. "([a-z]+)"\)', block)
        assert mounts == [role], (command, mounts)
        assert f'include "gpudra.natsVolume" (list . "{role}")' in text
    volume = _helper("gpudra.natsVolume")
    assert 'audience: {{ printf "%s:%s" $.Values.nats.auth.audience (index . 1) }}' in volume
    assert "key: ca.crt" in volume and "tls.key" not in volume
    env = _helper("gpudra.busEnv")
    assert "GPUDRA_NATS_TOKEN_FILE\n  value: /var/run/gpudra/nats/token" in env
    assert "GPUDRA_NATS_CA\n  value: /var/run/gpudra/nats/ca.crt" in env
    assert "mountPath: /var/run/gpudra/nats\n" in _helper("gpudra.natsMount")
    assert _helper("gpudra.natsUrl").count("tls://") == 1 and "nats://" not in _helper(
        "gpudra.natsUrl"
    )


def test_the_grants_give_each_role_to_the_account_its_pod_runs_as() -> None:
    """gpudra nats-auth's GPUDRA_GRANTS: role -> the ServiceAccount of its workload."""
    pairs = re.findall(r'"([a-z]+)" "([a-z]+)"', _helper("gpudra.natsGrants"))
    grants = dict(pairs)
    assert grants == {"discovery": "preparer", "preparer": "preparer",
                      "kubeletplugin": "preparer", "publisher": "publisher",
                      "allocator": "allocator", "domains": "domains",
                      "admin": "provision"}  # fmt: skip
    for template in ("node.yaml", "controllers.yaml", "nats-auth.yaml", "domains.yaml"):
        text = (TEMPLATES / template).read_text()
        for doc in text.split("\n---\n"):
            account = re.search(r"serviceAccountName: \{\{ \$full \}\}-([\w-]+)", doc)
            for command, _ in _containers(doc):
                if command in ROLE_OF:
                    assert account and grants[ROLE_OF[command]] == account[1], command
    auth = (TEMPLATES / "nats-auth.yaml").read_text()
    assert 'value: {{ include "gpudra.natsGrants" . | quote }}' in auth
    flags = set(_subcommands()["nats-auth"]._option_string_actions)
    block = dict(_containers(auth))["nats-auth"]
    assert _env_flags(block) <= flags


def test_the_bus_runs_tls_auth_callout_and_monitoring_on_localhost_only() -> None:
    nats = (TEMPLATES / "nats.yaml").read_text()
    conf = nats[nats.index("nats.conf: |") : nats.index("nats-auth.conf: |")]
    assert "http: 127.0.0.1:{{ int $ports.monitor }}" in conf  # never another address
    assert "httpGet" not in nats
    assert nats.count('printf "http://127.0.0.1:%d/healthz?js-enabled-only=true"') == 2
    tls = "cert_file: {{ $tls }}/tls.crt\n"
    assert conf.count(tls) == 2  # the client port and the routes
    cluster = conf[conf.index("cluster {") :]
    assert "verify: true" in cluster  # routes: only holders of our CA's certificates
    assert "include ./nats-auth.conf" in conf
    assert '{{- .Files.Get "files/nats-auth.conf" | nindent 4 }}' in nats
    for key in ("issuer", "user"):
        assert f"name: {{{{ $full }}}}-nats-auth-public\n                  key: {key}" in nats
    auth = (CHART / "files" / "nats-auth.conf").read_text()
    callout = auth[auth.index("auth_callout {") :]
    assert "issuer: $GPUDRA_NATS_AUTH_ISSUER" in callout
    assert "auth_users: [ $GPUDRA_NATS_AUTH_USER ]" in callout and "account: AUTH" in callout
    assert "GPUDRA {\n    jetstream: enabled" in auth
    tls_secret = (TEMPLATES / "nats-tls.yaml").read_text()
    assert "kind: Certificate" in tls_secret and "genCA" in tls_secret
    assert 'lookup "v1" "Secret"' in tls_secret  # the chart's CA is kept across upgrades


def test_every_component_has_its_own_metrics_port_and_scrapers_find_them() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    ports = values["metrics"]["ports"]
    assert set(ports) == {"discovery", "preparer", "kubeletplugin", "publisher", "allocator",
                          "domains"}  # fmt: skip
    assert len(set(ports.values())) == len(ports)  # the node pod's three share a network
    names = {f"metrics-{c}"[:15] for c in ports}
    assert len(names) == len(ports) and all(len(n) <= 15 for n in names)  # IANA port names
    assert values["metrics"]["address"] == "0.0.0.0"  # Prometheus scrapes from elsewhere
    monitoring = (TEMPLATES / "monitoring.yaml").read_text()
    assert "kind: PodMonitor" in monitoring and "podMetricsEndpoints" in monitoring
    assert 'printf "metrics-%s" $component | trunc 15' in monitoring
    assert 'printf "metrics-%s" $component | trunc 15' in _helper("gpudra.metricsPort")
    controllers = (TEMPLATES / "controllers.yaml").read_text()
    for component in ("publisher", "allocator"):
        assert f'include "gpudra.scrapeAnnotations" (list . "{component}")' in controllers
    domains = (TEMPLATES / "domains.yaml").read_text()
    assert 'include "gpudra.scrapeAnnotations" (list . "domains")' in domains
    assert "prometheus.io/scrape" in _helper("gpudra.scrapeAnnotations")


def test_tracing_settings_are_the_standard_otel_variables() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["otlp"]["endpoint"] == ""  # off unless asked for
    env = _helper("gpudra.observabilityEnv")
    for variable in ("ENDPOINT", "PROTOCOL", "INSECURE", "CERTIFICATE", "HEADERS"):
        assert f"- name: OTEL_EXPORTER_OTLP_{variable}" in env
    assert "- name: OTEL_TRACES_SAMPLER\n" in env and "OTEL_TRACES_SAMPLER_ARG" in env
    assert "secretKeyRef" in env  # headers (credentials) come from a Secret, not values
    assert "fieldPath: metadata.name" in env  # POD_NAME: the instance in claim events


def test_the_preparer_sees_the_driver_where_it_is_mounted_and_writes_host_paths() -> None:
    """As the reference's nvidiaDriverRoot / container driver root: specs name host paths."""
    node = _template_texts()["node.yaml"]
    preparer = node[node.index("- name: preparer") : node.index("- name: kubeletplugin")]
    env = re.findall(r"- name: (GPUDRA_\w+)\n\s+value: (.+)", preparer)
    assert ("GPUDRA_DRIVER_ROOT", "{{ .Values.containerDriverRoot | quote }}") in env
    assert ("GPUDRA_HOST_DRIVER_ROOT", "{{ .Values.nvidiaDriverRoot | quote }}") in env
    assert "mountPath: {{ .Values.containerDriverRoot }}" in preparer
    assert "GPUDRA_NVIDIA_CDI_HOOK_PATH" in preparer
    values = _values()
    assert (values["nvidiaDriverRoot"], values["containerDriverRoot"]) == ("/", "/driver-root")


# --- The chart as real helm lints and renders it ------------------------------------------

# Values other than the defaults, each a release users may install (--set-json key=value).
VARIANTS: dict[str, dict[str, object]] = {
    "defaults": {},
    "external-bus": {"nats.enabled": False, "nats.url": "tls://nats.example:4222",
                     "nats.streamReplicas": 3},
    "one-server-cert-manager": {"nats.replicas": 1,
                                "nats.tls.certManager.issuerRef": {"name": "ca",
                                                                   "kind": "ClusterIssuer"}},
    "everything-on": {
        "image.tag": "1.2.3", "imagePullSecrets": [{"name": "regcred"}],
        "featureGates": {"TimeSlicingSettings": True, "MPSSupport": True},
        "retention": {"CLAIMS": {"maxAge": "90d", "maxBytes": "4Gi"}},
        "simulatedFleet": "dgx-h100", "nvidiaCDIHookPath": "/usr/local/bin/nvidia-cdi-hook",
        "node.kubeletplugin.rollingUpdateSockets": True,
        "node.preparer.trustClaimsBucket": True, "node.nodeSelector": {"gpu": "yes"},
        "metrics.podMonitor.enabled": True, "otlp.endpoint": "http://otel:4317",
        "publisher.additionalXidsToIgnore": "48,63", "publisher.gpuCliqueLabelEnabled": True,
    },
    "quiet": {"metrics.enabled": False, "networkPolicy.enabled": False},
    "webhook": {"webhook.enabled": True, "featureGates": {"MPSSupport": True}},
    "webhook-cert-manager": {"webhook.enabled": True, "webhook.failurePolicy": "Ignore",
                             "webhook.tls.certManager.issuerRef": {"name": "ca",
                                                                   "kind": "ClusterIssuer"}},
    "preparer-without-api": {"rbac.rules.preparer": [], "node.preparer.trustClaimsBucket": True},
    "no-compute-domains": {"computeDomains.enabled": False},
    "no-claim-status-writes": {"node.preparer.claimDeviceStatus": "off",
                               "computeDomains.bindingConditions": "off"},
    # One node whose pods have only a loopback (tests/e2e/deploy/test_chart_install.py).
    "host-network": {
        "hostNetwork": True, "apiServer": {"host": "127.0.0.1", "port": "16443"},
        "nats.url": "tls://127.0.0.1:14222", "nats.listenAddress": "127.0.0.1",
        "nats.ports": {"client": 14222, "cluster": 16222, "monitor": 18222},
        "nats.replicas": 1, "nats.command": ["nats-server"],
        "nats.persistence.enabled": False, "metrics.enabled": False,
    },
}  # fmt: skip
NAMESPACE = "gpu-system"
ADMISSION_KINDS = {"ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                   "ValidatingAdmissionPolicyBinding"}  # cluster-scoped  # fmt: skip
# Read from the environment by services/core/bus/retention.py, not flags.
RETENTION_VARIABLES = {f"GPUDRA_{retention.setting_name(name)}_{limit}"
                       for name in retention.DEFAULTS
                       for limit in ("MAX_AGE", "MAX_BYTES", "MAX_MSG_SIZE")}  # fmt: skip
# Containers that run privileged, and why (values.yaml says the same).
PRIVILEGED = {"discovery", "preparer"}  # NVML device nodes; MIG, MPS, vfio-pci binding
# Containers that run as root without privileges: they write root-owned host or volume paths.
ROOT = {"kubeletplugin", "nats"}  # sockets under the kubelet root; the JetStream store
HOST_PATHS = {"/sys", "/dev", "/", "/var/lib/kubelet/plugins",
              "/var/lib/kubelet/plugins_registry", "/var/run/cdi"}  # fmt: skip


@pytest.fixture(scope="module")
def chart_helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return helm(tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="module")
def rendered(chart_helm: Helm) -> dict[str, list[dict[str, Any]]]:
    return {name: chart_helm.template(values, namespace=NAMESPACE)
            for name, values in VARIANTS.items()}  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_strict_passes(chart_helm: Helm, variant: str) -> None:
    out = chart_helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                         "--kube-version", KUBE_VERSION, *set_args(VARIANTS[variant]))  # fmt: skip
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out


def test_a_missing_bus_url_is_refused_by_name(chart_helm: Helm) -> None:
    with pytest.raises(HelmError, match=r"nats\.url is required when nats\.enabled is false"):
        chart_helm.template({"nats.enabled": False})


def _containers_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_rbac_is_the_least_privilege_table(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    docs = rendered[variant]
    bus = VARIANTS[variant].get("nats.enabled", True)
    full = "gpudra"
    roles = objects_by_kind(docs, "ClusterRole")
    expected = {c: g for c, g in LEAST_PRIVILEGE.items() if g}
    if not bus:
        expected = {c: g for c, g in expected.items() if c not in ("nats-auth", "provision")}
    if variant == "preparer-without-api":
        del expected["preparer"]
    if not (
        VARIANTS[variant].get("webhook.enabled")
        and VARIANTS[variant].get("computeDomains.enabled", True)
    ):  # the webhook looks up ComputeDomains only when both are on
        del expected["webhook"]
    if VARIANTS[variant].get("publisher.gpuCliqueLabelEnabled"):  # the clique label only
        expected["publisher"] = expected["publisher"] | {("", "nodes", "patch")}
    if VARIANTS[variant].get("computeDomains.enabled", True) and "preparer" in expected:
        # the channel claim's domain (by UID) and the node's domain label
        expected["preparer"] = expected["preparer"] | {
            ("resource.nvidia.com", "computedomains", "list"),
            ("", "nodes", "get"),
            ("", "nodes", "patch"),
        }
    if "preparer" in expected and VARIANTS[variant].get("node.preparer.claimDeviceStatus") != "off":
        expected["preparer"] = expected["preparer"] | CLAIM_DEVICE_STATUS
    if "domains" in expected and VARIANTS[variant].get("computeDomains.bindingConditions") != "off":
        expected["domains"] = expected["domains"] | BINDING_CONDITIONS
    assert {n.removeprefix(f"{full}-"): _grants(r["rules"]) for n, r in roles.items()} == expected
    for name, role in roles.items():  # resourceclaims/driver: the component's own driver only
        for rule in role["rules"]:
            if "resourceclaims/driver" in rule["resources"]:
                component = name.removeprefix(f"{full}-")
                assert rule["resources"] == ["resourceclaims/driver"], rule
                assert rule["resourceNames"] == [DRIVER_RULES[component]], rule
    bindings = objects_by_kind(docs, "ClusterRoleBinding")
    assert set(bindings) == set(roles)
    for name, binding in bindings.items():
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                      "kind": "ClusterRole", "name": name}  # fmt: skip
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name,
                                        "namespace": NAMESPACE}]  # fmt: skip
    # the namespaced Roles: the release's namespace only, bound to the component's account
    hook = f"{full}-nats-keygen"
    namespaced = {n: r for n, r in objects_by_kind(docs, "Role").items() if n != hook}
    expected_namespaced = {c: g for c, g in NAMESPACED.items() if bus or c != "nats-auth"}
    assert {n.removeprefix(f"{full}-"): _grants(r["rules"]) for n, r in namespaced.items()} == (
        expected_namespaced
    )
    namespaced_bindings = {
        n: b for n, b in objects_by_kind(docs, "RoleBinding").items() if n != hook
    }
    assert set(namespaced_bindings) == set(namespaced)
    for name, binding in namespaced_bindings.items():
        assert namespaced[name]["metadata"]["namespace"] == NAMESPACE
        assert binding["metadata"]["namespace"] == NAMESPACE
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                      "kind": "Role", "name": name}  # fmt: skip
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name,
                                        "namespace": NAMESPACE}]  # fmt: skip
    for role in [*roles.values(), *objects_by_kind(docs, "Role").values()]:
        for rule in role["rules"]:
            words = {*rule["apiGroups"], *rule["resources"], *rule["verbs"]}
            assert not words & NEVER and not any("*" in w for w in words), rule
    accounts = objects_by_kind(docs, "ServiceAccount")
    assert all(a["automountServiceAccountToken"] is False for a in accounts.values())
    # Every pod runs as a rendered account; an API token only where its account has rules.
    role_bindings = [*bindings.values(), *objects_by_kind(docs, "RoleBinding").values()]
    with_rules = {s["name"] for b in role_bindings for s in b["subjects"]}
    for workload, template in pod_specs(docs).items():
        spec = template["spec"]
        if "serviceAccountName" not in spec:  # NATS: no account of ours, no token
            assert spec["automountServiceAccountToken"] is False, workload
            continue
        assert spec["serviceAccountName"] in accounts, workload
        api_volumes = {
            v["name"] for v in spec.get("volumes", [])
            for s in v.get("projected", {}).get("sources", [])
            if "serviceAccountToken" in s and "audience" not in s["serviceAccountToken"]
        }  # fmt: skip
        for container in _containers_of(spec):
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            has_api = spec["automountServiceAccountToken"] or bool(mounted & api_volumes)
            if has_api:
                assert spec["serviceAccountName"] in with_rules, (workload, container["name"])


NODE_NAME = "authentication.kubernetes.io/node-name"  # the API server's, on pod-bound tokens


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_api_policies_narrow_exactly_gpudra_accounts_writes(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    """What RBAC cannot scope (tests/e2e/deploy/test_chart_rbac.py tries it on a real API
    server): the policies judge only the rendered accounts, with the model's names."""
    docs, values = rendered[variant], VARIANTS[variant]
    policies = objects_by_kind(docs, "ValidatingAdmissionPolicy")
    bindings = objects_by_kind(docs, "ValidatingAdmissionPolicyBinding")
    accounts = objects_by_kind(docs, "ServiceAccount")
    for name in ("gpudra-publisher-slices", "gpudra-node-patches"):
        assert bindings[name]["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        assert policies[name]["spec"]["failurePolicy"] == "Fail"

    def users(policy: dict[str, Any]) -> set[str]:
        (condition,) = policy["spec"]["matchConditions"]
        named = set(re.findall(r"system:serviceaccount:[\w.-]+:[\w.-]+", condition["expression"]))
        for user in named:  # each a rendered account of the release's namespace
            assert user.split(":")[2] == NAMESPACE and user.split(":")[3] in accounts, user
        return {u.rsplit(":", 1)[1] for u in named}

    slices = policies["gpudra-publisher-slices"]["spec"]
    assert users(policies["gpudra-publisher-slices"]) == {"gpudra-publisher"}
    assert slices["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}]  # fmt: skip
    drivers = [nvidia.DRIVER_NAME]
    if values.get("computeDomains.enabled", True):
        drivers.append(computedomain.CD_DRIVER)
    quoted = "[" + ",".join(f"'{d}'" for d in drivers) + "]"
    assert f"s.spec.driver in {quoted}" in slices["validations"][0]["expression"]

    nodes = policies["gpudra-node-patches"]["spec"]
    want = {"gpudra-preparer", "gpudra-domains"}
    if values.get("publisher.gpuCliqueLabelEnabled"):
        want.add("gpudra-publisher")
    assert users(policies["gpudra-node-patches"]) == want
    assert nodes["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
        "resources": ["nodes"]}]  # fmt: skip
    label = {v["name"]: v["expression"] for v in nodes["variables"]}["label"]
    assert f"'{cliques.GPU_CLIQUE_LABEL}'" in label and f"'{computedomain.DOMAIN_LABEL}'" in label
    bound = nodes["validations"][0]["expression"]
    assert f"request.userInfo.extra['{NODE_NAME}'] == [object.metadata.name]" in bound


@pytest.mark.parametrize(
    ("kube_version", "mode", "on"),
    [("1.37.2", "auto", True), ("1.36.3", "auto", True), ("1.35.8", "auto", False),
     ("1.34.4", "auto", False), ("1.37.2", "off", False), ("1.35.8", "on", True)],
)  # fmt: skip
def test_claim_status_writes_follow_the_cluster_version(
    chart_helm: Helm, kube_version: str, mode: str, on: bool
) -> None:
    """Below 1.36 patch on resourceclaims/status would let a node rewrite any claim's
    allocation: auto grants it (and tells the binaries to write) only from 1.36, where the
    API server checks resourceclaims/driver per driver and node."""
    values = {"node.preparer.claimDeviceStatus": mode, "computeDomains.bindingConditions": mode}
    docs = chart_helm.template(values, namespace=NAMESPACE, extra=["--kube-version", kube_version])
    roles = objects_by_kind(docs, "ClusterRole")
    assert (CLAIM_DEVICE_STATUS <= _grants(roles["gpudra-preparer"]["rules"])) is on
    assert (BINDING_CONDITIONS <= _grants(roles["gpudra-domains"]["rules"])) is on
    if not on:
        for role in roles.values():
            assert not {r for _, r, _ in _grants(role["rules"])} & {"resourceclaims/status"}
    said = {
        (workload, var["name"]): var["value"]
        for workload, template in pod_specs(docs).items()
        for container in _containers_of(template["spec"])
        for var in container.get("env", [])
        if var["name"] in ("GPUDRA_CLAIM_DEVICE_STATUS", "GPUDRA_BINDING_CONDITIONS")
    }
    want = "on" if on else "off"
    assert said == {
        ("gpudra-node", "GPUDRA_CLAIM_DEVICE_STATUS"): want,
        ("gpudra-publisher", "GPUDRA_BINDING_CONDITIONS"): want,
        ("gpudra-domains", "GPUDRA_BINDING_CONDITIONS"): want,
    }


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector, as the API server evaluates it."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]  # fmt: skip
        if not ok:
            return False
    return True


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_network_policies_admit_exactly_gpudra_clients_to_the_bus(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    docs = rendered[variant]
    policies = objects_by_kind(docs, "NetworkPolicy")
    on = VARIANTS[variant].get("networkPolicy.enabled", True)
    bus = VARIANTS[variant].get("nats.enabled", True)
    pods = {name: t["metadata"]["labels"] for name, t in pod_specs(docs).items()}
    if not on:
        assert not policies
        return
    expected = {"gpudra-nats", "gpudra-nats-auth"} if bus else set()
    if VARIANTS[variant].get("metrics.enabled", True):
        expected.add("gpudra-metrics")
    assert set(policies) == expected
    for policy in policies.values():
        assert policy["metadata"]["namespace"] == NAMESPACE
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    if not bus:
        return
    nats = policies["gpudra-nats"]["spec"]
    (server,) = [n for n, labels in pods.items() if _matches(nats["podSelector"], labels)]
    assert server == "gpudra-nats"
    clients, routes = nats["ingress"]
    assert clients["ports"] == [{"port": "client"}] and routes["ports"] == [{"port": "cluster"}]
    admitted = {n for n, labels in pods.items()
                if any(_matches(p["podSelector"], labels) for p in clients["from"])}  # fmt: skip
    domains = VARIANTS[variant].get("computeDomains.enabled", True)
    assert admitted == {"gpudra-node", "gpudra-publisher", "gpudra-allocator",
                        "gpudra-nats-auth", "gpudra-provision-1"} | (
                        {"gpudra-domains"} if domains else set())  # fmt: skip
    daemon = _daemon_set(NAMESPACE, None)["spec"]["template"]["metadata"]["labels"]
    assert any(_matches(p["podSelector"], daemon) for p in clients["from"]) is domains
    peers = {n for n, labels in pods.items() if _matches(routes["from"][0]["podSelector"], labels)}
    assert peers == {"gpudra-nats"}
    (container,) = pod_specs(docs)["gpudra-nats"]["spec"]["containers"]
    ports = {"client": 4222, "cluster": 6222, **VARIANTS[variant].get("nats.ports", {})}  # type: ignore[dict-item]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "client": ports["client"], "cluster": ports["cluster"]}  # fmt: skip
    auth = policies["gpudra-nats-auth"]["spec"]
    assert auth["ingress"] == []
    assert {n for n, labels in pods.items() if _matches(auth["podSelector"], labels)} == {
        "gpudra-nats-auth"}  # fmt: skip


def _daemon_set(namespace: str, bus: DaemonBus | None) -> dict[str, Any]:
    """The DaemonSet the ComputeDomain controller makes, for some domain."""
    domain = a_domain("5e1c0a51-0000-4000-8000-00000000000a")
    return daemon_objects.daemon_set(domain, daemon_objects.DaemonSettings(namespace, bus=bus))


def _env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_imex_daemons_get_bus_credentials_the_callout_accepts(
    rendered: dict[str, list[dict[str, Any]]], variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's settings, read by its real flags, make daemon pods whose token
    names the imex-daemon role, which the auth callout grants to the pods' account."""
    docs = rendered[variant]
    specs = pod_specs(docs)
    daemon_grant = f"imex-daemon={NAMESPACE}/{computedomain.DAEMON_SERVICE_ACCOUNT}"
    grants: list[str] = []
    if "gpudra-nats-auth" in specs:  # the chart's bus (an external one has its own callout)
        (auth,) = [c for c in specs["gpudra-nats-auth"]["spec"]["containers"]
                   if c["name"] == "nats-auth"]  # fmt: skip
        grants = _env_of(auth)["GPUDRA_GRANTS"].split(",")
    if not VARIANTS[variant].get("computeDomains.enabled", True):
        assert "gpudra-domains" not in specs and not [g for g in grants if "imex" in g]
        return
    assert daemon_grant in grants or "gpudra-nats-auth" not in specs
    account = objects_by_kind(docs, "ServiceAccount")[computedomain.DAEMON_SERVICE_ACCOUNT]
    assert account["automountServiceAccountToken"] is False
    (controller,) = specs["gpudra-domains"]["spec"]["containers"]
    for name, value in _env_of(controller).items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["domains"])
    bus = domains_cli.daemon_bus(args)
    assert bus is not None and bus.url == _env_of(controller)["GPUDRA_NATS_URL"]
    pod = _daemon_set(NAMESPACE, bus)["spec"]["template"]["spec"]
    (volume,) = pod["volumes"]
    token, ca = volume["projected"]["sources"]
    audience = _values()["nats"]["auth"]["audience"]
    assert token["serviceAccountToken"]["audience"] == f"{audience}:imex-daemon"
    assert role_of_audiences(audience, [token["serviceAccountToken"]["audience"]]) == Role.IMEX
    tokens = {v["name"]: v for v in specs["gpudra-publisher"]["spec"]["volumes"]}
    (publisher_ca,) = [s for s in tokens["nats-publisher"]["projected"]["sources"] if "secret" in s]
    assert ca == publisher_ca  # the same CA Secret and key as every other bus client
    (container,) = pod["containers"]
    assert container["volumeMounts"] == [
        {"name": volume["name"], "mountPath": "/var/run/gpudra/nats", "readOnly": True}
    ]
    env = _env_of(container)
    assert env["GPUDRA_NATS_TOKEN_FILE"] == "/var/run/gpudra/nats/token"
    assert env["GPUDRA_NATS_CA"] == "/var/run/gpudra/nats/ca.crt"
    assert pod["serviceAccountName"] == computedomain.DAEMON_SERVICE_ACCOUNT
    assert (
        pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        and pod["automountServiceAccountToken"] is False
    )
    assert "volumes" not in _daemon_set(NAMESPACE, None)["spec"]["template"]["spec"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_pods_run_with_the_least_privileges_they_need(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    for workload, template in pod_specs(rendered[variant]).items():
        spec = template["spec"]
        for key in ("hostPID", "hostIPC"):
            assert not spec.get(key), (workload, key)
        host_paths = {v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
        if workload == "gpudra-node":
            assert host_paths == HOST_PATHS
        else:
            assert not host_paths, workload
        for container in _containers_of(spec):
            name = container["name"]
            context = container.get("securityContext") or {}
            if name in PRIVILEGED:
                assert context == {"privileged": True}, name
                continue
            assert not context.get("privileged"), name
            assert context.get("allowPrivilegeEscalation") is False, name
            assert context.get("readOnlyRootFilesystem") is True, name
            assert context.get("capabilities") == {"drop": ["ALL"]}, name
            if name not in ROOT:
                assert context.get("runAsNonRoot") is True, name
                assert context.get("runAsUser", 0) != 0, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_setting_is_a_flag_of_the_container_command(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    commands = _subcommands()
    for template in pod_specs(rendered[variant]).values():
        for container in _containers_of(template["spec"]):
            if container["name"] == "nats":
                continue  # the NATS image, configured by its file
            assert container["command"] == ["gpudra"]
            flags = set(commands[container["args"][0]]._option_string_actions)
            env = {e["name"] for e in container.get("env", [])}
            settings = {n for n in env if n.startswith("GPUDRA_")} - RETENTION_VARIABLES
            got = {"--" + n.removeprefix("GPUDRA_").lower().replace("_", "-") for n in settings}
            assert got <= flags, (container["name"], got - flags)
            assert container["args"][1:] == [] or container["name"] == "nats-keygen"


def test_rendered_settings_follow_the_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    def envs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {c["name"]: {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
                for t in pod_specs(docs).values() for c in _containers_of(t["spec"])
                if c["name"] != "nats" and "env" in c}  # fmt: skip

    on = envs(rendered["everything-on"])
    assert on["preparer"]["GPUDRA_FEATURE_GATES"] == "MPSSupport=true,TimeSlicingSettings=true"
    assert on["allocator"]["GPUDRA_CLAIMS_MAX_AGE"] == "90d"
    assert on["publisher"]["GPUDRA_CLAIMS_MAX_BYTES"] == "4Gi"
    assert on["discovery"]["GPUDRA_FLEET"] == on["preparer"]["GPUDRA_FLEET"] == "dgx-h100"
    assert on["kubeletplugin"]["GPUDRA_ROLLING_UPDATE_UID"] == {
        "fieldRef": {"fieldPath": "metadata.uid"}}  # fmt: skip
    assert on["preparer"]["GPUDRA_TRUST_CLAIMS_BUCKET"] == "true"
    assert on["preparer"]["GPUDRA_NVIDIA_CDI_HOOK_PATH"] == "/usr/local/bin/nvidia-cdi-hook"
    assert on["publisher"]["GPUDRA_ADDITIONAL_XIDS_TO_IGNORE"] == "48,63"
    for template in pod_specs(rendered["everything-on"]).values():
        spec = template["spec"]
        for container in _containers_of(spec):
            if container["name"] != "nats":
                assert container["image"] == "ghcr.io/gpudra/gpudra:1.2.3"
                assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod_specs(rendered["everything-on"])["gpudra-node"]["spec"]["nodeSelector"] == {
        "gpu": "yes"}  # fmt: skip
    default = envs(rendered["defaults"])
    assert "GPUDRA_ROLLING_UPDATE_UID" not in default["kubeletplugin"]
    assert "GPUDRA_TRUST_CLAIMS_BUCKET" not in default["preparer"]
    assert default["preparer"]["GPUDRA_NATS_URL"] == f"tls://gpudra-nats.{NAMESPACE}.svc:4222"
    assert default["preparer"]["GPUDRA_NATS_REPLICAS"] == "3"
    for template in pod_specs(rendered["defaults"]).values():
        for container in _containers_of(template["spec"]):
            if container["name"] != "nats":
                assert container["image"] == "ghcr.io/gpudra/gpudra:0.1.0"  # appVersion
    external = envs(rendered["external-bus"])
    assert set(external) == {"discovery", "preparer", "kubeletplugin", "publisher", "allocator",
                             "domains"}  # fmt: skip
    assert external["publisher"]["GPUDRA_NATS_URL"] == "tls://nats.example:4222"
    assert external["publisher"]["GPUDRA_NATS_REPLICAS"] == "3"
    assert not [d for d in rendered["external-bus"] if "nats" in d["metadata"]["name"]]
    host = rendered["host-network"]
    for name, template in pod_specs(host).items():
        assert template["spec"]["hostNetwork"] is True, name
        assert template["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet", name
    for name, template in pod_specs(rendered["defaults"]).items():
        assert "hostNetwork" not in template["spec"], name
    api_users = {"preparer", "publisher", "allocator", "nats-auth", "nats-keygen", "domains"}
    for name, got in envs(host).items():
        assert (got.get("KUBERNETES_SERVICE_HOST"), got.get("KUBERNETES_SERVICE_PORT")) == (
            ("127.0.0.1", "16443") if name in api_users else (None, None)), name  # fmt: skip
        if "GPUDRA_NATS_URL" in got:
            assert got["GPUDRA_NATS_URL"] == "tls://127.0.0.1:14222", name
    nats_spec = pod_specs(host)["gpudra-nats"]["spec"]
    (server,) = nats_spec["containers"]
    assert server["command"] == ["nats-server"]
    assert {"name": "data", "emptyDir": {}} in nats_spec["volumes"]
    assert "volumeClaimTemplates" not in one(host, "StatefulSet", "gpudra-nats")["spec"]
    conf = one(host, "ConfigMap", "gpudra-nats")["data"]["nats.conf"]
    assert "listen: 127.0.0.1:14222" in conf and "http: 127.0.0.1:18222" in conf
    assert "http://127.0.0.1:18222/healthz" in server["readinessProbe"]["exec"]["command"][-1]
    assert "command" not in one(rendered["defaults"], "StatefulSet", "gpudra-nats")["spec"][
        "template"]["spec"]["containers"][0]  # fmt: skip
    one_server = rendered["one-server-cert-manager"]
    assert "cluster {" not in one(one_server, "ConfigMap", "gpudra-nats")["data"]["nats.conf"]
    assert not objects_by_kind(one_server, "Secret")
    cert = one(one_server, "Certificate", "gpudra-nats")["spec"]
    assert cert["secretName"] == "gpudra-nats-tls"
    assert cert["issuerRef"] == {"name": "ca", "kind": "ClusterIssuer"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_namespaced_object_is_in_the_release_namespace(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "DeviceClass", *ADMISSION_KINDS}
    for doc in rendered[variant]:
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == NAMESPACE, (doc["kind"], doc["metadata"])


# --- Every value is documented and used ---------------------------------------------------

# Maps whose keys are the user's (components, gates, streams): documented as one value.
OPAQUE = {"rbac.rules", "rbac.namespacedRules", "rbac.hookRules", "retention", "featureGates",
          "metrics.ports"}  # fmt: skip


def _leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = prefix + key
        if isinstance(value, dict) and value and path not in OPAQUE:
            yield from _leaves(value, path + ".")
        else:
            yield path


def _documented_keys() -> set[str]:
    """Keys of values.yaml with a comment: on their line, in the comment block right above
    them, or (for every key inside it) on their parent."""
    documented: set[str] = set()
    stack: list[tuple[int, str]] = []
    comment_above = False
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment_above = True
            continue
        key = re.match(r"^( *)([A-Za-z][\w-]*):(.*)$", line)
        if not key:
            comment_above = comment_above and not stripped
            continue
        indent, name, rest = len(key[1]), key[2], key[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        path = f"{parent}.{name}" if parent else name
        if comment_above or " #" in rest or parent in documented:
            documented.add(path)
        stack.append((indent, path))
        comment_above = False
    return documented


# Standard Kubernetes fields passed to the pods as they are: their meaning is Kubernetes'.
PASSTHROUGH = {"nodeSelector", "tolerations", "affinity", "resources", "replicas",
               "pullPolicy", "imagePullSecrets", "repository", "tag", "updateStrategy"}  # fmt: skip


def test_every_value_is_documented_in_values_yaml() -> None:
    documented = _documented_keys()
    missing = [leaf for leaf in _leaves(_values()) if leaf not in documented
               and leaf.rsplit(".", 1)[-1] not in PASSTHROUGH
               and not any(leaf.startswith(p + ".") for p in documented)]  # fmt: skip
    assert not missing, f"values without a comment in values.yaml: {missing}"


def test_every_value_is_used_and_every_used_value_exists() -> None:
    used: set[str] = set()
    for path in (*TEMPLATES.iterdir(), CHART / "values.yaml"):
        used |= set(re.findall(r"\.Values((?:\.[A-Za-z]\w*)+)", path.read_text()))
    used = {u.lstrip(".") for u in used}
    leaves = set(_leaves(_values()))

    def known(u: str) -> bool:
        return any(leaf == u or leaf.startswith(u + ".") or u.startswith(leaf + ".")
                   for leaf in leaves)  # fmt: skip

    unknown = [u for u in used if not known(u)]
    assert not unknown, f"templates read values that values.yaml does not have: {unknown}"
    unused = [leaf for leaf in leaves
              if not any(leaf == u or leaf.startswith(u + ".") for u in used)]  # fmt: skip
    assert not unused, f"values no template reads: {unused}"


def test_no_hook_runs_after_the_workloads_so_helm_install_wait_cannot_deadlock(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """`helm install --wait` runs post-install hooks only once every workload is ready;
    the components are ready only once the bus is provisioned, so provisioning is a plain
    Job (one per revision) and the only hooks are the keygen's, before anything starts."""
    docs = rendered["defaults"]
    hooks = {d["metadata"]["name"]: d["metadata"]["annotations"]["helm.sh/hook"] for d in docs
             if "helm.sh/hook" in (d["metadata"].get("annotations") or {})}  # fmt: skip
    assert hooks and set(hooks.values()) == {"pre-install,pre-upgrade"}
    assert {name for name in hooks if not name.startswith("gpudra-nats-keygen")} == set()
    job = one(docs, "Job", "gpudra-provision-1")  # helm template renders revision 1
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["provision"]


@pytest.mark.parametrize("variant", ["defaults", "everything-on", "no-compute-domains"])
def test_the_plugin_is_ready_exactly_when_all_its_sockets_are_served(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    """The readiness probe runs as the kubelet runs it (sh in the container's environment),
    against sockets where services/kubeletplugin/sockets.py puts them: both drivers' with
    computeDomains.enabled (the default), the GPU driver's alone without. With and
    without a rolling-update UID."""
    with tempfile.TemporaryDirectory(prefix="kr-", dir="/tmp") as short:  # socket paths
        _probe_against_sockets(
            rendered[variant],
            Path(short),
            variant == "everything-on",
            domains=variant != "no-compute-domains",
        )


def _probe_against_sockets(
    docs: list[dict[str, Any]], tmp_path: Path, rolling: bool, *, domains: bool
) -> None:
    spec = pod_specs(docs)["gpudra-node"]["spec"]
    (plugin,) = [c for c in spec["containers"] if c["name"] == "kubeletplugin"]
    argv = plugin["readinessProbe"]["exec"]["command"]
    uid = "0f4c2a55-1b7e-4c1e-9a57-6f6d1d0c2b11" if rolling else ""
    assert ("GPUDRA_ROLLING_UPDATE_UID" in {e["name"] for e in plugin["env"]}) == bool(uid)
    env = {"PATH": os.environ["PATH"], "GPUDRA_KUBELET_ROOT": str(tmp_path)}
    if uid:
        env["GPUDRA_ROLLING_UPDATE_UID"] = uid
    drivers = [nvidia.DRIVER_NAME, *([computedomain.CD_DRIVER] if domains else [])]
    paths = [p for d in drivers for p in SocketPaths.for_driver(tmp_path, d, uid).all()]

    def probe() -> int:
        return subprocess.run(argv, env=env, check=False, capture_output=True).returncode

    listeners = []
    for path in paths:
        assert probe() != 0, f"ready before {path} is served"
        path.parent.mkdir(parents=True, exist_ok=True)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
        listeners.append(listener)
    assert probe() == 0
    for listener in listeners:
        listener.close()
