"""KEP-5304 device metadata: the JSON file a workload (KubeVirt) reads to find its device.

For each request of a claim that got a VFIO device, one file holds a stream of
``DeviceMetadata`` objects, newest API version first (``metadata.resource.k8s.io``
v1beta1, then v1alpha1 for older readers). It carries the attributes the
device is published with, among them ``resource.kubernetes.io/pciBusID``, which
KubeVirt needs to pass the GPU through. The file lives in the plugin directory
and the claim's CDI spec bind-mounts it read-only at the well-known path
``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json``
(``resourceclaimtemplates/<pod claim name>/...`` for claims made from a template).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from services.core.kube.resource import DeviceAttribute
from services.preparer.cdi import MetadataMount, metadata_container_path
from services.preparer.fsutil import atomic_write

API_VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


@dataclass(frozen=True)
class MetadataDevice:
    request: str  # the full request name (may be "req/sub")
    pool: str
    name: str
    attributes: Mapping[str, DeviceAttribute]


def claim_dir(plugin_dir: Path, uid: str) -> Path:
    return plugin_dir / "metadata" / uid


def render(
    *, uid: str, namespace: str, name: str, template: str, driver: str,
    devices: Sequence[MetadataDevice],
) -> bytes:  # fmt: skip
    """The file's bytes: one JSON object per API version, newline separated."""
    requests: dict[str, list[dict[str, Any]]] = {}
    for device in devices:
        requests.setdefault(device.request, []).append(
            {
                "driver": driver,
                "pool": device.pool,
                "name": device.name,
                "attributes": {k: msgspec.to_builtins(v) for k, v in device.attributes.items()},
            }
        )
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
    }
    if template:
        body["podClaimName"] = template
    body["requests"] = [{"name": req, "devices": devs} for req, devs in requests.items()]
    objects = [
        msgspec.json.encode({"kind": "DeviceMetadata", "apiVersion": version, **body})
        for version in API_VERSIONS
    ]
    return b"\n".join(objects) + b"\n"


def write_claim(
    plugin_dir: Path,
    *,
    uid: str,
    namespace: str,
    name: str,
    annotations: Mapping[str, str],
    driver: str,
    devices: Sequence[MetadataDevice],
) -> list[MetadataMount]:
    """One file per base request; returns the CDI mounts (one per request, on its first device)."""
    template = annotations.get(POD_CLAIM_NAME_ANNOTATION, "")
    by_request: dict[str, list[MetadataDevice]] = {}
    for device in devices:
        by_request.setdefault(device.request.split("/", 1)[0], []).append(device)
    mounts = []
    for base, members in by_request.items():
        host = claim_dir(plugin_dir, uid) / base / f"{driver}-metadata.json"
        data = render(
            uid=uid, namespace=namespace, name=name, template=template, driver=driver,
            devices=members,
        )  # fmt: skip
        atomic_write(host, data, mode=0o644)
        mounts.append(
            MetadataMount(
                host_path=str(host),
                container_path=metadata_container_path(name, base, driver, template),
                device=members[0].name,
            )
        )
    return mounts


def delete_claim(plugin_dir: Path, uid: str) -> None:
    shutil.rmtree(claim_dir(plugin_dir, uid), ignore_errors=True)


def claim_uids_on_disk(plugin_dir: Path) -> list[str]:
    root = plugin_dir / "metadata"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []
