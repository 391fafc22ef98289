"""A process the local tools start, and waiting for one to answer.

Every control-plane component, real node process and gpudra service of a local
stack is one :class:`Process`: stopped by its PID, never by a name, so that
nothing else on the machine is touched. A :class:`Server` (Jaeger, Prometheus)
starts its own and is stopped the same way. :func:`wait_until` polls a readiness
check and gives up at once when a component is known to have exited.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self, TypeVar

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A component failed to start or a kubectl call failed."""


class ComponentExited(ControlPlaneError):
    """A component process ended while we waited for it."""


def wait_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
) -> T:
    """Call ``check`` until it returns something other than None/False."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
            if result is not None and result is not False:
                return result
        except ComponentExited:
            raise  # waiting longer cannot help
        except Exception as e:  # retried; the last one is reported on timeout
            last_error = e
        if time.monotonic() >= deadline:
            detail = f": {last_error}" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` of a log, for an error message ("" when there is none yet)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Process:
    """One component process that we started: ``args``, ``cwd`` and ``env`` (None:
    ours) are how it was started, so that :meth:`respawn` starts it again the same way."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    args: list[str] = field(default_factory=list)
    cwd: Path | None = None
    env: Mapping[str, str] | None = None
    log_offset: int = 0  # where this run's output begins in the log

    @classmethod
    def start(
        cls,
        name: str,
        args: list[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        """Start ``args``, its output appended to ``log_path`` after a ``+ command`` line."""
        proc, offset = _launch(args, log_path, cwd, env)
        return cls(name, proc, log_path, args, cwd, env, offset)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def respawn(self) -> None:
        """Start the same command again in place of the exited one (same arguments,
        working directory, environment and log, appended to); this handle then names
        the new process."""
        if self.running():
            raise ControlPlaneError(f"{self.name} is running (pid {self.pid})")
        if not self.args:
            raise ControlPlaneError(f"{self.name}: no command to start again")
        self.proc, self.log_offset = _launch(self.args, self.log_path, self.cwd, self.env)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; only this process, by PID."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def _launch(
    args: list[str], log_path: Path, cwd: Path | None, env: Mapping[str, str] | None
) -> tuple[subprocess.Popen[bytes], int]:
    """The process and where its output begins in the log (after the ``+`` line).

    Its own session: a terminal's Ctrl-C reaches only us, and we stop it by its PID."""
    with open(log_path, "ab") as log:
        log.write(f"+ {' '.join(args)}\n".encode())
        log.flush()
        offset = log.tell()
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    return proc, offset


class Server:
    """A tool's own server process (Jaeger, Prometheus): its subclass writes the config
    and says when it is ready; it is started and stopped here, by the PID we started,
    as a :class:`Process` is, so that a context manager never leaves one behind."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Self:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _launch(self, args: list[str], what: str, timeout: float) -> None:
        """Start ``args`` (output appended to the log) and wait for :meth:`_ready`;
        stopped again if it never is."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C goes to our owner, which stops us by PID
            )
        try:
            wait_until(self._ready, timeout, what, interval=0.1)
        except BaseException:
            self.stop()
            raise

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            Process(self.name, self.proc, self.log_path).stop(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
