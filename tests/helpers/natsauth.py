"""The bus as the chart runs it: nats-server with the chart's own accounts and auth
callout block (deploy/chart/gpudra/files/nats-auth.conf, the same bytes), TLS, and a
real ``gpudra nats-auth`` process answering its authorization requests.

Everything listens on 127.0.0.1 and is stopped by the PID we started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.core.bus.natsauth import AccessDir, Credentials
from services.local.natsserver import server_binary
from services.local.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CHART_AUTH_CONF = REPO / "deploy" / "chart" / "gpudra" / "files" / "nats-auth.conf"


def wait_for(check: object, timeout: float, what: str) -> None:
    """Poll ``check()`` until true (a condition, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@dataclass
class CalloutNats:
    """nats-server configured as in the chart: accounts AUTH and GPUDRA, auth callout."""

    root: Path
    issuer: str  # public keys, as the chart's ConfigMap gives them
    auth_user: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.access = AccessDir(self.root / "tls").ensure()
        self.log = self.root / "nats.log"

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.port}"

    def client(self, token_file: Path | None = None, creds: Path | None = None) -> Credentials:
        return Credentials(creds=creds, ca=self.access.ca, token_file=token_file)

    def start(self) -> None:
        shutil.copy(CHART_AUTH_CONF, self.root / "nats-auth.conf")
        conf = self.root / "nats.conf"
        conf.write_text(
            f"server_name: auth-e2e\nlisten: 127.0.0.1:{self.port}\n"
            f"jetstream {{ store_dir: {json.dumps(str(self.root / 'js'))} }}\n"
            f"tls {{ cert_file: {json.dumps(str(self.access.server_cert))}, "
            f"key_file: {json.dumps(str(self.access.server_key))}, timeout: 5 }}\n"
            "include ./nats-auth.conf\n"
        )
        env = {
            **os.environ,
            "GPUDRA_NATS_AUTH_ISSUER": self.issuer,
            "GPUDRA_NATS_AUTH_USER": self.auth_user,
        }
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [server_binary(), "-c", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        wait_for(lambda: "Server is ready" in self.log.read_text(), 20, "nats-server ready")

    def restart(self) -> None:
        self.stop()
        self.log.write_text("")
        self.start()

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None


@dataclass
class AuthService:
    """A real ``gpudra nats-auth`` process."""

    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "nats-auth", *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
            )

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpudra nats-auth exited: {self.log.read_text()[-2000:]}")
            return "answering authorization requests" in self.log.read_text()

        wait_for(ready, timeout, "gpudra nats-auth ready")

    def decisions(self) -> list[dict[str, object]]:
        """The service's allowed/refused log lines, decoded."""
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{") and "connection " in line:
                out.append(json.loads(line))
        return out

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
