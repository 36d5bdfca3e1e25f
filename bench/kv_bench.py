"""Benchmark fs3.kv engines with metadata-like workloads.

    .venv/bin/python bench/kv_bench.py                      # lmdb in a temporary directory
    .venv/bin/python bench/kv_bench.py --engine mem --json
    .venv/bin/python bench/kv_bench.py --path /mnt/nvme/kvbench --seconds 5 --repeat 3

Workloads:

* ``create xN``: N concurrent callers each running ``db.run`` transactions that read one key (the
  parent directory's inode) and write two new keys of about 200 bytes (inode and directory entry),
  the shape of a file create. Each is acknowledged only once durable. Each caller has its own
  key sequence, so a batch of commits touches about two B-tree leaves per caller, as creates from
  many clients would.
* ``point read``: ``await tr.get`` of random existing keys, 1,000 per transaction.
* ``range scan``: a full ``get_range`` over a prefix of 50,000 entries, and 100-entry pages of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fs3.kv import Database, Transaction, open_database, prefix_end  # noqa: E402

VALUE = b"v" * 200
READS_PER_TXN = 1000


@dataclass(slots=True)
class Result:
    workload: str
    ops: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0


async def bench_creates(db: Database, callers: int, seconds: float, tag: str) -> Result:
    parent = b"INOD" + b"\x00" * 8

    async def seed(tr: Transaction) -> None:
        tr.set(parent, VALUE)

    await db.run(seed)
    done = 0
    stop = time.perf_counter() + seconds

    async def caller(n: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop:
            ino = f"{tag}-{n}-{i}".encode()

            async def create(tr: Transaction, ino: bytes = ino) -> None:
                if await tr.get(parent) is None:
                    raise RuntimeError("parent vanished")
                tr.set(b"INOD" + ino, VALUE)
                tr.set(b"DENT" + parent[4:] + ino, VALUE)

            await db.run(create)
            i += 1
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(caller(n) for n in range(callers)))
    return Result(f"create x{callers}", done, time.perf_counter() - start)


async def load(db: Database, prefix: bytes, count: int) -> list[bytes]:
    keys = [prefix + i.to_bytes(8, "big") for i in range(count)]
    for at in range(0, count, 5000):

        async def fill(tr: Transaction, chunk: list[bytes] = keys[at : at + 5000]) -> None:
            for k in chunk:
                tr.set(k, VALUE)

        await db.run(fill)
    return keys


async def bench_point_reads(db: Database, keys: list[bytes], seconds: float) -> Result:
    done = 0
    rng = random.Random(1)
    sample = [rng.choice(keys) for _ in range(READS_PER_TXN * 20)]
    start = time.perf_counter()
    stop = start + seconds
    while time.perf_counter() < stop:
        for at in range(0, len(sample), READS_PER_TXN):
            tr = db.create_transaction()
            get = tr.get
            for k in sample[at : at + READS_PER_TXN]:
                await get(k)
            tr.cancel()
            done += READS_PER_TXN
    return Result("point read", done, time.perf_counter() - start)


async def bench_scans(db: Database, prefix: bytes, entries: int, seconds: float) -> list[Result]:
    full = pages = 0
    start = time.perf_counter()
    stop = start + seconds / 2
    while time.perf_counter() < stop or full == 0:
        tr = db.create_transaction()
        rows = await tr.get_range(prefix, prefix_end(prefix))
        tr.cancel()
        assert len(rows) == entries, len(rows)
        full += 1
    mid = time.perf_counter()
    rng = random.Random(2)
    while time.perf_counter() < mid + seconds / 2:
        tr = db.create_transaction()
        begin = prefix + rng.randrange(entries).to_bytes(8, "big")
        await tr.get_range(begin, prefix_end(prefix), limit=100)
        tr.cancel()
        pages += 1
    return [
        Result(f"range scan {entries} (rows)", full * entries, mid - start),
        Result("range page of 100", pages, time.perf_counter() - mid),
    ]


def probe_fsync_ms(directory: str, samples: int = 100) -> float:
    """Median latency of overwriting 32 KiB and fdatasync-ing it here: the disk's state, so that
    figures from a shared machine can be read in context."""
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        block = b"x" * 32768
        times = []
        for i in range(samples):
            start = time.perf_counter()
            os.pwrite(fd, block, (i % 8) * len(block))
            os.fdatasync(fd)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000
    finally:
        os.close(fd)
        os.unlink(path)


async def run_once(db: Database, args: argparse.Namespace, round_no: int) -> list[Result]:
    results: list[Result] = []
    for callers in args.callers:
        results.append(await bench_creates(db, callers, args.seconds, f"r{round_no}c{callers}"))
    keys = await load(db, b"BNPR", args.read_keys)
    results.append(await bench_point_reads(db, keys, args.seconds))
    await load(db, b"BNSC", args.scan_entries)
    results += await bench_scans(db, b"BNSC", args.scan_entries, args.seconds)
    return results


async def main_async(args: argparse.Namespace) -> tuple[list[list[Result]], float | None]:
    path = args.path or tempfile.mkdtemp(prefix="kv-bench-")
    try:
        os.makedirs(path, exist_ok=True)
        fsync_ms = probe_fsync_ms(path) if args.engine == "lmdb" else None
        settings: dict[str, object] = {}
        if args.engine == "lmdb":
            settings = {"path": path, "group_commit_interval_ms": args.group_commit_interval_ms}
        if args.engine == "fdb" and args.cluster_file:
            settings = {"cluster_file": args.cluster_file}
        db = await open_database(args.engine, **settings)
        try:
            return [await run_once(db, args, n) for n in range(args.repeat)], fsync_ms
        finally:
            await db.close()
    finally:
        if not args.path:
            shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=os.environ.get("FS3_BENCH_PROG"),
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--engine", default="lmdb", choices=["lmdb", "mem", "fdb"])
    parser.add_argument("--path", help="lmdb directory (default: a fresh temporary one)")
    parser.add_argument("--cluster-file", help="fdb cluster file")
    parser.add_argument("--group-commit-interval-ms", type=float, default=2.0, help="lmdb setting")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each workload")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; the table shows best and median")
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--read-keys", type=int, default=100_000)
    parser.add_argument("--scan-entries", type=int, default=50_000)
    parser.add_argument("--no-uvloop", action="store_true")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if not args.no_uvloop:
        import uvloop

        uvloop.install()
    rounds, fsync_ms = asyncio.run(main_async(args))
    by_workload: dict[str, list[float]] = {}
    for results in rounds:
        for r in results:
            by_workload.setdefault(r.workload, []).append(r.per_second)
    if args.json:
        print(
            json.dumps(
                {
                    "engine": args.engine,
                    "seconds": args.seconds,
                    "fsync_probe_ms": fsync_ms,
                    "workloads": {
                        name: {
                            "best_per_second": round(max(rates), 1),
                            "median_per_second": round(statistics.median(rates), 1),
                            "runs_per_second": [round(x, 1) for x in rates],
                        }
                        for name, rates in by_workload.items()
                    },
                    "runs": [[asdict(r) for r in results] for results in rounds],
                },
                indent=2,
            )
        )
        return
    probe = f" fsync_probe_p50={fsync_ms:.3f}ms" if fsync_ms is not None else ""
    print(f"engine={args.engine} rounds={args.repeat} seconds={args.seconds}{probe}")
    print(f"{'workload':<28} {'best ops/s':>12} {'median ops/s':>13}")
    for name, rates in by_workload.items():
        print(f"{name:<28} {max(rates):>12,.0f} {statistics.median(rates):>13,.0f}")


if __name__ == "__main__":
    main()
