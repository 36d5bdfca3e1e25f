"""Chunk engine throughput on one target, without network or replication.

    python bench/chunk_bench.py [--dir DIR] [--threads 1,4] [--seconds 3] [--no-sync] [--json]

Cases: full 1 MiB chunk writes (update + commit, copy-on-write), 4 KiB overwrites inside 1 MiB
chunks (layered: each writes the one 64 KiB checksum block it touches, folded at commit), 64 KiB
appends (in place), full 1 MiB reads, random 4 KiB reads.
Every write is fsynced (data file, directory, LMDB) unless --no-sync. Each case reports the CPU
time of the process (all threads, user + system) per operation, steadier than throughput on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fs3.storage.chunk_engine import ChunkEngine, EngineOptions
from fs3.storage.chunk_meta import crc32c

MiB = 1 << 20
CHUNK = MiB
CHUNKS_PER_THREAD = 32


def cid(thread: int, index: int) -> bytes:
    return struct.pack(">BBQHI", 0, 0, 1000 + thread, 0, index)


def run_threads(
    threads: int, seconds: float, op: Callable[[int, random.Random], int]
) -> tuple[int, int, float, float]:
    """Run ``op(thread, rng)`` in ``threads`` threads for ``seconds``; return (ops, bytes, elapsed,
    CPU seconds of this process meanwhile: user + system, every thread)."""
    totals = [(0, 0)] * threads
    errors: list[BaseException] = []
    deadline = time.perf_counter() + seconds

    def worker(t: int) -> None:
        rng = random.Random(t)
        ops = nbytes = 0
        try:
            while time.perf_counter() < deadline:
                nbytes += op(t, rng)
                ops += 1
        except BaseException as exc:
            errors.append(exc)
        totals[t] = (ops, nbytes)

    cpu = time.process_time()
    start = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(o for o, _ in totals), sum(b for _, b in totals), elapsed, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=os.environ.get("FS3_BENCH_PROG"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dir", type=Path, help="target directory (default: a temporary one, removed after)")
    parser.add_argument("--threads", default="1,4", help="comma-separated thread counts")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each case")
    parser.add_argument("--no-sync", action="store_true", help="skip fsync (page-cache speed)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--cases", help='comma-separated case names (default: all), e.g. "overwrite 4KiB"')
    args = parser.parse_args(argv)

    root = args.dir or Path(tempfile.mkdtemp(prefix="fs3-chunk-bench-"))
    engine = ChunkEngine(root / "target", EngineOptions(sync=not args.no_sync))
    payload = os.urandom(CHUNK)
    payload_crc = crc32c(payload)  # the service passes the client's checksum, verified on arrival
    small = os.urandom(4096)
    append = os.urandom(64 * 1024)
    results = []
    try:
        thread_counts = [int(t) for t in args.threads.split(",")]
        # every chunk the read and overwrite cases touch exists before the first case runs
        for t in range(max(thread_counts)):
            for index in range(CHUNKS_PER_THREAD):
                meta = engine.update(cid(t, index), 0, payload, chunk_size=CHUNK, chain_ver=1)
                engine.commit(cid(t, index), meta.pending_ver)
        for threads in thread_counts:

            def full_write(t: int, rng: random.Random) -> int:
                chunk = cid(t, rng.randrange(CHUNKS_PER_THREAD))
                meta = engine.update(chunk, 0, payload, chunk_size=CHUNK, chain_ver=1, checksum=payload_crc)
                engine.commit(chunk, meta.pending_ver)
                return CHUNK

            def overwrite_4k(t: int, rng: random.Random) -> int:
                chunk = cid(t, rng.randrange(CHUNKS_PER_THREAD))
                meta = engine.update(
                    chunk, rng.randrange(CHUNK // 4096) * 4096, small, chunk_size=CHUNK, chain_ver=1
                )
                engine.commit(chunk, meta.pending_ver)
                return len(small)

            def append_64k(t: int, rng: random.Random) -> int:
                chunk = cid(t, CHUNKS_PER_THREAD + rng.randrange(CHUNKS_PER_THREAD))
                meta = engine.get_meta(chunk)
                length = meta.length if meta else 0
                if length + len(append) > CHUNK:
                    meta = engine.truncate(chunk, 0, chunk_size=CHUNK, chain_ver=1)
                    engine.commit(chunk, meta.pending_ver)
                    length = 0
                meta = engine.update(chunk, length, append, chunk_size=CHUNK, chain_ver=1)
                engine.commit(chunk, meta.pending_ver)
                return len(append)

            def full_read(t: int, rng: random.Random) -> int:
                return len(engine.read(cid(t, rng.randrange(CHUNKS_PER_THREAD))).data)

            def read_4k(t: int, rng: random.Random) -> int:
                offset = rng.randrange(CHUNK // 4096) * 4096
                return len(engine.read(cid(t, rng.randrange(CHUNKS_PER_THREAD)), offset, 4096).data)

            cases = [
                ("write 1MiB chunk", full_write),
                ("overwrite 4KiB", overwrite_4k),
                ("append 64KiB", append_64k),
                ("read 1MiB chunk", full_read),
                ("read 4KiB", read_4k),
            ]
            if args.cases:
                wanted = {c.strip() for c in args.cases.split(",")}
                if unknown := wanted - {name for name, _ in cases}:
                    raise SystemExit(f"unknown cases {sorted(unknown)}; known: {[n for n, _ in cases]}")
                cases = [(name, op) for name, op in cases if name in wanted]
            for name, op in cases:
                before = engine.commit_stats()
                ops, nbytes, elapsed, cpu = run_threads(threads, args.seconds, op)
                after = engine.commit_stats()
                txns = after.transactions - before.transactions
                results.append(
                    {
                        "case": name,
                        "threads": threads,
                        "ops_per_s": round(ops / elapsed, 1),
                        "mib_per_s": round(nbytes / elapsed / MiB, 1),
                        "cpu_ms_per_op": round(1000 * cpu / max(ops, 1), 3),
                        "changes_per_txn": round((after.changes - before.changes) / max(txns, 1), 2),
                        "sync": not args.no_sync,
                    }
                )
                if not args.json:
                    r = results[-1]
                    print(
                        f"{name:<18} threads={threads:<3} {r['ops_per_s']:>10.1f} ops/s "
                        f"{r['mib_per_s']:>9.1f} MiB/s {r['cpu_ms_per_op']:>8.3f} CPU ms/op "
                        f"{r['changes_per_txn']:>6.2f} changes/txn"
                    )
    finally:
        engine.close()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
