"""Asking the API server whether a ServiceAccount token is genuine (TokenReview).

The auth service never checks a token's signature itself: the API server knows
its signing keys, whether the token's pod and ServiceAccount still exist (a
deleted pod's token is refused at once) and which audiences it was issued for.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from services.core.kube.client import ApiError, KubeApi

PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
NODE_NAME = "authentication.kubernetes.io/node-name"  # ServiceAccountTokenPodNodeInfo
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"


class _User(msgspec.Struct):
    username: str = ""
    extra: dict[str, list[str]] = msgspec.field(default_factory=dict)


class _Status(msgspec.Struct):
    authenticated: bool = False
    user: _User = msgspec.field(default_factory=_User)
    audiences: list[str] = msgspec.field(default_factory=list)
    error: str = ""


class _Review(msgspec.Struct):
    status: _Status = msgspec.field(default_factory=_Status)


class Review(msgspec.Struct, frozen=True):
    """The API server's verdict on one token, for one audience."""

    authenticated: bool
    username: str = ""
    audiences: tuple[str, ...] = ()
    node: str = ""  # the node of the pod the token is bound to
    pod: str = ""
    error: str = ""
    pod_uid: str = ""


class Reviewer(Protocol):
    async def review(self, token: str, audience: str) -> Review: ...


class TokenReviewer:
    """TokenReview through the API client (RBAC: create tokenreviews, nothing else)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def review(self, token: str, audience: str) -> Review:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        try:
            answer = msgspec.json.decode(await self.api.create(PATH, body), type=_Review)
        except ApiError as exc:
            return Review(False, error=f"TokenReview failed: HTTP {exc.status} {exc.reason}")
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return Review(False, error=f"TokenReview answer undecodable: {exc}")
        return _review(answer.status)


def _review(status: _Status) -> Review:
    extra = status.user.extra
    return Review(
        authenticated=status.authenticated,
        username=status.user.username,
        audiences=tuple(status.audiences),
        node=next(iter(extra.get(NODE_NAME, [])), ""),
        pod=next(iter(extra.get(POD_NAME, [])), ""),
        error=status.error,
        pod_uid=next(iter(extra.get(POD_UID, [])), ""),
    )
