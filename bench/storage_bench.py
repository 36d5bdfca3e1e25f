"""Storage throughput through the storage client: three daemons on this machine, replication 3.

    python bench/storage_bench.py [--seconds 5] [--depth 32] [--chains 3] [--no-sync] [--json]
                                  [--runs 1] [--cases NAME,...] [--io-threads N] [--no-aio] [--dir DIR]
                                  [--tune-malloc]

Starts mgmtd and three storage daemons (tests/cluster.py) with ``--chains`` chains of three
targets (heads on different daemons), then measures, each for ``--seconds``, with ``--depth``
requests in flight from one client process:

- write 1MiB: whole 1 MiB chunks (chunk size 1 MiB), each a new chunk;
- read 1MiB: those chunks, in random order (``read``: the data comes back as new bytes);
- read 1MiB into: the same with ``batch_read_into``, received straight into the caller's buffer;
- write 4KiB: random 4 KiB blocks of 1 MiB chunks (each an overwrite: a copy-on-write chunk);
- append 4KiB: 4 KiB appends, each worker to chunks of its own (the engine appends in place);
- read 4KiB: random 4 KiB blocks of the 1 MiB chunks.

Every write is acknowledged after all three replicas committed it, each having fsynced its data
and metadata (unless ``--no-sync``). Prints a table, or JSON with ``--json``; with ``--runs N``
each case runs N times and best and median are reported.

Each case also reports CPU time per operation (user + system, from ``/proc/PID/stat``): of the
storage daemons together (``daemon ms/op``) and of this client process (``client ms/op``). On a
shared machine that figure is steadier than throughput.

``--tune-malloc`` fixes glibc's malloc thresholds in the client process (``fs3.memory.tune_malloc``,
what ``ClientConfig.tune_malloc`` does) before it starts: without it, whether each "read 1MiB"
faults its new 1 MiB of pages in afresh depends on glibc's dynamic thresholds, and its figure
swings from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cluster import DEPLOYED_MGMTD_TIMING, DEPLOYED_STORAGE_TIMING, Cluster  # noqa: E402

from fs3.client.storage_client import ReadRequest, StorageClient  # noqa: E402
from fs3.config import StorageConfig  # noqa: E402
from fs3.memory import tune_malloc  # noqa: E402
from fs3.storage.chunk_files import ext4_without_journal_note  # noqa: E402

MiB = 1 << 20
KiB = 1 << 10
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14 and 15)


async def run_for(
    seconds: float, depth: int, op: Callable[[int, random.Random], Awaitable[int]]
) -> tuple[int, int, float]:
    """Run ``op(worker, rng)`` from ``depth`` coroutines for ``seconds``; (ops, bytes, elapsed)."""
    deadline = time.perf_counter() + seconds
    totals = [0, 0]

    async def worker(w: int) -> None:
        rng = random.Random(w)
        while time.perf_counter() < deadline:
            n = await op(w, rng)  # not `totals[1] += await ...`: that reads totals[1] before awaiting
            totals[1] += n
            totals[0] += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(depth)))
    return totals[0], totals[1], time.perf_counter() - start


async def bench(args: argparse.Namespace, root: Path) -> list[dict]:
    # the daemons run as deployed (the test fixture gives them 8 I/O threads to spare the test
    # machine; 1 MiB reads and every write go through those threads), as in fio_bench
    extra: dict[str, object] = {"io_threads": args.io_threads}
    if args.page_cache:
        extra["direct_io"] = False
    if args.no_aio:
        extra["aio_reads"] = False
    # ... and with their deployed background intervals (heartbeats, routing polls), not the tests'
    extra.update(DEPLOYED_STORAGE_TIMING)
    cluster = Cluster(
        root,
        chains=args.chains,
        sync_writes=not args.no_sync,
        log_level="WARNING",
        storage_extra=extra,
        mgmtd_extra=dict(DEPLOYED_MGMTD_TIMING),
    )
    await cluster.start()
    try:
        client: StorageClient = await cluster.storage_client()
        chains = cluster.chain_ids
        written: list[tuple[int, int, int]] = []  # (chain, inode, chunk index) of full 1 MiB chunks
        counter = [0]
        results: list[dict] = []
        payload = os.urandom(MiB)
        small = os.urandom(4 * KiB)

        async def write_1m(w: int, rng: random.Random) -> int:
            counter[0] += 1
            n = counter[0]
            chain = chains[n % len(chains)]
            await client.write(chain, 1000 + w, n, 0, payload, MiB)
            written.append((chain, 1000 + w, n))
            return MiB

        async def read_1m(w: int, rng: random.Random) -> int:
            chain, inode, index = rng.choice(written)
            data = await client.read(chain, inode, index, 0, MiB)
            return len(data)

        sinks = [bytearray(MiB) for _ in range(args.depth)]

        async def read_1m_into(w: int, rng: random.Random) -> int:
            chain, inode, index = rng.choice(written)
            (n,) = await client.batch_read_into([ReadRequest(chain, inode, index, 0, MiB)], [sinks[w]])
            return n

        async def write_4k(w: int, rng: random.Random) -> int:
            chain, inode, index = rng.choice(written)
            await client.write(chain, inode, index, rng.randrange(256) * 4 * KiB, small, MiB)
            return 4 * KiB

        appended = [0] * args.depth  # bytes appended so far by each worker to its chunk

        async def append_4k(w: int, rng: random.Random) -> int:
            n = appended[w] // MiB
            off = appended[w] % MiB
            await client.write(chains[w % len(chains)], 2000 + w, n, off, small, MiB)
            appended[w] += 4 * KiB
            return 4 * KiB

        async def read_4k(w: int, rng: random.Random) -> int:
            chain, inode, index = rng.choice(written)
            (data,) = await client.batch_read(
                [ReadRequest(chain, inode, index, rng.randrange(256) * 4 * KiB, 4 * KiB)]
            )
            return len(data)

        cases = [
            ("write 1MiB", write_1m),
            ("read 1MiB", read_1m),
            ("read 1MiB into", read_1m_into),
            ("write 4KiB", write_4k),
            ("append 4KiB", append_4k),
            ("read 4KiB", read_4k),
        ]
        if args.cases:
            wanted = [c.strip() for c in args.cases.split(",")]
            unknown = [w for w in wanted if w not in dict(cases)]
            if unknown:
                raise SystemExit(f"unknown cases {unknown}; known: {[c for c, _ in cases]}")
            # the read cases read what "write 1MiB" wrote, so it always runs first
            cases = [c for c in cases if c[0] in wanted or c[0] == "write 1MiB"]
        daemon_pids = [n.proc.pid for n in cluster.nodes if n.proc is not None and n.proc.pid]
        me = os.getpid()
        for _ in range(args.runs):
            for name, op in cases:
                d0 = [cpu_seconds(p) for p in daemon_pids]
                c0 = cpu_seconds(me)
                ops, nbytes, elapsed = await run_for(args.seconds, args.depth, op)
                c1 = cpu_seconds(me)
                d1 = [cpu_seconds(p) for p in daemon_pids]
                n = max(ops, 1)
                results.append(
                    {
                        "case": name,
                        "depth": args.depth,
                        "ops_per_s": ops / elapsed,
                        "mib_per_s": nbytes / elapsed / MiB,
                        "seconds": elapsed,
                        "daemon_cpu_ms_per_op": (sum(d1) - sum(d0)) * 1000 / n,
                        "daemon_cpu_ms_per_op_each": [
                            (b - a) * 1000 / n for a, b in zip(d0, d1, strict=True)
                        ],
                        "client_cpu_ms_per_op": (c1 - c0) * 1000 / n,
                    }
                )
                if not args.json:
                    r = results[-1]
                    each = "/".join(f"{x:.2f}" for x in r["daemon_cpu_ms_per_op_each"])
                    print(
                        f"  {name:<15} depth={args.depth:<3} {r['ops_per_s']:10.1f} ops/s {r['mib_per_s']:10.1f} MiB/s"
                        f"  daemon {r['daemon_cpu_ms_per_op']:.3f} ms/op ({each})"
                        f"  client {r['client_cpu_ms_per_op']:.3f} ms/op",
                        flush=True,
                    )
        return results
    finally:
        await cluster.stop()


def summarize(results: list[dict]) -> list[dict]:
    out = []
    for case in dict.fromkeys(r["case"] for r in results):
        rates = [r["mib_per_s"] for r in results if r["case"] == case]
        ops = [r["ops_per_s"] for r in results if r["case"] == case]
        daemon = [r["daemon_cpu_ms_per_op"] for r in results if r["case"] == case]
        client = [r["client_cpu_ms_per_op"] for r in results if r["case"] == case]
        out.append(
            {
                "case": case,
                "runs": len(rates),
                "best_mib_per_s": max(rates),
                "median_mib_per_s": statistics.median(rates),
                "best_ops_per_s": max(ops),
                "median_ops_per_s": statistics.median(ops),
                "median_daemon_cpu_ms_per_op": statistics.median(daemon),
                "median_client_cpu_ms_per_op": statistics.median(client),
            }
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(prog=os.environ.get("FS3_BENCH_PROG"), description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--depth", type=int, default=32, help="requests in flight")
    p.add_argument("--chains", type=int, default=3)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument(
        "--no-aio", action="store_true", help="storage daemons read cold small ranges without native AIO"
    )
    p.add_argument("--cases", help='comma-separated case names (default: all), e.g. "write 1MiB,read 4KiB"')
    default_threads = next(f.default for f in dataclasses.fields(StorageConfig) if f.name == "io_threads")
    p.add_argument(
        "--io-threads",
        type=int,
        default=default_threads,
        help=f"I/O threads per storage daemon (default {default_threads}, the storage config's default)",
    )
    p.add_argument(
        "--page-cache",
        action="store_true",
        help="storage daemons read and write chunk files through the page cache (direct_io = false)",
    )
    p.add_argument("--no-sync", action="store_true", help="no fsync in the daemons (throwaway data)")
    p.add_argument("--dir", help="where the cluster lives (default: a temporary directory)")
    p.add_argument(
        "--tune-malloc",
        action="store_true",
        help="fix glibc's malloc thresholds in this client process (ClientConfig.tune_malloc)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.tune_malloc and not tune_malloc():
        print("note: --tune-malloc: the C library is not glibc; nothing changed", file=sys.stderr)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fs3-storage-bench-"))
    if (note := ext4_without_journal_note(root, measure=True)) is not None:
        print(f"note: {note} (see the README)", file=sys.stderr)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        results = runner(bench(args, root / "cluster"))
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    summary = summarize(results)
    if args.json:
        print(
            json.dumps(
                {
                    "replication": 3,
                    "daemons": 3,
                    "sync": not args.no_sync,
                    "tune_malloc": args.tune_malloc,
                    "results": results,
                    "summary": summary,
                },
                indent=2,
            )
        )
    else:
        print(
            f"\n{'case':<15} {'runs':>4} {'best MiB/s':>11} {'median MiB/s':>13} {'best ops/s':>11}"
            f" {'daemon ms/op':>13} {'client ms/op':>13}"
        )
        for s in summary:
            print(
                f"{s['case']:<15} {s['runs']:>4} {s['best_mib_per_s']:>11.1f} {s['median_mib_per_s']:>13.1f} "
                f"{s['best_ops_per_s']:>11.1f} {s['median_daemon_cpu_ms_per_op']:>13.3f}"
                f" {s['median_client_cpu_ms_per_op']:>13.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
