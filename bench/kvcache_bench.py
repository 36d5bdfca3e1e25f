"""KV cache throughput (fs3.client.kvcache) over a cluster started on this machine.

    python bench/kvcache_bench.py [--sizes 64K,1M] [--keys 256] [--batch 32] [--concurrency 16]
                                  [--chunk-size 1M] [--json]

Starts mgmtd, one meta server and three storage daemons (replication 3, tests/client/fs_cluster.py)
and, for each value size, measures from one client process:

- put: ``--keys`` values stored with ``--concurrency`` puts in flight (each: create, write, close,
  rename; acknowledged once every replica has it);
- get: each key read by ``get`` with ``--concurrency`` in flight (a lookup and a storage read each);
- get_many: all keys read in batches of ``--batch`` (one lookup per key, one batched storage read);
- miss: ``get_many`` of keys that are not there.

Prints a table (ops/s, MiB/s and the client's CPU ms per op) or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fs3.cli import parse_size

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _timed(ops: int, nbytes: int, run: Callable[[], Awaitable[None]]) -> dict[str, float]:
    cpu, start = _cpu(), time.perf_counter()
    await run()
    wall, used = time.perf_counter() - start, _cpu() - cpu
    return {
        "ops_per_s": ops / wall,
        "mib_per_s": nbytes / wall / (1 << 20),
        "client_cpu_ms_per_op": used / ops * 1e3,
    }


async def bench(args: argparse.Namespace, tmp: Path) -> list[dict[str, object]]:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "client")]
    from cluster import DEPLOYED_MGMTD_TIMING, DEPLOYED_STORAGE_TIMING
    from fs_cluster import FsCluster

    from fs3.client.kvcache import KVCache

    rows: list[dict[str, object]] = []
    # the daemons with their deployed background intervals (heartbeats, routing polls)
    async with FsCluster(
        tmp / "cluster",
        log_level="WARNING",
        chunk_size=args.chunk_size,
        storage_extra=dict(DEPLOYED_STORAGE_TIMING),
        mgmtd_extra=dict(DEPLOYED_MGMTD_TIMING),
    ) as c:
        fs = await c.connect()
        for size in args.sizes:
            cache = KVCache(fs, f"/bench-{size}", concurrency=args.concurrency)
            keys = [f"prompt-{i:06d}-block".encode() for i in range(args.keys)]
            for case, run, nbytes in _cases(cache, keys, os.urandom(size), args):
                result = await _timed(len(keys), nbytes, run)
                rows.append({"case": case, "value_bytes": size, **result})
                if not args.json:
                    print(
                        f"  {case:9s} value={size >> 10:5d}KiB {result['ops_per_s']:9.1f} ops/s "
                        f"{result['mib_per_s']:8.1f} MiB/s  client {result['client_cpu_ms_per_op']:6.3f} ms/op",
                        flush=True,
                    )
    return rows


def _cases(
    cache: Any, keys: list[bytes], value: bytes, args: argparse.Namespace
) -> list[tuple[str, Callable[[], Awaitable[None]], int]]:
    sem = asyncio.Semaphore(args.concurrency)
    batches = [keys[i : i + args.batch] for i in range(0, len(keys), args.batch)]

    async def puts() -> None:
        await cache.put_many((k, value) for k in keys)

    async def gets() -> None:
        got = await asyncio.gather(*(cache.get(k) for k in keys))
        assert all(g == value for g in got)

    async def one_batch(batch: list[bytes]) -> None:
        async with sem:
            assert await cache.get_many(batch) == [value] * len(batch)

    async def get_many() -> None:
        await asyncio.gather(*(one_batch(b) for b in batches))

    async def misses() -> None:
        for batch in batches:
            assert await cache.get_many([b"absent-" + k for k in batch]) == [None] * len(batch)

    total = len(value) * len(keys)
    return [("put", puts, total), ("get", gets, total), ("get_many", get_many, total), ("miss", misses, 0)]


def main() -> None:
    p = argparse.ArgumentParser(
        prog=os.environ.get("FS3_BENCH_PROG"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", default="64K,1M", help="comma-separated value sizes")
    p.add_argument("--keys", type=int, default=256, help="keys per size")
    p.add_argument("--batch", type=int, default=32, help="keys per get_many")
    p.add_argument("--concurrency", type=int, default=16, help="puts/gets/batches in flight")
    p.add_argument("--chunk-size", default="1M", help="the cluster's chunk size")
    p.add_argument("--tmp", default="/var/tmp", help="where the temporary cluster goes")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.chunk_size = parse_size(args.chunk_size)
    tmp = Path(tempfile.mkdtemp(prefix="fs3-kvcache-bench-", dir=args.tmp))
    try:
        rows = asyncio.run(bench(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
