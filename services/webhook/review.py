"""AdmissionReview (admission.k8s.io/v1) in and out: strict about what it reads.

A malformed review is a :class:`ReviewError` naming what is wrong; the server
answers it with HTTP 400 and never guesses an answer for a review it cannot
read (so it never admits by accident). A review whose object is nested too deeply
to decode (the API server stores 4,000 levels, the decoders stop near 1,000) is
:class:`TooDeep`: its envelope is read with the deep values cut off, so that the
server can deny it by its uid, with the reason. The API server shows the user
only an AdmissionReview's message; an HTTP error reaches them as "the server
rejected our request for an unknown reason".
"""

from __future__ import annotations

from typing import Any

import msgspec

from services.core.kit.limits import cap_depth

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class ReviewError(ValueError):
    """A request body that is not an admission.k8s.io/v1 AdmissionReview with a request."""


class TooDeep(ReviewError):
    """A review whose object is nested too deeply to read; ``request`` is the rest of it."""

    def __init__(self, request: AdmissionRequest, body: bytes) -> None:
        super().__init__(f"AdmissionReview {request.uid}: object nested too deeply to read")
        self.request = request
        self.body = body


class GroupVersionKind(msgspec.Struct, frozen=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class UserInfo(msgspec.Struct, frozen=True):
    """Who sent the request (as the API server authenticated them)."""

    username: str = ""


class AdmissionRequest(msgspec.Struct, frozen=True, rename="camel"):
    uid: str
    kind: GroupVersionKind
    operation: str
    name: str = ""
    namespace: str = ""
    user_info: UserInfo = msgspec.field(default_factory=UserInfo)
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool = False


def parse(body: bytes) -> AdmissionRequest:
    """The request of an AdmissionReview, or :class:`ReviewError` saying what is wrong."""
    if not body:
        raise ReviewError("empty body; expected an admission.k8s.io/v1 AdmissionReview")
    try:
        review = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ReviewError(f"body is not JSON: {exc}") from exc
    except RecursionError:
        raise _too_deep(body) from None
    if not isinstance(review, dict):
        raise ReviewError(f"not an AdmissionReview: a JSON {type(review).__name__}, not an object")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if api_version != API_VERSION or kind != KIND:
        raise ReviewError(
            f"unsupported review {api_version or '<no apiVersion>'}/{kind or '<no kind>'}; "
            f"expected {API_VERSION}/{KIND}"
        )
    if review.get("request") is None:
        raise ReviewError("AdmissionReview has no request")
    try:
        request = msgspec.convert(review["request"], type=AdmissionRequest)
    except msgspec.ValidationError as exc:
        raise ReviewError(f"not an AdmissionReview request: {exc}") from exc
    if not request.uid:
        raise ReviewError("AdmissionReview request has an empty uid")
    return request


def _too_deep(body: bytes) -> ReviewError:
    """The review with its deep values cut to null (decoded without recursion): a
    :class:`TooDeep` to deny by its uid, or why there is no review to answer."""
    try:
        return TooDeep(parse(cap_depth(body)), body)
    except ReviewError as exc:
        return ReviewError(f"body nested too deeply to read, and no review around it: {exc}")


def response(uid: str, allowed: bool, message: str = "", code: int = 200) -> bytes:
    """The AdmissionReview answer; a denial carries ``message``, reason Invalid (422),
    Forbidden (403), InternalError (500) or BadRequest."""
    answer: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        answer["status"] = {
            "status": "Failure",
            "message": message,
            "reason": {422: "Invalid", 403: "Forbidden", 500: "InternalError"}.get(
                code, "BadRequest"
            ),
            "code": code,
        }
    return msgspec.json.encode({"apiVersion": API_VERSION, "kind": KIND, "response": answer})
