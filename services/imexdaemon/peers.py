"""The daemon's peers: the members of its domain and clique that have an index.

The node list IMEX gets is their addresses in index order (the controller gives
indices, stable across restarts), so every daemon of a clique renders the same
list and a daemon's position never changes while it stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.core.model.schemas import DomainIndex, DomainMember


@dataclass
class Peers:
    uid: str
    clique: str
    members: dict[str, DomainMember] = field(default_factory=dict)
    indices: dict[str, DomainIndex] = field(default_factory=dict)

    def indexed(self) -> list[tuple[int, str]]:
        """(index, IP address) of the members of our clique that have an index, in order."""
        ranked = []
        for node, member in self.members.items():
            index = self.indices.get(node)
            if member.clique_id == self.clique and index is not None:
                if index.clique_id == self.clique and index.index >= 0:
                    ranked.append((index.index, member.ip_address))
        return sorted(ranked)

    def node_list(self) -> list[str]:
        """IP addresses in index order: the members of our clique that have an index."""
        return [ip for _, ip in self.indexed()]

    def render(self) -> str:
        return "".join(f"{ip}\n" for ip in self.node_list())
