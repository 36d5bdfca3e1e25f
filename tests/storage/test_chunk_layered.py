"""Layered versions: a small overwrite inside a chunk writes only the checksum blocks it touches to
an overlay file and leaves the committed version's file alone; once committed, the next update of
the chunk (or the next opening of the target) folds the overlay back into the data file."""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from chunk_crash_workload import update_ranges

from fs3.errors import FS3Error, StatusCode
from fs3.storage.chunk_engine import ChunkEngine, EngineOptions
from fs3.storage.chunk_files import release_read
from fs3.storage.chunk_meta import (
    FORMAT_VERSION,
    ChunkMeta,
    ChunkVersion,
    block_crcs,
    block_size,
    crc32c,
    decode_meta,
    encode_meta,
)

pytestmark = pytest.mark.timeout(60)

CS = 1 << 20
B = block_size(CS)  # the checksum block of a new version of such a chunk


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
    data = os.urandom(B // 2)  # straddles blocks 3 and 4
    offset = 4 * B - B // 4
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
    assert committed is not None and committed.committed.layered and committed.committed.crc == crc32c(new)
    assert engine.read(cid(1)).data == new
    assert len(data_files(engine)) == 2 and base_file.read_bytes() == old

    # the next update folds the overlay into the data file, in the same transaction as its own
    more = b"appended"
    meta = engine.update(cid(1), CS - len(more), more, chunk_size=CS, chain_ver=1)
    assert not meta.committed.layered and meta.committed.crc == crc32c(new)
    assert base_file.read_bytes() == new
    assert engine.read(cid(1)).data == new
    newer = new[: CS - len(more)] + more
    assert engine.read(cid(1), version=3).data == newer
    engine.commit(cid(1), 3)
    engine.update(cid(1), 0, b"!", chunk_size=CS, chain_ver=1)
    engine.abort(cid(1), 4)  # nothing to fold: the committed version is plain again
    assert data_files(engine) == [base_file] and base_file.read_bytes() == newer
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


def test_a_committed_layered_version_is_folded_at_open(tmp_path: Path) -> None:
    """Also when the process died while folding it (here: half the block already written)."""
    eng = ChunkEngine(tmp_path)
    old = os.urandom(CS)
    write(eng, cid(1), 0, old)
    committed = write(eng, cid(1), 10 * B + 7, b"new bytes")
    assert committed.committed.layered
    new = old[: 10 * B + 7] + b"new bytes" + old[10 * B + 16 :]
    base = eng._files.path(cid(1), committed.committed.file_id)  # noqa: SLF001
    with open(base, "r+b") as f:  # a fold had begun: half its block written
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
    # a corrupt overlay is not folded into the data file: the next update refuses it (the chain
    # then sends the whole chunk), and the committed version stays as it was
    overlay = engine.get_meta(cid(1)).committed
    assert overlay.layered
    with open(engine._files.path(cid(1), overlay.overlay_file_id), "r+b") as f:  # noqa: SLF001
        first = f.read(2)
        f.seek(0)
        f.write(bytes(b ^ 0xFF for b in first))
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 0, b"y", chunk_size=CS, chain_ver=1)
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
    assert engine.get_meta(cid(1)).committed == overlay
    engine.replace(cid(1), old, chunk_size=CS, chain_ver=2, version=9, commit=True)  # as resync does
    assert engine.read(cid(1)).data == old and len(data_files(engine)) == 1


def test_readers_racing_layered_overwrites_see_whole_versions(tmp_path: Path) -> None:
    """Every read of the committed version returns exactly the content of the version it names,
    while small overwrites are committed under it (and each folded in place by the next)."""
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
            assert meta.pending.layered and not meta.committed.layered  # the previous one folded
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


def test_a_write_of_several_small_ranges_writes_only_their_blocks(engine: ChunkEngine) -> None:
    """A gathered random write (several ranges of one chunk) makes one layered version whose
    overlay file holds the block runs the ranges touch, back to back; the data file stays as it is
    until the next update folds every run into it."""
    old = os.urandom(CS)
    write(engine, cid(1), 0, old)
    (base_file,) = data_files(engine)
    ranges = [
        (5 * B + 10, os.urandom(100)),  # inside block 5
        (6 * B - 3, os.urandom(6)),  # across blocks 5 and 6: joins the run before
        (20 * B, os.urandom(B)),  # block 20 exactly
        (21 * B + 1, os.urandom(2 * B)),  # blocks 21 to 23: touches the run before, so joins it
        (100 * B - 1, os.urandom(2)),  # across blocks 99 and 100
        (CS - 5, os.urandom(5)),  # the end
    ]
    meta, new = update_ranges(engine, cid(1), old, ranges, CS)
    v = meta.pending
    runs = ((5, 7), (20, 24), (99, 101), (CS // B - 1, CS // B))
    assert v.layered and v.overlay_runs == runs and (v.overlay_first, v.overlay_end) == (5, CS // B)
    assert v.crc == crc32c(new) and v.block_crcs == block_crcs(new, B)
    overlay = [p for p in data_files(engine) if p != base_file]
    assert [p.stat().st_size for p in overlay] == [9 * B]
    assert overlay[0].read_bytes() == b"".join(new[a * B : b * B] for a, b in runs)
    assert base_file.read_bytes() == old
    assert engine.space_info().used == CS + 9 * B
    assert decode_meta(cid(1), encode_meta(meta)) == meta
    assert engine.read(cid(1), version=2).data == new
    for off, length in [
        (0, 5 * B),
        (5 * B, 2 * B),
        (7 * B - 1, 2),
        (19 * B, 6 * B),
        (6 * B, 95 * B),
        (CS - 9, 9),
    ]:
        assert engine.read(cid(1), off, length, version=2).data == new[off : off + length]
    # as the storage service reads (into a lent buffer): the data file once, the runs laid over it
    got = engine.read(cid(1), version=2, lease=True).data
    assert bytes(got) == new
    release_read(got)
    assert engine.read(cid(1)).data == old

    engine.commit(cid(1), 2)
    assert engine.read(cid(1)).data == new
    # the next update (here another gathered one) folds every run into the data file first
    more = [(2 * B, b"a"), (50 * B, b"b")]
    newer = bytearray(new)
    for offset, data in more:
        newer[offset : offset + len(data)] = data
    meta = engine.update(cid(1), 2 * B, b"ab", chunk_size=CS, chain_ver=1, extents=[(2 * B, 1), (50 * B, 1)])
    assert not meta.committed.layered and meta.committed.crc == crc32c(new)
    assert base_file.read_bytes() == new
    assert meta.pending.overlay_runs == ((2, 3), (50, 51))
    engine.commit(cid(1), 3)
    assert engine.read(cid(1)).data == newer
    engine.close()
    with ChunkEngine(engine.path) as again:  # folds the last one
        assert not again.get_meta(cid(1)).committed.layered
        assert data_files(again) == [base_file] and base_file.read_bytes() == newer
        assert again.space_info().used == CS


def test_several_ranges_over_too_much_of_the_chunk_or_past_its_end_copy_it(engine: ChunkEngine) -> None:
    old = os.urandom(8 * B)
    write(engine, cid(1), 0, old)
    cases = [
        [(0, 1), (2 * B, 1), (4 * B, 1), (6 * B, 1), (7 * B, 1)],  # five of eight blocks
        [(B, 1), (8 * B - 1, 10)],  # past the end
    ]
    for extents in cases:
        data = os.urandom(sum(n for _, n in extents))
        meta = engine.update(cid(1), extents[0][0], data, chunk_size=CS, chain_ver=1, extents=extents)
        assert not meta.pending.layered and meta.pending.file_id != meta.committed.file_id
        engine.abort(cid(1))
        assert data_files(engine) == [engine._files.path(cid(1), meta.committed.file_id)]  # noqa: SLF001


def test_several_ranges_never_build_on_a_corrupt_base_or_fold_a_corrupt_run(engine: ChunkEngine) -> None:
    old = os.urandom(16 * B)
    committed = write(engine, cid(1), 0, old)
    path = engine._files.path(cid(1), committed.committed.file_id)  # noqa: SLF001
    with open(path, "r+b") as f:  # a bad byte in block 12, which the write does not touch
        f.seek(12 * B + 9)
        f.write(bytes([old[12 * B + 9] ^ 1]))
    extents = [(B, 3), (3 * B, 3)]
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), B, b"xxxyyy", chunk_size=CS, chain_ver=1, extents=extents)
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH and "block 12" in err.value.message
    engine.replace(cid(1), old, chunk_size=CS, chain_ver=2, version=5, commit=True)  # the chain repairs it
    write_meta = engine.update(cid(1), B, b"xxxyyy", chunk_size=CS, chain_ver=1, extents=extents)
    engine.commit(cid(1), write_meta.pending_ver)
    layered = engine.get_meta(cid(1)).committed
    assert layered.overlay_runs == ((1, 2), (3, 4))
    with open(engine._files.path(cid(1), layered.overlay_file_id), "r+b") as f:  # noqa: SLF001
        f.seek(B + 7)  # in the second run: flip a bit (a zero written there is no change 1 time in 256)
        byte = f.read(1)[0]
        f.seek(B + 7)
        f.write(bytes([byte ^ 1]))
    with pytest.raises(FS3Error) as err:
        engine.read(cid(1), 3 * B, 10)
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH and "block 3" in err.value.message
    with pytest.raises(FS3Error) as err:  # not folded into the data file
        engine.update(cid(1), 0, b"z", chunk_size=CS, chain_ver=1)
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
    assert engine.get_meta(cid(1)).committed == layered


def test_records_of_an_older_format_are_updated_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A target from the previous build holds records with its format's first byte: they read,
    and the changes that replace them (here the fold at opening, then updates) find them as they
    are (a record is compared decoded when its format differs, not byte for byte)."""
    eng = ChunkEngine(tmp_path)
    old = os.urandom(CS)
    write(eng, cid(1), 0, old)
    write(eng, cid(2), 0, old)
    layered = write(eng, cid(1), 3 * B, b"layered")
    assert layered.committed.layered
    store = eng._store  # noqa: SLF001
    with store._env.begin(write=True) as txn:  # noqa: SLF001 - as format 3 wrote them
        for n in (1, 2):
            raw = bytearray(txn.get(cid(n), db=store._chunks))  # noqa: SLF001
            raw[0] = 3
            txn.put(cid(n), bytes(raw), db=store._chunks)  # noqa: SLF001
        txn.put(b"format", struct.pack("<I", 3), db=store._target)  # noqa: SLF001
    eng.close()
    new = bytearray(old)
    new[3 * B : 3 * B + 7] = b"layered"
    with ChunkEngine(tmp_path) as eng:
        assert eng.recovery.layered == [cid(1)]
        assert not eng.get_meta(cid(1)).committed.layered and eng.read(cid(1)).data == new
        write(eng, cid(2), 10, b"updated")
        assert eng.read(cid(2)).data == old[:10] + b"updated" + old[17:]
    # the upgrade is said, with what it means for a rollback (it was silent)
    assert any(
        r.levelname == "WARNING"
        and "upgraded from format 3" in r.getMessage()
        and "cannot open" in r.getMessage()
        for r in caplog.records
    ), caplog.text
    # a target of a newer format than this build reads names what to run
    store = ChunkEngine(tmp_path)
    with store._store._env.begin(write=True) as txn:  # noqa: SLF001
        txn.put(b"format", struct.pack("<I", FORMAT_VERSION + 1), db=store._store._target)  # noqa: SLF001
    store.close()
    with pytest.raises(FS3Error) as err:
        ChunkEngine(tmp_path)
    assert "written by a newer fs3" in err.value.message


def test_a_whole_rewrite_of_a_layered_version_does_not_fold_it(engine: ChunkEngine) -> None:
    """Folding writes the overlay into the data file for the next version to build on; a write of
    the whole chunk builds on nothing (a sequential writer after random ones), so the layered
    version stays as it is until the commit deletes both of its files."""
    old = os.urandom(CS)
    write(engine, cid(1), 0, old)
    layered = write(engine, cid(1), 7 * B, b"small").committed
    assert layered.layered
    files = data_files(engine)
    before = [p.read_bytes() for p in files]
    new = os.urandom(CS)
    meta = engine.update(cid(1), 0, new, chunk_size=CS, chain_ver=1)
    assert meta.committed == layered and not meta.pending.layered
    assert [p.read_bytes() for p in files] == before  # neither file was written
    assert engine.read(cid(1)).data == old[: 7 * B] + b"small" + old[7 * B + 5 :]
    engine.commit(cid(1), meta.pending_ver)
    assert engine.read(cid(1)).data == new
    assert len(data_files(engine)) == 1 and not set(files) & set(data_files(engine))
    assert engine.space_info().used == CS


def test_a_short_overlay_file_of_several_runs_is_a_checksum_error(engine: ChunkEngine) -> None:
    old = os.urandom(CS)
    write(engine, cid(1), 0, old)
    extents = [(i * 8 * B, 10) for i in range(6)]
    meta, _ = update_ranges(engine, cid(1), old, [(at, b"x" * n) for at, n in extents], CS)
    v = meta.pending
    assert len(v.overlay_runs) == 6
    with open(engine._files.path(cid(1), v.overlay_file_id), "r+b") as f:  # noqa: SLF001
        f.truncate(5 * B)  # the last run is gone
    for lease in (False, True):
        with pytest.raises(FS3Error) as err:
            engine.read(cid(1), version=2, lease=lease)
        assert (
            err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
            and "overlay file short" in err.value.message
        )


def test_several_ranges_that_replace_a_bad_block_whole_repair_it(engine: ChunkEngine) -> None:
    old = os.urandom(16 * B)
    committed = write(engine, cid(1), 0, old)
    with open(engine._files.path(cid(1), committed.committed.file_id), "r+b") as f:  # noqa: SLF001
        f.seek(5 * B + 1)
        f.write(bytes([old[5 * B + 1] ^ 1]))
    fix = os.urandom(B)
    meta = engine.update(cid(1), B, b"a" + fix, chunk_size=CS, chain_ver=1, extents=[(B, 1), (5 * B, B)])
    assert meta.pending.overlay_runs == ((1, 2), (5, 6))
    engine.commit(cid(1), meta.pending_ver)
    assert engine.read(cid(1)).data == old[:B] + b"a" + old[B + 1 : 5 * B] + fix + old[6 * B :]
