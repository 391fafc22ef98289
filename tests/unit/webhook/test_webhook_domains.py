"""gpudra webhook --compute-domains: channel and daemon claims only for a domain of their own.

The ComputeDomains are served by a fake API (a list, as the webhook asks for them); the
same attacks on a real API server with the chart's policy beside the webhook:
tests/e2e/deploy/test_chart_domain_claims.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.core.kube.client import ApiError, Body, Listing, RawEvent
from services.core.model import computedomain as cd
from services.core.model import featuregates as fg
from services.webhook import review
from services.webhook.domains import DomainCheck
from services.webhook.server import PATH, Webhook

NS, TENANT, OTHER = "gpudra", "tenant", "other-team"
MINE, THEIRS, MADE_UP = "uid-mine", "uid-theirs", "uid-made-up"
CONTROLLER = f"system:serviceaccount:{NS}:gpudra-domains"
API = "resource.nvidia.com/v1beta1"


class Api:
    """ComputeDomains ``mine`` in the tenant's namespace and ``theirs`` in another."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.lists: list[str] = []

    async def list(self, path: str, params: Mapping[str, str]) -> Listing:
        self.lists.append(path)
        if self.fail:
            raise ApiError(503, "the API server is away")
        items = [{"metadata": {"name": "cd", "namespace": ns, "uid": uid}}
                 for ns, uid in ((TENANT, MINE), (OTHER, THEIRS))]  # fmt: skip
        return Listing([msgspec.Raw(json.dumps(i).encode()) for i in items], "1")

    def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[RawEvent]:
        raise NotImplementedError

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> bytes:
        raise NotImplementedError

    async def create(self, path: str, body: Body) -> bytes:
        raise NotImplementedError

    async def replace(self, path: str, body: Body) -> bytes:
        raise NotImplementedError

    async def patch(self, path: str, body: dict[str, Any]) -> bytes:
        raise NotImplementedError

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        raise NotImplementedError

    async def close(self) -> None:
        pass


def config(kind: str, domain: str, requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": cd.CD_DRIVER, "parameters": {
        "apiVersion": API, "kind": kind, "domainID": domain}}}  # fmt: skip
    if requests is not None:
        entry["requests"] = requests
    return entry


def spec(device_class: str, configs: list[dict[str, Any]], version: str = "v1") -> dict[str, Any]:
    request: dict[str, Any] = {"name": "r"}
    if version == "v1beta1":
        request["deviceClassName"] = device_class
    else:
        request["exactly"] = {"deviceClassName": device_class}
    return {"devices": {"requests": [request], "config": configs}}


def request(
    namespace: str, body: dict[str, Any], *, template: bool = False, user: str = "someone",
    operation: str = "CREATE", version: str = "v1", old: dict[str, Any] | None = None,
) -> review.AdmissionRequest:  # fmt: skip
    kind = "ResourceClaimTemplate" if template else "ResourceClaim"
    obj = {"apiVersion": f"resource.k8s.io/{version}", "kind": kind,
           "metadata": {"name": "c", "namespace": namespace},
           "spec": {"spec": body} if template else body}  # fmt: skip
    old_obj = None if old is None else {**obj, "spec": {"spec": old} if template else old}
    raw = {"uid": "u", "kind": {"group": "resource.k8s.io", "version": version, "kind": kind},
           "operation": operation, "namespace": namespace, "name": "c",
           "userInfo": {"username": user, "groups": ["system:authenticated"]},
           "object": obj, "oldObject": old_obj}  # fmt: skip
    review_body = {"apiVersion": review.API_VERSION, "kind": review.KIND, "request": raw}
    return review.parse(json.dumps(review_body).encode())


def channel(domain: str) -> dict[str, Any]:
    return spec(cd.CHANNEL_CLASS, [config(cd.CHANNEL_CONFIG, domain)])


def daemon(domain: str) -> dict[str, Any]:
    return spec(cd.DAEMON_CLASS, [config(cd.DAEMON_CONFIG, domain)])


async def judge(req: review.AdmissionRequest, api: Api | None = None) -> tuple[bool, str, int]:
    verdict = await DomainCheck(api or Api(), NS, CONTROLLER).judge(req)
    return verdict.allowed, verdict.message, verdict.code


@pytest.mark.parametrize("template", [False, True])
async def test_a_channel_of_the_claims_own_domain_is_admitted(template: bool) -> None:
    assert await judge(request(TENANT, channel(MINE), template=template)) == (True, "", 200)


@pytest.mark.parametrize("template", [False, True])
async def test_a_channel_of_a_domain_that_does_not_exist_is_refused(template: bool) -> None:
    allowed, message, code = await judge(request(TENANT, channel(MADE_UP), template=template))
    kind = "ResourceClaimTemplate" if template else "ResourceClaim"
    assert (allowed, code) == (False, 422)
    assert message == (
        f"{kind} {TENANT}/c: config[0] (FromClaim) ComputeDomainChannelConfig.domainID: "
        f"no ComputeDomain with UID {MADE_UP} in namespace {TENANT} (request r)"
    )


async def test_a_channel_of_another_namespaces_domain_is_refused() -> None:
    allowed, message, code = await judge(request(TENANT, channel(THEIRS)))
    assert (allowed, code) == (False, 422)
    assert f"ComputeDomain {THEIRS} is in namespace {OTHER}, not {TENANT}" in message


@pytest.mark.parametrize("device_class", [cd.CHANNEL_CLASS, cd.DAEMON_CLASS])
@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_a_compute_domain_device_without_its_config_is_refused(
    device_class: str, version: str
) -> None:
    """No config: prepare's default config, with an empty domainID."""
    body = spec(device_class, [], version)
    allowed, message, code = await judge(request(NS, body, version=version))
    kind = cd.CHANNEL_CONFIG if device_class == cd.CHANNEL_CLASS else cd.DAEMON_CONFIG
    assert (allowed, code) == (False, 422)
    assert f"request r needs a {kind} naming its ComputeDomain: default config" in message


async def test_a_config_of_the_other_kind_or_for_another_request_does_not_cover_it() -> None:
    body = spec(cd.CHANNEL_CLASS, [config(cd.DAEMON_CONFIG, MINE)])
    allowed, message, _ = await judge(request(TENANT, body))
    assert not allowed and "cannot apply ComputeDomainDaemonConfig to request: r" in message
    body = spec(cd.CHANNEL_CLASS, [config(cd.CHANNEL_CONFIG, MINE, requests=["other"])])
    allowed, message, _ = await judge(request(TENANT, body))
    assert not allowed and "needs a ComputeDomainChannelConfig" in message
    # the last config that applies wins, as at prepare
    body = spec(cd.CHANNEL_CLASS, [config(cd.CHANNEL_CONFIG, MADE_UP),
                                   config(cd.CHANNEL_CONFIG, MINE, requests=["r"])])  # fmt: skip
    assert (await judge(request(TENANT, body)))[0]


async def test_a_subrequest_is_judged_by_its_own_name() -> None:
    body = {"devices": {"requests": [{"name": "r", "firstAvailable": [
        {"name": "gpu", "deviceClassName": "gpu.nvidia.com"},
        {"name": "ch", "deviceClassName": cd.CHANNEL_CLASS}]}],
        "config": [config(cd.CHANNEL_CONFIG, MADE_UP, requests=["r/ch"])]}}  # fmt: skip
    allowed, message, _ = await judge(request(TENANT, body))
    assert not allowed and f"no ComputeDomain with UID {MADE_UP}" in message
    assert "(request r/ch)" in message


async def test_a_daemon_is_claimed_only_in_the_drivers_namespace() -> None:
    allowed, message, code = await judge(request(TENANT, daemon(MINE)))
    assert (allowed, code) == (False, 403)
    assert f"claimed only in the driver's namespace {NS}" in message
    # the claim the resource claim controller makes from the controller's template
    assert (await judge(request(NS, daemon(MINE))))[0]
    allowed, message, _ = await judge(request(NS, daemon(MADE_UP)))
    assert not allowed and f"no ComputeDomain with UID {MADE_UP} (request r)" in message


async def test_daemon_templates_only_from_the_controller() -> None:
    admin = request(NS, daemon(MINE), template=True, user="kubernetes-admin")
    allowed, message, code = await judge(admin)
    assert (allowed, code) == (False, 403)
    assert f"only the ComputeDomain controller ({CONTROLLER})" in message
    assert message.endswith("not kubernetes-admin")
    assert (await judge(request(NS, daemon(MINE), template=True, user=CONTROLLER)))[0]


async def test_other_claims_and_unchanged_updates_ask_the_api_nothing() -> None:
    api = Api(fail=True)
    gpu = spec("gpu.nvidia.com", [])
    assert (await judge(request(TENANT, gpu), api))[0]
    same = request(TENANT, channel(MADE_UP), operation="UPDATE", old=channel(MADE_UP))
    assert (await judge(same, api))[0]
    assert (await judge(request(TENANT, channel(MINE), operation="DELETE"), api))[0]
    assert api.lists == []


async def test_a_lookup_that_fails_is_not_an_admission() -> None:
    with pytest.raises(ApiError):  # the server denies it (500) and says why
        await judge(request(TENANT, channel(MINE)), Api(fail=True))


async def _served(api: Api, req: review.AdmissionRequest) -> dict[str, Any]:
    """The answer of the webhook's HTTPS handler (without TLS) to ``req``."""
    hook = Webhook(fg.FeatureGates(), Path("tls.crt"), Path("tls.key"),
                   domains=DomainCheck(api, NS, CONTROLLER))  # fmt: skip
    body = msgspec.json.encode({"apiVersion": review.API_VERSION, "kind": review.KIND,
                                "request": msgspec.to_builtins(req)})  # fmt: skip
    async with TestClient(TestServer(hook.app())) as client:
        resp = await client.post(PATH, data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 200
        answer: dict[str, Any] = (await resp.json())["response"]
        return answer


async def test_the_server_answers_each_refusal_with_its_reason() -> None:
    answer = await _served(Api(), request(TENANT, channel(MADE_UP)))
    assert answer["allowed"] is False and answer["status"]["reason"] == "Invalid"
    assert f"no ComputeDomain with UID {MADE_UP}" in answer["status"]["message"]
    answer = await _served(Api(), request(TENANT, daemon(MINE)))
    assert answer["allowed"] is False and answer["status"]["reason"] == "Forbidden"
    assert (await _served(Api(), request(TENANT, channel(MINE))))["allowed"] is True


async def test_the_server_denies_a_claim_whose_domain_it_could_not_look_up() -> None:
    answer = await _served(Api(fail=True), request(TENANT, channel(MINE)))
    assert answer["allowed"] is False and answer["status"]["code"] == 500
    assert "could not judge the request" in answer["status"]["message"]
    assert "the API server is away" in answer["status"]["message"]
