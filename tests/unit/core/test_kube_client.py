"""The one Kubernetes client (services.core.kube.client) against a small in-process HTTP server.

Narrow wire checks only; the services' use of it is tested against the real
kube-apiserver in tests/integration and tests/e2e.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from services.core.kube.client import ApiError, HttpKubeApi, RawEvent
from services.core.kube.informer import WATCH_RESTARTS, watch_forever
from services.core.kube.kubeconfig import Endpoint

PATH = "/apis/resource.k8s.io/v1/resourceclaims"


@pytest.fixture
async def server() -> AsyncIterator[tuple[HttpKubeApi, list[dict[str, Any]]]]:
    """An API stand-in: a two-page list, a watch stream, Status errors; requests recorded."""
    seen: list[dict[str, Any]] = []
    big = "x" * 200_000  # one watch line far over aiohttp's 64 KiB readline limit

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        record = {"method": request.method, "path": request.path, "query": dict(request.query)}
        seen.append({**record, "body": json.loads(body) if body else None})
        if request.path == "/missing":
            status = {"kind": "Status", "code": 404, "reason": "NotFound", "message": "gone"}
            return web.json_response(status, status=404)
        if request.query.get("watch") == "true":
            resp = web.StreamResponse()
            await resp.prepare(request)
            meta = {"name": "a", "resourceVersion": "7"}
            added = {"type": "ADDED", "object": {"metadata": meta, "note": big}}
            data = (json.dumps(added) + "\n").encode()
            for i in range(0, len(data), 1000):  # arrives in many small chunks
                await resp.write(data[i : i + 1000])
            status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
            expired = {"type": "ERROR", "object": status}
            await resp.write((json.dumps(expired) + "\n").encode())
            return resp
        if request.query.get("continue") == "page2":
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": [{"n": 2}]})
        return web.json_response(
            {"metadata": {"resourceVersion": "4", "continue": "page2"}, "items": [{"n": 1}]}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = HttpKubeApi(Endpoint(f"http://127.0.0.1:{port}", False, {"Authorization": "Bearer t"}))
    try:
        yield api, seen
    finally:
        await api.close()
        await runner.cleanup()


async def test_list_follows_continue_tokens_and_keeps_the_last_version(server: Any) -> None:
    api, seen = server
    listing = await api.list(PATH, {"fieldSelector": "spec.driver=gpu.nvidia.com"})
    assert [json.loads(bytes(i)) for i in listing.items] == [{"n": 1}, {"n": 2}]
    assert listing.resource_version == "5"
    assert [r["query"].get("continue") for r in seen] == [None, "page2"]
    assert all(r["query"]["fieldSelector"] == "spec.driver=gpu.nvidia.com" for r in seen)


async def test_a_watch_reads_huge_lines_and_raises_the_servers_status(server: Any) -> None:
    api, seen = server
    events: list[RawEvent] = []
    with pytest.raises(ApiError) as caught:
        async for event in api.watch(PATH, {}, "3"):
            events.append(event)
    assert [e.type for e in events] == ["ADDED"]
    assert len(bytes(events[0].object)) > 200_000
    assert caught.value.gone and caught.value.reason == "Expired"
    query = seen[0]["query"]
    assert query["resourceVersion"] == "3" and query["allowWatchBookmarks"] == "true"


async def test_status_errors_carry_code_reason_and_message(server: Any) -> None:
    api, _ = server
    with pytest.raises(ApiError) as caught:
        await api.get("/missing")
    assert caught.value.not_found and caught.value.retryable
    assert str(caught.value) == "HTTP 404 NotFound: gone"


async def test_delete_sends_its_options(server: Any) -> None:
    api, seen = server
    await api.delete(f"{PATH}/x", {"preconditions": {"uid": "u1"}})
    assert seen[-1]["method"] == "DELETE" and seen[-1]["body"] == {"preconditions": {"uid": "u1"}}


async def test_watch_forever_resumes_relists_on_410_and_backs_off_on_errors() -> None:
    """The one loop: resume from the last version, relist on 410, pause after an error."""
    scripts: list[list[str | ApiError]] = [
        ["8", "9"],  # ended by the server: resume from 9
        [ApiError(410, "too old", "Expired")],  # relist, go on from its version
        [ApiError(500, "boom")],  # back off, then again from the same version
        [],
    ]
    asked: list[str] = []
    relists = 0

    async def watch(rv: str) -> AsyncIterator[str]:
        asked.append(rv)
        if not scripts:
            raise _Done
        for item in scripts.pop(0):
            if isinstance(item, ApiError):
                raise item
            yield item

    async def on_event(rv: str) -> str:
        return rv

    async def relist() -> str:
        nonlocal relists
        relists += 1
        return "20"

    expired = WATCH_RESTARTS.labels(resource="test", reason="expired")
    before = expired._value.get()
    with pytest.raises(_Done):
        await watch_forever("test", watch, "7", on_event, relist)
    assert asked == ["7", "9", "20", "20", "20"]
    assert relists == 1
    assert expired._value.get() == before + 1


class _Done(Exception):
    pass


def test_a_list_or_event_with_an_item_too_deep_to_decode_is_split_not_lost() -> None:
    """The envelope is split without recursion; only the deep item fails, on its own."""
    from services.core.kube import client as kube

    deep = b'{"metadata":{"name":"deep"},"x":' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}"
    body = (
        b'{"metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"ok"}},' + deep + b"]}"
    )
    page = kube._decode_page(body)
    assert page.metadata.resource_version == "9"
    assert [bytes(i)[:25] for i in page.items or []] == [b'{"metadata":{"name":"ok"}', deep[:25]]
    event = kube._decode_event(b'{"type":"MODIFIED","object":' + deep + b"}")
    assert event.type == "MODIFIED" and bytes(event.object) == deep
