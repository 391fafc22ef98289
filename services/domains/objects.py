"""The objects the controller makes for one ComputeDomain, as the reference makes them.

Each carries the label and the finalizer ``resource.nvidia.com/computeDomain``
(value: the domain's UID) and ``resource.nvidia.com/computeDomainTarget``, so the
controller finds them again by label alone (after a restart, or as orphans).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.core.model import computedomain as cd
from services.core.model.opaque import API_VERSION
from services.domains.model import ComputeDomain

APP_LABEL = "app.kubernetes.io/name"
APP = "gpudra-compute-domain"
RCT_PATH = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"
DS_PATH = "/apis/apps/v1/namespaces/{ns}/daemonsets"


NATS_DIR = "/var/run/gpudra/nats"  # where every bus client of the chart finds its token and CA
NATS_VOLUME = "nats-imex-daemon"


@dataclass(frozen=True)
class DaemonBus:
    """The bus credentials a daemon pod gets in a cluster, as the chart gives its own pods:
    a projected token of audience ``<audience>:imex-daemon`` (the auth callout makes it
    ``imex-daemon.<node>``, the node taken from the pod the token is bound to) and the CA
    from ``ca_secret`` in the driver's namespace. Without it (``gpudra up``, where daemons
    are local processes given their credentials) the pods carry none."""

    url: str
    ca_secret: str
    audience: str = "gpudra-nats"
    token_seconds: int = 3600


@dataclass
class DaemonSettings:
    """How the IMEX daemon pods are made (flags of ``gpudra domains``)."""

    namespace: str = "gpudra"
    image: str = "gpudra:latest"
    image_pull_policy: str = "IfNotPresent"
    max_nodes: int = cd.MAX_NODES_PER_IMEX_DOMAIN
    feature_gates: str = ""
    env: dict[str, str] = field(default_factory=dict)  # more variables for the container
    bus: DaemonBus | None = None


def _meta(domain: ComputeDomain, namespace: str, name: str, target: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "finalizers": [cd.FINALIZER],
        "labels": {cd.DOMAIN_LABEL: domain.uid, cd.TARGET_LABEL: target, APP_LABEL: APP},
    }


def _template(request: str, device_class: str, params: dict[str, Any]) -> dict[str, Any]:
    opaque = {"driver": cd.CD_DRIVER, "parameters": params}
    devices = {
        "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
        "config": [{"requests": [request], "opaque": opaque}],
    }
    return {"spec": {"devices": devices}}


def workload_template(domain: ComputeDomain) -> dict[str, Any]:
    """The channel ResourceClaimTemplate workloads name, in the domain's namespace."""
    params = {
        "apiVersion": API_VERSION,
        "kind": cd.CHANNEL_CONFIG,
        "domainID": domain.uid,
        "allocationMode": domain.spec.channel.allocation_mode,
    }
    name = domain.spec.channel.resource_claim_template.name
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(domain, domain.metadata.namespace, name, cd.TARGET_WORKLOAD),
        "spec": _template(cd.CHANNEL_REQUEST, cd.CHANNEL_CLASS, params),
    }


def daemon_template(domain: ComputeDomain, settings: DaemonSettings) -> dict[str, Any]:
    """The daemon ResourceClaimTemplate, in the driver's namespace."""
    params = {"apiVersion": API_VERSION, "kind": cd.DAEMON_CONFIG, "domainID": domain.uid}
    name = cd.daemon_name(domain.uid)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(domain, settings.namespace, name, cd.TARGET_DAEMON),
        "spec": _template(cd.DAEMON_REQUEST, cd.DAEMON_CLASS, params),
    }


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(domain: ComputeDomain, settings: DaemonSettings) -> list[dict[str, Any]]:
    fixed: list[dict[str, Any]] = [
        {"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": str(settings.max_nodes)},
        # The reference's daemon reads numNodes from the ComputeDomain; gpudra's has no API
        # access, and the spec is immutable: IMEX waits for them with IP addresses.
        {"name": "COMPUTE_DOMAIN_NUM_NODES", "value": str(domain.spec.num_nodes)},
        {"name": "NODE_NAME", **_field("spec.nodeName")},
        {"name": "POD_IP", **_field("status.podIP")},
        {"name": "POD_UID", **_field("metadata.uid")},
        {"name": "POD_NAME", **_field("metadata.name")},
        {"name": "POD_NAMESPACE", **_field("metadata.namespace")},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "FEATURE_GATES", "value": settings.feature_gates},
    ]
    if settings.bus is not None:
        fixed += [
            {"name": "GPUDRA_NATS_URL", "value": settings.bus.url},
            {"name": "GPUDRA_NATS_TOKEN_FILE", "value": f"{NATS_DIR}/token"},
            {"name": "GPUDRA_NATS_CA", "value": f"{NATS_DIR}/ca.crt"},
        ]
    return fixed + [{"name": k, "value": v} for k, v in sorted(settings.env.items())]


def _bus_volume(bus: DaemonBus) -> dict[str, Any]:
    token = {
        "path": "token",
        "audience": f"{bus.audience}:imex-daemon",
        "expirationSeconds": bus.token_seconds,
    }
    ca = {"name": bus.ca_secret, "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    return {
        "name": NATS_VOLUME,
        "projected": {"sources": [{"serviceAccountToken": token}, {"secret": ca}]},
    }


def _probe(period: int, failures: int) -> dict[str, Any]:
    command = ["gpudra", "imex-daemon", "check"]
    return {"exec": {"command": command}, "periodSeconds": period, "failureThreshold": failures}


def daemon_set(domain: ComputeDomain, settings: DaemonSettings) -> dict[str, Any]:
    """The IMEX daemons: one pod on every node labelled with the domain's UID."""
    selector = {cd.DOMAIN_LABEL: domain.uid}
    container: dict[str, Any] = {
        "name": cd.DAEMON_CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["gpudra", "imex-daemon", "run"],
        "env": _env(domain, settings),
        "resources": {"claims": [{"name": cd.DAEMON_CONTAINER}]},
        "startupProbe": _probe(1, 1200),
        "livenessProbe": _probe(60, 20),
        "readinessProbe": _probe(10, 1),
    }
    tolerations = [
        {"operator": "Exists", "effect": e} for e in ("NoSchedule", "NoExecute", "PreferNoSchedule")
    ]
    pod: dict[str, Any] = {
        "serviceAccountName": cd.DAEMON_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,  # no API rights; its bus token is its own
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",  # the bus by its Service name
        "nodeSelector": selector,
        "tolerations": tolerations,
        "resourceClaims": [
            {"name": cd.DAEMON_CONTAINER, "resourceClaimTemplateName": cd.daemon_name(domain.uid)}
        ],
        "containers": [container],
    }
    if settings.bus is not None:
        mount = {"name": NATS_VOLUME, "mountPath": NATS_DIR, "readOnly": True}
        container["volumeMounts"] = [mount]
        pod["volumes"] = [_bus_volume(settings.bus)]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(domain, settings.namespace, cd.daemon_name(domain.uid), cd.TARGET_DAEMON),
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": {**selector, APP_LABEL: APP}}, "spec": pod},
        },
    }
