"""The native client's I/O paths leave no data in reference cycles: a mount (like every daemon)
runs the cyclic collector seldom (``fs3.daemon.settle_gc``), so bytes held by a cycle stay until a
full collection. A retry closure that named itself once kept every written MiB of a mount (a48068f).
Real daemons on 127.0.0.1; the collector is off while the client works, then asked what it finds."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from cluster import expect_errno
from cycles import buffers, cycles_kept
from fs_cluster import FsCluster

from fs3.client.filesystem import FileSystem

pytestmark = pytest.mark.timeout(120)


async def work(fs: FileSystem) -> None:
    data = os.urandom(3 << 20)
    async with await fs.open("/f", "w") as f:
        await f.write(data)
    async with await fs.open("/f", "r+") as f:
        for i in range(64):
            await f.pwrite(b"y" * 4096, (i * 7919 * 4096) % len(data))
        for i in range(16):
            await f.pread(4096, (i * 104729 * 4096) % len(data))
        assert len(await f.pread(2 << 20, 0)) == 2 << 20
        await f.fsync()
    assert len(await fs.read_file("/f")) == len(data)
    assert [len(b) for b in await fs.read_batch([("/f", 0, 100), ("/f", 1 << 20, 8192)])] == [100, 8192]
    await fs.mkdir("/d")
    await fs.rename("/d", "/e")
    await fs.rmdir("/e")
    await fs.truncate("/f", 1000)
    await fs.unlink("/f")


async def test_reads_writes_and_namespace_calls_keep_no_bytes_in_cycles(tmp_path: Path) -> None:
    async with FsCluster(tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1) as c:
        fs = await c.connect()
        await work(fs)  # every connection made, every cache warm
        with cycles_kept() as found:
            await work(fs)
            await expect_errno(errno.ENOENT, fs.stat("/missing"))
        assert buffers(found) == []
        assert len(found) < 200, sorted({type(o).__name__ for o in found})
