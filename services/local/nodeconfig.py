"""The configuration files of a real node: containerd's, the kubelet's, the CNI's.

Each setting here was a failure first on a 2-core VM with cgroup v1 (hybrid)
and no CAP_SYS_RESOURCE (issue 11 lists them):

* containerd: CDI on, reading the node's CDI folder (it must exist before
  containerd starts: a folder made later is never watched); overlayfs; runc
  through the runc shim with cgroupfs; ``restrict_oom_score_adj`` (the pause
  container otherwise fails in runc: ``nsexec: failed to update
  /proc/self/oom_score_adj``); NRI off; its root, state, socket and ``opt``
  folder the node's own; the pod network from a stand-in CNI plugin with
  containerd's internal loopback;
* the kubelet: ``failCgroupV1: false`` (1.35 refuses cgroup v1 otherwise),
  ``makeIPTablesUtilChains: false`` (otherwise it edits the host's iptables),
  cgroupfs under a cgroup root of its own (two nodes on one host must not
  share ``/kubepods``), its server on 127.0.0.1 with anonymous access (the
  API server's ``kubectl logs``/``exec`` reach it there), image garbage
  collection off (the images cannot be pulled again).

The stand-in CNI plugin reports an interface and an address without creating
anything: pods get their loopback and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CNI_PLUGIN = "gpudra-standin"
CNI_VERSION = "1.0.0"

CNI_SCRIPT = r"""#!/bin/sh
# Stand-in CNI plugin of gpudra's real nodes (services/local/nodeconfig.py):
# reports an interface and an address, creates nothing; the pod keeps only the
# loopback that containerd brings up itself.
case "$CNI_COMMAND" in
ADD)
    cat >/dev/null
    n=$(printf %s "$CNI_CONTAINERID" | cksum | cut -d' ' -f1)
    ip="10.244.$((n / 256 % 256)).$((n % 254 + 1))"
    printf '{"cniVersion":"%s","interfaces":[{"name":"%s","sandbox":"%s"}],' \
        "1.0.0" "$CNI_IFNAME" "$CNI_NETNS"
    printf '"ips":[{"address":"%s/32","interface":0}]}\n' "$ip"
    ;;
DEL | CHECK | GC | STATUS)
    cat >/dev/null
    ;;
VERSION)
    printf '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}\n'
    ;;
*)
    printf '{"cniVersion":"1.0.0","code":4,"msg":"unknown CNI_COMMAND %s"}\n' "$CNI_COMMAND"
    exit 1
    ;;
esac
"""


@dataclass(frozen=True)
class ContainerdSettings:
    root: Path  # persistent state (content, snapshots, metadata)
    state: str  # runtime state, inside the node's /run tmpfs
    socket: Path  # the gRPC socket the kubelet and ctr use
    cdi_dir: Path
    cni_bin: Path
    cni_conf: Path
    runc: Path
    sandbox_image: str
    opt: Path  # the opt plugin's folder (default /opt/containerd, on the host)


def containerd_toml(s: ContainerdSettings) -> str:
    """containerd 2.x configuration (version 3)."""

    def q(value: object) -> str:
        return json.dumps(str(value))  # a TOML basic string is a JSON string

    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return "\n".join(
        [
            "version = 3",
            f"root = {q(s.root)}",
            f"state = {q(s.state)}",
            "",
            "[grpc]",
            f"  address = {q(s.socket)}",
            "",
            "[plugins.'io.containerd.internal.v1.opt']",
            f"  path = {q(s.opt)}",
            "",
            "[plugins.'io.containerd.nri.v1.nri']",
            "  disable = true",
            "",
            "[plugins.'io.containerd.cri.v1.images']",
            "  snapshotter = 'overlayfs'",
            "  [plugins.'io.containerd.cri.v1.images'.pinned_images]",
            f"    sandbox = {q(s.sandbox_image)}",
            "",
            f"[{cri_runtime}]",
            "  enable_cdi = true",
            f"  cdi_spec_dirs = [{q(s.cdi_dir)}]",
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            f"  [{cri_runtime}.containerd]",
            "    default_runtime_name = 'runc'",
            f"    [{cri_runtime}.containerd.runtimes.runc]",
            "      runtime_type = 'io.containerd.runc.v2'",
            f"      [{cri_runtime}.containerd.runtimes.runc.options]",
            f"        BinaryName = {q(s.runc)}",
            "        SystemdCgroup = false",
            f"  [{cri_runtime}.cni]",
            f"    bin_dirs = [{q(s.cni_bin)}]",
            f"    conf_dir = {q(s.cni_conf)}",
            "    use_internal_loopback = true",
            "",
            "[plugins.'io.containerd.grpc.v1.cri']",
            "  stream_server_address = '127.0.0.1'",
            "  stream_server_port = '0'",
            "",
        ]
    )


def write_cni(bin_dir: Path, conf_dir: Path) -> None:
    """The stand-in plugin and the one network configuration naming it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    conf_dir.mkdir(parents=True, exist_ok=True)
    plugin = bin_dir / CNI_PLUGIN
    plugin.write_text(CNI_SCRIPT)
    plugin.chmod(0o755)
    conflist = {"cniVersion": CNI_VERSION, "name": "gpudra", "plugins": [{"type": CNI_PLUGIN}]}
    (conf_dir / "10-gpudra.conflist").write_text(json.dumps(conflist, indent=2) + "\n")


@dataclass(frozen=True)
class KubeletSettings:
    runtime_socket: Path
    cgroup_root: str
    port: int
    healthz_port: int
    volume_plugin_dir: Path  # default /usr/libexec/kubernetes/..., made at start
    feature_gates: Mapping[str, bool]


def kubelet_config(s: KubeletSettings) -> dict[str, Any]:
    """A KubeletConfiguration (kubelet.config.k8s.io/v1beta1), as JSON-able data."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": s.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": s.healthz_port,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{s.runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": s.cgroup_root,
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "hairpinMode": "none",
        "resolvConf": "",
        # No DNS runs; a cluster DNS address keeps the kubelet from warning on every pod.
        "clusterDNS": ["10.96.0.10"],
        "clusterDomain": "cluster.local",
        "staticPodPath": "",
        "volumePluginDir": str(s.volume_plugin_dir),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "featureGates": dict(s.feature_gates),
    }
