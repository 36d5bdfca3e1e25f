"""A disk that hangs (its calls neither return nor fail): the target is taken offline after
``disk_stall_s``, its chains go on with their other replicas, and the node's other disks, whose I/O
threads are their own, serve on."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster, wait_until
from prometheus_client import CollectorRegistry

from fs3.config import StorageConfig, load_config
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2
from fs3.storage.chunk_engine import ChunkEngine, StallClock
from fs3.storage.daemon import StorageDaemon

pytestmark = pytest.mark.timeout(150)

CHUNK = 1 << 20


def _cid(inode: int) -> bytes:
    return struct.pack(">BBQHI", 0, 0, inode, 0, 0)


def _hang_writes(engine: ChunkEngine, disk: threading.Event) -> None:
    """New data files of ``engine`` are written only once ``disk`` is set (a disk that hangs)."""
    files = engine._files  # noqa: SLF001 - the disk below the engine
    real = files.write_new

    def write_new(*args, **kwargs):  # type: ignore[no-untyped-def]
        disk.wait(120)
        return real(*args, **kwargs)

    files.write_new = write_new  # type: ignore[method-assign]


@contextlib.contextmanager
def _stuck_update(engine: ChunkEngine) -> Iterator[None]:
    """An update of ``engine`` under way on a disk that hangs, until the block ends."""
    disk = threading.Event()
    _hang_writes(engine, disk)
    stuck = threading.Thread(
        target=lambda: engine.update(_cid(2), 0, b"x" * 4096, chunk_size=CHUNK, chain_ver=1, commit=True),
        daemon=True,
    )
    stuck.start()
    try:
        deadline = time.monotonic() + 30
        while engine.stalled_call() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        yield
    finally:
        disk.set()
        stuck.join(30)


def test_a_call_left_unanswered_past_the_limit_takes_the_target_offline(tmp_path: Path) -> None:
    failures: list[FS3Error] = []
    with ChunkEngine(tmp_path / "t", on_failure=failures.append) as eng:
        eng.update(_cid(1), 0, b"before", chunk_size=CHUNK, chain_ver=1, commit=True)
        assert eng.stalled_call() is None  # nothing under way
        with _stuck_update(eng):
            what, seconds = eng.stalled_call()  # type: ignore[misc]
            assert what == "update" and 0 <= seconds < 60
            assert eng.fail_if_stalled(60.0) is None and eng.online  # not yet past the limit
            time.sleep(0.05)
            error = eng.fail_if_stalled(0.01)
            assert error is not None and error.code == StatusCode.STORAGE_IO_ERROR
            assert "has not answered" in error.message and "update" in error.message
            assert failures == [error] and not eng.online
            with pytest.raises(FS3Error) as e:  # refused at once, not queued behind the disk
                eng.read(_cid(1))
            assert e.value.code == StatusCode.STORAGE_IO_ERROR and "offline" in e.value.message
            assert eng.fail_if_stalled(0.01) is None and failures == [error]  # told once


def test_time_the_process_did_not_run_does_not_count_as_a_stalled_disk(tmp_path: Path) -> None:
    """A storage daemon stopped (SIGSTOP, a paused VM) for longer than disk_stall_s with a call
    under way took that sound target offline for good as it resumed: the call's time counted the
    pause. A check that runs much later than its interval now counts afresh from then."""
    clock = StallClock(1.0)
    assert clock.tick(100.0) == 0.0 and clock.tick(101.0) == 0.0  # on time: from the call's start
    assert clock.tick(146.0) == 146.0  # 45 s late: the process was stopped
    assert clock.tick(147.0) == 146.0
    failures: list[FS3Error] = []
    with ChunkEngine(tmp_path / "t", on_failure=failures.append) as eng, _stuck_update(eng):
        now = time.monotonic() + 45  # the call began before a 45 s pause
        assert eng.fail_if_stalled(30.0, now, since=now - 1) is None and eng.online
        assert eng.fail_if_stalled(30.0, now + 31, since=now - 1) is not None  # stalled since
        assert len(failures) == 1 and not eng.online


async def test_a_disk_that_hangs_is_taken_offline_and_the_nodes_other_disk_serves_on(tmp_path: Path) -> None:
    """Node 0 holds the head of chain 1 (target 101) and the tail of chain 2 (102). Target 101's
    disk hangs under writes to chain 1, more of them than its I/O threads: before, the target
    stayed SERVING and chain 1's writes waited without end; and with one pool of threads for the
    node, the writes to chain 2 waited behind them too."""
    async with Cluster(tmp_path / "c", storage_nodes=2, chains=2, replication=2) as c:
        client = await c.storage_client()
        node = c.nodes[0]
        hung_tid, other_tid = sorted(node.targets)
        assert c.chain_targets[1][0] == hung_tid and c.chain_targets[2][-1] == other_tid
        c.kill_storage(0)
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        cfg = dataclasses.replace(cfg, disk_stall_s=2.0, io_threads=2)
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        await daemon.start()
        disk = threading.Event()
        writes: list[asyncio.Future[object]] = []
        try:
            await c.wait_all_serving(60)
            data = os.urandom(CHUNK)
            for chain_id in c.chain_ids:
                await client.write(chain_id, 1, 0, 0, data, CHUNK)
            assert daemon.targets is not None
            hung = daemon.targets.target(hung_tid)
            _hang_writes(hung.engine.engine, disk)
            writes = [asyncio.ensure_future(client.write(1, 2 + i, 0, 0, data, CHUNK)) for i in range(4)]
            await wait_until(lambda: hung.failed, 20, "the stalled target to be taken offline")
            failure = hung.engine.engine.failure
            assert failure is not None and "has not answered" in failure.message
            await c.wait_chains(lambda ch: hung_tid not in ch.serving, 15, "chain 1 to drop the target")
            # its threads are still in the disk: chain 2's writes reach node 0's other target
            assert not disk.is_set()
            await asyncio.wait_for(client.write(2, 9, 0, 0, data, CHUNK), 15)
            assert daemon.targets.target(other_tid).public_state == common_pb2.SERVING
            await asyncio.wait_for(asyncio.gather(*writes), 60)  # chain 1 went on without it
            for i in range(4):
                assert await client.read(1, 2 + i, 0, 0, CHUNK) == data
            assert await client.read(2, 9, 0, 0, CHUNK) == data
        finally:
            disk.set()
            for w in writes:
                w.cancel()
            await asyncio.gather(*writes, return_exceptions=True)
            await daemon.stop()
