"""The length an open file has in the native client: meta's, which other clients change (appends,
truncates), extended by what this client wrote that meta has not counted yet; never a length
remembered from the open or from this client's own earlier reports."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from fs_cluster import FsCluster

from fs3.client import FileSystem

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FsCluster]:
    async with FsCluster(tmp_path_factory.mktemp("sizes"), chunk_size=256 << 10) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fs(cluster: FsCluster) -> FileSystem:
    return await cluster.connect()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def other(cluster: FsCluster) -> FileSystem:
    return await cluster.connect()


async def test_a_reader_follows_another_clients_appends_and_truncates(
    fs: FileSystem, other: FileSystem
) -> None:
    """`tail -f` over the native API: the reader keeps its handle while another client appends,
    then truncates."""
    first, more = os.urandom(100), os.urandom(100)
    await other.write_file("/followed", first)
    r = await fs.open("/followed")
    assert await r.read() == first
    async with await other.open("/followed", "a") as a:
        await a.write(more)
    assert (await fs.stat("/followed")).st_size == 200
    assert await r.pread(4096, 100) == more
    assert r.size == 200
    await other.truncate("/followed", 10)
    assert (await fs.stat("/followed")).st_size == 10
    assert r.size == 10
    assert await r.pread(100, 0) == first[:10]  # not 10 bytes and 90 zeros
    assert r.seek(0, os.SEEK_END) == 10
    await r.close()


async def test_a_read_after_another_client_truncated_is_short_not_zeros(
    fs: FileSystem, other: FileSystem
) -> None:
    """A reader holding its handle while another client truncates the file, or writes it again
    shorter, reads to the new end (a short read, as on a local file system or NFS), not zeros up
    to the length it knew: those bytes were never written. Holes still read as zeros."""
    data = os.urandom(600 << 10)  # three chunks and a part
    await other.write_file("/cut", data)
    r = await fs.open("/cut")
    assert r.size == len(data)
    await other.truncate("/cut", 300 << 10)  # inside the second chunk
    assert await r.pread(len(data), 0) == data[: 300 << 10]
    await other.truncate("/cut", 0)
    assert await r.pread(100, 0) == b""
    await other.write_file("/cut", b"z" * 50)  # truncated, then 50 bytes
    assert await r.pread(100, 0) == b"z" * 50
    await r.close()
    async with await other.open("/cut", "r+") as w:
        await w.pwrite(b"end", 600 << 10)  # chunk 2; chunk 1 is a hole
    r = await fs.open("/cut")
    assert await r.pread(4096, 300 << 10) == bytes(4096)
    assert await r.pread(100, (600 << 10) - 10) == bytes(10) + b"end"
    await r.close()


async def test_reads_of_this_clients_own_unflushed_bytes_ask_meta_nothing(
    fs: FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storage has nothing yet where this client wrote (its bytes are buffered): that is no hole
    that another client's truncate may have made, and the read asks meta for no length."""
    f = await fs.open("/own", "w+")
    await f.pwrite(b"x" * 100, 0)
    stats: list[int] = []
    real = fs.meta.stat

    async def counted(inode_id: int) -> object:
        stats.append(inode_id)
        return await real(inode_id)

    monkeypatch.setattr(fs.meta, "stat", counted)
    for _ in range(5):
        assert await f.pread(100, 0) == b"x" * 100
    assert stats == []
    monkeypatch.undo()
    await f.close()


async def test_a_writers_own_old_length_does_not_come_back_after_another_client_truncated(
    fs: FileSystem, other: FileSystem
) -> None:
    """`logrotate copytruncate` seen from the writer's own client: while its handle stays open,
    stat and reads there show the truncated file and what the writer wrote since, not the length
    it had written before."""
    f = await fs.open("/rotating.log", "w+")
    await f.write(b"x" * 100_000)
    await f.fsync()
    await other.truncate("/rotating.log", 0)
    assert (await fs.stat("/rotating.log")).st_size == 0
    assert (await f.stat()).st_size == 0
    assert await f.pread(4096, 0) == b""
    await f.pwrite(b"after rotation\n", 0)
    assert (await fs.stat("/rotating.log")).st_size == 15  # this client's unreported write counts
    assert await f.pread(4096, 0) == b"after rotation\n"
    await f.close()
    assert (await fs.stat("/rotating.log")).st_size == 15
    assert await other.read_file("/rotating.log") == b"after rotation\n"


async def test_closing_one_append_handle_keeps_its_length_for_the_others(fs: FileSystem) -> None:
    """Two O_APPEND handles of one client: what one wrote before its close stays counted, so the
    other appends after it."""
    h1 = await fs.open("/appended", "a+")
    h2 = await fs.open("/appended", "a+")
    await h2.write(b"x" * 100)
    await h2.close()
    assert h1.size == 100
    assert h1.seek(0, os.SEEK_END) == 100
    assert await fs.read_batch([(h1, 0, 64)]) == [b"x" * 64]
    await h1.write(b"y" * 10)
    await h1.close()
    assert await fs.read_file("/appended") == b"x" * 100 + b"y" * 10


async def test_read_batch_by_path_sees_this_clients_unflushed_writes(fs: FileSystem) -> None:
    w = await fs.open("/batched", "w+")
    await w.write(b"z" * 50)  # buffered in this client
    assert await w.pread(50, 0) == b"z" * 50
    assert await fs.read_batch([("/batched", 0, 50), ("/batched", 40, 100)]) == [b"z" * 50, b"z" * 10]
    await w.close()
    assert await fs.read_batch([("/batched", 0, 100)]) == [b"z" * 50]
