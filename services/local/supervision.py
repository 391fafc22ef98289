"""Every process of a local stack watched and restarted, as a cluster's kubelet would.

:class:`Supervisor` looks at the processes a stack lists (:class:`Watched`) ten
times a second. One that exited although nobody stopped it is reported at once,
in one line: its name, PID, exit status or signal and the tail of its log. Then
it is started again by the stack's own recipe for it (same arguments, identity
and credentials, ports, store and log) after a back-off like the kubelet's
CrashLoopBackOff: 1 s before the first restart, doubling to 30 s at most, and back
to 1 s once the process has stayed up for a minute. A restart that fails is
reported and tried again after the next delay; what cannot be restarted at all
(``restart`` None) is reported once and left down.

:meth:`Supervisor.stop` ends the watch (a restart under way finishes first, so the
stack knows every PID it must stop): a stack stops its supervision before any
process, so nothing is restarted while it stops. Restarts are counted per
process (:attr:`Supervisor.restarts`) and written, with each process's PID and
state, to a status file (``supervision.json`` in the stack's work directory)
whenever something changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.local.component import Process

log = logging.getLogger(__name__)

#: How often the processes are looked at (seconds).
INTERVAL_S = 0.1
#: Lines of a dead process's log in its report, each cut to this many characters.
TAIL_LINES = 3
TAIL_WIDTH = 200


@dataclass(frozen=True)
class Backoff:
    """The delay before each restart: ``initial``, doubled after every restart up to
    ``cap``, back to ``initial`` once a process stayed up ``reset_after`` seconds."""

    initial: float = 1.0
    cap: float = 30.0
    reset_after: float = 60.0


@dataclass(frozen=True)
class Watched:
    """One process of the stack and how to start it again: ``restart`` returns the
    new process (None: it cannot be restarted)."""

    process: Process
    restart: Callable[[], Process] | None = None


@dataclass
class _State:
    pid: int
    started: float  # when the running PID was (re)started, as far as we know
    delay: float  # the wait before the next restart
    restarts: int = 0
    down: int | None = None  # the PID whose death was reported, not replaced yet
    due: float = 0.0  # when the next restart is due
    last_exit: str = ""
    failed: bool = False  # the latest restart raised: its process's death is known


def exit_text(returncode: int) -> str:
    """``exit status 1``, ``killed by SIGKILL``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def log_tail(path: Path, lines: int = TAIL_LINES, width: int = TAIL_WIDTH) -> str:
    """The last ``lines`` non-empty lines of ``path`` on one line, each cut to ``width``."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(line if len(line) <= width else line[: width - 3] + "..." for line in kept)


class Supervisor:
    """Watches what ``units()`` lists (asked again on every look, so processes started
    later count too) in a thread of its own; ``say`` gets each report line."""

    def __init__(
        self,
        units: Callable[[], Sequence[Watched]],
        *,
        say: Callable[[str], None] | None = None,
        backoff: Backoff | None = None,
        status_path: Path | None = None,
        interval: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.units = units
        self.clock = clock
        self.say = say or log.warning
        self.backoff = backoff or Backoff()
        self.status_path = status_path
        self.interval = interval
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()  # the states, between the watch and its readers
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------

    def start(self) -> Supervisor:
        self.check()  # every process known (and in the status file) before we return
        self._thread = threading.Thread(target=self._loop, name="stack-supervisor", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """End the watch; a restart under way finishes first. Nothing is restarted after."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # a bug here must not end the watch
                log.exception("stack supervision: a check failed")

    # ---- what it found -----------------------------------------------------------

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts per process, of those restarted at least once."""
        with self._lock:
            return {name: s.restarts for name, s in self._states.items() if s.restarts}

    def summary(self) -> str:
        """``none``, or ``3 (nats 1, preparer-gpu-node-h100 2)``."""
        restarts = self.restarts
        if not restarts:
            return "none"
        each = ", ".join(f"{name} {n}" for name, n in sorted(restarts.items()))
        return f"{sum(restarts.values())} ({each})"

    def status(self) -> dict[str, Any]:
        """What the status file holds: restarts in all, and per process its PID, state
        (``running``, ``restarting``, ``down``: not restartable), restarts and last exit."""
        processes = {}
        with self._lock:
            states = sorted(self._states.items())
        for name, s in states:
            state = "running" if s.down is None else "restarting"
            if s.down is not None and s.due == float("inf"):
                state = "down"
            processes[name] = {
                "pid": s.pid,
                "state": state,
                "restarts": s.restarts,
                "last_exit": s.last_exit,
            }
        return {"restarts": sum(s.restarts for s in self._states.values()), "processes": processes}

    # ---- one look ------------------------------------------------------------------

    def check(self) -> None:
        """Look at every process once: report new deaths, restart those that are due."""
        changed = False
        for unit in self.units():
            if self._stop.is_set():
                break
            with self._lock:
                changed = self._check(unit) or changed
        if changed:
            self._write_status()

    def _check(self, unit: Watched) -> bool:
        process, now = unit.process, self.clock()
        state = self._states.get(process.name)
        if state is None:
            state = _State(pid=process.pid, started=now, delay=self.backoff.initial)
            self._states[process.name] = state
            changed = True
        else:
            changed = False
        code = process.proc.poll()
        if code is None:
            if state.pid != process.pid or state.down is not None:  # started again by hand
                state.pid, state.started, state.down, state.failed = process.pid, now, None, False
                changed = True
            return changed
        if state.down != process.pid:
            state.down, state.last_exit = process.pid, exit_text(code)
            if state.failed:  # its restart's failure was reported with the reason
                state.failed = False
                return True
            if now - state.started >= self.backoff.reset_after:
                state.delay = self.backoff.initial
            died = f"{process.name} (pid {process.pid}) {state.last_exit}"
            tail = f"log {process.log_path}: {log_tail(process.log_path)}"
            if unit.restart is None:
                state.due = float("inf")
                self.say(f"{died}; it cannot be restarted; {tail}")
            else:
                state.due = now + state.delay
                self.say(f"{died}; restarting it in {state.delay:g}s; {tail}")
            changed = True
        if unit.restart is None or now < state.due:
            return changed
        try:
            new = unit.restart()
        except Exception as exc:
            state.delay = min(state.delay * 2, self.backoff.cap)
            state.due, state.failed = self.clock() + state.delay, True
            first = str(exc).strip().splitlines()[:1] or [type(exc).__name__]
            self.say(f"{process.name}: restart failed: {first[0]}; next try in {state.delay:g}s")
            return True
        state.restarts += 1
        state.pid, state.started, state.down, state.failed = new.pid, self.clock(), None, False
        state.delay = min(state.delay * 2, self.backoff.cap)
        total = sum(s.restarts for s in self._states.values())
        self.say(
            f"{process.name} restarted (pid {new.pid}; restart {state.restarts}, "
            f"{total} in all); the stack stays up"
        )
        return True

    def _write_status(self) -> None:
        if self.status_path is None:
            return
        tmp = self.status_path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.status(), indent=2) + "\n")
            tmp.replace(self.status_path)
