"""What the node's runner gives a daemon pod's process (services/local/daemonpods.py).

The pod and the CDI spec are what the cluster and the node driver wrote; a pod that
is not runnable yet (no annotation, no spec, no ``/imexd`` mount) is skipped with a
reason, never run half-configured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.core.model import computedomain as cd
from services.local.daemonpods import CDI_ANNOTATION, DaemonNode, LaunchError, launch_of
from services.preparer.computedomain import edits
from services.preparer.computedomain.engine import CDI_VERSION, KIND, spec_path

CLAIM = "0b3c2f5e-7d3a-4a47-9f0c-1d2e3f405162"
DOMAIN = "9d1f3c2e-5b6a-4c7d-8e9f-0a1b2c3d4e5f"


def pod(annotation: dict[str, list[str]] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "daemon-x", "namespace": "gpudra", "uid": "pod-uid"}
    if annotation is not None:
        meta["annotations"] = {CDI_ANNOTATION: json.dumps(annotation)}
    downward = {"fieldRef": {"fieldPath": "status.podIP"}}
    env = [{"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": "18"},
           {"name": "POD_IP", "valueFrom": downward}]  # fmt: skip
    return {"metadata": meta,
            "spec": {"containers": [{"name": cd.DAEMON_CONTAINER, "env": env}]}}  # fmt: skip


def device_id() -> str:
    return f"{edits.VENDOR}/claim={CLAIM}-{cd.DAEMON_DEVICE}"


def write_spec(root: Path, container: dict[str, Any]) -> None:
    device = {"name": f"{CLAIM}-{cd.DAEMON_DEVICE}", "containerEdits": container}
    spec = {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": [device]}
    spec_path(root, CLAIM).write_bytes(msgspec.json.encode(spec))


def test_the_process_gets_the_pods_and_the_claims_environment(tmp_path: Path) -> None:
    node = DaemonNode("n1", tmp_path, "127.0.0.10")
    ref = edits.DomainRef(DOMAIN, "job", "team-a")
    folder = tmp_path / "domains" / "x"
    folder.mkdir(parents=True)
    write_spec(tmp_path, edits.daemon_edits(ref, "c.1", str(folder), edits.CapFile(0, 0), 508))
    launch = launch_of(pod({cd.DAEMON_CONTAINER: [device_id()]}), node)
    assert launch.imexd_dir == folder
    assert launch.key == "gpudra/daemon-x/pod-uid"
    assert launch.env == {
        "MAX_NODES_PER_IMEX_DOMAIN": "18",
        "NODE_NAME": "n1",
        "POD_IP": "127.0.0.10",  # the node's own address, not the downward API's
        "POD_NAME": "daemon-x",
        "POD_NAMESPACE": "gpudra",
        "POD_UID": "pod-uid",
        "CLIQUE_ID": "c.1",
        "COMPUTE_DOMAIN_UUID": DOMAIN,
        "COMPUTE_DOMAIN_NAME": "job",
        "COMPUTE_DOMAIN_NAMESPACE": "team-a",
    }


@pytest.mark.parametrize(
    ("annotation", "spec", "says"),
    [
        (None, None, "no gpudra.dev/cdi-devices annotation"),
        ({"c": ["k8s.gpu.nvidia.com/claim=x-gpu-0"]}, None, "no compute-domain CDI device"),
        ({cd.DAEMON_CONTAINER: [device_id()]}, None, "No such file"),
        ({cd.DAEMON_CONTAINER: [device_id()]}, {"env": ["CLIQUE_ID="]}, "mounts nothing at"),
        (
            {cd.DAEMON_CONTAINER: [device_id()]},
            {"mounts": [{"hostPath": "/no/such/domain", "containerPath": "/imexd"}]},
            "the claim's folder is gone",
        ),
    ],
)
def test_a_pod_not_runnable_yet_says_why(
    tmp_path: Path,
    annotation: dict[str, list[str]] | None,
    spec: dict[str, Any] | None,
    says: str,
) -> None:
    if spec is not None:
        write_spec(tmp_path, spec)
    with pytest.raises(LaunchError, match=says):
        launch_of(pod(annotation), DaemonNode("n1", tmp_path, "127.0.0.10"))
