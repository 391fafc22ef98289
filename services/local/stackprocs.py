"""The processes of a stack, by name: started, stopped on purpose, dead, waited on,
supervised.

Every process a :class:`~services.local.stack.Stack` starts is kept here under its
name (``preparer-<node>``, ``publisher``, ``kubelet-dra-<node>``, ...) and its PID
is written to ``processes.json`` in the work directory, so that whoever started the
stack can check that stopping it left nothing behind (:func:`recorded_pids`,
:func:`still_running`). A process that exits although nobody stopped it is
:meth:`StackProcesses.dead`, and a wait fails at once, with its log, when one dies.

:meth:`StackProcesses.watched` lists every process with the way to start it again
(nats-server on its port and store, Jaeger, the control plane's components, the
kubelets, every gpudra service with its own arguments and identity): under
:meth:`StackProcesses.supervise` (:mod:`services.local.supervision`) a death is
reported and the process restarted, and only what cannot be restarted is dead.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from services.local import REPO
from services.local.cluster import ControlPlane, KubeletDRA
from services.local.component import Process
from services.local.jaeger import Jaeger
from services.local.natsserver import NatsServer
from services.local.supervision import Backoff, Supervisor, Watched

#: The supervisor's status file in the work directory (services/local/supervision.py).
SUPERVISION_FILE = "supervision.json"


class StackError(RuntimeError):
    """A component did not start, or the stack is not in the state asked for."""


class StackProcesses:
    """The processes of the stack in ``workdir``: the control plane's, NATS's and
    Jaeger's, and those started by name (gpudra services, kubelets, node runners)."""

    def __init__(
        self,
        workdir: Path,
        cp: ControlPlane,
        nats: NatsServer,
        jaeger: Jaeger | None,
        startup_timeout: float,
    ) -> None:
        self.workdir = workdir
        self.logs_dir = workdir / "logs"
        self.cp = cp
        self.nats = nats
        self.jaeger = jaeger
        self.startup_timeout = startup_timeout
        self.service_env: dict[str, str] = {}
        self.processes: dict[str, Process] = {}
        self._argv: dict[str, list[str]] = {}
        self._started: list[str] = []  # what stop() undoes, in start order
        self._paused: set[str] = set()  # stopped on purpose, to be started again
        self._unrestartable: set[str] = set()  # whose death no restart can mend
        # Between the supervisor's thread and whoever starts or stops processes by hand.
        self._lock = threading.RLock()
        self.supervisor: Supervisor | None = None

    def start_service(
        self, name: str, *, env: Mapping[str, str] | None = None, ready: str = ""
    ) -> Process:
        """(Re)start a gpudra process by name (``preparer-<node>``, ``publisher``, ...);
        ``ready`` is a text its log shows once it serves."""
        with self._lock:
            old = self.processes.get(name)
            if old is not None and old.running():
                raise StackError(f"{name} is already running (pid {old.pid})")
            argv = self._argv[name]
            log_path = self.logs_dir / f"{name}.log"
            environ = {**os.environ, **self.service_env, **(env or {})}
            process = Process.start(name, argv, log_path, cwd=REPO, env=environ)
            self.processes[name] = process
            self._paused.discard(name)
            self._write_pids()
        if ready:
            self.wait_for(
                lambda: ready in _read_from(log_path, process.log_offset),  # this run's only
                f"{name} to log {ready}",
                process,
            )
        return process

    def stop_service(self, name: str, timeout: float = 15.0) -> int | None:
        """SIGTERM (SIGKILL after ``timeout``); the exit status."""
        with self._lock:  # first: a supervisor restarts no process stopped on purpose
            self._paused.add(name)
        return self.processes[name].stop(timeout)

    def expect_exit(self, name: str) -> None:
        """``name`` is about to exit on purpose (e.g. an injected crash): not a failure."""
        with self._lock:
            self._paused.add(name)

    def restart_service(
        self, name: str, *, env: Mapping[str, str] | None = None, ready: str = ""
    ) -> Process:
        self.stop_service(name)
        return self.start_service(name, env=env, ready=ready)

    def _write_pids(self) -> None:
        with self._lock:
            pids: dict[str, int] = {}
            if self.nats.proc is not None:
                pids["nats"] = self.nats.proc.pid
            if self.jaeger is not None and self.jaeger.proc is not None:
                pids["jaeger"] = self.jaeger.proc.pid
            pids.update({p.name: p.pid for p in self.cp.processes})
            pids.update({name: p.pid for name, p in self.processes.items()})
            path = self.workdir / "processes.json"
            tmp = path.with_suffix(".tmp")  # whoever reads it never sees half a file
            tmp.write_text(json.dumps(pids, indent=2) + "\n")
            tmp.replace(path)

    def all_processes(self) -> list[Process]:
        return [*self.cp.processes, *self.processes.values()]

    # ---- supervision -----------------------------------------------------------------

    def watched(self) -> list[Watched]:
        """Every process of the stack that should be running, and how to start it again:
        nats-server (same port, store and users: JetStream's state survives), Jaeger,
        the control plane's components and the kubelets (same command), every gpudra
        service (same arguments: identity, credentials, ports). Not those stopped on
        purpose; a real node's namespace holder cannot be restarted (its node's
        processes live in its namespace)."""
        with self._lock:
            units: list[Watched] = []
            if self.jaeger is not None and self.jaeger.proc is not None:
                jaeger = Process("jaeger", self.jaeger.proc, self.jaeger.log_path)
                units.append(Watched(jaeger, self._restart_jaeger))
            nats = self._nats_process()
            if nats is not None:
                units.append(Watched(nats, self._restart_nats))
            units += [Watched(p, functools.partial(self._respawn, p)) for p in self.cp.processes]
            kubelets = list(self.cp.kubelets.values())  # those stopped on purpose are gone
            for name, p in self.processes.items():
                if name in self._paused:
                    continue
                if isinstance(p, KubeletDRA) and not any(p is k for k in kubelets):
                    continue
                if name in self._unrestartable:
                    units.append(Watched(p))
                else:
                    units.append(Watched(p, functools.partial(self._respawn, p)))
            return units

    def _nats_process(self) -> Process | None:
        proc = self.nats.proc
        if proc is None:  # not started, or stopped on purpose
            return None
        return Process("nats", proc, self.nats.log_file or self.logs_dir / "nats.log")

    def _restart_nats(self) -> Process:
        with self._lock:
            try:
                self.nats.start()
            finally:
                self._write_pids()
            process = self._nats_process()
            assert process is not None
            return process

    def _restart_jaeger(self) -> Process:
        assert self.jaeger is not None
        with self._lock:
            try:
                self.jaeger.start()
            finally:
                self._write_pids()
            assert self.jaeger.proc is not None
            return Process("jaeger", self.jaeger.proc, self.jaeger.log_path)

    def _respawn(self, process: Process) -> Process:
        with self._lock:
            if process.running():  # started again meanwhile, by hand
                return process
            process.respawn()
            self._write_pids()
            return process

    def supervise(
        self, say: Callable[[str], None] | None = None, backoff: Backoff | None = None
    ) -> Supervisor:
        """Watch every process from now on: a death is reported (``say``, default the
        log) and the process restarted with ``backoff``; :meth:`stop_supervision`
        ends it (a stack's stop does that first)."""
        if self.supervisor is None or not self.supervisor.running:
            self.supervisor = Supervisor(
                self.watched,
                say=say,
                backoff=backoff,
                status_path=self.workdir / SUPERVISION_FILE,
            ).start()
        return self.supervisor

    def stop_supervision(self) -> None:
        """No restart from now on (a restart under way finishes first)."""
        if self.supervisor is not None:
            self.supervisor.stop()

    def dead(self) -> list[Process]:
        """Processes of the stack that exited although nobody stopped them (under
        supervision: those that cannot be restarted)."""
        supervised = self.supervisor is not None and self.supervisor.running
        return [
            w.process
            for w in self.watched()
            if not w.process.running() and not (supervised and w.restart is not None)
        ]

    def wait_for(
        self,
        check: Callable[[], Any],
        what: str,
        process: Process | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Poll ``check`` until it returns something true and return that; fail
        at once, with its log, if ``process`` (or any stack process) exits
        meanwhile. Errors raised by ``check`` are retried (the last one is
        reported on timeout). ``timeout`` defaults to the start-up timeout."""
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        last_error: Exception | None = None
        while True:
            watched = [process] if process is not None else self.dead()
            for p in watched:
                if not p.running():
                    raise StackError(
                        f"{p.name} exited with {p.proc.returncode} while waiting for {what}; "
                        f"log {p.log_path}:\n{p.log_tail()}"
                    )
            try:
                result = check()
                if result:
                    return result
            except Exception as exc:  # retried, like a false answer
                last_error = exc
            if time.monotonic() >= deadline:
                detail = f": {last_error}" if last_error else ""
                raise StackError(f"timed out waiting for {what}{detail}")
            time.sleep(0.1)


def _read_from(path: Path, offset: int) -> str:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")
    return ""


def recorded_pids(workdir: Path) -> dict[str, int]:
    """``processes.json`` of a stack's work directory: every process it started."""
    path = workdir / "processes.json"
    return {k: int(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def still_running(pids: Mapping[str, int], timeout: float = 5.0) -> dict[str, int]:
    """Those of ``pids`` that are still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    left = {n: p for n, p in pids.items() if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {n: p for n, p in left.items() if alive(p)}
    return left
