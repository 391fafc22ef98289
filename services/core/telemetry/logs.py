"""JSON logs, one object a line, carrying the current trace and span ids."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from opentelemetry import trace

from services.core.telemetry import tracing

_STD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_trace_ids(record))
        for key, value in record.__dict__.items():
            if key not in _STD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _trace_ids(record: logging.LogRecord) -> dict[str, str]:
    """The current span's ids; outside a span, a line about a claim (``uid``) gets the
    claim's trace id (services/core/telemetry/tracing.py), so every claim line leads to
    its trace."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}
    uid = getattr(record, "uid", None)
    if isinstance(uid, str) and uid:
        return {"trace_id": tracing.claim_trace_hex(uid)}
    return {}


def _not_tls_eof_noise(record: logging.LogRecord) -> bool:
    return "eof_received() has no effect when using ssl" not in record.getMessage()


def quiet_tls_eof_warnings() -> None:
    """asyncio warns on every TLS connection nats-py closes; it says nothing to an operator."""
    asyncio_log = logging.getLogger("asyncio")
    if _not_tls_eof_noise not in asyncio_log.filters:
        asyncio_log.addFilter(_not_tls_eof_noise)


def setup(service: str, level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("nats", "kubernetes_asyncio", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet_tls_eof_warnings()
