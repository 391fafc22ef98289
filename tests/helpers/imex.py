"""IMEX daemons as real processes (``gpudra imex-daemon run --mode simulated``) for tests.

Each simulated node binds its own loopback address, so several share the ports as
real nodes would. Each daemon runs in its own process group: killing the group
kills its IMEX stand-in too, as a container's death does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from services.core.bus.access import Role
from services.domains.model import ComputeDomain
from services.local.natsserver import NatsServer
from services.local.ports import free_port

CLIQUE = "c0ffee00-0000-4000-8000-000000000001.1"


class Daemons:
    def __init__(self, server: NatsServer, root: Path, addresses: dict[str, str]) -> None:
        self.server, self.root = server, root
        self.addresses = addresses
        self.port, self.cmd = free_port(), free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        node: str,
        *,
        uid: str,
        clique: str = CLIQUE,
        extra: Sequence[str] = ("--mode", "simulated"),
        **env: str,
    ) -> Path:
        """Start ``node``'s daemon (``extra``: more flags, the mode by default); ``env``:
        more of its environment (FEATURE_GATES, COMPUTE_DOMAIN_NUM_NODES, ...)."""
        imexd = self.root / node
        imexd.mkdir(exist_ok=True)  # the daemon claim's mount, as the preparer makes it
        argv = [sys.executable, "-m", "services.cli", "imex-daemon", "run", *extra,
                "--imexd-dir", str(imexd), "--server-port", str(self.port),
                "--cmd-port", str(self.cmd), "--probe-interval", "0.2",
                "--hosts-file", str(self.hosts(node)),
                *self.server.client_argv(Role.IMEX, node)]  # fmt: skip
        environ = {**os.environ, "NODE_NAME": node, "POD_IP": self.addresses.get(node, "127.0.0.9"),
                   "COMPUTE_DOMAIN_UUID": uid, "CLIQUE_ID": clique, **env}  # fmt: skip
        log = open(self.root / f"{node}.log", "ab")
        # Its own process group: killing it kills its IMEX too, as a container's death does.
        self.procs[node] = subprocess.Popen(
            argv, env=environ, stdout=log, stderr=log, start_new_session=True
        )
        return imexd

    def hosts(self, node: str) -> Path:
        """The node's pod's own hosts file (never this machine's /etc/hosts)."""
        return self.root / f"{node}.hosts"

    def stop(self, node: str) -> None:
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)

    def check(self, node: str, uid: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "services.cli", "imex-daemon", "check", "--mode",
                "simulated", "--imexd-dir", str(self.root / node),
                "--server-port", str(self.port), "--cmd-port", str(self.cmd)]  # fmt: skip
        env = {**os.environ, "NODE_NAME": node, "POD_IP": self.addresses[node],
               "COMPUTE_DOMAIN_UUID": uid, "CLIQUE_ID": CLIQUE}  # fmt: skip
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)

    def kill(self, node: str) -> None:
        """The daemon dies (with its IMEX) without leaving: its key stays."""
        proc = self.procs.pop(node)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)

    def kill_all(self) -> None:
        for node in list(self.procs):
            self.kill(node)


def a_domain(uid: str, name: str = "job", num_nodes: int = 2) -> ComputeDomain:
    """A ComputeDomain as the controller's informer decodes it."""
    channel = {"resourceClaimTemplate": {"name": f"{name}-channel"}}
    body = {
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"numNodes": num_nodes, "channel": channel},
    }
    return msgspec.convert(body, ComputeDomain)


FAKE_IMEX = """\
import signal, sys
events = sys.argv[sys.argv.index("-c") + 1] + ".events"


def note(what):
    with open(events, "a") as out:
        out.write(what + "\\n")


signal.signal(signal.SIGUSR1, lambda *_: note("SIGUSR1"))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
note("start")
while True:
    signal.pause()
"""


def fake_imex(root: Path) -> tuple[Path, Path]:
    """An ``nvidia-imex`` that notes each start and each SIGUSR1 in ``<config>.events``,
    and an ``nvidia-imex-ctl`` that always says READY: what the wrapper does to IMEX in
    real mode, without NVIDIA's binaries."""
    binary, ctl = root / "nvidia-imex", root / "nvidia-imex-ctl"
    binary.write_text(f"#!{sys.executable}\n{FAKE_IMEX}")
    ctl.write_text("#!/bin/sh\necho READY\n")
    for each in (binary, ctl):
        each.chmod(0o755)
    return binary, ctl
