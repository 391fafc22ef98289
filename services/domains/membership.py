"""Who is in each domain, from the bus's ``domains`` bucket, and what the status says.

Each node's daemon owns its member key; the controller owns the index keys. An
index is the lowest one free in the member's clique (-1 outside a fabric), given
once and kept while the member stays, so a daemon restart or another node joining
never renumbers anyone (the reference's index swaps, #1418/#1440). A member whose
key goes away loses its index; a member that moves to another clique gets a new
one there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from services.core.model import computedomain as cd
from services.core.model.schemas import DomainIndex, DomainMember
from services.domains.model import DomainNode, DomainStatus

NO_INDEX = -1
V = TypeVar("V")


@dataclass
class IndexChange:
    """An index key to write (``index`` set) or to remove (``index`` None)."""

    uid: str
    node: str
    index: DomainIndex | None


@dataclass
class Membership:
    members: dict[str, dict[str, DomainMember]] = field(default_factory=dict)
    indices: dict[str, dict[str, DomainIndex]] = field(default_factory=dict)
    max_nodes: int = cd.MAX_NODES_PER_IMEX_DOMAIN

    def set_member(self, uid: str, node: str, member: DomainMember | None) -> None:
        _set(self.members, uid, node, member)

    def set_index(self, uid: str, node: str, index: DomainIndex | None) -> None:
        _set(self.indices, uid, node, index)

    def domains(self) -> set[str]:
        return set(self.members) | set(self.indices)

    def forget(self, uid: str) -> None:
        self.members.pop(uid, None)
        self.indices.pop(uid, None)

    def index_changes(self, uid: str) -> list[IndexChange]:
        """What to write so every member has exactly one index and no one else has any."""
        members = self.members.get(uid, {})
        indices = dict(self.indices.get(uid, {}))
        out = [IndexChange(uid, n, None) for n in sorted(indices.keys() - members.keys())]
        for gone in out:
            indices.pop(gone.node)
        for node in sorted(members):
            clique = members[node].clique_id
            have = indices.get(node)
            if have is not None and have.clique_id == clique:
                continue
            index = self._free_index(clique, (i for n, i in indices.items() if n != node))
            if index is None:
                continue  # the clique is full: the member stays without an index (NotReady)
            new = DomainIndex(domain_uid=uid, node=node, clique_id=clique, index=index)
            indices[node] = new
            out.append(IndexChange(uid, node, new))
        return out

    def _free_index(self, clique: str, taken: Iterable[DomainIndex]) -> int | None:
        if not clique:
            return NO_INDEX
        used = {i.index for i in taken if i.clique_id == clique}
        return next((i for i in range(self.max_nodes) if i not in used), None)

    def nodes(self, uid: str) -> list[DomainNode]:
        """``status.nodes``: every member, its index (-1 until it has one) and readiness."""
        indices = self.indices.get(uid, {})
        out = []
        for node, member in sorted(self.members.get(uid, {}).items()):
            index = indices.get(node)
            valid = index is not None and index.clique_id == member.clique_id
            out.append(
                DomainNode(
                    name=node,
                    ip_address=member.ip_address,
                    clique_id=member.clique_id,
                    index=index.index if valid and index is not None else NO_INDEX,
                    status=member.status if valid or not member.clique_id else cd.NOT_READY,
                )
            )
        return out


def domain_status(num_nodes: int, nodes: list[DomainNode]) -> DomainStatus:
    """As the reference: NotReady while fewer than numNodes or any node is not Ready."""
    ready = len(nodes) >= num_nodes and all(n.status == cd.READY for n in nodes)
    return DomainStatus(status=cd.READY if ready else cd.NOT_READY, nodes=nodes)


def _set(table: dict[str, dict[str, V]], uid: str, node: str, value: V | None) -> None:
    if value is None:
        entries = table.get(uid)
        if entries is not None:
            entries.pop(node, None)
            if not entries:
                del table[uid]
        return
    table.setdefault(uid, {})[node] = value
