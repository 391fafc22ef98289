"""``gpudra imex-daemon run``: render, join, run IMEX, keep the peers current, report.

The steps, as the reference's ``compute-domain-daemon run`` with the bus in place
of its clique objects: refuse to start without the CDI edits
(``COMPUTE_DOMAIN_UUID``); a node outside a fabric (empty ``CLIQUE_ID``) joins as
Ready and idles; otherwise write ``imexd.cfg``, join with its member key, keep the
peers current from the bus, run IMEX under a watchdog that restarts it, and set the
member's status from the readiness check. A binary that cannot start marks the
member Failed with why. On SIGTERM it stops IMEX and leaves (deletes its key).

How the peers reach IMEX is the gate IMEXDaemonsWithDNSNames's (FEATURE_GATES, as
the reference's daemon reads it):

- on (the default): ``nodes.cfg`` lists the DNS names of every index once
  (dnsnames.py), IMEX starts at once, and each change of the clique's members
  rewrites their addresses in the hosts file and sends IMEX SIGUSR1;
- off: ``nodes.cfg`` lists the clique's addresses in index order. As the
  reference, IMEX starts only once ``numNodes`` daemons of the domain have joined
  (``COMPUTE_DOMAIN_NUM_NODES``; the member says what it waits for meanwhile), and
  each change of the list then restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model import computedomain as cd
from services.core.model.schemas import DomainIndex, DomainMember
from services.imexdaemon import dnsnames, imexcfg
from services.imexdaemon.member import MemberKey
from services.imexdaemon.peers import Peers

log = logging.getLogger(__name__)
CDI_MISSING = "CDI container edits did not apply -- is CDI enabled in your container runtime?"
BUCKET = subjects.DOMAINS_BUCKET
PR_SET_PDEATHSIG = 1  # prctl(2)


class StartError(RuntimeError):
    """The daemon cannot run at all (missing environment)."""


@dataclass
class DaemonSettings:
    imexd_dir: Path
    node: str
    pod_ip: str
    domain_uid: str
    clique_id: str
    simulated: bool = True
    imex_binary: str = "nvidia-imex"
    imex_ctl: str = "nvidia-imex-ctl"
    server_port: int = imexcfg.SERVER_PORT
    cmd_port: int = imexcfg.CMD_PORT
    probe_s: float = 1.0
    restart_s: float = 1.0
    pod: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    dns_names: bool = True  # IMEXDaemonsWithDNSNames
    hosts_file: Path = Path("/etc/hosts")  # the pod's own; where the names get addresses
    max_nodes: int = cd.MAX_NODES_PER_IMEX_DOMAIN  # names in nodes.cfg (DNS names)
    num_nodes: int = 0  # the domain's spec.numNodes: IMEX waits for them (IP addresses)

    @classmethod
    def from_env(cls, imexd_dir: Path, env: dict[str, str], **options: object) -> DaemonSettings:
        uid = env.get("COMPUTE_DOMAIN_UUID", "")
        if not uid:
            raise StartError(CDI_MISSING)
        for name in ("NODE_NAME", "POD_IP"):
            if not env.get(name):
                raise StartError(f"{name} is not set (the DaemonSet's downward API sets it)")
        pod = f"{env.get('POD_NAMESPACE', '')}/{env.get('POD_NAME', '')}".strip("/")
        counts = {
            "max_nodes": _count(env, "MAX_NODES_PER_IMEX_DOMAIN", cd.MAX_NODES_PER_IMEX_DOMAIN, 1),
            "num_nodes": _count(env, "COMPUTE_DOMAIN_NUM_NODES", 0, 0),
        }
        return cls(imexd_dir=imexd_dir, node=env["NODE_NAME"], pod_ip=env["POD_IP"],
                   domain_uid=uid, clique_id=env.get("CLIQUE_ID", ""), pod=pod,
                   **counts, **options)  # type: ignore[arg-type]  # fmt: skip

    def check_folder(self) -> None:
        """``/imexd`` is the daemon claim's mount: made by the preparer, never by the daemon
        (one made here would outlive the claim, whose unprepare removes the host folder)."""
        if self.clique_id and not self.imexd_dir.is_dir():
            raise StartError(
                f"{self.imexd_dir}: no such folder (the daemon claim's CDI mount did not apply)"
            )

    @property
    def config_path(self) -> Path:
        return self.imexd_dir / imexcfg.CONFIG

    def imex_config(self) -> imexcfg.ImexConfig:
        return imexcfg.ImexConfig(
            bind_ip=self.pod_ip,
            nodes_file=self.imexd_dir / imexcfg.NODES,
            server_port=self.server_port,
            cmd_port=self.cmd_port,
        )

    def command(self) -> list[str]:
        if self.simulated:
            import sys

            # The stand-in resolves the names as IMEX's resolver would, from the hosts file.
            hosts = ["--hosts-file", str(self.hosts_file)] if self.dns_names else []
            return [sys.executable, "-m", "services.imexdaemon.standin",
                    "-c", str(self.config_path), *hosts]  # fmt: skip
        return [self.imex_binary, "-c", str(self.config_path)]


def _count(env: dict[str, str], name: str, default: int, least: int) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise StartError(f"{name}={raw!r}: not a number") from None
    if value < least:
        raise StartError(f"{name}={raw!r}: must be at least {least}")
    return value


class Daemon:
    def __init__(self, bus: Bus, settings: DaemonSettings) -> None:
        self.bus, self.settings = bus, settings
        member = DomainMember(
            domain_uid=settings.domain_uid, node=settings.node, ip_address=settings.pod_ip,
            clique_id=settings.clique_id, pod=settings.pod,
        )  # fmt: skip
        self.key = MemberKey(bus, member)
        self.peers = Peers(settings.domain_uid, settings.clique_id)
        self.proc: asyncio.subprocess.Process | None = None
        self.failure = ""  # why IMEX cannot run, when it cannot
        self.waiting = ""  # why IMEX is not started yet (IP addresses: numNodes not joined)
        self._may_start = asyncio.Event()
        self._restarting = False  # the watchdog's next exit is ours (a new node list)

    async def run(self) -> None:
        try:
            if not self.settings.clique_id:
                await self.key.set("Ready")  # no fabric: nothing to broker, as the reference
                await self.key.guard()  # no watch here: its word is checked on a timer
            imexcfg.write_atomic(self.settings.config_path, self.settings.imex_config().render())
            nodes = self.settings.imex_config().nodes_file
            if self.settings.dns_names:
                imexcfg.write_atomic(nodes, dnsnames.static_nodes(self.settings.max_nodes))
                dnsnames.update_hosts(self.settings.hosts_file, {})  # an earlier run's names go
                self._may_start.set()
            else:
                imexcfg.write_atomic(nodes, "")
                self._render_peers()  # numNodes 0 starts at once, with no peers yet
            await self.key.set("NotReady", "starting")
            async with asyncio.TaskGroup() as group:
                group.create_task(self._follow(DomainMember, subjects.MEMBER))
                group.create_task(self._follow(DomainIndex, subjects.INDEX))
                group.create_task(self._watchdog())
                group.create_task(self._readiness())
        finally:
            await self._stop_imex()
            with contextlib.suppress(Exception):
                await self.key.leave()

    async def _follow(self, kind: type[DomainMember] | type[DomainIndex], what: str) -> None:
        pattern = f"{subjects.escape_token(self.settings.domain_uid)}.{what}.*"
        async for update in self.bus.watch_kv(BUCKET, kind, pattern):
            parsed = subjects.parse_domain_key(update.key)
            if parsed is None:
                continue
            table = self.peers.members if what == subjects.MEMBER else self.peers.indices
            if update.value is None:
                table.pop(parsed[2], None)
            else:
                table[parsed[2]] = update.value  # type: ignore[assignment]
            self._render_peers()
            if what == subjects.MEMBER and parsed[2] == self.settings.node:
                await self.key.repair(update.value, update.revision)  # type: ignore[arg-type]

    def _render_peers(self) -> None:
        if self.settings.dns_names:
            names = dnsnames.mapping(self.peers.indexed(), self.settings.max_nodes)
            if dnsnames.update_hosts(self.settings.hosts_file, names):
                log.info("peers changed", extra={"names": names})
                # The real binary re-resolves and reconnects on SIGUSR1; the stand-in
                # reads the names per query.
                if not self.settings.simulated and self._imex_running():
                    assert self.proc is not None
                    self.proc.send_signal(signal.SIGUSR1)
            return
        joined = len(self.peers.members)  # the domain's members, every clique (its status)
        if joined < self.settings.num_nodes:
            # Before the first start the member says why IMEX is not there; once it runs,
            # a peer that leaves changes nothing until numNodes are back (as the reference).
            if not self._may_start.is_set():
                self.waiting = (
                    f"waiting for numNodes ({self.settings.num_nodes}) IMEX daemons to join: "
                    f"{joined} so far"
                )
            return
        self.waiting = ""
        changed = imexcfg.write_atomic(self.settings.imex_config().nodes_file, self.peers.render())
        if changed:
            log.info("peers changed", extra={"peers": self.peers.node_list()})
        if not self._may_start.is_set():
            self._may_start.set()
        elif changed and self._imex_running():
            assert self.proc is not None
            self._restarting = True  # as the reference: a new address list restarts IMEX
            self.proc.terminate()

    def _imex_running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def _watchdog(self) -> None:
        """Run IMEX once it may start; start it again when it exits (after ``restart_s``,
        at once when it was stopped for a new node list)."""
        await self._may_start.wait()
        while True:
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    *self.settings.command(),
                    env={**os.environ, **self.settings.extra_env},
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                self.failure = f"cannot start {self.settings.command()[0]}: {exc.strerror or exc}"
                await self.key.set("Failed", self.failure)
                await asyncio.sleep(self.settings.restart_s * 10)
                continue
            self.failure = ""
            code = await self.proc.wait()
            if self._restarting:
                self._restarting = False
                log.info("IMEX restarted for a new node list")
                continue
            log.warning("IMEX exited; restarting", extra={"code": code})
            self.failure = f"IMEX exited with code {code}"
            await asyncio.sleep(self.settings.restart_s)

    async def _readiness(self) -> None:
        while True:
            ok = await check(self.settings) if not (self.failure or self.waiting) else False
            if self.waiting:
                await self.key.set("NotReady", self.waiting)
            elif ok:
                await self.key.set("Ready")
            elif self.failure.startswith("cannot start"):
                pass  # the watchdog has said Failed
            else:
                await self.key.set("NotReady", self.failure or "IMEX not READY: peers missing")
            await asyncio.sleep(self.settings.probe_s)

    async def _stop_imex(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the wrapper dies, however it dies.

    In a pod the container's end takes IMEX with it; on a simulated node (a local
    process) nothing else would, and an orphaned IMEX would keep answering its peers.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


async def check(settings: DaemonSettings) -> bool:
    """The readiness probe: IMEX says exactly READY (an idle non-fabric daemon always is)."""
    if not settings.clique_id:
        return True
    if settings.simulated:
        from services.imexdaemon.standin import query

        try:
            return await query(imexcfg.read(settings.config_path)) == "READY\n"
        except (OSError, TimeoutError, imexcfg.ConfigError):
            return False
    proc = await asyncio.create_subprocess_exec(
        settings.imex_ctl, "-c", str(settings.config_path), "-q",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return out == b"READY\n"
