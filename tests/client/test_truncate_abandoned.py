"""A truncate abandoned while meta trims the file on storage is finished by meta, not left half
made: meta trims before it commits the new length, so a truncate whose trim was made in part
(one chain answered, another did not before the call's deadline) and that then never committed
left the file at its old length over chunks that were gone: zeros, for ever, after a truncate
that had failed (a helper's run: meta killed 20 ms into a truncate, its client with it, left a
24 MiB file of zeros). Two storage nodes, one copy each, so that one chain can be stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from fs_cluster import FsCluster

from fs3.client import FileSystem
from fs3.errors import FS3Error

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

CHUNK = 1 << 20


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FsCluster]:
    async with FsCluster(
        tmp_path_factory.mktemp("fs"), storage_nodes=2, chains=2, replication=1, stripe=2
    ) as c:
        yield c


async def test_a_truncate_whose_trim_was_made_in_part_is_finished_by_meta(cluster: FsCluster) -> None:
    other = await cluster.connect()
    data = os.urandom(4 * CHUNK)  # chunks 0 and 2 on one chain, 1 and 3 on the other
    await other.write_file("/cut", data)
    fs: FileSystem = await cluster.connect(rpc_timeout_s=2.0)
    await fs.stat("/cut")
    stopped = cluster.cluster.nodes[1].proc
    assert stopped is not None and stopped.popen is not None
    os.kill(stopped.popen.pid, signal.SIGSTOP)  # its chain's trim waits; the other's is made
    try:
        # the truncate fails (no answer in time), or its caller gives up: meta's attempts end at
        # their deadlines, none committed
        with contextlib.suppress(TimeoutError, FS3Error):
            await asyncio.wait_for(fs.truncate("/cut", 0), 4.0)
        await asyncio.sleep(2.5)
    finally:
        os.kill(stopped.popen.pid, signal.SIGCONT)
    # once the record's time (the call's deadline and a margin) has passed, a collector round
    # finishes it as the truncate asked (before, the old length stayed over the trimmed chunks)
    deadline = time.monotonic() + 30
    while (await other.stat("/cut")).st_size != 0:
        assert time.monotonic() < deadline, "the abandoned truncate was not finished"
        await asyncio.sleep(0.5)
    assert await other.read_file("/cut") == b""
    # the file goes on as any other: written again, it reads back whole (no chunk of before)
    await other.write_file("/cut", b"x" * (3 * CHUNK))
    assert await other.read_file("/cut") == b"x" * (3 * CHUNK)


async def test_a_truncate_cut_short_by_meta_killed_mid_trim_is_finished_after_its_restart(
    cluster: FsCluster,
) -> None:
    """Meta killed while it trims (its client gone with it): the record is in the store, and the
    restarted meta finishes the truncate once its time has passed (a helper's run left a 24 MiB
    file of zeros at its old length)."""
    other = await cluster.connect()
    data = os.urandom(4 * CHUNK)
    await other.write_file("/killed", data)
    fs: FileSystem = await cluster.connect(rpc_timeout_s=3.0)
    await fs.stat("/killed")
    stopped = cluster.cluster.nodes[1].proc
    assert stopped is not None and stopped.popen is not None
    os.kill(stopped.popen.pid, signal.SIGSTOP)
    try:
        task = asyncio.ensure_future(fs.truncate("/killed", CHUNK // 2))
        await asyncio.sleep(1.0)  # one chain trimmed, the other's trim waiting
        cluster.kill_meta(0)
        task.cancel()  # the client gives up with it
        with contextlib.suppress(asyncio.CancelledError, FS3Error):
            await task
    finally:
        os.kill(stopped.popen.pid, signal.SIGCONT)
    cluster.start_meta(0)
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(FS3Error):  # (meta starting)
            if (await other.stat("/killed")).st_size == CHUNK // 2:
                break
        assert time.monotonic() < deadline, "the truncate cut short was not finished"
        await asyncio.sleep(0.5)
    assert await other.read_file("/killed") == data[: CHUNK // 2]
