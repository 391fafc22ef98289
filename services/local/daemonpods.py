"""IMEX daemon pods on simulated nodes, run as local processes.

A simulated node has no container runtime: kubelet-dra prepares a pod's claims,
records their CDI device ids in the pod annotation ``gpudra.dev/cdi-devices`` and
reports the pod Running. For the pods of a ComputeDomain's daemon DaemonSet (label
``resource.nvidia.com/computeDomain``) that is not enough: their IMEX daemon must
really run, or no channel claim of the domain ever becomes ready. So the node's
runner does what the container runtime would: it reads the daemon claim's CDI spec
from the node's CDI folder (the environment, the ``/imexd`` mount's host folder) and
runs the container's own command, ``gpudra imex-daemon run``, as a local process
with the pod's environment (``NODE_NAME``, ``POD_IP`` = the node's own 127.0.0.x,
``POD_NAME``, ...) and the node's ``imex-daemon`` bus identity, in simulated mode.
The process is stopped (SIGTERM, by PID: the daemon leaves the domain) when its pod
goes, stops running, or is replaced; one that dies is started again, as the
container's restart policy would. ``crash`` kills a node's daemon outright (its key
stays, its peers lose it) and keeps it down until ``recover``, so a test can watch
the domain fall NotReady before the restart brings it back.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.core.model import computedomain as cd
from services.preparer.computedomain.edits import IMEXD_IN_CONTAINER, VENDOR
from services.preparer.computedomain.engine import spec_path

log = logging.getLogger(__name__)

CDI_ANNOTATION = "gpudra.dev/cdi-devices"  # set by kubelet-dra (controlplane/kubelet_dra.go)
POLL_S = 0.5
STOP_GRACE_S = 10.0

#: GET a path from the API server as JSON (None for 404), with query parameters.
ApiGet = Callable[..., Any]
#: The bus flags of a node's IMEX daemon identity.
BusArgv = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class DaemonNode:
    """A simulated node whose daemon pods are run here."""

    name: str
    cdi_root: Path
    address: str  # the pod IP its daemons bind (a 127.0.0.x of its own)


@dataclass(frozen=True)
class PodLaunch:
    """What the container runtime would give the daemon container."""

    key: str  # namespace/name/uid
    node: str
    env: dict[str, str]
    imexd_dir: Path


class LaunchError(ValueError):
    """A Running daemon pod whose claim's CDI spec is not (yet) readable."""


def launch_of(pod: Mapping[str, Any], node: DaemonNode) -> PodLaunch:
    """The daemon container's environment and ``/imexd`` host folder, from its pod and the
    CDI spec its claim's id names (LaunchError when something is missing)."""
    meta, spec = pod["metadata"], pod["spec"]
    try:
        devices: dict[str, list[str]] = json.loads(meta.get("annotations", {})[CDI_ANNOTATION])
    except (KeyError, ValueError) as exc:
        raise LaunchError(f"no {CDI_ANNOTATION} annotation yet") from exc
    ids = [i for container in devices.values() for i in container if i.startswith(f"{VENDOR}/")]
    if not ids:
        raise LaunchError("no compute-domain CDI device among the pod's")
    env: dict[str, str] = {}
    for container in spec.get("containers", []):
        if container.get("name") == cd.DAEMON_CONTAINER:
            env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    env.update(
        NODE_NAME=node.name,
        POD_IP=node.address,
        POD_NAME=meta["name"],
        POD_NAMESPACE=meta["namespace"],
        POD_UID=meta["uid"],
    )
    imexd: Path | None = None
    for device_id in ids:
        edits = _container_edits(node.cdi_root, device_id)
        env.update(e.split("=", 1) for e in edits.get("env", []) if "=" in e)
        for mount in edits.get("mounts", []):
            if mount.get("containerPath") == IMEXD_IN_CONTAINER:
                imexd = Path(mount["hostPath"])
    if imexd is None:
        raise LaunchError(f"the claim's CDI spec mounts nothing at {IMEXD_IN_CONTAINER}")
    if not imexd.is_dir():  # unprepared meanwhile: a container would not start either
        raise LaunchError(f"{imexd}: the claim's folder is gone")
    key = f"{meta['namespace']}/{meta['name']}/{meta['uid']}"
    return PodLaunch(key=key, node=node.name, env=env, imexd_dir=imexd)


def _container_edits(cdi_root: Path, device_id: str) -> dict[str, Any]:
    """``k8s.compute-domain.nvidia.com/claim=<uid>-daemon-0``: its device's containerEdits."""
    name = device_id.partition("=")[2]
    path = spec_path(cdi_root, name.rsplit("-", 2)[0])
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{path}: {exc}") from exc
    for device in spec.get("devices", []):
        if device.get("name") == name:
            return dict(device.get("containerEdits", {}))
    raise LaunchError(f"{path} has no device {name!r}")


class DaemonPods:
    """Keeps one local ``gpudra imex-daemon run`` per Running daemon pod on ``nodes``."""

    def __init__(
        self,
        api_get: ApiGet,
        nodes: Sequence[DaemonNode],
        bus_argv: BusArgv,
        logs_dir: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.api_get = api_get
        self.nodes = {n.name: n for n in nodes}
        self.bus_argv = bus_argv
        self.logs_dir = logs_dir
        self.env = dict(env or {})
        self.running: dict[str, subprocess.Popen[bytes]] = {}  # pod key -> its daemon
        self._nodes_by_key: dict[str, str] = {}  # pod key -> its node
        self.held: set[str] = set()  # nodes whose crashed daemon is not restarted yet
        self._lock = threading.Lock()  # one sync, crash or recover at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="daemon-pods", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for key in list(self.running):
            self._end(key)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception:  # an API hiccup: look again next time
                log.exception("daemon pods: sync failed")
            self._stop.wait(POLL_S)

    def crash(self, node: str) -> int:
        """SIGKILL the daemon running on ``node`` (its IMEX dies with it) and start it
        no more until :meth:`recover`; its PID."""
        with self._lock:
            self.held.add(node)
            found = [p for k, p in self.running.items() if self._node_of(k) == node]
            if len(found) != 1 or found[0].poll() is not None:
                raise LaunchError(f"no running daemon on {node} to crash")
            os.kill(found[0].pid, signal.SIGKILL)
            found[0].wait()
            return found[0].pid

    def recover(self, node: str) -> None:
        """Let the next pass restart ``node``'s crashed daemon, as its pod's restart would."""
        with self._lock:
            self.held.discard(node)

    def _node_of(self, key: str) -> str:
        return self._nodes_by_key.get(key, "")

    def sync(self) -> None:
        """One pass: start a daemon for each new Running pod, stop those whose pod went."""
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        listing = self.api_get("/api/v1/pods", labelSelector=cd.DOMAIN_LABEL) or {"items": []}
        wanted: dict[str, PodLaunch] = {}
        for pod in listing["items"]:
            node = self.nodes.get(pod["spec"].get("nodeName", ""))
            running = pod.get("status", {}).get("phase") == "Running"
            if node is None or not running or pod["metadata"].get("deletionTimestamp"):
                continue
            try:
                launch = launch_of(pod, node)
            except LaunchError as exc:
                log.info("daemon pod not runnable yet", extra={"pod": pod["metadata"]["name"],
                                                               "why": str(exc)})  # fmt: skip
                continue
            wanted[launch.key] = launch
        for key in [k for k in self.running if k not in wanted]:
            self._end(key)
        for key, launch in wanted.items():
            proc = self.running.get(key)
            if launch.node in self.held:
                continue
            if proc is None or proc.poll() is not None:  # new, or died: as its watchdog would
                self.running[key] = self._launch(launch)
                self._nodes_by_key[key] = launch.node

    def _launch(self, launch: PodLaunch) -> subprocess.Popen[bytes]:
        name = launch.key.split("/")[1]
        # The pod's own hosts file, as the kubelet gives each pod one: never this machine's.
        hosts = self.logs_dir / f"imex-daemon-{name}.hosts"
        argv = [sys.executable, "-m", "services.cli", "imex-daemon", "run",
                *self.bus_argv(launch.node), "--mode", "simulated",
                "--imexd-dir", str(launch.imexd_dir), "--hosts-file", str(hosts)]  # fmt: skip
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with open(self.logs_dir / f"imex-daemon-{name}.log", "ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=Path(__file__).resolve().parents[2],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env, **launch.env},
                start_new_session=True,
            )
        log.info("daemon pod started", extra={"pod": launch.key, "pid": proc.pid})
        return proc

    def _end(self, key: str) -> None:
        proc = self.running.pop(key)
        self._nodes_by_key.pop(key, None)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # it leaves the domain (deletes its member key)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        log.info("daemon pod stopped", extra={"pod": key})
