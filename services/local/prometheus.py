"""Debian's Prometheus on 127.0.0.1: what checks and evaluates the chart's alert rules.

The binaries come from ``services/local/prometheus/build.sh`` (Debian 12's package,
downloaded and unpacked into the cache outside the repository: nothing is installed
on the host); ``GPUDRA_PROMETHEUS`` names another ``prometheus``, with ``promtool``
beside it. :data:`RULES` is the one rule file: promtool checks it, the chart ships it
as a PrometheusRule, and :class:`Prometheus` loads it (or a copy) while it scrapes
the metrics ports of a stack. It writes its config and keeps its data under a work
directory, waits until it is ready, and is stopped by PID; :meth:`Prometheus.alerts`
and :meth:`Prometheus.query` read its HTTP API.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from services.local import REPO
from services.local.component import ComponentExited, Server
from services.local.ports import free_port

BUILD_SCRIPT = REPO / "services" / "local" / "prometheus" / "build.sh"
#: The alert rules (a plain Prometheus rule file), which the chart renders as a PrometheusRule.
RULES = REPO / "deploy" / "chart" / "gpudra" / "files" / "alerts.yaml"
#: How to get the binaries, for whoever finds them missing.
HOW = "run `make prometheus` (services/local/prometheus/build.sh: Debian's package, via apt-get)"


class PrometheusError(RuntimeError):
    """Prometheus could not be had, or did not start or answer."""


def build_prometheus(*, force: bool = False) -> Path:
    """``GPUDRA_PROMETHEUS``, else build.sh's binary (a cache hit hashes two files)."""
    given = os.environ.get("GPUDRA_PROMETHEUS")
    if given and not force:
        if not os.access(given, os.X_OK) or not os.access(promtool(Path(given)), os.X_OK):
            raise PrometheusError(
                f"GPUDRA_PROMETHEUS={given}: no executable prometheus and promtool"
            )
        return Path(given)
    cmd = [str(BUILD_SCRIPT), *(["--force"] if force else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        raise PrometheusError(
            f"{BUILD_SCRIPT} failed with exit status {proc.returncode}: {proc.stderr.strip()}"
        )
    return Path(lines[-1])


def promtool(prometheus: Path) -> Path:
    return prometheus.with_name("promtool")


class Prometheus(Server):
    """One Prometheus server on a free 127.0.0.1 port, scraping ``targets`` (a name ->
    ``host:port`` serving /metrics, labelled ``pod=<name>`` and with ``labels[name]``, as
    a PodMonitor labels a pod's series) and evaluating ``rule_files``, both every
    ``interval`` seconds."""

    def __init__(
        self,
        workdir: Path,
        binary: Path,
        targets: Mapping[str, str],
        rule_files: Sequence[Path] = (RULES,),
        *,
        labels: Mapping[str, Mapping[str, str]] | None = None,
        interval: float = 1.0,
    ) -> None:
        super().__init__("prometheus", workdir / "prometheus.log")
        self.workdir = workdir
        self.binary = binary
        self.targets = dict(targets)
        self.rule_files = list(rule_files)
        self.labels = {name: dict(more) for name, more in (labels or {}).items()}
        self.interval = interval
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        every = f"{self.interval:g}s"
        return {
            "global": {
                "scrape_interval": every,
                "scrape_timeout": every,
                "evaluation_interval": every,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "gpudra",
                    "static_configs": [
                        {"targets": [address], "labels": {"pod": name, **self.labels.get(name, {})}}
                        for name, address in sorted(self.targets.items())
                    ],
                }
            ],
        }

    def start(self, timeout: float = 60.0) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps(self.config(), indent=1))  # JSON is YAML
        args = [
            str(self.binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self._launch(args, "Prometheus's /-/ready", timeout)
        return self

    def _ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise ComponentExited(f"prometheus exited; log {self.log_path}:\n{self.log_tail()}")
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
            return bool(response.status == 200)

    # ---- the HTTP API ----------------------------------------------------------

    def get(self, path: str, **params: str) -> Any:
        """``data`` of an API answer (PrometheusError when its status is not success)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=10) as response:
            answer = json.load(response)
        if answer.get("status") != "success":
            raise PrometheusError(f"{path}: {answer}")
        return answer["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert now pending or firing, with its labels, annotations and state."""
        return list(self.get("/api/v1/alerts")["alerts"])

    def firing(self, name: str) -> list[dict[str, Any]]:
        return [
            a for a in self.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"
        ]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: each series' labels (``metric``) and ``value``."""
        return list(self.get("/api/v1/query", query=expr)["result"])

    def targets_up(self) -> dict[str, bool]:
        """Each scraped target's ``pod`` label -> whether its last scrape worked."""
        active = self.get("/api/v1/targets")["activeTargets"]
        return {t["labels"]["pod"]: t["health"] == "up" for t in active}
