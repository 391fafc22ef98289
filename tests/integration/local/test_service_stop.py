"""Every node service starts and stops by the one path (services/core/process/serve.py).

On SIGTERM a service closes what it opened, newest first, and exits 0 without a
traceback; one that cannot start says why in one line and exits non-zero, having
closed what it had opened. Real processes (`gpudra discovery|preparer|kubeletplugin`)
on a real nats-server; the cluster services are stopped the same way by every e2e
stack (tests/e2e/local/test_service_stop.py checks them one by one).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from services.core.bus.access import Role
from tests.helpers.jsonlogs import said
from tests.helpers.preparer import Node, Proc

pytestmark = pytest.mark.integration


async def until_running(proc: Proc, timeout: float = 30.0) -> None:
    """Until the process logs that it serves (serve's "running" line)."""
    deadline = time.monotonic() + timeout
    while not said(proc.output(), "running"):
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited before serving:\n{proc.output()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.name} not serving after {timeout}s:\n{proc.output()}")
        await asyncio.sleep(0.1)


def assert_stopped_cleanly(proc: Proc) -> None:
    code = proc.stop()
    out = proc.output()
    assert code == 0, (proc.name, out)
    assert "Traceback" not in out, out
    assert said(out, "stopping") and not said(out, "closing failed"), out


async def test_the_node_services_stop_on_sigterm_with_status_0(node: Node) -> None:
    discovery = await node.start_discovery()
    preparer = await node.start_preparer()
    front = node.start_front()
    for proc in (discovery, preparer, front):
        await until_running(proc)
    for proc in (front, preparer, discovery):  # as the node pod stops them
        assert_stopped_cleanly(proc)
    sockets = list(node.paths.registration_dir.glob("*.sock"))
    assert sockets == [], sockets  # the front took its registration socket away


async def test_a_front_told_to_stop_while_its_bus_is_down_exits_0(node: Node) -> None:
    """It tries the bus again and again; SIGTERM ends that wait, not SIGKILL later."""
    front = node.start_front("--nats-url", "tls://127.0.0.1:1")
    deadline = time.monotonic() + 30
    while not said(front.output(), "nats error"):
        assert front.alive() and time.monotonic() < deadline, front.output()
        await asyncio.sleep(0.1)
    assert front.stop(timeout=10) == 0, front.output()
    assert said(front.output(), "stopped while starting"), front.output()
    assert "Traceback" not in front.output()


async def test_discovery_without_nvml_says_why_and_closes_the_bus(node: Node) -> None:
    """No GPU and no --fleet: NVML cannot start, said in one line, exit 1."""
    proc = node._spawn(
        "discovery",
        ["discovery", "--node-name", node.name, *node.nats.client_argv(Role.DISCOVERY, node.name)],
    )
    code = proc.wait()
    out = proc.output()
    assert code == 1, out
    assert "gpudra discovery: NVML:" in out and "no GPU here?" in out, out
    assert "Traceback" not in out, out
