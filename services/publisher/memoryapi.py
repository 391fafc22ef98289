"""An in-memory :class:`SliceApi` that records every write: the benchmark's sink and a test double.

It keeps the API server's rules that the reconciler depends on: a new
resourceVersion on every write, 409 for a stale resourceVersion, an existing
name or a failed delete precondition, 404 for a missing object, 410 for a watch
older than the retained history, and objects returned as copies (stored
encoded, optionally compressed, so a big fleet costs little memory). Calls can
be made to fail on purpose with :meth:`MemorySliceApi.fail_next`; ``drops`` are
fields not stored (a gate off), ``refuses_lists`` refuses list-type attributes as
kube-apiserver does without DRAListTypeAttributes (422 naming the attribute).
"""

from __future__ import annotations

import asyncio
import time
import uuid
import zlib
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import msgspec

from services.core.kube.client import ApiError
from services.core.kube.resource import ResourceSlice
from services.publisher.sliceapi import EventType, SliceList, SliceNodes, WatchEvent


@dataclass(frozen=True)
class Write:
    """One recorded mutation."""

    op: str  # create | update | delete
    name: str
    node: str
    at: float  # time.monotonic()


@dataclass
class _Stored:
    data: bytes
    node: str
    uid: str
    resource_version: int


@dataclass
class MemorySliceApi:
    """A fake API server for ResourceSlices (one driver) and Nodes."""

    minor: int = 35
    compress: bool = False
    history_size: int = 256  # watch events kept for resuming watches (0: watches always 410)
    drops: frozenset[str] = frozenset()  # fields not stored, as with a feature gate off
    refuses_lists: bool = False  # 422 for list-type attributes (DRAListTypeAttributes off)
    nodes: dict[str, str] = field(default_factory=dict)  # name -> uid
    auto_nodes: bool = True  # any node name exists unless listed in missing_nodes
    missing_nodes: set[str] = field(default_factory=set)
    writes: list[Write] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    _objects: dict[str, _Stored] = field(default_factory=dict)
    _rv: int = 0
    _history: deque[tuple[int, EventType, bytes]] = field(default_factory=deque)
    _changed: asyncio.Condition | None = None
    _failures: list[tuple[str, ApiError]] = field(default_factory=list)
    _encoder: msgspec.msgpack.Encoder = field(default_factory=msgspec.msgpack.Encoder)

    # ---------------------------------------------------------------- test controls

    def fail_next(self, call: str, status: int, message: str = "injected") -> None:
        """Make the next ``call`` (e.g. "replace") raise ApiError(status)."""
        self._failures.append((call, ApiError(status, message)))

    def expire_history(self) -> None:
        """Forget watch history, as etcd compaction does: older watches get 410."""
        self._history.clear()

    def stored(self) -> list[ResourceSlice]:
        return [self._load(s) for s in self._objects.values()]

    def writes_for(self, node: str) -> list[Write]:
        return [w for w in self.writes if w.node == node]

    def count(self) -> int:
        return len(self._objects)

    def stored_bytes(self) -> int:
        return sum(len(s.data) for s in self._objects.values())

    async def mutate(self, name: str, change: str = "external") -> None:
        """Someone else edits a slice (adds an annotation): the publisher should notice."""
        stored = self._objects[name]
        obj = self._load(stored)
        obj.metadata.annotations = {**(obj.metadata.annotations or {}), "touched-by": change}
        await self._put(obj, stored.uid)

    async def remove(self, name: str) -> None:
        """Someone else deletes a slice (the kubelet does at start-up)."""
        stored = self._objects.pop(name)
        await self._emit("DELETED", self._load(stored))

    # ---------------------------------------------------------------- SliceApi

    async def server_minor(self) -> int:
        self._count("server_minor")
        return self.minor

    async def node_uid(self, node: str) -> str | None:
        self._count("node_uid")
        if node in self.missing_nodes:
            return None
        if node not in self.nodes and self.auto_nodes:
            self.nodes[node] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"node/{node}"))
        return self.nodes.get(node)

    async def node_uids(self) -> dict[str, str]:
        self._count("list_nodes")
        return {n: uid for n, uid in self.nodes.items() if n not in self.missing_nodes}

    async def list_slices(self, node: str | None = None) -> SliceList:
        self._count("list")
        items = [self._load(s) for s in self._objects.values() if node in (None, s.node)]
        return SliceList(items, str(self._rv))

    async def slice_nodes(self) -> SliceNodes:
        self._count("list")
        nodes = {s.node for s in self._objects.values() if s.node}
        return SliceNodes(nodes, str(self._rv))

    async def create(self, obj: ResourceSlice) -> ResourceSlice:
        self._count("create")
        name = obj.metadata.name
        if name in self._objects:
            raise ApiError(409, f'resourceslices "{name}" already exists', reason="AlreadyExists")
        return await self._put(obj, str(uuid.uuid4()), record="create")

    async def replace(self, obj: ResourceSlice) -> ResourceSlice:
        self._count("replace")
        name = obj.metadata.name
        stored = self._objects.get(name)
        if stored is None:
            raise ApiError(404, f'resourceslices "{name}" not found', reason="NotFound")
        if obj.metadata.resource_version != str(stored.resource_version):
            raise ApiError(409, "the object has been modified", reason="Conflict")
        return await self._put(obj, stored.uid, record="update")

    async def delete(self, name: str, *, uid: str | None, resource_version: str | None) -> None:
        self._count("delete")
        stored = self._objects.get(name)
        if stored is None:
            raise ApiError(404, f'resourceslices "{name}" not found', reason="NotFound")
        if (uid and uid != stored.uid) or (
            resource_version and resource_version != str(stored.resource_version)
        ):
            raise ApiError(409, "precondition failed", reason="Conflict")
        del self._objects[name]
        self.writes.append(Write("delete", name, stored.node, time.monotonic()))
        await self._emit("DELETED", self._load(stored))

    async def watch(self, resource_version: str) -> AsyncGenerator[WatchEvent, None]:
        async for kind, obj in self.watch_objects(resource_version):
            meta = obj.metadata
            yield WatchEvent(kind, meta.name, obj.spec.node_name or "", meta.resource_version or "")

    async def watch_objects(
        self, resource_version: str
    ) -> AsyncGenerator[tuple[EventType, ResourceSlice], None]:
        """The watch with whole objects (what an HTTP front such as a test server sends)."""
        self._count("watch")
        since = int(resource_version or 0)
        changed = self._condition()
        while True:
            if since < self._rv and (not self._history or self._history[0][0] > since + 1):
                raise ApiError(410, "too old resource version", reason="Expired")
            for rv, kind, data in list(self._history):
                if rv > since:
                    since = rv
                    yield kind, self._decode(data)
            async with changed:
                if not any(rv > since for rv, _, _ in self._history):
                    await changed.wait()

    # ---------------------------------------------------------------- internals

    def _count(self, call: str) -> None:
        self.calls[call] = self.calls.get(call, 0) + 1
        for i, (name, error) in enumerate(self._failures):
            if name == call:
                del self._failures[i]
                raise error

    def __post_init__(self) -> None:
        self._history = deque(maxlen=self.history_size)

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _put(self, obj: ResourceSlice, uid: str, record: str = "") -> ResourceSlice:
        if self.refuses_lists:
            self._refuse_lists(obj)
        if self.drops:
            from services.publisher.droppedfields import without

            obj = without(obj, self.drops)
        self._rv += 1
        meta = msgspec.structs.replace(
            obj.metadata, uid=uid, resource_version=str(self._rv), generation=None
        )
        stored_obj = msgspec.structs.replace(obj, metadata=meta)
        node = obj.spec.node_name or ""
        data = self._encoder.encode(stored_obj)
        self._objects[meta.name] = _Stored(
            zlib.compress(data, 1) if self.compress else data, node, uid, self._rv
        )
        if record:
            self.writes.append(Write(record, meta.name, node, time.monotonic()))
        await self._emit("ADDED" if record == "create" else "MODIFIED", stored_obj, data)
        return self._decode(data)

    @staticmethod
    def _refuse_lists(obj: ResourceSlice) -> None:
        """What kube-apiserver answers when it drops the lists and validates what is left."""
        for i, device in enumerate(obj.spec.devices or []):
            for name, attr in (device.attributes or {}).items():
                if attr.is_list:
                    raise ApiError(
                        422,
                        f'ResourceSlice.resource.k8s.io "{obj.metadata.name}" is invalid: '
                        f'spec.devices[{i}].attributes[{name}]: Invalid value: "": '
                        "exactly one value must be specified",
                        reason="Invalid",
                    )

    async def _emit(self, kind: EventType, obj: ResourceSlice, data: bytes | None = None) -> None:
        if kind == "DELETED":  # the event carries the deletion's resourceVersion
            self._rv += 1
            meta = msgspec.structs.replace(obj.metadata, resource_version=str(self._rv))
            obj, data = msgspec.structs.replace(obj, metadata=meta), None
        if not self.history_size:
            return
        self._history.append((self._rv, kind, data or self._encoder.encode(obj)))
        changed = self._condition()
        async with changed:
            changed.notify_all()

    def _load(self, stored: _Stored) -> ResourceSlice:
        return self._decode(zlib.decompress(stored.data) if self.compress else stored.data)

    @staticmethod
    def _decode(data: bytes) -> ResourceSlice:
        return msgspec.msgpack.decode(data, type=ResourceSlice)
