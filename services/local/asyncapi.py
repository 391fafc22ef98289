"""The bus as an AsyncAPI 3.0 document, generated from the subjects and msgspec schemas here.

docs/asyncapi.yaml is this module's output; tests/unit/local/test_asyncapi.py fails
when the two differ (regenerate with ``python -m services.local.asyncapi >
docs/asyncapi.yaml``) and has the official AsyncAPI parser (npm
``@asyncapi/parser``) validate it. Channel addresses come from the subject
functions in :mod:`services.core.bus.subjects` (called with placeholder names),
payloads from :func:`msgspec.json.schema_components` over the schemas in
:mod:`services.core.model.schemas`, so neither is written twice.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import yaml

from services.core.bus import subjects
from services.core.bus.claimtrail import SEQ_HEADER
from services.core.kube.resource import ResourceClaim
from services.core.model.computedomain import CD_DRIVER
from services.core.model.schemas import (
    SCHEMA_VERSION,
    ClaimEvent,
    HealthEvent,
    InventoryChanged,
    NodeInventory,
    NodePreparedDevices,
    NodeReply,
    NodeRequest,
    PluginPresence,
    SimMigReply,
    SimMigRequest,
)

CONTENT_TYPE = "application/msgpack"
_MARK = "PARAM"  # survives escape_token unchanged: letters only

PARAMETERS = {
    "node": "The node's name, escaped (services/core/bus/subjects.py: escape_token).",
    "namespace": "The claim's namespace, escaped.",
    "claim": "The claim's name, escaped.",
    "uid": "The claim's UID, escaped.",
    "driver": "The DRA driver's name, escaped.",
    "event": "One of the fixed claim event names (one or two tokens, e.g. prepare.requested).",
}


@dataclass(frozen=True)
class Channel:
    name: str
    address: Callable[..., str]
    params: tuple[str, ...]
    message: type[Any]
    description: str
    stream: str = ""  # the JetStream stream or bucket that stores it


CHANNELS = (
    Channel("claimEvent", subjects.claim_event, ("namespace", "claim", "uid", "node", "event"),
            ClaimEvent, "One step of a claim's life, numbered per claim (seq); the audit trail.",
            subjects.CLAIMS_STREAM),
    Channel("health", subjects.health, ("node",), HealthEvent,
            "A GPU's XID or loss, from the node's discovery.", subjects.HEALTH_STREAM),
    Channel("inventoryChanged", subjects.inventory_changed, ("node",), InventoryChanged,
            "The node's stored inventory changed.", subjects.INVENTORY_EVENTS_STREAM),
    Channel("nodePrepare", subjects.node_prepare, ("node",), NodeRequest,
            "The claims of one kubelet NodePrepareResources call (request/reply)."),
    Channel("nodeUnprepare", subjects.node_unprepare, ("node",), NodeRequest,
            "The claims of one kubelet NodeUnprepareResources call (request/reply)."),
    Channel("domainPrepare", lambda node: subjects.node_prepare(node, CD_DRIVER), ("node",),
            NodeRequest, "The compute-domain.nvidia.com driver's claims of one kubelet "
            "NodePrepareResources call (request/reply)."),
    Channel("domainUnprepare", lambda node: subjects.node_unprepare(node, CD_DRIVER), ("node",),
            NodeRequest, "The compute-domain.nvidia.com driver's claims of one kubelet "
            "NodeUnprepareResources call (request/reply)."),
    Channel("simControl", subjects.sim_control, ("node",), SimMigRequest,
            "A MIG change on a simulated GPU (request/reply)."),
    Channel("inventoryKey", lambda node: f"$KV.{subjects.INVENTORY_BUCKET}."
            f"{subjects.inventory_key(node)}", ("node",), NodeInventory,
            "KV inventory: what the node's NVML says.", subjects.INVENTORY_BUCKET),
    Channel("claimsKey", lambda node, uid: f"$KV.{subjects.CLAIMS_BUCKET}."
            f"{subjects.claim_key(node, uid)}", ("node", "uid"), ResourceClaim,
            "KV claims: the allocated ResourceClaim (resource.k8s.io/v1 shape).",
            subjects.CLAIMS_BUCKET),
    Channel("preparedKey", lambda node: f"$KV.{subjects.PREPARED_BUCKET}."
            f"{subjects.prepared_key(node)}", ("node",), NodePreparedDevices,
            "KV prepared: the devices the node's prepared claims hold.", subjects.PREPARED_BUCKET),
    Channel("presenceKey", lambda node, driver: f"$KV.{subjects.PRESENCE_BUCKET}."
            f"{subjects.presence_key(node, driver)}", ("node", "driver"), PluginPresence,
            "KV presence: the node's kubelet plugin is registered.", subjects.PRESENCE_BUCKET),
)  # fmt: skip

REPLIES = {"nodePrepare": NodeReply, "nodeUnprepare": NodeReply, "domainPrepare": NodeReply,
           "domainUnprepare": NodeReply, "simControl": SimMigReply}  # fmt: skip

#: Who sends and who receives each channel (the operations); see docs/bus.md.
OPERATIONS = (
    ("publishClaimEvent", "send", "claimEvent", "allocator and preparers publish claim events"),
    ("auditClaimEvents", "receive", "claimEvent", "gpudra audit replays the trail"),
    ("publishHealth", "send", "health", "discovery reports GPU health"),
    ("receiveHealth", "receive", "health", "the kubelet plugin front follows its node's health"),
    ("publishInventoryChanged", "send", "inventoryChanged", "discovery says the inventory changed"),
    ("requestPrepare", "send", "nodePrepare", "the front asks its node's preparer"),
    ("answerPrepare", "receive", "nodePrepare", "the node's preparer prepares and answers"),
    ("requestUnprepare", "send", "nodeUnprepare", "the front asks its node's preparer"),
    ("answerUnprepare", "receive", "nodeUnprepare", "the node's preparer undoes and answers"),
    ("requestDomainPrepare", "send", "domainPrepare", "the front (--compute-domains)"),
    ("answerDomainPrepare", "receive", "domainPrepare", "the preparer (--compute-domains)"),
    ("requestDomainUnprepare", "send", "domainUnprepare", "the front (--compute-domains)"),
    ("answerDomainUnprepare", "receive", "domainUnprepare", "the preparer (--compute-domains)"),
    ("requestSimControl", "send", "simControl", "gpudra sim or a simulated preparer"),
    ("answerSimControl", "receive", "simControl", "a simulated node's discovery"),
    ("writeInventory", "send", "inventoryKey", "discovery writes its node's inventory"),
    ("readInventory", "receive", "inventoryKey", "publisher, preparer and front follow it"),
    ("writeClaims", "send", "claimsKey", "the allocator's claim watcher"),
    ("readClaims", "receive", "claimsKey", "the node's preparer"),
    ("writePrepared", "send", "preparedKey", "the node's preparer"),
    ("readPrepared", "receive", "preparedKey", "the publisher"),
    ("writePresence", "send", "presenceKey", "the node's kubelet plugin front"),
    ("readPresence", "receive", "presenceKey", "the publisher"),
)

HEADERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "traceparent": {"type": "string", "description": "W3C trace context"},
        "tracestate": {"type": "string"},
    },
}
CLAIM_HEADERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        **HEADERS["properties"],
        "Nats-Msg-Id": {"type": "string", "description": "the stream stores one copy"},
        SEQ_HEADER: {"type": "string", "description": "the claim's event number (seq)"},
    },
}


def address(channel: Channel) -> str:
    placeholders = [f"{_MARK}{p}" for p in channel.params]
    text = channel.address(*placeholders)
    for param in channel.params:
        text = text.replace(f"{_MARK}{param}", "{" + param + "}")
    return text


def document() -> dict[str, Any]:
    kinds = {c.message for c in CHANNELS} | set(REPLIES.values())
    _, schemas = msgspec.json.schema_components(
        sorted(kinds, key=lambda k: k.__name__), ref_template="#/components/schemas/{name}"
    )
    messages = {k.__name__: _message(k) for k in sorted(kinds, key=lambda k: k.__name__)}
    channels = {c.name: _channel(c) for c in CHANNELS}
    for name, reply in REPLIES.items():
        channels[f"{name}Reply"] = {
            "address": None,  # the requester's inbox (_I.<identity>.<id>)
            "description": f"The answer to {name}, in the requester's inbox.",
            "messages": {reply.__name__: {"$ref": f"#/components/messages/{reply.__name__}"}},
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "gpudra bus",
            "version": str(SCHEMA_VERSION),
            "description": "NATS JetStream subjects, streams and buckets of gpudra "
            "(docs/bus.md). Generated by services/local/asyncapi.py; do not edit.",
        },
        "defaultContentType": CONTENT_TYPE,
        "servers": {
            "nats": {
                "host": "nats:4222",
                "protocol": "nats",
                "description": "TLS; one nkey or auth-callout identity per component "
                "(docs/security.md)",
            }
        },
        "channels": channels,
        "operations": {name: _operation(name, *rest) for name, *rest in OPERATIONS},
        "components": {"messages": messages, "schemas": schemas},
    }


def _channel(channel: Channel) -> dict[str, Any]:
    out: dict[str, Any] = {
        "address": address(channel),
        "description": channel.description,
        "messages": {
            channel.message.__name__: {"$ref": f"#/components/messages/{channel.message.__name__}"}
        },
        "parameters": {p: {"description": PARAMETERS[p]} for p in channel.params},
    }
    if channel.stream:
        out["x-gpudra-stored-in"] = channel.stream
    return out


def _operation(name: str, action: str, channel: str, summary: str) -> dict[str, Any]:
    kind = next(c.message for c in CHANNELS if c.name == channel)
    out: dict[str, Any] = {
        "action": action,
        "summary": summary,
        "channel": {"$ref": f"#/channels/{channel}"},
        "messages": [{"$ref": f"#/channels/{channel}/messages/{kind.__name__}"}],
    }
    if channel in REPLIES:
        reply = REPLIES[channel].__name__
        out["reply"] = {
            "channel": {"$ref": f"#/channels/{channel}Reply"},
            "messages": [{"$ref": f"#/channels/{channel}Reply/messages/{reply}"}],
        }
    return out


def _message(kind: type[Any]) -> dict[str, Any]:
    doc = (kind.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    return {
        "name": kind.__name__,
        "title": kind.__name__,
        "summary": doc or kind.__name__,
        "contentType": CONTENT_TYPE,
        "headers": CLAIM_HEADERS if kind is ClaimEvent else HEADERS,
        "payload": {"$ref": f"#/components/schemas/{kind.__name__}"},
    }


def render() -> str:
    header = "# Generated by services/local/asyncapi.py from services/core; do not edit.\n"
    return header + yaml.safe_dump(document(), sort_keys=False, width=100, allow_unicode=True)


if __name__ == "__main__":
    sys.stdout.write(render())
