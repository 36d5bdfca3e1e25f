"""Write-back errors, reported as Linux reports them: a flush that fails in the background reaches
every handle of the file once, at its next fsync or close (the failing handle's next write too);
a stat or a read that flushes does not swallow it; and meta never counts bytes that failed.

Storage here keeps 99.9% of its disks free, so every chunk write is refused with ENOSPC at once
(the target stays online): the file system is full for data, not for metadata.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from cluster import wait_until
from fs_cluster import FsCluster

from fs3.client import FileSystem
from fs3.client.fuse_ops import WARN_EVERY_S, _ErrorLog
from fs3.errors import FS3Error, StatusCode

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FsCluster]:
    async with FsCluster(tmp_path_factory.mktemp("full"), storage_extra={"keep_free": 0.999}) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fs(cluster: FsCluster) -> FileSystem:
    return await cluster.connect()


def enospc(e: pytest.ExceptionInfo[FS3Error]) -> bool:
    return e.value.errno == errno.ENOSPC


async def test_a_stat_does_not_swallow_the_error_close_reports_it(cluster: FsCluster, fs: FileSystem) -> None:
    f = await fs.open("/victim", "w")
    await f.write(os.urandom(900_000))  # under a chunk and the buffer: buffered
    # a stat flushes the buffer (to report the length this client wrote); the flush fails, but
    # that is the writer's to hear, not the stat's
    assert (await fs.stat("/victim")).st_size == 900_000
    assert (await f.stat()).st_size == 900_000
    with pytest.raises(FS3Error) as e:
        await f.close()
    assert enospc(e)
    # meta did not count the bytes that never reached storage
    other = await cluster.connect()
    assert (await other.stat("/victim")).st_size == 0


async def test_every_open_handle_hears_of_it_once(fs: FileSystem) -> None:
    a = await fs.open("/shared", "w")
    b = await fs.open("/shared", "r+")
    await a.write(b"x" * 5000)
    with pytest.raises(FS3Error) as e:
        await a.fsync()
    assert enospc(e)
    await a.fsync()  # reported to a already
    with pytest.raises(FS3Error) as e:
        await b.fsync()  # b was open when it happened: it hears of it too, once
    assert enospc(e)
    await b.fsync()
    late = await fs.open("/shared", "r+")  # opened after: not its error
    await late.fsync()
    for h in (a, b, late):
        await h.close()


async def test_closing_a_reader_reports_no_write_error(fs: FileSystem) -> None:
    """As on Linux: a descriptor that cannot write is not told of a write-back error at close (its
    fsync would be)."""
    w = await fs.open("/read-while-failing", "w")
    r = await fs.open("/read-while-failing", "r")
    await w.write(b"x" * 5000)
    with pytest.raises(FS3Error):
        await w.fsync()
    await r.close()
    await w.close()


async def test_the_failing_writer_is_told_at_its_next_write_and_still_at_close(fs: FileSystem) -> None:
    f = await fs.open("/writer", "w")
    await f.write(b"a" * (1 << 20))  # a whole chunk: its flush starts at once, in the background
    await asyncio.wait(list(f.handle._flushes))  # it failed
    with pytest.raises(FS3Error) as e:
        await f.write(b"b" * 100)
    assert enospc(e)
    await f.write(b"c" * 100)  # told once; the writer may go on (and fail again)
    with pytest.raises(FS3Error) as e:
        await f.close()  # the error was never reported to an fsync or close of this handle
    assert enospc(e)
    assert (await fs.stat("/writer")).st_size == 0


async def test_a_mount_reports_it_to_close_and_fsync(cluster: FsCluster, tmp_path: Path) -> None:
    m = await cluster.mount(tmp_path / "mnt")
    try:
        await asyncio.to_thread(_mount_checks, m.path)
    finally:
        assert m.unmount() == 0
    # the operator hears of it (a full disk is no caller's doing; how often: the test below)
    warnings = [line for line in m.proc.log().splitlines() if "failed error=STORAGE_SPACE_KEPT" in line]
    assert warnings and "WARNING" in warnings[0], m.proc.log()[-2000:]


def _mount_checks(mnt: Path) -> None:
    path = mnt / "m1"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"z" * 100_000)
    os.stat(path)  # may flush (a getattr); must not fail for the writer's error
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.ENOSPC
    time.sleep(1.5)  # the kernel's attribute cache (1 s) still has the size the writes gave it
    assert os.stat(path).st_size == 0  # meta's: the bytes that failed are not counted

    # fsync on one descriptor writes out the others' buffered bytes too, and reports their error
    fd1 = os.open(path, os.O_WRONLY)
    fd2 = os.open(path, os.O_RDONLY)
    os.write(fd1, b"y" * 10_000)
    with pytest.raises(OSError) as e:
        os.fsync(fd2)
    assert e.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as e:
        os.close(fd1)  # fd1 has not been told yet
    assert e.value.errno == errno.ENOSPC
    os.close(fd2)

    # closing a read-only descriptor reports no write-back error (fsync on it would)
    reader = os.open(path, os.O_RDONLY)
    fd3 = os.open(path, os.O_WRONLY)
    os.write(fd3, b"v" * 10_000)
    with pytest.raises(OSError):
        os.fsync(fd3)
    os.close(reader)
    os.close(fd3)


async def test_a_recorded_flush_error_does_not_keep_the_bytes_that_failed(fs: FileSystem) -> None:
    """The error a failed background flush leaves for the handles' next fsync or close keeps no
    reference to the flush's bytes (through its traceback's frames): a writer that goes on to
    write elsewhere, or a file left open, would otherwise hold every failed buffer."""
    f = await fs.open("/held", "w")
    payload = os.urandom(3 << 20)  # three whole chunks: flushed at once, in parallel
    base = sys.getrefcount(payload)
    gc.disable()  # what reference counting frees, not what a later collection might
    try:
        await f.write(payload)
        while f.handle._flushes:
            await asyncio.wait(list(f.handle._flushes))
        assert f.handle._write_error is not None  # recorded, not reported yet
        assert sys.getrefcount(payload) == base
        # the writer goes on elsewhere: told of the error by that write, which must not leave its
        # own bytes with the error the file keeps for its other handles (raised afresh each time)
        other = os.urandom(1 << 20)
        before = sys.getrefcount(other)
        try:
            await f.write(other)
        except FS3Error as told:
            assert told.errno == errno.ENOSPC
        else:
            pytest.fail("the write was not told of the flush error")
        assert sys.getrefcount(other) == before
    finally:
        gc.enable()
    with pytest.raises(FS3Error) as e:
        await f.close()
    assert enospc(e)


async def test_the_mounts_error_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    """One WARNING per request type and error every WARN_EVERY_S, then one saying how many were
    left out; a caller's outcome (EACCES, ENOTEMPTY, ...) is no warning."""
    now = [100.0]
    errors = _ErrorLog(clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="fs3.client.fuse_ops")
    timeout = FS3Error(StatusCode.DEADLINE_EXCEEDED, "meta did not answer")
    for _ in range(5):
        errors.failed("getattr", timeout)
    errors.failed("lookup", timeout)  # another request type: its own line
    errors.failed("getattr", FS3Error(StatusCode.PERMISSION_DENIED, "not yours"))
    errors.failed("lookup", FS3Error(StatusCode.NOT_FOUND, "no such name"))
    # no room for another xattr: ENOSPC, the caller's (it was a WARNING)
    errors.failed("setxattr", FS3Error(StatusCode.RESOURCE_EXHAUSTED, "no room for more xattrs"))
    now[0] += WARN_EVERY_S
    errors.failed("getattr", timeout)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "getattr failed error=DEADLINE_EXCEEDED: meta did not answer",
        "lookup failed error=DEADLINE_EXCEEDED: meta did not answer",
        "getattr failed error=DEADLINE_EXCEEDED: meta did not answer (4 more getattr requests failed so "
        "since the last such line)",
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG] == [
        "getattr failed error=PERMISSION_DENIED: not yours",
        "setxattr failed error=RESOURCE_EXHAUSTED: no room for more xattrs",
    ]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def test_the_count_of_a_last_burst_comes_out_at_the_windows_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Failures left out of the log and followed by none of their kind are still told of: their
    count comes out when the window ends, with no further failure to carry it."""
    errors = _ErrorLog(every_s=0.2)
    caplog.set_level(logging.WARNING, logger="fs3.client.fuse_ops")
    for i in range(4):
        errors.failed("read", FS3Error(StatusCode.STORAGE_IO_ERROR, f"disk {i} failed"))
    await wait_until(lambda: len(_warnings(caplog)) >= 2, 10, "the count of the left-out failures")
    assert _warnings(caplog) == [
        "read failed error=STORAGE_IO_ERROR: disk 0 failed",
        "read failed 3 more times since the last such line, the last with error=STORAGE_IO_ERROR: disk 3 failed",
    ]


async def test_the_count_of_a_last_burst_comes_out_at_unmount(caplog: pytest.LogCaptureFixture) -> None:
    errors = _ErrorLog(every_s=3600.0)
    caplog.set_level(logging.WARNING, logger="fs3.client.fuse_ops")
    timeout = FS3Error(StatusCode.DEADLINE_EXCEEDED, "meta did not answer")
    for _ in range(3):
        errors.failed("getattr", timeout)
    errors.flush()
    errors.flush()  # said once
    assert _warnings(caplog) == [
        "getattr failed error=DEADLINE_EXCEEDED: meta did not answer",
        "getattr failed 2 more times since the last such line, the last with error=DEADLINE_EXCEEDED: meta did "
        "not answer",
    ]
