"""Who may do what on the bus: one identity per component instance, least privilege.

The bus is a control channel (whoever writes ``claims`` or answers
``dra.node.<node>.prepare`` decides who gets a GPU), so every connection is
authenticated and each identity may publish and subscribe only what its job
needs. The rules, all derived from :mod:`services.core.bus.subjects`:

- only a node's kubelet plugin (front) may request ``dra.node.<node>.*``, and
  only that node's preparer may receive (and so answer) those requests;
- replies go to inboxes only their owner may read (``_I.<identity>.>``), and
  nobody may publish to another's inbox: the front's answer can only come from
  its node's preparer. No identity may answer onto whatever reply subject a
  request names (nats-server's ``allow_responses``): a responder publishes only
  into the inboxes of those it serves, so a compromised node cannot have its own
  preparer "answer" onto another node's subjects or keys;
- only the allocator's claim watcher writes ``claims``; only a node's discovery
  writes its own ``inventory`` key; only a node's preparer its ``prepared`` key;
- each service publishes only its own claim and device events;
- nobody (the provisioning identity included) may purge or delete a stream or
  bucket, or delete a message; auditors only read;
- consumers only on the streams an identity reads, and only under a few names of
  its own (:mod:`services.core.bus.slots`): no identity can exhaust a stream's
  consumers for the others.

This module is pure data: :mod:`services.core.bus.natsauth` renders it into the
nats-server configuration, the chart into its own.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.core.bus import slots, subjects
from services.core.model.computedomain import CD_DRIVER
from services.core.model.nvidia import DRIVER_NAME
from services.core.model.schemas import ClaimEventName

JS_API = "$JS.API"


class Role(enum.StrEnum):
    ADMIN = "admin"  # creates and updates streams and buckets (provisioning)
    ALLOCATOR = "allocator"  # the claim watcher
    PUBLISHER = "publisher"
    DISCOVERY = "discovery"  # per node
    PREPARER = "preparer"  # per node
    FRONT = "kubeletplugin"  # per node
    AUDITOR = "auditor"  # read-only: streams and buckets
    SIM = "sim"  # `gpudra sim`: changes simulated GPUs (local stacks and tests)
    DOMAINS = "domains"  # the ComputeDomain controller
    IMEX = "imex-daemon"  # per node: the IMEX daemon wrapper of one ComputeDomain


NODE_ROLES = frozenset({Role.DISCOVERY, Role.PREPARER, Role.FRONT, Role.IMEX})

#: Claim events each service may publish (the others' are refused by the server).
ALLOCATOR_EVENTS: tuple[ClaimEventName, ...] = (
    "allocated",
    "reserved",
    "released",
    "deleted",
    "pending",
)
PREPARER_EVENTS: tuple[ClaimEventName, ...] = (
    "prepare.requested",
    "prepared",
    "prepare.failed",
    "unprepare.requested",
    "unprepared",
    "unprepare.failed",
)

#: What no identity may ever do: lose the audit trail or a bucket.
NEVER = (
    f"{JS_API}.STREAM.DELETE.>",
    f"{JS_API}.STREAM.PURGE.>",
    f"{JS_API}.STREAM.MSG.DELETE.>",
)


class AccessError(ValueError):
    """An identity that cannot exist (a node role without a node, or the reverse)."""


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = NEVER


@dataclass(frozen=True)
class Identity:
    """One component instance: a role, and the node for the node-scoped roles."""

    role: Role
    node: str = ""

    def __post_init__(self) -> None:
        if (self.role in NODE_ROLES) != bool(self.node):
            need = "needs a node name" if self.role in NODE_ROLES else "takes no node name"
            raise AccessError(f"role {self.role.value!r} {need}, got node {self.node!r}")

    @property
    def name(self) -> str:
        """A subject-safe name: ``preparer.<node token>`` or ``allocator``."""
        if not self.node:
            return self.role.value
        return f"{self.role.value}.{subjects.escape_token(self.node)}"

    @property
    def inbox_prefix(self) -> str:
        """Where this identity's replies arrive; only it may subscribe there."""
        return f"_I.{self.name}"

    def permissions(self) -> Permissions:
        return _RULES[self.role](self)


@dataclass
class _Grant:
    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)  # streams it may have consumers on

    def kv_read(self, *buckets: str) -> _Grant:
        for bucket in buckets:
            self.stream_read(f"KV_{bucket}")
        return self

    def kv_write(self, bucket: str, keys: str) -> _Grant:
        self.publish.append(f"$KV.{bucket}.{keys}")
        return self

    def stream_read(self, stream: str, *, replays: bool = False) -> _Grant:
        """Info, direct and stored gets, flow control; consumers only under the
        identity's own names (:mod:`services.core.bus.slots`, added by
        :meth:`done`): a bounded few, whatever their kind. With ``replays`` (the
        auditor's ``CLAIMS``, where no service has a consumer): consumers of any name,
        durable ones too, pulled, acknowledged and deleted."""
        api = JS_API
        self.publish += [
            f"{api}.STREAM.INFO.{stream}",
            f"{api}.STREAM.MSG.GET.{stream}",
            f"{api}.DIRECT.GET.{stream}",
            f"{api}.DIRECT.GET.{stream}.>",
            f"$JS.FC.{stream}.>",
        ]
        if replays:
            self.publish += [
                f"{api}.CONSUMER.CREATE.{stream}",
                f"{api}.CONSUMER.CREATE.{stream}.>",
                f"{api}.CONSUMER.DURABLE.CREATE.{stream}.>",
                f"{api}.CONSUMER.INFO.{stream}.>",
                f"{api}.CONSUMER.DELETE.{stream}.>",
                f"{api}.CONSUMER.MSG.NEXT.{stream}.>",
                f"$JS.ACK.{stream}.>",
            ]
        self.read.append(stream)
        return self

    def answers(self, *requesters: Identity) -> _Grant:
        """Replies into these identities' inboxes, and nowhere else."""
        self.publish += [f"{who.inbox_prefix}.>" for who in requesters]
        return self

    def done(self, identity: Identity) -> Permissions:
        ops = ("CREATE", "INFO", "DELETE")
        own = [f"{JS_API}.CONSUMER.{op}.{stream}.{name}" for stream in self.read
               for op in ops for name in slots.consumer_names(identity.name)]  # fmt: skip
        publish = [f"{JS_API}.INFO", *self.publish, *own]
        subscribe = [f"{identity.inbox_prefix}.>", *self.subscribe]
        return Permissions(tuple(publish), tuple(subscribe))


def _events(node_token: str, names: Iterable[str]) -> list[str]:
    """Publishing ``names`` about any claim on one node, and reading a claim's last
    event (each event is numbered after it, see services.core.bus.claimtrail)."""
    numbering = f"{JS_API}.STREAM.MSG.GET.{subjects.CLAIMS_STREAM}"
    return [numbering, *(subjects.claim_event_publishers(node_token, n) for n in names)]


def _admin(who: Identity) -> Permissions:
    return Permissions(publish=(">",), subscribe=(">",))


def _allocator(who: Identity) -> Permissions:
    grant = _Grant().kv_read(subjects.CLAIMS_BUCKET).kv_write(subjects.CLAIMS_BUCKET, ">")
    grant.publish += _events("*", ALLOCATOR_EVENTS)
    # How full CLAIMS is and how far back it reaches (services/core/bus/usage.py): its
    # state, no message (those it may read already, one by one, to number its events).
    grant.publish.append(f"{JS_API}.STREAM.INFO.{subjects.CLAIMS_STREAM}")
    return grant.done(who)


def _publisher(who: Identity) -> Permissions:
    grant = _Grant().kv_read(
        subjects.INVENTORY_BUCKET,
        subjects.PRESENCE_BUCKET,
        subjects.PREPARED_BUCKET,
        subjects.PUBLISHERS_BUCKET,
    )
    grant.kv_write(subjects.PUBLISHERS_BUCKET, ">")  # replicas' shard leases
    return grant.done(who)


def _discovery(who: Identity) -> Permissions:
    node = subjects.escape_token(who.node)
    grant = _Grant().kv_read(subjects.INVENTORY_BUCKET, subjects.SIM_BUCKET)
    grant.kv_write(subjects.INVENTORY_BUCKET, subjects.inventory_key(who.node))
    grant.kv_write(subjects.SIM_BUCKET, node)  # its simulated GPUs (simulated fleets only)
    grant.publish += [subjects.inventory_changed(who.node), subjects.health(who.node)]
    grant.subscribe.append(subjects.sim_control(who.node))
    # simulated MIG changes, asked by `gpudra sim` and by its node's preparer
    grant.answers(Identity(Role.SIM), Identity(Role.PREPARER, who.node))
    return grant.done(who)


def _preparer(who: Identity) -> Permissions:
    node = subjects.escape_token(who.node)
    grant = _Grant().kv_read(
        subjects.CLAIMS_BUCKET,
        subjects.INVENTORY_BUCKET,
        subjects.PREPARED_BUCKET,
        subjects.DOMAINS_BUCKET,  # a ComputeDomain channel waits for its node's daemon
    )
    grant.kv_write(subjects.PREPARED_BUCKET, subjects.prepared_key(who.node))
    grant.publish += _events(node, PREPARER_EVENTS)
    grant.publish.append(subjects.sim_control(who.node))  # dynamic MIG on simulated GPUs
    grant.subscribe += _node_operations(who.node)
    grant.answers(Identity(Role.FRONT, who.node))
    return grant.done(who)


def _node_operations(node: str) -> list[str]:
    """One node's prepare and unprepare subjects, of both kubelet plugin drivers."""
    return [
        op(node, driver)
        for driver in (DRIVER_NAME, CD_DRIVER)
        for op in (subjects.node_prepare, subjects.node_unprepare)
    ]


def _front(who: Identity) -> Permissions:
    node = subjects.escape_token(who.node)
    grant = _Grant().kv_read(subjects.PRESENCE_BUCKET, subjects.INVENTORY_BUCKET)
    grant.kv_write(subjects.PRESENCE_BUCKET, f"{node}.>")
    grant.publish += _node_operations(who.node)
    grant.subscribe.append(subjects.health(who.node))
    return grant.done(who)


def _auditor(who: Identity) -> Permissions:
    """Reads only. It replays ``CLAIMS`` with consumers of its own choosing (only auditors
    have any there); elsewhere, as everyone, a few of its own names: a service's KV watch
    is never its to end."""
    grant = _Grant().stream_read(subjects.CLAIMS_STREAM, replays=True)
    for stream in (subjects.HEALTH_STREAM, subjects.INVENTORY_EVENTS_STREAM,
                   *(f"KV_{bucket}" for bucket in (subjects.CLAIMS_BUCKET,
                     subjects.INVENTORY_BUCKET, subjects.PRESENCE_BUCKET,
                     subjects.PREPARED_BUCKET))):  # fmt: skip
        grant.stream_read(stream)
    return grant.done(who)


def _domains(who: Identity) -> Permissions:
    """The ComputeDomain controller: reads members, writes indices (and removes a gone
    domain's keys), announces each domain's status."""
    grant = _Grant().kv_read(subjects.DOMAINS_BUCKET)
    grant.kv_write(subjects.DOMAINS_BUCKET, f"*.{subjects.INDEX}.*")
    grant.kv_write(subjects.DOMAINS_BUCKET, f"*.{subjects.MEMBER}.*")  # removal of a gone domain's
    grant.publish.append(subjects.domain_status_all())
    return grant.done(who)


def _imex(who: Identity) -> Permissions:
    """A node's IMEX daemon: its own member key in every domain; reads its peers."""
    grant = _Grant().kv_read(subjects.DOMAINS_BUCKET)
    grant.kv_write(
        subjects.DOMAINS_BUCKET, f"*.{subjects.MEMBER}.{subjects.escape_token(who.node)}"
    )
    return grant.done(who)


def _sim(who: Identity) -> Permissions:
    grant = _Grant().kv_read(subjects.SIM_BUCKET).kv_write(subjects.SIM_BUCKET, ">")
    grant.publish.append(f"{subjects.SIM_ROOT}.>")
    return grant.done(who)


_RULES = {
    Role.ADMIN: _admin,
    Role.ALLOCATOR: _allocator,
    Role.PUBLISHER: _publisher,
    Role.DISCOVERY: _discovery,
    Role.PREPARER: _preparer,
    Role.FRONT: _front,
    Role.AUDITOR: _auditor,
    Role.SIM: _sim,
    Role.DOMAINS: _domains,
    Role.IMEX: _imex,
}


def front_inbox(node: str) -> str:
    """The inbox prefix of ``node``'s front: the preparer answers no other requester."""
    return Identity(Role.FRONT, node).inbox_prefix + "."
