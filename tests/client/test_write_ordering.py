"""Write order and acknowledged bytes in the native client's write path (client.file.OpenFile,
client.filesystem.File), over a real cluster: whatever the calls that returned wrote is what
storage and meta hold after close, in the order the calls were made, whichever task, handle or
kind of write (buffered, write-through, O_APPEND) made them, and a caller that gives up on a
write does not take earlier acknowledged bytes with it.

Each chain has one replica, on its own storage daemon, so stopping a daemon (SIGSTOP) stalls the
writes of one chain only: with one flush slot per handle, a flush of a chunk there holds the slot
and keeps every later flush of the handle waiting, for as long as the test wants.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from fs_cluster import FsCluster

from fs3.client import FileSystem
from fs3.client.file import chain_of
from fs3.client.filesystem import File

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHUNK = 1 << 20


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FsCluster]:
    async with FsCluster(
        tmp_path_factory.mktemp("order"),
        chains=3,
        replication=1,
        stripe=3,
        mgmtd_extra={"heartbeat_timeout_s": 10.0},  # a daemon stopped for a moment stays in routing
    ) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fs(cluster: FsCluster) -> FileSystem:
    """One flush in flight per handle, a small buffer and a small scattered buffer."""
    return await cluster.connect(max_flushes_in_flight=1, write_buffer_bytes=64 << 10, write_scatter_bytes=64)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def other(cluster: FsCluster) -> FileSystem:
    """Another client: it sees what reached storage and meta, nothing buffered."""
    return await cluster.connect()


@contextlib.contextmanager
def stalled(c: FsCluster, f: File, chunk_index: int) -> Iterator[None]:
    """The storage daemon of chunk ``chunk_index`` of ``f`` stopped: writes there go unanswered
    until the block ends."""
    (target,) = c.cluster.chain_targets[chain_of(f.handle.layout, chunk_index)]
    proc = c.cluster.node_of_target(target).proc
    assert proc is not None and proc.popen is not None
    os.kill(proc.popen.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.popen.pid, signal.SIGCONT)


async def settle(task: asyncio.Task[object], timeout_s: float = 0.5) -> None:
    """Give ``task`` time to finish, if it can while a daemon is stopped. (Where a test waits here,
    the write path without ordering finished at once, in the wrong order; with it, the task
    cannot finish until the daemon runs again, and the test does not depend on this time.)"""
    await asyncio.wait([task], timeout=timeout_s)


# -- a cancelled write ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "trigger"),
    [
        # a large write elsewhere sends the buffer's run to a flush of its own
        ("run", (2 * CHUNK, b"Z" * (300 << 10))),
        # a small write elsewhere moves the run into the scattered buffer, now over its 64 bytes
        ("scattered", (4096, b"z" * 10)),
    ],
)
async def test_a_write_given_up_on_keeps_the_bytes_written_before_it(
    cluster: FsCluster, fs: FileSystem, other: FileSystem, name: str, trigger: tuple[int, bytes]
) -> None:
    path = f"/given-up-{name}"
    f = await fs.open(path, "w")
    with stalled(cluster, f, 5):
        await f.pwrite(b"F" * CHUNK, 5 * CHUNK)  # completes a chunk: its flush holds the one slot
        await f.pwrite(b"X" * 100, 0)  # buffered: acknowledged
        # the next write takes X out of the buffer into a flush that waits for the slot, and its
        # caller gives up while it waits
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(f.pwrite(trigger[1], trigger[0]), 0.2)
    await f.close()
    data = await other.read_file(path)
    assert len(data) == 6 * CHUNK
    assert data[:100] == b"X" * 100
    assert data[100 : 5 * CHUNK] == bytes(5 * CHUNK - 100)  # the given-up write left nothing
    assert data[5 * CHUNK :] == b"F" * CHUNK


async def test_a_write_given_up_on_once_its_bytes_were_taken_counts(
    cluster: FsCluster, fs: FileSystem, other: FileSystem
) -> None:
    """A write whose bytes filled the buffer, given up on as it waits for a slot for their flush:
    the flush goes on, so the write was made and counts. The position and the length stayed before
    it, its bytes landed past the file's end, and a truncate that later extended the file showed
    them where zeros belong."""
    f = await fs.open("/taken", "w")
    with stalled(cluster, f, 5):
        await f.pwrite(b"F" * CHUNK, 5 * CHUNK)  # completes a chunk: its flush holds the one slot
        f.seek(6 * CHUNK)
        with pytest.raises(TimeoutError):  # a full buffer (64 KiB): its flush waits for the slot
            await asyncio.wait_for(f.write(b"E" * (64 << 10)), 0.2)
        assert f.tell() == 6 * CHUNK + (64 << 10)
    assert (await f.stat()).st_size == 6 * CHUNK + (64 << 10)
    await f.close()
    data = await other.read_file("/taken")
    assert len(data) == 6 * CHUNK + (64 << 10)
    assert data[6 * CHUNK :] == b"E" * (64 << 10)


# -- write-throughs -------------------------------------------------------------------------------


async def test_a_write_through_lands_after_an_older_buffered_write_of_its_range(
    cluster: FsCluster, fs: FileSystem, other: FileSystem
) -> None:
    f = await fs.open("/overtaken", "w+")
    with stalled(cluster, f, 5):
        await f.pwrite(b"F" * CHUNK, 5 * CHUNK)  # holds the slot
        await f.pwrite(b"X" * 100, 0)  # buffered: acknowledged
        push = asyncio.create_task(f.pwrite(b"Z" * (300 << 10), 2 * CHUNK))  # X waits for the slot
        through = asyncio.create_task(f.write_parallel([(0, b"Y" * 100)]))  # a later write over X
        await settle(through)
    await push
    assert await through == 100
    assert await f.pread(100, 0) == b"Y" * 100
    await f.close()
    data = await other.read_file("/overtaken")
    assert len(data) == 6 * CHUNK
    assert data[:100] == b"Y" * 100
    assert data[2 * CHUNK : 2 * CHUNK + (300 << 10)] == b"Z" * (300 << 10)
    assert data[5 * CHUNK :] == b"F" * CHUNK


async def test_close_after_a_failed_write_parallel_waits_for_its_other_pieces(
    cluster: FsCluster, fs: FileSystem, other: FileSystem
) -> None:
    """A piece that fails at once (a strided view: not contiguous) does not make write_parallel
    return, nor close settle the length, while another piece is still on its way to storage."""
    f = await fs.open("/checkpoint", "w+")
    shard = os.urandom(CHUNK)
    strided = memoryview(bytes(200))[::2]
    with stalled(cluster, f, 4):
        pieces = asyncio.create_task(f.write_parallel([(0, strided), (4 * CHUNK, shard)]))
        await settle(pieces)
        ended_early = pieces.done()  # the shard cannot be written yet: write_parallel must not end
        closing = asyncio.create_task(f.close())
        await settle(closing)
    with pytest.raises(TypeError):
        await pieces
    await closing
    assert not ended_early
    data = await other.read_file("/checkpoint")
    assert len(data) == 5 * CHUNK
    assert data[4 * CHUNK :] == shard


# -- O_APPEND -------------------------------------------------------------------------------------


@pytest.mark.parametrize("files", [1, 2])
async def test_appends_from_several_tasks_each_get_a_range_of_their_own(
    fs: FileSystem, other: FileSystem, files: int
) -> None:
    """Two tasks append records to one File, or each through a File of its own: no record lands
    over another (each write fills the 64 KiB buffer, so appends wait for the flush slot)."""
    path = f"/log-{files}"
    handles = [await fs.open(path, "a") for _ in range(files)]
    rec = 64 << 10

    async def appender(f: File, tag: bytes) -> None:
        for _ in range(6):
            assert await f.write(tag * rec) == rec

    await asyncio.gather(appender(handles[0], b"a"), appender(handles[-1], b"b"))
    assert handles[0].size == 12 * rec
    for f in handles:
        await f.close()
    data = await other.read_file(path)
    assert len(data) == 12 * rec
    records = [data[i : i + rec] for i in range(0, len(data), rec)]
    assert all(r == r[:1] * rec for r in records)
    assert sorted(r[:1] for r in records) == [b"a"] * 6 + [b"b"] * 6


async def test_writes_of_several_tasks_through_one_file_each_get_a_range_of_their_own(
    fs: FileSystem, other: FileSystem
) -> None:
    """Tasks sharing one File (its position, like a shared descriptor's): no record lands over
    another, though each write waits for the flush slot."""
    f = await fs.open("/shared-position", "w")
    rec = 64 << 10

    async def writer(tag: bytes) -> None:
        for _ in range(6):
            assert await f.write(tag * rec) == rec

    await asyncio.gather(writer(b"a"), writer(b"b"))
    assert f.tell() == 12 * rec
    await f.close()
    data = await other.read_file("/shared-position")
    assert len(data) == 12 * rec
    records = [data[i : i + rec] for i in range(0, len(data), rec)]
    assert all(r == r[:1] * rec for r in records)
    assert sorted(r[:1] for r in records) == [b"a"] * 6 + [b"b"] * 6


# -- several handles of one file ------------------------------------------------------------------


async def test_the_later_of_two_handles_buffered_writes_wins(fs: FileSystem, other: FileSystem) -> None:
    for trial in range(8):
        path = f"/two-handles-{trial}"
        f1 = await fs.open(path, "w+")
        f2 = await fs.open(path, "r+")
        await f1.pwrite(b"A" * 10, 0)
        await f2.pwrite(b"B" * 10, 0)
        assert await f1.pread(10, 0) == b"B" * 10
        assert await f2.pread(10, 0) == b"B" * 10
        await f2.close()  # flushes B first; A, older, must not land over it when f1 closes
        await f1.close()
        assert await other.read_file(path) == b"B" * 10


async def test_a_write_lands_after_another_handles_older_write_still_waiting_to_flush(
    cluster: FsCluster, fs: FileSystem, other: FileSystem
) -> None:
    f1 = await fs.open("/two-handles-waiting", "w+")
    f2 = await fs.open("/two-handles-waiting", "r+")
    with stalled(cluster, f1, 5):
        await f1.pwrite(b"F" * CHUNK, 5 * CHUNK)  # holds f1's slot
        await f1.pwrite(b"A" * 100, 0)  # buffered: acknowledged
        push = asyncio.create_task(f1.pwrite(b"Z" * (300 << 10), 2 * CHUNK))  # A waits for f1's slot
        later = asyncio.create_task(f2.pwrite(b"B" * CHUNK, 0))  # a whole chunk: flushed at once
        await settle(later)
    await push
    await later
    assert await f1.pread(100, 0) == b"B" * 100
    await f1.close()
    await f2.close()
    data = await other.read_file("/two-handles-waiting")
    assert data[:CHUNK] == b"B" * CHUNK


async def test_a_write_through_flushes_another_handles_older_bytes_first(
    fs: FileSystem, other: FileSystem
) -> None:
    f1 = await fs.open("/two-handles-through", "w+")
    f2 = await fs.open("/two-handles-through", "r+")
    await f1.pwrite(b"A" * 100, 0)  # buffered in f1
    assert await f2.write_parallel([(50, b"B" * 100)]) == 100
    assert await f1.pread(150, 0) == b"A" * 50 + b"B" * 100
    await f2.close()
    await f1.close()
    assert await other.read_file("/two-handles-through") == b"A" * 50 + b"B" * 100
