"""The nodes of a stack: what each one simulates, and where its files live.

A node is a name and a fleet profile (:mod:`services.discovery.fleets`); the demo
of ``gpudra up`` runs :data:`DEMO_NODES`, and :data:`GB200_DEMO_NODES` beside them
when an example has a ComputeDomain.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.local.nodepaths import NodePaths


@dataclass(frozen=True)
class NodeSpec:
    """A simulated GPU node: its Node name, the fleet profile it boots as, and a
    taint (``key=value:Effect``) it gets once its Node exists, if any."""

    name: str
    fleet: str
    taint: str = ""


DEMO_NODES = (NodeSpec("gpu-node-h100", "dgx-h100"), NodeSpec("gpu-node-a100", "dgx-a100"))

#: Kept for the jobs that tolerate it: the GPU examples stay on DEMO_NODES, where
#: they mean what they say (the unsatisfiable one's GPUs exist on no node there).
GB200_DEMO_TAINT = "gpudra.dev/nvlink-rack=gb200:NoSchedule"

#: Two compute trays of one GB200 NVL72 rack (one seed: one NVLink clique), which
#: `gpudra up` adds when an example has a ComputeDomain (examples/13-...).
GB200_DEMO_NODES = (
    NodeSpec("gpu-node-gb200-1", "gb200-nvl72", GB200_DEMO_TAINT),
    NodeSpec("gpu-node-gb200-2", "gb200-nvl72", GB200_DEMO_TAINT),
)


@dataclass(frozen=True)
class StackNode:
    """A node of the stack and where its files live."""

    spec: NodeSpec
    paths: NodePaths

    @property
    def name(self) -> str:
        return self.spec.name
