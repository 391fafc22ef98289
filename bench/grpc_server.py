"""The front's gRPC server flavours side by side: which costs less CPU per kubelet call.

    python bench/grpc_server.py [--calls 3000] [--concurrency 1 16] [--rounds 3]

Each flavour runs in its own server process on a unix socket, serving the real
DRA v1 ``NodePrepareResources`` whose handler does what the front does on its
hot path: one NATS request (to a responder in this process, over a real
nats-server without TLS) and the reply turned into the gRPC response:

* ``aio``: ``grpc.aio.server()`` on asyncio's own loop (the front as it is);
* ``aio+uvloop``: the same on uvloop;
* ``sync``: ``grpc.server()`` with a thread pool, each call handed to the
  process's asyncio loop (the NATS client) with ``run_coroutine_threadsafe``
  and back.

Rounds alternate the flavours, so the machine's load weighs on all alike.
Printed per flavour and concurrency: the server's CPU ms per call, p50/p99
latency as the client sees it, calls/s; then the median over rounds. Nothing
is asserted: the front's flavour is chosen from these figures
(docs/operations.md, Performance).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.local.natsserver import server_binary  # noqa: E402

FLAVOURS = ("aio", "aio+uvloop", "sync")
SUBJECT = "bench.prepare"


def serve(flavour: str, socket: str, nats_url: str) -> None:
    """The server process: one flavour until killed."""
    import nats
    import nats.aio.msg

    from services.proto_gen.kubelet.dra.v1 import api_pb2 as pb
    from services.proto_gen.kubelet.dra.v1 import api_pb2_grpc as pb_grpc

    async def answer(nc: Any, request: Any) -> Any:
        reply = await nc.request(SUBJECT, request.claims[0].uid.encode(), timeout=10)
        response = pb.NodePrepareResourcesResponse()
        response.claims[reply.data.decode()].devices.add(
            request_names=["gpu"], pool_name="n", device_name="gpu-0", cdi_device_ids=["x"]
        )
        return response

    async def run_aio() -> None:
        import grpc

        nc = await nats.connect(nats_url)

        class Servicer(pb_grpc.DRAPluginServicer):
            async def NodePrepareResources(self, request, context):
                return await answer(nc, request)

        server = grpc.aio.server()
        pb_grpc.add_DRAPluginServicer_to_server(Servicer(), server)
        server.add_insecure_port(f"unix:{socket}")
        await server.start()
        await server.wait_for_termination()

    if flavour == "aio":
        asyncio.run(run_aio())
    elif flavour == "aio+uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run_aio())
    else:
        from concurrent import futures

        import grpc

        loop = asyncio.new_event_loop()
        nc = loop.run_until_complete(nats.connect(nats_url))

        class SyncServicer(pb_grpc.DRAPluginServicer):
            def NodePrepareResources(self, request, context):
                return asyncio.run_coroutine_threadsafe(answer(nc, request), loop).result()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        pb_grpc.add_DRAPluginServicer_to_server(SyncServicer(), server)
        server.add_insecure_port(f"unix:{socket}")
        server.start()
        loop.run_forever()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def phase(
    socket: str, pid: int, calls: int, concurrency: int
) -> tuple[float, list[float], float]:
    """CPU ms per call of the server, latencies (ms), calls/s."""
    import grpc

    from services.proto_gen.kubelet.dra.v1 import api_pb2 as pb
    from services.proto_gen.kubelet.dra.v1 import api_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        stub = pb_grpc.DRAPluginStub(channel)
        latencies: list[float] = []

        async def worker(n: int) -> None:
            for i in range(n):
                request = pb.NodePrepareResourcesRequest(
                    claims=[pb.Claim(uid=f"u{i}", namespace="b", name="c")]
                )
                t0 = time.perf_counter()
                await stub.NodePrepareResources(request, timeout=30)
                latencies.append((time.perf_counter() - t0) * 1000)

        await worker(20)  # warm
        latencies.clear()
        before = cpu_seconds(pid)
        started = time.perf_counter()
        await asyncio.gather(*(worker(calls // concurrency) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
        cpu = (cpu_seconds(pid) - before) * 1000 / len(latencies)
    return cpu, latencies, len(latencies) / seconds


def start(argv: list[str], quiet: bool = False) -> subprocess.Popen[bytes]:
    out = subprocess.DEVNULL if quiet else None
    return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=out)


def all_exist(paths: list[str]) -> bool:
    return all(Path(p).exists() for p in paths)


def pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


async def main(args: argparse.Namespace) -> None:
    import nats
    import nats.aio.msg

    work = Path(tempfile.mkdtemp(prefix="gpudra-bench-grpc-", dir="/tmp"))
    port = 14222 + os.getpid() % 1000
    nats_proc = start([server_binary(), "-a", "127.0.0.1", "-p", str(port)], quiet=True)
    url = f"nats://127.0.0.1:{port}"
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for _ in range(100):
            try:
                nc = await nats.connect(url)
                break
            except Exception:
                await asyncio.sleep(0.1)

        async def respond(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(msg.data)

        await nc.subscribe(SUBJECT, cb=respond)
        for flavour in FLAVOURS:
            socket = str(work / f"{flavour}.sock")
            proc = start(
                [sys.executable, __file__, "--serve", flavour, "--socket", socket, "--nats", url]
            )
            servers[flavour] = (proc, socket)
        for _ in range(300):
            if all_exist([s for _, s in servers.values()]):
                break
            await asyncio.sleep(0.1)
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        figures: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
        for r in range(args.rounds):
            order = FLAVOURS if r % 2 == 0 else tuple(reversed(FLAVOURS))
            for concurrency in args.concurrency:
                for flavour in order:
                    proc, socket = servers[flavour]
                    cpu, lat, rate = await phase(socket, proc.pid, args.calls, concurrency)
                    figures.setdefault((flavour, concurrency), []).append(
                        (cpu, pct(lat, 50), pct(lat, 99), rate)
                    )
                    print(
                        f"round {r + 1} c={concurrency:<3} {flavour:<11} CPU {cpu:5.2f} ms/call  "
                        f"p50 {pct(lat, 50):6.2f} ms  p99 {pct(lat, 99):6.2f} ms  "
                        f"{rate:7.1f} calls/s"
                    )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for (flavour, concurrency), runs in figures.items():
            med = [statistics.median(x[i] for x in runs) for i in range(4)]
            print(
                f"median c={concurrency:<3} {flavour:<11} CPU {med[0]:5.2f} ms/call  "
                f"p50 {med[1]:6.2f} ms  p99 {med[2]:6.2f} ms  {med[3]:7.1f} calls/s"
            )
        await nc.close()
    finally:
        for proc, _ in servers.values():
            proc.kill()
            proc.wait()
        nats_proc.kill()
        nats_proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=FLAVOURS, help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.serve:
        serve(parsed.serve, parsed.socket, parsed.nats)
    else:
        asyncio.run(main(parsed))
