"""The stack's supervisor on real processes: a death reported in one line and the
process started again the same way, with the kubelet's back-off; nothing after stop.

Time is the supervisor's clock, moved by the test (the back-off is checked to the
second without waiting for it); each look is one ``check()``, but for the test of
the watching thread itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.local.component import Process
from services.local.supervision import Backoff, Supervisor, Watched, exit_text, log_tail
from tests.helpers.waiting import until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Process]]:
    """Processes a test starts with :func:`spawn`; each stopped by its PID afterwards."""
    processes: list[Process] = []
    yield processes
    for p in processes:
        p.stop(timeout=5)


def spawn(started: list[Process], tmp_path: Path, name: str, script: str) -> Process:
    args = ["sh", "-c", script]
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            args, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    process = Process(name, proc, log_path, args, cwd=tmp_path)
    started.append(process)
    return process


def respawning(process: Process) -> Watched:
    def restart() -> Process:
        process.respawn()
        return process

    return Watched(process, restart)


def kill(process: Process) -> int:
    pid = process.pid
    os.kill(pid, signal.SIGKILL)
    process.proc.wait()  # dead (the supervisor reaps nothing itself)
    return pid


def test_exit_text_names_the_status_or_the_signal() -> None:
    assert exit_text(1) == "exit status 1"
    assert exit_text(0) == "exit status 0"
    assert exit_text(-9) == "killed by SIGKILL"
    assert exit_text(-15) == "killed by SIGTERM"


def test_log_tail_is_one_line_of_the_last_lines_each_cut(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("one\n\ntwo\nthree\n" + "x" * 300 + "\n")
    tail = log_tail(log, lines=3, width=20)
    assert tail == "two | three | " + "x" * 17 + "..."
    assert log_tail(tmp_path / "missing.log") == "(no log)"


async def test_a_killed_process_is_reported_at_once_and_restarted_the_same_way(
    tmp_path: Path, started: list[Process]
) -> None:
    """The watching thread itself: one line for the death (name, PID, signal, the log's
    tail), one for the restart; the same command, cwd and log; counted in the status."""
    process = spawn(started, tmp_path, "preparer-n1", "echo serving in $(pwd); exec sleep 60")
    lines: list[str] = []
    status = tmp_path / "supervision.json"
    supervisor = Supervisor(
        lambda: [respawning(process)],
        say=lines.append,
        backoff=Backoff(initial=0.05),
        status_path=status,
        interval=0.01,
    ).start()
    try:
        assert json.loads(status.read_text())["processes"]["preparer-n1"]["state"] == "running"
        await until(lambda: "serving" in process.log_path.read_text(), "the first run's line")
        old = kill(process)
        await until(lambda: supervisor.restarts == {"preparer-n1": 1}, "the restart")
    finally:
        supervisor.stop()
    assert process.running() and process.pid != old
    assert lines == [
        f"preparer-n1 (pid {old}) killed by SIGKILL; restarting it in 0.05s; "
        f"log {process.log_path}: serving in {tmp_path}",
        f"preparer-n1 restarted (pid {process.pid}; restart 1, 1 in all); the stack stays up",
    ]
    await until(
        lambda: process.log_path.read_text().count(f"serving in {tmp_path}") == 2, "the second run"
    )
    assert json.loads(status.read_text()) == {
        "restarts": 1,
        "processes": {
            "preparer-n1": {
                "pid": process.pid,
                "state": "running",
                "restarts": 1,
                "last_exit": "killed by SIGKILL",
            }
        },
    }
    assert supervisor.summary() == "1 (preparer-n1 1)"


def test_a_crash_loop_backs_off_1s_doubling_to_the_cap_and_resets_after_a_minute_up(
    tmp_path: Path, started: list[Process]
) -> None:
    """CrashLoopBackOff: each death waits 1, 2, 4 ... s (at most 30) before its restart;
    a process that stayed up a minute starts again after 1 s."""
    flag = tmp_path / "healthy"
    process = spawn(started, tmp_path, "allocator", f"test -f {flag} && exec sleep 60; exit 3")
    clock, lines = Clock(), list[str]()
    supervisor = Supervisor(lambda: [respawning(process)], say=lines.append, clock=clock)
    delays = []
    for _ in range(7):
        process.proc.wait()
        supervisor.check()  # the death: reported, restart due after the delay
        delays.append(float(lines[-1].split("restarting it in ")[1].split("s;")[0]))
        assert "exit status 3" in lines[-1]
        clock.now += delays[-1] - 0.01
        supervisor.check()
        assert not lines[-1].startswith("allocator restarted")  # not yet
        clock.now += 0.01
        if len(delays) == 7:
            flag.touch()  # this restart stays up
        supervisor.check()
        assert lines[-1].startswith(f"allocator restarted (pid {process.pid}; restart")
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert supervisor.restarts == {"allocator": 7}

    clock.now += 59  # up, but not long enough to be forgiven
    kill(process)
    supervisor.check()
    assert "restarting it in 30s" in lines[-1]
    clock.now += 30
    supervisor.check()
    clock.now += 60  # a minute up: the next death waits 1 s again
    kill(process)
    supervisor.check()
    assert "killed by SIGKILL; restarting it in 1s" in lines[-1]


def test_a_restart_that_fails_is_reported_and_tried_again_after_the_next_delay(
    tmp_path: Path, started: list[Process]
) -> None:
    process = spawn(started, tmp_path, "nats", "exec sleep 60")
    clock, lines = Clock(), list[str]()
    refusals = ["listen tcp 127.0.0.1:4222: bind: address already in use\nmore"]

    def restart() -> Process:
        if refusals:
            raise RuntimeError(refusals.pop())
        process.respawn()
        return process

    supervisor = Supervisor(lambda: [Watched(process, restart)], say=lines.append, clock=clock)
    supervisor.check()
    old = kill(process)
    supervisor.check()
    clock.now += 1
    supervisor.check()
    assert lines[1] == (
        "nats: restart failed: listen tcp 127.0.0.1:4222: bind: address already in use; "
        "next try in 2s"
    )
    supervisor.check()  # nothing new to say meanwhile
    assert len(lines) == 2
    clock.now += 2
    supervisor.check()
    assert (
        lines[2] == f"nats restarted (pid {process.pid}; restart 1, 1 in all); the stack stays up"
    )
    assert process.running() and process.pid != old


def test_what_cannot_be_restarted_is_reported_once_and_left_down(
    tmp_path: Path, started: list[Process]
) -> None:
    process = spawn(started, tmp_path, "nodehost-n1", "exec sleep 60")
    clock, lines = Clock(), list[str]()
    supervisor = Supervisor(lambda: [Watched(process)], say=lines.append, clock=clock)
    supervisor.check()
    pid = kill(process)
    for _ in range(3):
        supervisor.check()
        clock.now += 60
    assert len(lines) == 1
    assert lines[0].startswith(f"nodehost-n1 (pid {pid}) killed by SIGKILL; it cannot be restarted")
    assert supervisor.status()["processes"]["nodehost-n1"]["state"] == "down"
    assert supervisor.restarts == {}


def test_a_process_restarted_by_hand_is_taken_as_it_is(
    tmp_path: Path, started: list[Process]
) -> None:
    process = spawn(started, tmp_path, "publisher", "exec sleep 60")
    clock, lines = Clock(), list[str]()
    supervisor = Supervisor(lambda: [respawning(process)], say=lines.append, clock=clock)
    kill(process)
    supervisor.check()
    process.respawn()  # someone was quicker
    clock.now += 1
    supervisor.check()
    assert len(lines) == 1 and supervisor.restarts == {}
    assert supervisor.status()["processes"]["publisher"] == {
        "pid": process.pid,
        "state": "running",
        "restarts": 0,
        "last_exit": "killed by SIGKILL",
    }


def test_nothing_is_restarted_once_supervision_stopped(
    tmp_path: Path, started: list[Process]
) -> None:
    process = spawn(started, tmp_path, "discovery-n1", "exec sleep 60")
    lines: list[str] = []
    supervisor = Supervisor(lambda: [respawning(process)], say=lines.append, interval=0.01)
    supervisor.start()
    assert supervisor.running
    supervisor.stop()
    assert not supervisor.running
    kill(process)
    supervisor.check()  # a look after stop sees nothing to do
    assert lines == [] and not process.running()
    assert supervisor.summary() == "none"
