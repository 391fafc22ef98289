"""What a bus call fails with, and which of its failures the same call may outlive."""

from __future__ import annotations

from nats.errors import (
    ConnectionReconnectingError,
    NoRespondersError,
    OutboundBufferLimitError,
    StaleConnectionError,
    UnexpectedEOF,
)
from nats.js.errors import APIError, NoStreamResponseError, ServerError, ServiceUnavailableError


class RequestFailed(Exception):
    """A request got no answer: nobody listens, or the answer came too late."""


class RequestTimeout(RequestFailed, TimeoutError):
    """A responder exists but did not answer in time."""


class NotProvisioned(RuntimeError):
    """A stream or bucket is missing, and this identity may not create it."""


def unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the bus could not answer now, and the same call may succeed later.

    A stream without a leader (a server died and the cluster elects another, or
    quorum is lost) answers 503 or nobody answers; a connection that is being
    re-established to another server fails or times out what is sent meanwhile.
    Any other API error (4xx: too large, wrong sequence, no such stream) is the
    request's own fault and fails again the same way.
    """
    if isinstance(exc, ServiceUnavailableError | ServerError):
        return True
    if isinstance(exc, APIError):
        return False
    return isinstance(
        exc,
        TimeoutError  # nats' own TimeoutError is one
        | NoStreamResponseError
        | NoRespondersError
        | ConnectionReconnectingError
        | OutboundBufferLimitError
        | StaleConnectionError
        | UnexpectedEOF,
    )
