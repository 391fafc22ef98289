"""What a gpudra process logged: its JSON lines (services/core/telemetry/logs.py)."""

from __future__ import annotations

import json
from typing import Any


def messages(output: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``output`` (anything else the process printed is left out)."""
    found = []
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def said(output: str, message: str) -> bool:
    """Whether a log line's message is ``message``."""
    return any(m.get("msg") == message for m in messages(output))
