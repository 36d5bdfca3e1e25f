"""A child process for the multi-process and crash tests: ``python kv_worker.py MODE PATH [ARGS]``.

Modes:
  incr PATH TASKS COUNT    TASKS concurrent tasks each commit COUNT read-modify-write increments of
                           one counter; prints the number of conflicts retried, then ``done``.
  hold PATH                reads ``held`` in a transaction, prints ``read``, waits for a line on
                           stdin, writes and commits; prints ``committed`` or the error code name.
  crash PATH TASKS         commits new keys as fast as it can and prints each one once acknowledged.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys

import uvloop

from fs3.errors import FS3Error
from fs3.kv import Transaction, open_database

COUNTER = b"counter"


def crash_value(key: bytes) -> bytes:
    return hashlib.sha256(key).digest() * 4


async def incr(path: str, tasks: int, count: int) -> None:
    db = await open_database("lmdb", path=path)
    conflicts = 0

    async def bump(tr: Transaction) -> None:
        nonlocal conflicts
        conflicts += 1
        value = int(await tr.get(COUNTER) or b"0")
        await asyncio.sleep(0)  # widen the window for other tasks and the other process
        tr.set(COUNTER, b"%d" % (value + 1))

    async def worker() -> None:
        for _ in range(count):
            await db.run(bump, max_attempts=10_000)

    await asyncio.gather(*(worker() for _ in range(tasks)))
    await db.close()
    print(conflicts - tasks * count, flush=True)
    print("done", flush=True)


async def hold(path: str) -> None:
    db = await open_database("lmdb", path=path)
    tr = db.create_transaction()
    value = await tr.get(b"held")
    print("read", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    tr.set(b"held", (value or b"") + b"+hold")
    try:
        await tr.commit()
        print("committed", flush=True)
    except FS3Error as e:
        print(e.code.name, flush=True)
    await db.close()


async def crash(path: str, tasks: int) -> None:
    db = await open_database("lmdb", path=path)
    run_id = os.urandom(4).hex().encode()

    async def writer(n: int) -> None:
        i = 0
        while True:
            key = b"crash/%s/%d/%d" % (run_id, n, i)

            async def put(tr: Transaction, key: bytes = key) -> None:
                tr.set(key, crash_value(key))

            await db.run(put)
            # Acknowledged, hence durable: announce it in one write so lines never interleave.
            os.write(1, key + b"\n")
            i += 1

    await asyncio.gather(*(writer(n) for n in range(tasks)))


def main() -> None:
    mode, path, *args = sys.argv[1:]
    if mode == "incr":
        coro = incr(path, int(args[0]), int(args[1]))
    elif mode == "hold":
        coro = hold(path)
    elif mode == "crash":
        coro = crash(path, int(args[0]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    uvloop.run(coro)


if __name__ == "__main__":
    main()
