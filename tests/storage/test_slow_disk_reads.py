"""Small reads on a storage daemon whose disk is slow: a read that misses the page cache must not
stall the daemon's event loop (every other request would wait behind the disk).

The slow disk is real: the daemon's process goes into a blkio cgroup that throttles its reads of
the block device under its targets (cgroup v1 ``blkio.throttle.read_iops_device`` or v2
``io.max``). Needs root and such a cgroup; skips, saying which is missing, elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster

from fs3.client.storage_client import ReadRequest
from fs3.storage.chunk_files import ColdReads

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
READ_IOPS = 4  # of the throttled daemon: each read that goes to the disk waits ~250 ms
V1 = Path("/sys/fs/cgroup/blkio")
V2 = Path("/sys/fs/cgroup")


def _whole_disk(path: Path) -> str | None:
    """``major:minor`` of the block device (the whole disk, not a partition) holding ``path``."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not node.exists():
        return None  # tmpfs, overlayfs, ...: no block device to throttle
    if (node / "partition").exists():
        return (node.resolve().parent / "dev").read_text().strip()
    return (node / "dev").read_text().strip()


def _cgroup_kind() -> str | None:
    if (V1 / "blkio.throttle.read_iops_device").exists():
        return "v1"
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "io" in controllers.read_text().split():
        return "v2"
    return None


@contextlib.contextmanager
def throttled_reads(pid: int, path: Path, iops: int) -> Iterator[None]:
    """Throttle reads by process ``pid`` of the disk under ``path`` to ``iops`` per second."""
    if os.geteuid() != 0:
        pytest.skip("throttling a process's disk reads needs root (a blkio cgroup)")
    kind, disk = _cgroup_kind(), _whole_disk(path)
    if kind is None:
        pytest.skip("no cgroup with read throttling (v1 blkio.throttle or v2 io.max) on this machine")
    if disk is None:
        pytest.skip(f"{path} is on no block device (tmpfs?): nothing to throttle")
    root = V1 if kind == "v1" else V2
    group = root / f"fs3-test-slow-{os.getpid()}"
    group.mkdir()
    try:
        if kind == "v1":
            (group / "blkio.throttle.read_iops_device").write_text(f"{disk} {iops}\n")
        else:
            (group / "io.max").write_text(f"{disk} riops={iops}\n")
        (group / "cgroup.procs").write_text(f"{pid}\n")
        try:
            yield
        finally:
            with contextlib.suppress(OSError):  # the process may be gone
                (root / "cgroup.procs").write_text(f"{pid}\n")
    finally:
        group.rmdir()


@pytest.mark.parametrize("aio", [True, False], ids=["aio", "no-aio"])
async def test_a_cold_read_of_a_slow_disk_does_not_hold_up_other_requests(tmp_path: Path, aio: bool) -> None:
    """A lone cold read is read on the event loop while the disk is fast; the daemon learns that
    the disk is slow and then sends such reads through native AIO (the default) or, without it
    (``aio_reads = false``, or where the kernel refuses AIO), to its I/O threads. Either way a read
    of cached bytes is answered while a cold one waits for the disk."""
    async with Cluster(
        tmp_path / "c", storage_nodes=1, replication=1, metrics=True, storage_extra={"aio_reads": aio}
    ) as c:
        client = await c.storage_client()
        chain = c.chain_ids[0]
        chunks = {i: os.urandom(MiB) for i in range(8)}
        for i, data in chunks.items():  # whole chunks: written with O_DIRECT, not in the page cache
            await client.write(chain, 5, i, 0, data, MiB)
        small = os.urandom(8192)  # a small file is written through the page cache, and stays there
        await client.write(chain, 6, 0, 0, small, MiB)
        hot = ReadRequest(chain, 6, 0, 4096, 4096)
        assert await client.batch_read([hot]) == [small[4096:]]

        node = c.nodes[0]
        assert node.proc is not None and node.proc.pid is not None
        with throttled_reads(node.proc.pid, next(iter(node.targets.values())), READ_IOPS):
            # cold reads, one at a time: without AIO the daemon learns that its disk is slow
            for i in (0, 1):
                assert await client.batch_read([ReadRequest(chain, 5, i, 8192, 4096)]) == [
                    chunks[i][8192:12288]
                ]
            cold = asyncio.create_task(client.batch_read([ReadRequest(chain, 5, 2, 65536, 4096)]))
            if not aio:
                assert re.search(r"fs3_storage_cold_reads_off_loop\{target=\"\d+\"\} 1\.0", await c.scrape(0))
            await asyncio.sleep(0.05)  # the cold read is at the daemon, waiting for the disk
            # a read of cached bytes is answered meanwhile, not after the disk
            assert await client.batch_read([hot]) == [small[4096:]]
            await asyncio.sleep(0.01)
            assert not cold.done(), "the cached read waited for the cold one"
            assert await cold == [chunks[2][65536:69632]]

        metrics = await c.scrape(0)
        sent = re.search(
            rf'fs3_storage_batched_reads_total\{{where="{"aio" if aio else "io_thread"}"\}} (\S+)', metrics
        )
        assert sent is not None and float(sent.group(1)) >= 1, metrics
        assert "disk slow: cold reads leave the event loop" in node.proc.log()


def test_cold_reads_leave_the_loop_when_slow_and_come_back_when_fast() -> None:
    cold = ColdReads()
    for _ in range(100):  # a fast disk, with one hiccup
        cold.record(0.0002)
    cold.record(0.050)
    assert not cold.off_loop and all(cold.wait_here() for _ in range(40))
    while not cold.off_loop:  # a slow one: off the loop within a few reads
        cold.record(0.020)
    assert cold.avg_s > ColdReads.SLOW_S
    # off the loop, one miss in SAMPLE_EVERY is still read (and timed) on the loop
    waits = [cold.wait_here() for _ in range(4 * ColdReads.SAMPLE_EVERY)]
    assert waits.count(True) == 4 and waits[ColdReads.SAMPLE_EVERY - 1]
    # between the thresholds it stays off (no flapping); fast again, it comes back
    for _ in range(20):
        cold.record((ColdReads.SLOW_S + ColdReads.FAST_S) / 2)
    assert cold.off_loop
    while cold.off_loop:
        cold.record(0.0002)
    assert cold.avg_s < ColdReads.FAST_S and cold.wait_here()
