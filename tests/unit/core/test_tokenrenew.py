"""When a bus connection swaps its token.

The real server's expiry: tests/e2e/natsauth/test_nats_auth.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path

import pytest

from services.core.bus import tokenrenew
from services.core.bus.natsauth import Credentials


def _jwt(claims: dict[str, object]) -> str:
    def b64(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{b64({'alg': 'RS256'})}.{b64(claims)}.c2ln"


@pytest.mark.parametrize(
    "token",
    ["", "not-a-jwt", "a.b.c", _jwt({"iat": 1}), _jwt({"exp": True}), _jwt({"exp": "1700000000"})],
)
def test_a_token_without_a_readable_expiry_schedules_nothing(token: str) -> None:
    assert tokenrenew.expiry(token) is None


def test_expiry_and_when_to_renew() -> None:
    assert tokenrenew.expiry(_jwt({"iat": 100, "exp": 3700})) == (100.0, 3700.0)
    assert tokenrenew.renew_at(100, 3700) == 3640  # an hour's token: a minute before
    assert tokenrenew.renew_at(100, 120) == 116  # a short one: its last fifth


class Reconnecting:
    """Stands in for nats-py: a reconnect reads the token again, as the client does."""

    def __init__(self, source: tokenrenew.TokenSource) -> None:
        self.source = source
        self.reconnects = 0

    async def force_reconnect(self) -> None:
        self.reconnects += 1
        asyncio.get_running_loop().call_soon(self.source)


async def test_it_waits_for_the_rotated_token_then_reconnects_once(tmp_path: Path) -> None:
    now = int(time.time())
    file = tmp_path / "token"
    file.write_text(_jwt({"iat": now, "exp": now + 2}))
    source = tokenrenew.TokenSource(Credentials(token_file=file))
    source()  # the first connect
    nc = Reconnecting(source)
    task = asyncio.create_task(tokenrenew.renew(nc, source, "test"))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0)
        file.write_text(_jwt({"iat": now, "exp": now + 3600}))  # the kubelet rotates it
        while source.used != (now, now + 3600):
            await asyncio.sleep(0.05)
        assert nc.reconnects == 1
    finally:
        task.cancel()


async def test_a_file_the_kubelet_has_not_rotated_yet_is_read_again(tmp_path: Path) -> None:
    now = int(time.time())
    file = tmp_path / "token"
    file.write_text(_jwt({"iat": now - 10, "exp": now + 1}))
    source = tokenrenew.TokenSource(Credentials(token_file=file))
    source()
    nc = Reconnecting(source)
    task = asyncio.create_task(tokenrenew.renew(nc, source, "test"))  # type: ignore[arg-type]
    try:
        file.unlink()  # mid-rotation: missing, then the same token, then a fresh one
        await asyncio.sleep(1.2)
        file.write_text(_jwt({"iat": now - 10, "exp": now + 1}))
        await asyncio.sleep(0.3)
        assert nc.reconnects == 0
        file.write_text(_jwt({"iat": now, "exp": now + 3600}))
        while nc.reconnects == 0:
            await asyncio.sleep(0.05)
        assert not task.done()
    finally:
        task.cancel()


async def test_a_token_without_expiry_needs_no_renewal(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text(_jwt({"sub": "x"}))
    source = tokenrenew.TokenSource(Credentials(token_file=file))
    source()
    await asyncio.wait_for(tokenrenew.renew(Reconnecting(source), source, "t"), 5)  # type: ignore[arg-type]
