"""Native AIO reads (storage.aio) and the storage daemon's cold small reads through them.

The reads are real: O_DIRECT files on the test's disk, ``io_submit`` to the kernel, completions
through an eventfd on the running loop. Where the machine has no native AIO, or the directory's
file system refuses O_DIRECT (tmpfs before Linux 6.6), the tests skip and say which.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from cluster import Cluster

from fs3.client.storage_client import ReadRequest
from fs3.errors import FS3Error, StatusCode
from fs3.storage.aio import ALIGN, AioError, AioReader, open_aio

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


def _direct_fd(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:
            pytest.skip(f"the file system under {path.parent} refuses O_DIRECT")
        raise


@pytest_asyncio.fixture
async def aio() -> AsyncIterator[AioReader]:
    reader = open_aio(asyncio.get_running_loop(), depth=32, slot_bytes=64 << 10)
    if reader is None:
        pytest.skip("no native AIO on this machine (see the warning logged by open_aio)")
    try:
        yield reader
    finally:
        await reader.close()
    assert reader.in_flight == 0


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(MiB + 1000)  # not a multiple of ALIGN: the last read is short
    path = tmp_path / "data"
    path.write_bytes(data)
    return path, data


async def test_a_batch_of_reads_returns_each_its_bytes(aio: AioReader, data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    fd = _direct_fd(path)
    try:
        rng = random.Random(7)
        reads = [
            (fd, rng.randrange(len(data) // ALIGN) * ALIGN, rng.choice([4096, 8192, 65536]))
            for _ in range(20)
        ]
        reads.append((fd, len(data) // ALIGN * ALIGN, 8192))  # the tail: 1000 bytes
        reads.append((fd, 2 * MiB, 4096))  # past the end: nothing
        batches = aio.batches
        futures = aio.read_batch(reads)
        assert aio.batches == batches + 1 and aio.free_slots == 32 - len(reads)
        for (_, offset, length), fut in zip(reads, futures, strict=True):
            got = await fut
            assert bytes(got.data) == data[offset : offset + length]
            aio.release(got)
        assert aio.free_slots == 32
    finally:
        os.close(fd)


async def test_refused_reads_fail_alone_and_leak_no_slot(
    aio: AioReader, data_file: tuple[Path, bytes]
) -> None:
    path, data = data_file
    fd = _direct_fd(path)
    wfd = os.open(path, os.O_WRONLY)
    try:
        with pytest.raises(AioError) as e:
            aio.read_batch([(fd, 0, 4096), (fd, 100, 4096)])  # unaligned offset
        assert e.value.errno == errno.EINVAL and aio.free_slots == 32
        with pytest.raises(AioError) as e:
            aio.read_batch([(fd, 0, 128 << 10)])  # larger than a slot
        assert e.value.errno == errno.EINVAL and aio.free_slots == 32
        with pytest.raises(AioError) as e:
            aio.read_batch([(fd, 0, 4096)] * 33)
        assert e.value.errno == errno.EAGAIN and aio.free_slots == 32

        # the kernel refuses a read of a write-only descriptor at submission: the reads before it
        # complete, it and those after it fail with its errno, every slot comes back
        futures = aio.read_batch([(fd, 0, 4096), (wfd, 0, 4096), (fd, 4096, 4096)])
        first = await futures[0]
        assert bytes(first.data) == data[:4096]
        aio.release(first)
        for fut in futures[1:]:
            with pytest.raises(AioError) as e:
                await fut
            assert e.value.errno == errno.EBADF
        assert aio.free_slots == 32
    finally:
        os.close(fd)
        os.close(wfd)


async def test_close_waits_for_reads_in_flight(data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    reader = open_aio(asyncio.get_running_loop(), depth=8, slot_bytes=4096)
    if reader is None:
        pytest.skip("no native AIO on this machine")
    fd = _direct_fd(path)
    try:
        futures = reader.read_batch([(fd, i * ALIGN, ALIGN) for i in range(8)])
        await reader.close()  # the kernel owned the buffers until the reads completed
        assert reader.in_flight == 0 and all(f.done() for f in futures)
        with pytest.raises(AioError):
            reader.read_batch([(fd, 0, 4096)])
    finally:
        os.close(fd)


def _aio_max_nr() -> int:
    return int(Path("/proc/sys/fs/aio-max-nr").read_text())


async def test_open_aio_says_why_it_cannot() -> None:
    limit = _aio_max_nr()
    assert open_aio(asyncio.get_running_loop(), depth=limit + 1) is None  # io_setup: EAGAIN
    with pytest.raises(ValueError):
        AioReader(asyncio.get_running_loop(), depth=4, slot_bytes=1000)


# -- the storage daemon ---------------------------------------------------------------------------


def _reads(metrics: str, where: str) -> float:
    m = re.search(rf'fs3_storage_batched_reads_total\{{where="{where}"\}} (\S+)', metrics)
    assert m is not None, metrics
    return float(m.group(1))


async def test_cold_small_reads_go_through_aio_and_damage_is_still_caught(tmp_path: Path) -> None:
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1, metrics=True) as c:
        client = await c.storage_client()
        chain = c.chain_ids[0]
        chunks = {i: os.urandom(MiB) for i in range(6)}
        for i, data in chunks.items():  # whole chunks: written with O_DIRECT, not in the page cache
            await client.write(chain, 9, i, 0, data, MiB)
        before = await c.scrape(0)
        rng = random.Random(3)
        asks = [
            (i, rng.randrange(MiB // 4096) * 4096 + rng.choice([0, 100]), 4096)
            for i in chunks
            for _ in range(8)
        ]
        got = await client.batch_read([ReadRequest(chain, 9, i, off, n) for i, off, n in asks])
        assert got == [chunks[i][off : off + n] for i, off, n in asks]
        after = await c.scrape(0)
        assert _reads(after, "aio") - _reads(before, "aio") == len(asks)
        assert _reads(after, "io_thread") == _reads(before, "io_thread")

        # damage one block of chunk 2 on disk, behind the daemon's back: an AIO read of it fails
        # its checksum, is read again the usual way, and the error reaches the client; the other
        # reads of the batch are served
        node = c.nodes[0]
        target = next(iter(node.targets.values()))
        files = sorted((target / "chunks").glob(f"*/{(9).to_bytes(8, 'big').hex()}*"))
        assert files, list((target / "chunks").iterdir())
        victim = [f for f in files if _chunk_index(f) == 2]
        assert len(victim) == 1, files
        _damage(victim[0], 5 * 4096 + 17, chunks[2][5 * 4096 + 17 : 5 * 4096 + 25])
        with pytest.raises(FS3Error) as e:
            await client.batch_read(
                [ReadRequest(chain, 9, 2, 5 * 4096, 4096), ReadRequest(chain, 9, 3, 0, 4096)]
            )
        assert e.value.code == StatusCode.STORAGE_CHECKSUM_MISMATCH, e.value
        assert "block 5 " in e.value.message, e.value
        assert await client.batch_read(
            [ReadRequest(chain, 9, 2, 6 * 4096, 4096), ReadRequest(chain, 9, 1, 0, 4096)]
        ) == [
            chunks[2][6 * 4096 : 7 * 4096],
            chunks[1][:4096],
        ]


def _damage(path: Path, offset: int, was: bytes) -> None:
    """Overwrite ``was`` at ``offset`` of a chunk file with other bytes, durably."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in was))
        f.flush()
        os.fsync(f.fileno())


def _files_of(target: Path, cid: bytes) -> list[Path]:
    return sorted((target / "chunks").glob(f"*/{cid.hex()}.*"))


def _chunk_index(path: Path) -> int:
    # file name: <chunk id hex>.<file id hex>; a chunk id is the inode id then the chunk index
    cid = bytes.fromhex(path.name.split(".")[0])
    return int.from_bytes(cid[8:], "big")


async def test_without_aio_cold_reads_take_the_old_ways(tmp_path: Path) -> None:
    async with Cluster(
        tmp_path / "c", storage_nodes=1, replication=1, metrics=True, storage_extra={"aio_reads": False}
    ) as c:
        client = await c.storage_client()
        chain = c.chain_ids[0]
        data = os.urandom(MiB)
        await client.write(chain, 4, 0, 0, data, MiB)
        asks = [ReadRequest(chain, 4, 0, i * 8192, 4096) for i in range(20)]
        assert await client.batch_read(asks) == [data[i * 8192 : i * 8192 + 4096] for i in range(20)]
        metrics = await c.scrape(0)
        assert _reads(metrics, "aio") == 0 and _reads(metrics, "inline") >= 20


async def test_more_cold_reads_than_aio_slots_take_the_io_threads(tmp_path: Path) -> None:
    async with Cluster(
        tmp_path / "c", storage_nodes=1, replication=1, metrics=True, storage_extra={"aio_depth": 4}
    ) as c:
        client = await c.storage_client()
        chain = c.chain_ids[0]
        chunks = {i: os.urandom(MiB) for i in range(4)}
        for i, data in chunks.items():
            await client.write(chain, 3, i, 0, data, MiB)
        before = await c.scrape(0)
        asks = [(i, k * 20480 + 512, 4096) for i in chunks for k in range(10)]
        got = await client.batch_read([ReadRequest(chain, 3, i, off, n) for i, off, n in asks])
        assert got == [chunks[i][off : off + n] for i, off, n in asks]
        after = await c.scrape(0)
        by_aio = _reads(after, "aio") - _reads(before, "aio")
        by_threads = _reads(after, "io_thread") - _reads(before, "io_thread")
        assert by_aio == 4 and by_threads == len(asks) - 4, (by_aio, by_threads)
        # every slot came back: the next batch goes through AIO again
        again = await client.batch_read(
            [ReadRequest(chain, 3, 0, 0, 4096), ReadRequest(chain, 3, 1, 0, 4096)]
        )
        assert again == [chunks[0][:4096], chunks[1][:4096]]
        assert _reads(await c.scrape(0), "aio") - _reads(after, "aio") == 2


async def test_reads_of_layered_versions_go_through_aio(tmp_path: Path) -> None:
    """A small overwrite of a whole chunk makes a layered version (its blocks from the data file
    and an overlay file); AIO reads it in pieces from both files."""
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1, metrics=True) as c:
        client = await c.storage_client()
        chain = c.chain_ids[0]
        model = bytearray(os.urandom(MiB))
        await client.write(chain, 8, 0, 0, bytes(model), MiB)
        patch = os.urandom(3 * 4096)
        await client.write(chain, 8, 0, 100 * 4096 + 10, patch, MiB)
        model[100 * 4096 + 10 : 103 * 4096 + 10] = patch
        target = next(iter(c.nodes[0].targets.values()))
        cid = (8).to_bytes(8, "big") + (0).to_bytes(8, "big")
        assert len(_files_of(target, cid)) == 2, "the overwrite did not make a layered version"
        before = await c.scrape(0)
        asks = [
            (0, 4096),  # data file only
            (100 * 4096, 4096),  # overlay only
            (99 * 4096 + 100, 8192),  # data file, then overlay
            (102 * 4096, 12288),  # overlay, then data file
            (98 * 4096, 8 * 4096),  # data file, overlay, data file
            (MiB - 5000, 5000),  # the end
        ]
        got = await client.batch_read([ReadRequest(chain, 8, 0, off, n) for off, n in asks])
        assert got == [bytes(model[off : off + n]) for off, n in asks]
        after = await c.scrape(0)
        assert _reads(after, "aio") - _reads(before, "aio") == len(asks)
        assert _reads(after, "io_thread") == _reads(before, "io_thread")


async def test_reads_of_versions_layered_by_several_ranges_go_through_aio(tmp_path: Path) -> None:
    """A write of several small ranges of a chunk over replication 3 makes a layered version with
    several overlay runs on every replica; AIO reads it in pieces from both files."""
    async with Cluster(tmp_path / "c", storage_nodes=3, replication=3, metrics=True) as c:
        client = await c.storage_client()
        chain = c.chain_ids[0]
        model = bytearray(os.urandom(MiB))
        await client.write(chain, 9, 0, 0, bytes(model), MiB)
        ranges = [(10 * 4096 + 5, os.urandom(10)), (40 * 4096, os.urandom(8192)), (200 * 4096 - 1, b"xy")]
        for offset, data in ranges:
            model[offset : offset + len(data)] = data
        extents = [(offset, len(data)) for offset, data in ranges]
        await client.write(chain, 9, 0, extents[0][0], b"".join(d for _, d in ranges), MiB, extents)
        cid = (9).to_bytes(8, "big") + (0).to_bytes(8, "big")
        for node in c.nodes:
            target = next(iter(node.targets.values()))
            files = _files_of(target, cid)
            assert len(files) == 2, "the write did not make a layered version"
            # blocks 10, 40 and 41, 199 and 200
            assert sorted(p.stat().st_size for p in files) == [5 * 4096, MiB]
        asks = [
            (0, 11 * 4096),  # data file, then the first run
            (9 * 4096, 3 * 4096),  # data file, the first run, data file
            (39 * 4096 + 7, 3 * 4096),  # data file, the second run
            (41 * 4096 + 100, 8192),  # the second run, then data file
            (199 * 4096, 8192),  # the third run only
        ]
        scrapes = [await c.scrape(i) for i in range(3)]
        got = await client.batch_read([ReadRequest(chain, 9, 0, off, n) for off, n in asks])
        assert got == [bytes(model[off : off + n]) for off, n in asks]
        again = [await c.scrape(i) for i in range(3)]

        def count(where: str) -> float:
            return sum(_reads(b, where) - _reads(a, where) for a, b in zip(scrapes, again, strict=True))

        # those that find a piece not in the page cache (the data file was written with O_DIRECT)
        # go through AIO, the others are read inline (the small overlay file went through the cache)
        assert count("aio") >= 1 and count("aio") + count("inline") == len(asks)
        assert await client.batch_read([ReadRequest(chain, 9, 0, 0, MiB)]) == [bytes(model)]


async def test_a_lone_cold_read_is_read_at_once_on_the_loop(tmp_path: Path) -> None:
    """A read alone in its request costs less read right away on the loop than submitted and
    waited for, while the disk is fast; so does the one cold read of a request whose other reads
    are cached."""
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1, metrics=True) as c:
        client = await c.storage_client()
        chain = c.chain_ids[0]
        data = os.urandom(MiB)
        await client.write(chain, 2, 0, 0, data, MiB)
        before = await c.scrape(0)
        for off in (0, 4096 * 7 + 3, MiB - 4096):
            assert await client.batch_read([ReadRequest(chain, 2, 0, off, 4096)]) == [data[off : off + 4096]]
        after = await c.scrape(0)
        assert _reads(after, "inline") - _reads(before, "inline") == 3
        assert _reads(after, "aio") == _reads(before, "aio")
        assert _reads(after, "io_thread") == _reads(before, "io_thread")
        small = os.urandom(8192)  # written through the page cache: cached
        await client.write(chain, 2, 1, 0, small, MiB)
        pair = [ReadRequest(chain, 2, 1, 0, 4096), ReadRequest(chain, 2, 0, 40960, 4096)]
        assert await client.batch_read(pair) == [small[:4096], data[40960:45056]]
        last = await c.scrape(0)
        assert _reads(last, "inline") - _reads(after, "inline") == 2 and _reads(last, "aio") == _reads(
            after, "aio"
        )
