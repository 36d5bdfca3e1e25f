"""The lmdb engine when the machine misbehaves: a failed fsync fails the store instead of being
retried into a false acknowledgement, and a process killed mid-transaction does not keep the
survivors from reusing freed pages."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fs3.daemon import wait_for_shutdown
from fs3.errors import FS3Error, StatusCode
from fs3.kv import Database, Transaction, lmdb_engine, open_database, open_database_sync

pytestmark = pytest.mark.timeout(120)

WORKER = str(Path(__file__).with_name("kv_worker.py"))


async def put(db: Database, key: bytes, value: bytes) -> None:
    async def body(tr: Transaction) -> None:
        tr.set(key, value)

    await db.run(body)


async def get(db: Database, key: bytes) -> bytes | None:
    async def body(tr: Transaction) -> bytes | None:
        return await tr.get(key)

    return await db.run(body, read_only=True)


async def test_a_failed_fsync_fails_the_commit_waiting_for_it_and_every_later_one(tmp_path: Path) -> None:
    """After an fsync error the kernel may report the next fsync as a success without the pages
    it lost: the commit that waited for the failed one must not be acknowledged by a retry."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"))
    try:
        committer = db._shared.committer  # noqa: SLF001
        real = committer._sync  # noqa: SLF001
        calls = 0

        def failing_once() -> None:  # the disk's write-back error, reported once (as Linux does)
            nonlocal calls
            calls += 1
            if calls == 2:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real()

        committer._sync = failing_once  # noqa: SLF001
        await put(db, b"a", b"1")
        with pytest.raises(FS3Error) as e:
            await put(db, b"b", b"2")
        assert e.value.code == StatusCode.KV_STORE_FAILED and "fsync" in e.value.message
        with pytest.raises(FS3Error) as e:
            await put(db, b"c", b"3")
        assert e.value.code == StatusCode.KV_STORE_FAILED and "restart" in e.value.message
        assert await get(db, b"a") == b"1"  # reads go on
        # a daemon over it stops (exit status 1), for its supervisor to restart it
        assert db.failure() is not None
        assert await asyncio.wait_for(wait_for_shutdown(db, check_s=0.05), 5) == 1
    finally:
        await db.close()


def test_a_reader_killed_mid_transaction_does_not_keep_freed_pages_from_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lmdb_engine, "READER_CHECK_S", 0.05)
    path = tmp_path / "kv"
    db = open_database_sync("lmdb", path=str(path))  # open before the other process dies
    holder = subprocess.Popen(
        [sys.executable, WORKER, "hold", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )

    async def overwrite() -> None:
        value = os.urandom(60_000)
        for _ in range(1500):  # 90 MB written to one key: freed pages must be reused
            await put(db, b"k", value)

    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"read\n"  # snapshot taken
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        asyncio.run(overwrite())
        assert os.path.getsize(path / "data.mdb") < 40 << 20
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
        for stream in (holder.stdin, holder.stdout):
            if stream:
                stream.close()
        asyncio.run(db.close())
