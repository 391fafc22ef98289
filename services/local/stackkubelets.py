"""Each node's kubelet in a stack: kubelet-dra, or a real node's containerd and kubelet.

A starting kubelet deletes its node's ResourceSlices. So that a slice seen after a
kubelet started was written after that wipe, a sentinel slice of a dummy driver is
planted on the node first, and the kubelet counts as started once it is gone. Real
nodes (:mod:`services.local.node`) get their private host first, before the
preparer that must see its driver installation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from services.local import images
from services.local.component import Process
from services.local.kubebinary import build_controlplane
from services.local.node import RealNode
from services.local.nodetools import NodeTools
from services.local.stacknodes import StackNode
from services.local.stackprocs import StackProcesses

#: Driver of the slice that shows when a starting kubelet-dra has wiped its node.
SENTINEL_DRIVER = "wipe-sentinel.gpudra.dev"


class StackKubelets(StackProcesses):
    """The kubelets of a stack's ``nodes`` (set by :class:`~services.local.stack.Stack`)."""

    nodes: dict[str, StackNode]
    real_nodes: bool  # containerd and the real kubelet instead of kubelet-dra
    real: dict[str, RealNode]  # node name -> its runner, with real_nodes
    node_tools: NodeTools | None
    kube_version: str | None
    images: tuple[images.ImageArchive, ...]

    def _start_real_hosts(self) -> None:
        """Each real node's namespace and driver installation, before its preparer."""
        assert self.cp.binary is not None
        hooks = None if self.kube_version is None else build_controlplane()  # the default's
        tools = self.node_tools or NodeTools.find(self.cp.binary, hooks_from=hooks)
        self.images = images.build(self.workdir / "images")
        for name, node in self.nodes.items():
            fleet, timeout = node.spec.fleet, self.startup_timeout
            real = RealNode(self.cp, name, fleet, node.paths.root, tools, startup_timeout=timeout)
            self.real[name] = real
            self._started.append(f"node-{name}")
            real.launch_host()  # the nodes build their driver roots side by side
        for real in self.real.values():
            real.wait_host()
            assert real.holder is not None
            self.processes[real.holder.name] = real.holder  # its exit is a failure
            # The node's processes run in its namespace (nsenter by the holder's PID):
            # a new holder would be a new, empty node.
            self._unrestartable.add(real.holder.name)
            self._write_pids()

    def start_kubelets(self, nodes: Sequence[str]) -> list[Process]:
        """Start each node's kubelet (kubelet-dra, or containerd and the real
        kubelet) and return once each has wiped its node's ResourceSlices, as a
        starting kubelet does (so that a slice seen after this was written after
        the wipe)."""
        if self.real_nodes:
            return self._start_real_kubelets(nodes)
        sentinels = [self._plant_sentinel(node) for node in nodes]
        handles: list[Process] = []
        for node in nodes:
            name = f"kubelet-dra-{node}"
            with self._lock:
                handle = self.cp.start_kubelet_dra(node, self.nodes[node].paths.kubelet_root)
                self.processes[name] = handle
                self._paused.discard(name)
                if name not in self._started:
                    self._started.append(name)
            handles.append(handle)
        self._write_pids()
        for node, sentinel, started in zip(nodes, sentinels, handles, strict=True):
            self.wait_for(
                functools.partial(self._slice_gone, sentinel),
                f"kubelet-dra {node} to wipe the node's ResourceSlices",
                started,
            )
        return handles

    def _slice_gone(self, name: str) -> bool:
        return self.cp.api_get(f"/apis/resource.k8s.io/v1/resourceslices/{name}") is None

    def _start_real_kubelets(self, nodes: Sequence[str]) -> list[Process]:
        handles: list[Process] = []
        for node in nodes:
            sentinel = self._plant_sentinel(node)
            real = self.real[node]
            if real.containerd is None:
                real.start_runtime(self.images)
            else:
                real.start_kubelet()
            assert real.containerd is not None and real.kubelet is not None
            self.processes[real.containerd.name] = real.containerd
            self.processes[real.kubelet.name] = real.kubelet
            self._paused.discard(real.kubelet.name)
            self._write_pids()
            self.wait_for(
                functools.partial(self._slice_gone, sentinel),
                f"the kubelet of {node} to wipe the node's ResourceSlices",
                real.kubelet,
            )
            handles.append(real.kubelet)
        return handles

    def kill_containerd(self, node: str) -> None:
        """SIGKILL a real node's containerd (its shims and containers live on)."""
        real = self.real[node]
        with self._lock:
            if real.containerd is not None:
                self._paused.add(real.containerd.name)
            real.kill_containerd()

    def start_containerd(self, node: str) -> Process:
        """Start a real node's containerd again (same root, same config)."""
        process = self.real[node].start_containerd()  # the old one stays paused meanwhile
        with self._lock:
            self.processes[process.name] = process
            self._paused.discard(process.name)
            self._write_pids()
        return process

    def restart_kubelet(self, node: str) -> Process:
        with self._lock:  # paused first: a supervisor restarts no kubelet stopped on purpose
            if node in self.real:
                kubelet = self.real[node].kubelet
                if kubelet is not None:
                    self._paused.add(kubelet.name)
            else:
                self._paused.add(f"kubelet-dra-{node}")
        if node in self.real:
            self.real[node].stop_kubelet()
        else:
            self.cp.stop_kubelet_dra(node)
        return self.start_kubelets([node])[0]

    def _plant_sentinel(self, node: str) -> str:
        """A ResourceSlice of a dummy driver on ``node``: gone = the kubelet wiped."""
        name = f"gpudra-wipe-sentinel-{node}"
        self.cp.apply(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": SENTINEL_DRIVER,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                    "devices": [],
                },
            }
        )
        return name
