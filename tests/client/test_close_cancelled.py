"""A close whose caller gives up (``asyncio.wait_for`` times out) while the file's flushes are still
pending, over a real cluster: the close goes on in the background, and the file's write session
ends only once the flushes are on storage. Ended earlier, a file unlinked meanwhile would be
collected before they land, and the chunks they write would belong to no inode, for good.

Storage is slow for the writing client only: its storage writes wait at a gate the test opens
(the meta daemon's garbage collector, which removes chunks on the same storage daemons, is not
held up). With one flush slot per handle, a completed chunk's flush holds the slot and the close's
flush of the rest queues behind it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from cluster import wait_until
from fs_cluster import FsCluster

from fs3.client import FileSystem
from fs3.client.filesystem import File
from fs3.errors import FS3Error, StatusCode

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHUNK = 1 << 20


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FsCluster]:
    async with FsCluster(tmp_path_factory.mktemp("close-cancelled")) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def other(cluster: FsCluster) -> FileSystem:
    """Another client: it sees what reached storage and meta."""
    return await cluster.connect()


class Gate:
    """Holds a client's storage writes until :meth:`open`."""

    def __init__(self, fs: FileSystem, monkeypatch: pytest.MonkeyPatch) -> None:
        self._opened = asyncio.Event()
        self._write = fs.storage.write
        monkeypatch.setattr(fs.storage, "write", self._gated)

    async def _gated(self, *args: Any, **kwargs: Any) -> Any:
        await self._opened.wait()
        return await self._write(*args, **kwargs)

    def open(self) -> None:
        self._opened.set()


async def close_given_up(
    cluster: FsCluster, monkeypatch: pytest.MonkeyPatch, path: str
) -> tuple[FileSystem, File, Gate, bytes]:
    """A writer (a client of its own) whose close of ``path`` timed out with flushes pending."""
    fs = await cluster.connect(max_flushes_in_flight=1)
    gate = Gate(fs, monkeypatch)
    data = os.urandom(CHUNK) + os.urandom(100 << 10)
    f = await fs.open(path, "w")
    await f.write(data[:CHUNK])  # completes chunk 0: its flush holds the one slot
    await f.write(data[CHUNK:])  # buffered: the close's flush of it waits for the slot
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(f.close(), 0.2)
    return fs, f, gate, data


async def gone(fs: FileSystem, inode_id: int) -> bool:
    """Whether meta no longer has the inode (the garbage collector finished it)."""
    try:
        await fs.meta.stat(inode_id)
    except FS3Error as e:
        if e.code == StatusCode.NOT_FOUND:
            return True
        raise
    return False


async def chunks_of(cluster: FsCluster, fs: FileSystem, inode_id: int) -> list[tuple[int, int]]:
    """(target, chunk index) of every chunk of the inode on any storage target."""
    out = []
    for targets in cluster.cluster.chain_targets.values():
        for target in targets:
            for cm in await fs.storage.dump_chunk_meta(target, inode_id):
                out.append((target, cm.key.chunk_index))
    return sorted(out)


async def test_a_file_unlinked_after_a_given_up_close_leaves_no_chunk(
    cluster: FsCluster, other: FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, f, gate, _ = await close_given_up(cluster, monkeypatch, "/unlinked")
    ino = f.inode_id
    await fs.unlink("/unlinked")
    # a file unlinked after the victim and closed for good: once the collector has finished it, a
    # collection pass has looked at the victim too, unlinked and with its flushes still held
    async with await fs.open("/probe", "w") as p:
        probe = p.inode_id
    await fs.unlink("/probe")
    await wait_until(lambda: gone(other, probe), 20, "the probe file to be collected")
    gate.open()  # the flushes land now
    await wait_until(lambda: f.handle.settled, 20, "the flushes to end")
    await wait_until(lambda: gone(other, ino), 20, "the unlinked file to be collected")
    assert await chunks_of(cluster, other, ino) == []
    await fs.close()


async def test_a_given_up_close_still_settles_the_files_length_and_content(
    cluster: FsCluster, other: FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, f, gate, data = await close_given_up(cluster, monkeypatch, "/kept")
    gate.open()
    await fs.close()  # waits for the close that goes on in the background
    assert (await other.stat("/kept")).st_size == len(data)
    assert await other.read_file("/kept") == data


@pytest.mark.parametrize(("method", "mode"), [("Open", "r+"), ("Create", "x")])
async def test_an_open_given_up_on_after_meta_opened_its_session_has_it_closed(
    cluster: FsCluster, other: FileSystem, monkeypatch: pytest.MonkeyPatch, method: str, mode: str
) -> None:
    """An open (or a create) whose caller was cancelled once meta had opened the file's session,
    its answer still on the way: nobody closed that session, which kept the file, once unlinked,
    from being collected for as long as the client lived. The client now asks meta what became of
    the request, and closes the session it made."""
    path = f"/given-up-{method.lower()}"
    if method == "Open":
        await other.write_file(path, b"x" * 100)
    fs = await cluster.connect()
    real = fs.meta._call
    made = asyncio.Event()

    async def answer_lost(name: str, *args: Any, **kwargs: Any) -> Any:
        out = await real(name, *args, **kwargs)
        if name == method:
            made.set()
            await asyncio.Event().wait()  # meta made the session; its answer never comes
        return out

    monkeypatch.setattr(fs.meta, "_call", answer_lost)
    task = asyncio.ensure_future(fs.open(path, mode))
    await asyncio.wait_for(made.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    ino = (await other.stat(path)).st_ino
    await other.unlink(path)
    await wait_until(lambda: gone(other, ino), 20, "the unlinked file to be collected")
    await fs.close()


async def test_a_client_close_given_up_on_then_made_again_waits_for_its_files(
    cluster: FsCluster, other: FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FileSystem.close() cancelled while it closes the files still open, then called again: the
    second close ended the connections at once (the files counted as closed), under the first
    one's file closes, whose flushes then failed: the file was left empty."""
    fs = await cluster.connect()
    gate = Gate(fs, monkeypatch)
    data = os.urandom(3 * CHUNK)
    f = await fs.open("/client-close", "w")
    await f.write(data)  # three whole chunks: their flushes wait at the gate
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(fs.close(), 0.2)
    gate.open()
    await fs.close()
    assert await other.read_file("/client-close") == data


async def test_a_truncate_given_up_on_while_meta_trims_storage_is_made_whole(
    cluster: FsCluster, other: FileSystem
) -> None:
    """A truncate whose caller was cancelled (Ctrl-C in the sync API) while meta waited for storage
    to trim the file is made once storage answers: meta has trimmed the file by then, so it must
    not be called off (settled as never to happen, the file kept its length over zeros). The
    file ends as the truncate leaves it, whole."""
    data = os.urandom(3 * CHUNK)
    await other.write_file("/cut-short", data)
    fs = await cluster.connect()
    procs = [n.proc.popen.pid for n in cluster.cluster.nodes if n.proc is not None and n.proc.popen]
    for pid in procs:
        os.kill(pid, signal.SIGSTOP)  # meta's trim of the file's chunks waits
    try:
        task = asyncio.ensure_future(fs.truncate("/cut-short", CHUNK))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(2.0)  # the client asks meta about it (SETTLE_FIRST_S)
    finally:
        for pid in procs:
            os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(3.0)  # meta's trim goes on once storage answers
    assert await other.read_file("/cut-short") == data[:CHUNK]
    await fs.close()


async def test_an_o_trunc_open_given_up_on_while_meta_trims_storage_is_made_whole(
    cluster: FsCluster, other: FileSystem
) -> None:
    """As a truncate: an O_TRUNC open cancelled while meta trims the file is not settled as never
    to happen (the file kept its length, and read zeros where the trim had been), and its session
    is let expire instead of closed."""
    data = os.urandom(3 * CHUNK)
    await other.write_file("/open-cut-short", data)
    fs = await cluster.connect()
    procs = [n.proc.popen.pid for n in cluster.cluster.nodes if n.proc is not None and n.proc.popen]
    for pid in procs:
        os.kill(pid, signal.SIGSTOP)
    try:
        task = asyncio.ensure_future(fs.open("/open-cut-short", "w"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(2.0)
    finally:
        for pid in procs:
            os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(3.0)
    assert await other.read_file("/open-cut-short") == b""
    await fs.close()
