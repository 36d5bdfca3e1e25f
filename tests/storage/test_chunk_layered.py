"""Layered versions: a small overwrite inside a chunk writes only the checksum blocks it touches to
an overlay file, leaves the committed version's file alone until the commit, and the commit folds
the overlay back into the data file (also after a crash between the two)."""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.storage.chunk_engine import ChunkEngine, EngineOptions
from fs3.storage.chunk_meta import CHECKSUM_BLOCK, ChunkMeta, ChunkVersion, crc32c, decode_meta, encode_meta

pytestmark = pytest.mark.timeout(60)

CS = 1 << 20
B = CHECKSUM_BLOCK


def cid(n: int) -> bytes:
    return struct.pack(">BBQHI", 0, 0, 11, 0, n)


def write(eng: ChunkEngine, chunk: bytes, offset: int, data: bytes) -> ChunkMeta:
    meta = eng.update(chunk, offset, data, chunk_size=CS, chain_ver=1)
    committed = eng.commit(chunk, meta.pending_ver)
    assert committed is not None
    return committed


def data_files(eng: ChunkEngine) -> list[Path]:
    return sorted(p for p in (eng.path / "chunks").rglob("*") if p.is_file())


@pytest.fixture
def engine(tmp_path: Path):
    with ChunkEngine(tmp_path / "target") as eng:
        yield eng


def test_small_overwrite_writes_only_its_blocks(engine: ChunkEngine) -> None:
    old = os.urandom(CS)
    write(engine, cid(1), 0, old)
    (base_file,) = data_files(engine)
    data = os.urandom(6000)  # straddles blocks 3 and 4
    offset = 4 * B - 1000
    new = old[:offset] + data + old[offset + len(data) :]
    meta = engine.update(cid(1), offset, data, chunk_size=CS, chain_ver=1)
    v = meta.pending
    assert v.layered and (v.overlay_first, v.overlay_end) == (3, 5)
    assert v.file_id == meta.committed.file_id and v.crc == crc32c(new) and v.length == CS
    overlay = [p for p in data_files(engine) if p != base_file]
    assert [p.stat().st_size for p in overlay] == [2 * B]
    assert base_file.read_bytes() == old  # the committed version's file is untouched
    assert engine.read(cid(1)).data == old
    assert engine.read(cid(1), version=2).data == new
    for off, length in [(0, 10), (3 * B - 5, 10), (4 * B - 1500, 7000), (5 * B - 3, 6), (CS - 7, 7)]:
        assert engine.read(cid(1), off, length, version=2).data == new[off : off + length]
    assert engine.space_info().used == CS + 2 * B

    committed = engine.commit(cid(1), 2)
    assert committed is not None and not committed.committed.layered
    assert committed.committed.crc == crc32c(new)
    assert data_files(engine) == [base_file] and base_file.read_bytes() == new
    assert engine.read(cid(1)).data == new
    assert engine.space_info().used == CS


def test_abort_of_a_layered_version_removes_the_overlay(engine: ChunkEngine) -> None:
    old = os.urandom(3 * B + 10)
    write(engine, cid(1), 0, old)
    engine.update(cid(1), 2 * B + 5, b"zz", chunk_size=CS, chain_ver=1)
    assert len(data_files(engine)) == 2
    meta = engine.abort(cid(1), 2)
    assert meta is not None and meta.pending is None
    assert len(data_files(engine)) == 1 and engine.read(cid(1)).data == old
    assert engine.space_info().used == len(old)


def test_overwrites_that_are_not_small_copy_the_chunk(engine: ChunkEngine) -> None:
    old = os.urandom(4 * B)
    write(engine, cid(1), 0, old)
    cases = [
        (B, os.urandom(2 * B + 1)),  # three of four blocks: cheaper to copy
        (4 * B - 10, os.urandom(20)),  # extends the chunk
    ]
    for offset, data in cases:
        meta = engine.update(cid(1), offset, data, chunk_size=CS, chain_ver=1)
        assert not meta.pending.layered and meta.pending.file_id != meta.committed.file_id
        engine.abort(cid(1))


def test_a_crash_between_commit_and_fold_is_finished_at_open(tmp_path: Path) -> None:
    """The commit is recorded with the version still layered, then the process dies before the
    overlay is folded into the data file (here: its first bytes already overwritten)."""
    eng = ChunkEngine(tmp_path)
    old = os.urandom(CS)
    write(eng, cid(1), 0, old)
    meta = eng.update(cid(1), 10 * B + 7, b"new bytes", chunk_size=CS, chain_ver=1)
    new = old[: 10 * B + 7] + b"new bytes" + old[10 * B + 16 :]
    # the commit's transaction, without the fold after it
    layered = ChunkMeta(cid(1), CS, meta.pending, None)
    eng._store.swap(cid(1), meta, layered)  # noqa: SLF001 - stop where a crash would
    base = eng._files.path(cid(1), meta.committed.file_id)  # noqa: SLF001
    with open(base, "r+b") as f:  # the fold had begun: half its block written
        f.seek(10 * B)
        f.write(new[10 * B : 10 * B + B // 2])
    assert eng.read(cid(1)).data == new  # layered: those bytes come from the overlay
    eng.close()
    with ChunkEngine(tmp_path) as eng:
        assert eng.recovery.layered == [cid(1)]
        got = eng.get_meta(cid(1))
        assert got is not None and not got.committed.layered and got.committed.crc == crc32c(new)
        assert eng.read(cid(1)).data == new
        assert len(data_files(eng)) == 1 and eng.space_info().used == CS


def test_overwrite_never_builds_on_a_corrupt_base(engine: ChunkEngine) -> None:
    old = os.urandom(8 * B)
    committed = write(engine, cid(1), 0, old)
    path = engine._files.path(cid(1), committed.committed.file_id)  # noqa: SLF001
    with open(path, "r+b") as f:
        f.seek(6 * B + 3)
        f.write(bytes([old[6 * B + 3] ^ 1]))
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 100, b"x", chunk_size=CS, chain_ver=1)
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH and "block 6" in err.value.message
    # rewriting the bad block whole needs none of its bytes: that repairs the chunk
    fix = os.urandom(B)
    write(engine, cid(1), 6 * B, fix)
    assert engine.read(cid(1)).data == old[: 6 * B] + fix + old[7 * B :]


def test_readers_racing_layered_overwrites_see_whole_versions(tmp_path: Path) -> None:
    """Every read of the committed version returns exactly the content of the version it names,
    while small overwrites are committed (and folded in place) under it."""
    eng = ChunkEngine(tmp_path, EngineOptions(sync=False))
    content = bytearray(os.urandom(16 * B))
    versions = {write(eng, cid(1), 0, bytes(content)).committed_ver: bytes(content)}
    stop = threading.Event()
    bad: list[object] = []
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            try:
                got = eng.read(cid(1))
            except FS3Error as exc:
                bad.append(exc)
                return
            if versions.get(got.version) != got.data:
                bad.append(got.version)
                return
            reads[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for n in range(200):
            offset = (n * 7919) % (16 * B - 5000)
            data = os.urandom(5000)
            content[offset : offset + 5000] = data
            meta = eng.update(cid(1), offset, data, chunk_size=CS, chain_ver=1)
            assert meta.pending.layered
            versions[meta.pending_ver] = bytes(content)  # before the commit makes it readable
            eng.commit(cid(1), meta.pending_ver)
    finally:
        stop.set()
        for t in threads:
            t.join()
        eng.close()
    assert bad == [] and reads[0] > 0


def test_layered_metadata_round_trips_and_format_1_still_reads(engine: ChunkEngine) -> None:
    committed = write(engine, cid(1), 0, os.urandom(CS))
    meta = engine.update(cid(1), 5, b"abc", chunk_size=CS, chain_ver=1)
    assert meta.pending.layered and decode_meta(cid(1), encode_meta(meta)) == meta
    tombstone = ChunkVersion(3, 1, 0, 0, 0, b"", removal=True)
    removal = replace(committed, pending=tombstone)
    assert decode_meta(cid(1), encode_meta(removal)) == removal
    # a record written by format 1 (no layered versions) differs only in its first byte
    for plain in (committed, removal):
        assert decode_meta(cid(1), b"\x01" + encode_meta(plain)[1:]) == plain
