"""New chunk files of 256 KiB or more are written with O_DIRECT (storage.chunk_files): the bytes and
the length come back exactly, the page cache is left alone, and a file system that refuses
O_DIRECT (ramfs) gets ordinary writes instead of an error."""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import mmap
import os
import subprocess
from pathlib import Path

import pytest
from mounts import unmount

from fs3.net.buffers import AlignedBuffer, BufferPool
from fs3.storage import chunk_files
from fs3.storage.chunk_engine import ChunkEngine, EngineOptions
from fs3.storage.chunk_files import (
    DIRECT_MIN,
    DIRECT_READ_MIN,
    ChunkFiles,
    CorruptVersion,
    ReadBuffers,
    lent_buffer,
    release_read,
)
from fs3.storage.chunk_meta import CHECKSUM_BLOCK, FINE_BLOCK

CHUNK = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]


def cached_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache (mincore over a mapping of it)."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(v & 1 for v in vec)
        finally:
            _libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)


def direct_supported(directory: Path) -> bool:
    probe = directory / ".direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
    os.close(fd)
    return True


@pytest.mark.parametrize("length", [DIRECT_MIN, CHUNK, CHUNK - 1000, 3 * DIRECT_MIN + 17])
def test_direct_writes_read_back_exactly(tmp_path, length):
    eng = ChunkEngine(tmp_path / "t")
    try:
        cid = bytes(range(16))
        data = os.urandom(length)
        eng.update(cid, 0, data, chunk_size=2 * CHUNK, chain_ver=1)
        eng.commit(cid, 1)
        assert eng.read(cid).data == data
        meta = eng.get_meta(cid)
        path = eng._files.path(cid, meta.committed.file_id)
        assert path.stat().st_size == length  # the padding of the last block is cut off
        assert eng._files.direct == direct_supported(tmp_path)
        # an in-place append after a direct write goes through the page cache and stays exact
        eng.update(cid, length, b"tail", chunk_size=2 * CHUNK, chain_ver=1)
        eng.commit(cid, 2)
        assert eng.read(cid).data == data + b"tail"
    finally:
        eng.close()


@pytest.fixture
def files(tmp_path):
    """ChunkFiles with O_DIRECT, on a file system that takes it (else the test is skipped)."""
    if not direct_supported(tmp_path):
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")
    files = ChunkFiles(tmp_path / "chunks")
    yield files
    files.close()


def test_a_direct_write_leaves_the_page_cache_alone(files):
    cid = bytes(16)
    files.write_new(cid, 1, os.urandom(CHUNK))
    files.write_new(cid, 2, os.urandom(DIRECT_MIN - 1))  # small files use the page cache
    assert cached_pages(files.path(cid, 1)) == 0
    assert cached_pages(files.path(cid, 2)) > 0


class _NoThreadBuffer:
    """Stands in for the I/O thread's aligned buffer where a write must not copy through it."""

    @property
    def view(self):  # noqa: ANN201
        raise AssertionError("copied through the thread's aligned buffer")


@pytest.mark.parametrize("length", [CHUNK, 4 * CHUNK, DIRECT_MIN + 4096])
def test_a_page_aligned_payload_is_written_as_it_is(files, monkeypatch, length):
    # a payload received into the RPC server's pool (an AlignedBuffer from ALIGNED_MIN up)
    data = os.urandom(length)
    buf = BufferPool().acquire(length)
    assert isinstance(buf, AlignedBuffer)
    view = memoryview(buf)[:length]
    view[:] = data
    cid = bytes(16)
    with monkeypatch.context() as m:
        m.setattr(chunk_files, "_aligned", _NoThreadBuffer())
        files.write_new(cid, 1, view)
    assert files.read(cid, 1, 0, length) == data
    assert files.path(cid, 1).stat().st_size == length
    assert cached_pages(files.path(cid, 1)) == 0


@pytest.mark.parametrize("head", [0, 4096, 17])
def test_aligned_and_unaligned_payloads_with_short_tails_read_back_exactly(files, head):
    # a view that starts on a page (head 0, 4096) or off one (17), ending in a partial block
    length = CHUNK + 1000
    buf = BufferPool().acquire(head + length)
    data = os.urandom(length)
    view = memoryview(buf)[head : head + length]
    view[:] = data
    cid = bytes(16)
    files.write_new(cid, 1, view)
    assert files.read(cid, 1, 0, 2 * CHUNK) == data
    assert files.path(cid, 1).stat().st_size == length
    # and read-only bytes, whose address Python does not tell, are copied through as before
    files.write_new(cid, 2, data)
    assert files.read(cid, 2, 0, 2 * CHUNK) == data


def test_large_reads_are_direct_and_exact(files):
    cid = bytes(16)
    data = os.urandom(CHUNK - 100)
    files.write_new(cid, 1, data)
    assert files.read(cid, 1, 0, CHUNK) == data  # past the end: what there is
    assert files.read(cid, 1, DIRECT_READ_MIN, DIRECT_READ_MIN) == data[DIRECT_READ_MIN : 2 * DIRECT_READ_MIN]
    assert files.read(cid, 1, 3 * DIRECT_READ_MIN, DIRECT_READ_MIN) == data[3 * DIRECT_READ_MIN :]
    assert cached_pages(files.path(cid, 1)) == 0
    # a small read (one checksum block) keeps the page cache
    assert files.read(cid, 1, 0, CHECKSUM_BLOCK) == data[:CHECKSUM_BLOCK]
    assert cached_pages(files.path(cid, 1)) > 0


def test_no_direct_writes_when_switched_off(tmp_path):
    files = ChunkFiles(tmp_path / "chunks", direct=False)
    cid = bytes(16)
    data = os.urandom(CHUNK)
    files.write_new(cid, 1, data)
    assert files.read(cid, 1, 0, CHUNK) == data
    if direct_supported(tmp_path):
        assert cached_pages(files.path(cid, 1)) > 0
    files.close()


@pytest.fixture
def ramfs(tmp_path):
    """A ramfs mount (a file system without O_DIRECT); skipped where this process cannot mount."""
    where = tmp_path / "ramfs"
    where.mkdir()
    r = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a ramfs (needs root): {r.stderr.strip()}")
    try:
        yield where
    finally:
        unmount(where)


def test_a_file_system_without_o_direct_gets_buffered_writes(ramfs):
    assert not direct_supported(ramfs)
    eng = ChunkEngine(ramfs / "t", EngineOptions())
    try:
        cid = bytes(range(16))
        data = os.urandom(CHUNK)
        eng.update(cid, 0, data, chunk_size=CHUNK, chain_ver=1)
        eng.commit(cid, 1)
        assert eng.read(cid).data == data
        assert not eng._files.direct
        eng.update(cid, 0, data[::-1], chunk_size=CHUNK, chain_ver=1)
        eng.commit(cid, 2)
        assert eng.read(cid).data == data[::-1]
        # the refused open left no file behind: only the committed version's remains
        names = [p.name for p in (ramfs / "t" / "chunks").rglob("*") if p.is_file()]
        assert names == [eng._files.path(cid, eng.get_meta(cid).committed.file_id).name]
    finally:
        eng.close()
    # reopened, the first O_DIRECT attempt is a large read: refused, then read through the cache
    eng = ChunkEngine(ramfs / "t", EngineOptions())
    try:
        assert eng._files.direct
        assert eng.read(cid).data == data[::-1]
        assert not eng._files.direct
    finally:
        eng.close()


@pytest.mark.parametrize("length", [CHUNK, 3 * DIRECT_MIN + 17, 10_000])
def test_a_whole_version_read_is_checked_against_its_crc_and_blocks(tmp_path, length):
    """A read of a whole version checks it with one pass against the version's CRC32C; when that
    fails, the block CRC32Cs say which block is bad, and a version whose chunk CRC32C disagrees
    with its (good) blocks is refused too."""
    files = ChunkFiles(tmp_path / "chunks")
    cid = bytes(16)
    data = os.urandom(length)
    v = files.write_version(cid, 1, data, version=1, chain_ver=1, block=FINE_BLOCK)
    assert files.read_version(cid, v, 0, length) == data
    with pytest.raises(CorruptVersion, match="chunk CRC32C differs from its block CRC32Cs"):
        files.read_version(cid, dataclasses.replace(v, crc=v.crc ^ 1), 0, length)
    bad = length // 2
    with open(files.path(cid, 1), "r+b") as f:
        f.seek(bad)
        f.write(bytes([data[bad] ^ 0x40]))
    # (an O_DIRECT read of a file with dirty cached pages writes them back first: both ways see it)
    with pytest.raises(CorruptVersion, match=f"block {bad // FINE_BLOCK} "):
        files.read_version(cid, v, 0, length)
    files.close()


def test_a_leased_read_lands_in_a_lent_buffer_that_comes_back(files, monkeypatch):
    """With lease=True an O_DIRECT read is a view of a lent buffer (no copy out), checked like any
    read; release_read gives the buffer back and the next leased read uses it again. Without
    lease, and for reads that are not O_DIRECT, the bytes are bytes."""
    pool = ReadBuffers(limit=8)
    monkeypatch.setattr(chunk_files, "READ_BUFFERS", pool)
    cid = bytes(16)
    data = os.urandom(CHUNK)
    v = files.write_version(cid, 1, data, version=1, chain_ver=1, block=FINE_BLOCK)
    whole = files.read_version(cid, v, 0, CHUNK, lease=True)
    buf = lent_buffer(whole)
    assert buf is not None and whole == data and (pool.lent, pool.free) == (1, 0)
    part = files.read_version(cid, v, 3 * FINE_BLOCK, 3 * FINE_BLOCK + DIRECT_READ_MIN, lease=True)
    assert lent_buffer(part) is not None and part == data[3 * FINE_BLOCK : 3 * FINE_BLOCK + DIRECT_READ_MIN]
    release_read(part)
    release_read(whole)
    assert (pool.lent, pool.free) == (0, 2)
    release_read(whole)  # a second release is ignored: the buffer is not lent twice
    assert (pool.lent, pool.free) == (0, 2)
    again = files.read_version(cid, v, 0, CHUNK, lease=True)
    assert lent_buffer(again) is buf and again == data  # the same memory, read afresh
    release_read(again)
    plain = files.read_version(cid, v, 0, CHUNK)
    assert type(plain) is bytes and plain == data
    small = files.read_version(cid, v, 0, FINE_BLOCK, lease=True)  # a page-cache read
    assert lent_buffer(small) is None and small == data[:FINE_BLOCK]
    release_read(small)  # nothing to give back
    assert (pool.lent, pool.free) == (0, 2)
    # a leased read that fails its check gives the buffer back itself
    bad = CHUNK // 2
    with open(files.path(cid, 1), "r+b") as f:
        f.seek(bad)
        f.write(bytes([data[bad] ^ 1]))
    with pytest.raises(CorruptVersion, match=f"block {bad // FINE_BLOCK} "):
        files.read_version(cid, v, 0, CHUNK, lease=True)
    assert (pool.lent, pool.free) == (0, 2)


def test_leased_reads_past_the_limit_are_copied_out(files, monkeypatch):
    """No more than the pool's limit of buffers is lent at once: a read past it comes back as bytes
    (copied through the thread's buffer); a lent buffer dropped without being given back no
    longer counts."""
    pool = ReadBuffers(limit=2)
    monkeypatch.setattr(chunk_files, "READ_BUFFERS", pool)
    cid = bytes(16)
    data = os.urandom(CHUNK)
    v = files.write_version(cid, 1, data, version=1, chain_ver=1, block=FINE_BLOCK)
    first, second = (files.read_version(cid, v, 0, CHUNK, lease=True) for _ in range(2))
    third = files.read_version(cid, v, 0, CHUNK, lease=True)
    assert lent_buffer(first) is not None and lent_buffer(second) is not None
    assert lent_buffer(third) is None and type(third) is bytes
    assert first == second == third == data
    assert pool.lent == 2
    del first
    gc.collect()
    assert pool.lent == 1
    fourth = files.read_version(cid, v, 0, CHUNK, lease=True)
    assert lent_buffer(fourth) is not None and fourth == data
    release_read(second)
    release_read(fourth)
    assert (pool.lent, pool.free) == (0, 2)
