"""A real Jaeger v2 on 127.0.0.1: the trace sink of `gpudra up --jaeger`, the e2e tests
and ``bench/prepare.py --jaeger``.

The binary comes from ``services/local/jaeger/build.sh`` (built from the Go module
proxy, cached outside the repository like the control plane). :class:`Jaeger`
writes a config (OTLP gRPC and HTTP receivers, in-memory storage, the query
API and UI, all on free 127.0.0.1 ports), starts it, waits until the query API
answers and stops it by PID. :meth:`Jaeger.traces` asks the query API what
the e2e tests assert on.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from services.local import REPO
from services.local.component import Server
from services.local.ports import free_port

BUILD_SCRIPT = REPO / "services" / "local" / "jaeger" / "build.sh"

_CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [{processors}]
      exporters: [{exporter}]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{health}
  jaeger_query:
    storage:
      traces: memory
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memory:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc}{grpc_tls}
      http:
        endpoint: 127.0.0.1:{http}
processors:
  batch:
exporters:
  nop:
  jaeger_storage_exporter:
    trace_storage: memory
"""


class JaegerError(RuntimeError):
    """Jaeger did not build, start or answer."""


def build_jaeger(*, force: bool = False) -> Path:
    """Run build.sh (a cache hit hashes four files) and return the binary's path."""
    cmd = [str(BUILD_SCRIPT), *(["--force"] if force else [])]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        raise JaegerError(f"{BUILD_SCRIPT} failed with exit status {proc.returncode}")
    return Path(lines[-1])


class Jaeger(Server):
    """One Jaeger all-in-one process with in-memory storage, on free 127.0.0.1 ports.

    ``store=False`` makes it a sink: spans are received (decoded) and dropped, the
    cheapest receiver there is, for measuring what tracing costs the sender.
    """

    def __init__(
        self,
        workdir: Path,
        binary: Path | None = None,
        *,
        store: bool = True,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``tls``: (certificate, key) for the OTLP/gRPC receiver (then ``https://``)."""
        super().__init__("jaeger", workdir / "jaeger.log")
        self.workdir = workdir
        self.binary = binary
        self.store = store
        self.tls = tls
        self.ports = {
            name: free_port() for name in ("grpc", "http", "query", "query_grpc", "health")
        }

    @property
    def otlp_grpc(self) -> str:
        """The OTLP/gRPC endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` with protocol grpc)."""
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.ports['grpc']}"

    @property
    def otlp_http(self) -> str:
        """The OTLP/HTTP endpoint (protocol http/protobuf; the SDK adds /v1/traces)."""
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def ui(self) -> str:
        return f"http://127.0.0.1:{self.ports['query']}"

    def trace_url(self, trace_id: str) -> str:
        return f"{self.ui}/trace/{trace_id}"

    def start(self, timeout: float = 60.0) -> Self:
        if self.binary is None:
            self.binary = build_jaeger()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "jaeger.yaml"
        pipeline = (
            {"processors": "batch", "exporter": "jaeger_storage_exporter"}
            if self.store
            else {"processors": "", "exporter": "nop"}
        )
        grpc_tls = ""
        if self.tls is not None:
            cert, key = self.tls
            grpc_tls = f"\n        tls:\n          cert_file: {cert}\n          key_file: {key}"
        config.write_text(_CONFIG.format(**self.ports, **pipeline, grpc_tls=grpc_tls))
        self._launch(
            [str(self.binary), "--config", f"file:{config}"], "Jaeger's query API", timeout
        )
        return self

    def _ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise JaegerError(f"jaeger exited; log {self.log_path}:\n{self.log_tail()}")
        self.get("/api/services")
        return True

    # ---- the query API (what the UI reads) ------------------------------------

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(self.ui + path + query, timeout=10) as response:
            return json.load(response)

    def services(self) -> list[str]:
        return list(self.get("/api/services").get("data") or [])

    def find(
        self, service: str, tags: Mapping[str, str] | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Traces of ``service`` holding a span with every tag in ``tags`` (the UI's search)."""
        params = {"service": service, "limit": str(limit), "lookback": "2h"}
        if tags:
            params["tags"] = json.dumps(dict(tags))
        return list(self.get("/api/traces", **params).get("data") or [])

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """One trace by id (None if Jaeger has none)."""
        try:
            data = self.get(f"/api/traces/{trace_id}").get("data") or []
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return data[0] if data else None


def wait_for_trace(
    jaeger: Jaeger, trace_id: str, done: Any, timeout: float = 60.0
) -> dict[str, Any]:
    """Poll until trace ``trace_id`` exists and ``done(trace)`` is true; return it."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        last = jaeger.trace(trace_id)
        if last is not None and done(last):
            return last
        time.sleep(0.2)
    names = sorted({s["operationName"] for s in (last or {}).get("spans", [])})
    raise JaegerError(f"trace {trace_id} not complete within {timeout:.0f}s; spans: {names}")
