"""fs3 RPC benchmark: one client process against one server process on loopback.

    .venv/bin/python bench/rpc_bench.py [--duration 3] [--json] [--only ping32,read4m]

Measures the small-call rate (Ping) at 1 and 32 calls in flight, and bulk throughput with 1 MiB and
4 MiB payloads in both directions: ``write`` sends the payload to the server (Sink), ``read``
fetches it from the server straight into the caller's buffers (Source with ``into=``), ``echo`` does
both. Throughput counts payload bytes in one direction. The server is ``python -m fs3.net serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fs3.net import RpcClient  # noqa: E402
from fs3.net.system import ECHO, PING, SINK, SOURCE  # noqa: E402
from fs3.proto import rpc_pb2  # noqa: E402

MiB = 1 << 20


@dataclass
class Case:
    name: str
    kind: str  # ping | write | read | echo
    in_flight: int
    size: int = 0


CASES = [
    Case("ping1", "ping", 1),
    Case("ping32", "ping", 32),
    Case("write1m", "write", 4, MiB),
    Case("write4m", "write", 4, 4 * MiB),
    Case("read1m", "read", 4, MiB),
    Case("read4m", "read", 4, 4 * MiB),
    Case("echo4m", "echo", 4, 4 * MiB),
]


@dataclass
class Result:
    name: str
    in_flight: int
    payload_bytes: int
    calls: int
    seconds: float
    calls_per_s: float
    gb_per_s: float
    p50_us: float
    p99_us: float
    # CPU time per call in each process: a figure that stays meaningful on a busy machine
    client_cpu_us: float
    server_cpu_us: float


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_case(
    client: RpcClient, address: tuple[str, int], server_pid: int, case: Case, duration: float
) -> Result:
    payload = os.urandom(case.size) if case.kind in ("write", "echo") else None
    latencies: list[int] = []
    calls = 0
    measuring = False
    stop_at = 0.0

    async def worker() -> None:
        nonlocal calls
        into = bytearray(case.size) if case.kind in ("read", "echo") else None
        call = client.call
        perf = time.perf_counter_ns
        if case.kind == "ping":
            method, request = PING, rpc_pb2.PingRequest()
        elif case.kind == "write":
            method, request = SINK, rpc_pb2.SinkRequest()
        elif case.kind == "read":
            method, request = SOURCE, rpc_pb2.SourceRequest(length=case.size)
        else:
            method, request = ECHO, rpc_pb2.EchoRequest()
        while True:
            t0 = perf()
            await call(address, method, request, payload=payload, into=into, timeout=30)
            t1 = perf()
            if measuring:
                if t1 / 1e9 > stop_at:
                    return
                calls += 1
                latencies.append(t1 - t0)

    loop = asyncio.get_running_loop()
    warmup = min(1.0, duration / 3)
    workers = [asyncio.ensure_future(worker()) for _ in range(case.in_flight)]
    await asyncio.sleep(warmup)  # a benchmark's warm-up period, not synchronisation
    start = time.perf_counter_ns()
    cpu0, server_cpu0 = time.process_time(), process_cpu_seconds(server_pid)
    stop_at = start / 1e9 + duration
    measuring = True
    await asyncio.gather(*workers)
    seconds = (time.perf_counter_ns() - start) / 1e9
    client_cpu = time.process_time() - cpu0
    server_cpu = process_cpu_seconds(server_pid) - server_cpu0
    del loop
    latencies.sort()
    p50 = latencies[len(latencies) // 2] / 1e3 if latencies else 0.0
    p99 = latencies[int(len(latencies) * 0.99)] / 1e3 if latencies else 0.0
    return Result(
        case.name,
        case.in_flight,
        case.size,
        calls,
        round(seconds, 3),
        round(calls / seconds, 1),
        round(calls * case.size / seconds / 1e9, 3),
        round(p50, 1),
        round(p99, 1),
        round(client_cpu / max(calls, 1) * 1e6, 2),
        round(server_cpu / max(calls, 1) * 1e6, 2),
    )


def start_server(secret: bytes) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fs3.net", "serve", "--listen", "127.0.0.1:0", "--identity", "bench"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, FS3_CLUSTER_SECRET=secret.decode()),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    host, port = line.split()[1].rsplit(":", 1)
    return proc, (host, int(port))


async def bench(
    cases: list[Case], duration: float, address: tuple[str, int], server_pid: int, secret: bytes
) -> list[Result]:
    results = []
    async with RpcClient(secret, identity="rpc-bench") as client:
        await client.call(address, PING, rpc_pb2.PingRequest())
        for case in cases:
            results.append(await run_case(client, address, server_pid, case, duration))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=os.environ.get("FS3_BENCH_PROG"), description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per case")
    parser.add_argument("--only", help="comma-separated case names: " + ",".join(c.name for c in CASES))
    parser.add_argument("--in-flight", type=int, help="override calls in flight for bulk cases")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    cases = CASES
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {c.name for c in CASES}
        if unknown:
            parser.error(f"unknown cases: {', '.join(sorted(unknown))}")
        cases = [c for c in CASES if c.name in wanted]
    if args.in_flight:
        cases = [
            Case(c.name, c.kind, c.in_flight if c.kind == "ping" else args.in_flight, c.size) for c in cases
        ]
    secret = os.urandom(24).hex().encode()
    proc, address = start_server(secret)
    try:
        results = uvloop.run(bench(cases, args.duration, address, proc.pid, secret))
    finally:
        proc.terminate()
        proc.wait(10)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 0
    print(
        f"{'case':<9} {'in flight':>9} {'payload':>9} {'calls/s':>10} {'GB/s':>7} {'p50 us':>9} {'p99 us':>9}"
        f" {'cpu us/call: client':>19} {'server':>7}"
    )
    for r in results:
        size = f"{r.payload_bytes // MiB} MiB" if r.payload_bytes else "-"
        gbs = f"{r.gb_per_s:.2f}" if r.payload_bytes else "-"
        print(
            f"{r.name:<9} {r.in_flight:>9} {size:>9} {r.calls_per_s:>10,.0f} {gbs:>7} {r.p50_us:>9.1f} {r.p99_us:>9.1f}"
            f" {r.client_cpu_us:>19.1f} {r.server_cpu_us:>7.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
