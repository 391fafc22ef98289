"""``gpudra imex-daemon`` against a real nats-server, each daemon a real process.

Two simulated daemons of one domain bind 127.0.0.2 and 127.0.0.3 (the same
ports, as two nodes would); the test gives indices as the controller would (as
the admin identity) and reads every result from the bus and the files the
daemons render. Readiness is earned: a daemon is Ready only once its stand-in
reaches every peer, and loses it when a peer dies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.model.schemas import DomainIndex, DomainMember
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect
from tests.helpers.imex import CLIQUE, Daemons, fake_imex

pytestmark = [pytest.mark.integration]
UID = "0b7f6a52-1111-4222-8333-444455556666"
BUCKET = subjects.DOMAINS_BUCKET
NODES = {"tray-a": "127.0.0.2", "tray-b": "127.0.0.3"}  # as tests/helpers/imex.py


@pytest.fixture
async def setup(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[tuple[Daemons, Bus]]:
    daemons = Daemons(nats_server, tmp_path, NODES)
    admin = await connect(nats_server)
    try:
        yield daemons, admin
    finally:
        daemons.kill_all()
        await admin.close()


async def member(bus: Bus, node: str, uid: str = UID) -> DomainMember | None:
    got = await bus.kv_get(BUCKET, subjects.domain_member_key(uid, node), DomainMember)
    return got[0] if got else None


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    async def loop() -> Any:
        while not (value := await check()):
            await asyncio.sleep(0.05)
        return value

    return await asyncio.wait_for(loop(), timeout)


async def status_is(bus: Bus, node: str, want: str) -> bool:
    found = await member(bus, node)
    return found is not None and found.status == want


async def give_indices(bus: Bus) -> None:
    """The controller's part: index 0 and 1, in the clique."""
    for index, node in enumerate(NODES):
        value = DomainIndex(domain_uid=UID, node=node, clique_id=CLIQUE, index=index)
        await bus.kv_put(BUCKET, subjects.domain_index_key(UID, node), value)


NAMES = "".join(f"compute-domain-daemon-{i:04d}\n" for i in range(18))
MARKER = "# Compute Domain Daemon mappings\n"
IP_ADDRESSES = {"FEATURE_GATES": "ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=false"}


async def test_ready_only_when_every_peer_answers(setup: tuple[Daemons, Bus]) -> None:
    """IMEXDaemonsWithDNSNames, the default: the node list is the 18 names, written once;
    the hosts file gives the clique's members theirs by index (the pod's other lines
    kept), and the stand-in resolves them as IMEX would."""
    daemons, bus = setup
    daemons.hosts("tray-a").write_text("127.0.0.1\tlocalhost\n10.0.0.7\ttray-a\n")
    imexd = daemons.start("tray-a", uid=UID)
    await until(lambda: member(bus, "tray-a"))
    config = (imexd / "imexd.cfg").read_text()
    assert "IMEX_CMD_BIND_INTERFACE_IP=127.0.0.2\n" in config
    assert f"IMEX_NODE_CONFIG_FILE={imexd / 'nodes.cfg'}\n" in config
    await asyncio.sleep(1.0)
    assert await status_is(bus, "tray-a", "NotReady")  # no index yet: not in its own list
    daemons.start("tray-b", uid=UID)
    await until(lambda: member(bus, "tray-b"))
    await give_indices(bus)
    await until(lambda: status_is(bus, "tray-a", "Ready"))
    await until(lambda: status_is(bus, "tray-b", "Ready"))
    assert (imexd / "nodes.cfg").read_text() == NAMES  # the same on every node, always
    mapped = "127.0.0.2\tcompute-domain-daemon-0000\n127.0.0.3\tcompute-domain-daemon-0001\n"
    assert daemons.hosts("tray-a").read_text() == (
        f"127.0.0.1\tlocalhost\n10.0.0.7\ttray-a\n{MARKER}{mapped}"
    )
    assert daemons.hosts("tray-b").read_text() == f"{MARKER}{mapped}"
    assert daemons.check("tray-a", UID).stdout == "READY\n"
    daemons.kill("tray-b")  # dies without leaving: its key stays, nothing answers
    await until(lambda: status_is(bus, "tray-a", "NotReady"))
    assert daemons.check("tray-a", UID).returncode == 1
    daemons.start("tray-b", uid=UID)  # comes back, same index
    await until(lambda: status_is(bus, "tray-a", "Ready"))
    daemons.stop("tray-b")  # SIGTERM: it leaves, its key goes
    await until(lambda: _absent(bus, "tray-b"))
    only_a = (
        f"127.0.0.1\tlocalhost\n10.0.0.7\ttray-a\n{MARKER}127.0.0.2\tcompute-domain-daemon-0000\n"
    )
    await until(lambda: _text_is(daemons.hosts("tray-a"), only_a))
    assert (imexd / "nodes.cfg").read_text() == NAMES


async def test_with_ip_addresses_imex_waits_for_num_nodes(setup: tuple[Daemons, Bus]) -> None:
    """IMEXDaemonsWithDNSNames=false: the node list is the clique's addresses in index
    order, and IMEX starts only once numNodes daemons have joined (as the reference)."""
    daemons, bus = setup
    env = {**IP_ADDRESSES, "COMPUTE_DOMAIN_NUM_NODES": "2"}
    imexd = daemons.start("tray-a", uid=UID, **env)
    waiting = "waiting for numNodes (2) IMEX daemons to join: 1 so far"
    await until(lambda: _reason_is(bus, "tray-a", waiting))
    assert daemons.check("tray-a", UID).returncode == 1  # no IMEX: nothing answers
    daemons.start("tray-b", uid=UID, **env)
    await until(lambda: member(bus, "tray-b"))
    await give_indices(bus)
    await until(lambda: status_is(bus, "tray-a", "Ready"))
    await until(lambda: status_is(bus, "tray-b", "Ready"))
    assert (imexd / "nodes.cfg").read_text() == "127.0.0.2\n127.0.0.3\n"  # index order
    assert not daemons.hosts("tray-a").exists()  # no names, no hosts file touched
    # Fewer than numNodes again: as the reference, IMEX keeps the list it has (and loses
    # its peer) until numNodes are back.
    daemons.stop("tray-b")
    await until(lambda: _absent(bus, "tray-b"))
    await until(lambda: status_is(bus, "tray-a", "NotReady"))
    assert (imexd / "nodes.cfg").read_text() == "127.0.0.2\n127.0.0.3\n"
    daemons.start("tray-b", uid=UID, **env)
    await until(lambda: status_is(bus, "tray-a", "Ready"))


@pytest.mark.parametrize("dns_names", [True, False], ids=["dns-names", "ip-addresses"])
async def test_a_new_peer_reaches_imex_by_sigusr1_or_by_a_restart(
    setup: tuple[Daemons, Bus], tmp_path: Path, dns_names: bool
) -> None:
    """The real binary's path (a stand-in nvidia-imex that notes what it gets): with DNS
    names a peer change is SIGUSR1 to the running IMEX (the reference's
    IMEXDaemonUpdateLoopWithDNSNames); with IP addresses it restarts IMEX
    (IMEXDaemonUpdateLoopWithIPs)."""
    daemons, bus = setup
    binary, ctl = fake_imex(tmp_path)
    real = ("--mode", "real", "--imex-binary", str(binary), "--imex-ctl", str(ctl))
    imexd = daemons.start("tray-a", uid=UID, extra=real, **({} if dns_names else IP_ADDRESSES))
    events = imexd / "imexd.cfg.events"
    await until(lambda: _text_is(events, "start\n"))
    await until(lambda: status_is(bus, "tray-a", "Ready"))
    peer = DomainMember(domain_uid=UID, node="tray-b", ip_address="127.0.0.3", clique_id=CLIQUE)
    await bus.kv_put(BUCKET, subjects.domain_member_key(UID, "tray-b"), peer)
    await give_indices(bus)
    if dns_names:
        await until(
            lambda: _has_line(daemons.hosts("tray-a"), "127.0.0.3\tcompute-domain-daemon-0001")
        )
        await until(lambda: _contains(events, "SIGUSR1\n"))
        assert events.read_text().count("start") == 1
    else:
        await until(lambda: _text_is(imexd / "nodes.cfg", "127.0.0.2\n127.0.0.3\n"))
        await until(lambda: _contains(events, "start\nstart\n"))
        assert "SIGUSR1" not in events.read_text()


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def _text_is(path: Path, text: str) -> bool:
    return await asyncio.to_thread(_read, path) == text


async def _contains(path: Path, text: str) -> bool:
    return text in await asyncio.to_thread(_read, path)


async def _has_line(path: Path, line: str) -> bool:
    return line in (await asyncio.to_thread(_read, path)).splitlines()


async def _reason_is(bus: Bus, node: str, reason: str) -> bool:
    found = await member(bus, node)
    return found is not None and (found.status, found.reason) == ("NotReady", reason)


async def _absent(bus: Bus, node: str) -> bool:
    return await member(bus, node) is None


async def test_a_node_outside_a_fabric_joins_ready_and_idles(setup: tuple[Daemons, Bus]) -> None:
    daemons, bus = setup
    daemons.start("plain", uid=UID, clique="")
    found = await until(lambda: member(bus, "plain"))
    assert (found.status, found.clique_id, found.ip_address) == ("Ready", "", "127.0.0.9")


@pytest.mark.parametrize("clique", [CLIQUE, ""], ids=["watched", "outside-a-fabric"])
async def test_a_deleted_or_rewritten_member_key_is_put_back_by_its_daemon(
    setup: tuple[Daemons, Bus], tmp_path: Path, clique: str
) -> None:
    """Only the admin identity (and the controller, for a deleted domain) may remove or
    rewrite a daemon's member key; the daemon puts its word back (seen by its watch of
    the members, or, outside a fabric, on its check timer), logged."""
    daemons, bus = setup
    daemons.start("tray-a", uid=UID, clique=clique)
    mine = await until(lambda: member(bus, "tray-a"))
    key = subjects.domain_member_key(UID, "tray-a")

    async def back() -> bool:
        found = await member(bus, "tray-a")
        return found is not None and (found.ip_address, found.pod) == (mine.ip_address, mine.pod)

    await bus.kv_delete(BUCKET, key)
    await until(back)
    forged = msgspec.structs.replace(mine, ip_address="6.6.6.6", updated_at=0.0)
    await bus.kv_put(BUCKET, key, forged)
    await until(back)
    log = (tmp_path / "tray-a.log").read_text()
    for why in ("deleted", "rewritten"):
        assert f"the member key was {why} by someone else; putting it back" in log


async def test_a_binary_that_cannot_start_marks_the_member_failed(
    setup: tuple[Daemons, Bus], nats_server: NatsServer, tmp_path: Path
) -> None:
    daemons, bus = setup
    (tmp_path / "real").mkdir()
    argv = [sys.executable, "-m", "services.cli", "imex-daemon", "run", "--mode", "real",
            "--imex-binary", str(tmp_path / "no-such-nvidia-imex"), "--imexd-dir",
            str(tmp_path / "real"), "--hosts-file", str(tmp_path / "real.hosts"),
            *nats_server.client_argv(Role.IMEX, "tray-a")]  # fmt: skip
    env = {**os.environ, "NODE_NAME": "tray-a", "POD_IP": "127.0.0.2",
           "COMPUTE_DOMAIN_UUID": UID, "CLIQUE_ID": CLIQUE}  # fmt: skip
    daemons.procs["tray-a"] = subprocess.Popen(  # noqa: ASYNC220 - started, not awaited
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    found = await until(lambda: _failed(bus, "tray-a"))
    assert "cannot start" in found.reason and "no-such-nvidia-imex" in found.reason


async def _failed(bus: Bus, node: str) -> DomainMember | None:
    found = await member(bus, node)
    return found if found is not None and found.status == "Failed" else None


def test_without_the_cdi_edits_it_refuses_to_start(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "services.cli", "imex-daemon", "run", "--imexd-dir",
            str(tmp_path)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "COMPUTE_DOMAIN_UUID"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "CDI container edits did not apply -- is CDI enabled" in proc.stderr


def test_without_its_imexd_mount_it_refuses_to_start_and_makes_none(tmp_path: Path) -> None:
    """The claim's unprepare removed the host folder: a daemon started late must not make
    it again (it would outlive the claim)."""
    gone = tmp_path / "domains" / UID
    argv = [sys.executable, "-m", "services.cli", "imex-daemon", "run", "--mode", "simulated",
            "--imexd-dir", str(gone)]  # fmt: skip
    env = {**os.environ, "NODE_NAME": "tray-a", "POD_IP": "127.0.0.2",
           "COMPUTE_DOMAIN_UUID": UID, "CLIQUE_ID": CLIQUE}  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert f"{gone}: no such folder (the daemon claim's CDI mount did not apply)" in proc.stderr
    assert not (tmp_path / "domains").exists()


async def test_a_daemon_may_write_only_its_own_member_key(nats_server: NatsServer) -> None:
    bus = await connect(nats_server, Role.IMEX, "tray-a")
    try:
        mine = DomainMember(domain_uid=UID, node="tray-a", ip_address="127.0.0.2", clique_id="")
        await bus.kv_put(BUCKET, subjects.domain_member_key(UID, "tray-a"), mine)
        forged = DomainMember(domain_uid=UID, node="tray-b", ip_address="6.6.6.6", clique_id="")
        with pytest.raises(Exception, match=r"(?i)permission|timeout"):
            await bus.kv_put(BUCKET, subjects.domain_member_key(UID, "tray-b"), forged)
        index = DomainIndex(domain_uid=UID, node="tray-a", clique_id="", index=0)
        with pytest.raises(Exception, match=r"(?i)permission|timeout"):
            await bus.kv_put(BUCKET, subjects.domain_index_key(UID, "tray-a"), index)
    finally:
        await bus.close()


async def test_imex_dies_with_its_wrapper(setup: tuple[Daemons, Bus]) -> None:
    """Even a wrapper killed outright (no chance to stop it) takes its IMEX along."""
    daemons, bus = setup
    daemons.start("tray-a", uid=UID)
    await until(lambda: member(bus, "tray-a"))
    wrapper = daemons.procs["tray-a"]
    children = await until(lambda: asyncio.to_thread(_children, wrapper.pid))
    os.kill(wrapper.pid, signal.SIGKILL)  # the wrapper only, not its group
    wrapper.wait(timeout=20)
    await until(lambda: asyncio.to_thread(_all_gone, children))


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of each child: a pid alone may be reused within seconds."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [int(p) for p in path.read_text().split()] if path.exists() else []
    return [(p, start) for p in pids if (start := _start_time(p))]


def _start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat; empty once the process is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return ""
    return "" if fields[0] == "Z" else fields[19]


def _all_gone(children: list[tuple[int, str]]) -> bool:
    return not any(_start_time(pid) == start for pid, start in children)
