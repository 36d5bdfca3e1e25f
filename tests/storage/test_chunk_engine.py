"""The chunk engine's API: versions, copy-on-write, appends, truncate, remove, queries, space."""

from __future__ import annotations

import asyncio
import os
import struct
import threading
from pathlib import Path

import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.storage.async_engine import AsyncChunkEngine
from fs3.storage.chunk_engine import ChunkEngine, EngineOptions
from fs3.storage.chunk_meta import (
    CHECKSUM_BLOCK,
    FINE_BLOCK,
    ChunkState,
    UpdateCheck,
    check_update,
    crc32c,
    decode_meta,
    encode_meta,
)

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20
CS = MiB  # the chunk size most tests use


def cid(inode: int, index: int = 0) -> bytes:
    """A chunk id as 3FS lays it out: tenant, reserved, inode (BE), track, chunk index (BE)."""
    return struct.pack(">BBQHI", 0, 0, inode, 0, index)


@pytest.fixture
def engine(tmp_path: Path):
    eng = ChunkEngine(tmp_path / "target")
    yield eng
    eng.close()


def write(eng: ChunkEngine, chunk: bytes, offset: int, data: bytes, size: int = CS) -> int:
    """Update and commit; returns the committed version."""
    meta = eng.update(chunk, offset, data, chunk_size=size, chain_ver=1)
    assert eng.commit(chunk, meta.pending_ver) is not None
    return meta.pending_ver


def data_files(eng: ChunkEngine) -> list[Path]:
    return sorted(p for p in (eng.path / "chunks").rglob("*") if p.is_file())


def test_round_trip_whole_and_partial_reads(engine: ChunkEngine) -> None:
    payload = os.urandom(3 * CHECKSUM_BLOCK + 123)
    assert write(engine, cid(1), 0, payload) == 1
    got = engine.read(cid(1))
    assert got.data == payload
    assert (got.version, got.chunk_length, got.chunk_crc) == (1, len(payload), crc32c(payload))
    for offset, length in [(0, 1), (100, 5000), (CHECKSUM_BLOCK - 1, 2), (len(payload) - 7, 100)]:
        assert engine.read(cid(1), offset, length).data == payload[offset : offset + length]
    assert engine.read(cid(1), len(payload) + 10, 10).data == b""
    meta = engine.get_meta(cid(1))
    assert meta is not None and meta.state is ChunkState.COMMITTED and meta.crc == crc32c(payload)


def test_uncommitted_chunk_does_not_exist_for_readers(engine: ChunkEngine) -> None:
    engine.update(cid(1), 0, b"new", chunk_size=CS, chain_ver=1)
    with pytest.raises(FS3Error) as err:
        engine.read(cid(1))
    assert err.value.code is StatusCode.STORAGE_CHUNK_NOT_FOUND
    assert engine.read(cid(1), version=1).data == b"new"
    with pytest.raises(FS3Error) as err:
        engine.read(cid(2))
    assert err.value.code is StatusCode.STORAGE_CHUNK_NOT_FOUND


@pytest.mark.parametrize("layered", [False, True])
def test_overwrite_is_copy_on_write_and_committed_stays_readable(tmp_path: Path, layered: bool) -> None:
    # layered: the pending version shares the committed version's file, except for the one
    # checksum block the write touches, which goes to a file of its own; commit folds it back
    engine = ChunkEngine(tmp_path, EngineOptions(layered_overwrite_max=0.5 if layered else 0))
    old = os.urandom(200_000)
    write(engine, cid(1), 0, old)
    meta = engine.update(cid(1), 1000, b"X" * 5000, chunk_size=CS, chain_ver=2)
    assert (meta.committed_ver, meta.pending_ver, meta.state) == (1, 2, ChunkState.PENDING)
    assert meta.pending.layered is layered
    new_files = {meta.pending.overlay_file_id} if layered else {meta.pending.file_id}
    assert meta.committed.file_id not in new_files
    assert len(data_files(engine)) == 2
    assert meta.pending.crc == crc32c(old[:1000] + b"X" * 5000 + old[6000:])
    new = old[:1000] + b"X" * 5000 + old[6000:]
    assert engine.read(cid(1)).data == old
    assert engine.read(cid(1), version=1).data == old
    assert engine.read(cid(1), version=2).data == new
    committed = engine.commit(cid(1), 2)
    assert committed is not None and committed.pending is None and committed.chain_ver == 2
    assert engine.read(cid(1)).data == new
    with pytest.raises(FS3Error) as err:
        engine.read(cid(1), version=1)
    assert err.value.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
    # copy-on-write: the old version's file went with the commit; layered: the version keeps its
    # overlay until the next update or the next opening folds it into the data file
    assert len(data_files(engine)) == (2 if layered else 1)
    assert committed.committed.layered is layered
    engine.close()
    with ChunkEngine(tmp_path) as engine:
        assert engine.read(cid(1)).data == new
        assert len(data_files(engine)) == 1 and engine.space_info().used == len(new)


def test_append_goes_in_place_and_keeps_committed_readable(engine: ChunkEngine) -> None:
    first = os.urandom(CHECKSUM_BLOCK + 100)  # ends inside a block: the append continues its CRC
    write(engine, cid(1), 0, first)
    more = os.urandom(2 * CHECKSUM_BLOCK)
    meta = engine.update(cid(1), len(first), more, chunk_size=CS, chain_ver=1)
    assert meta.pending.file_id == meta.committed.file_id
    assert len(data_files(engine)) == 1
    assert engine.read(cid(1)).data == first
    assert engine.read(cid(1), version=2).data == first + more
    assert meta.pending.crc == crc32c(first + more)
    engine.commit(cid(1), 2)
    assert engine.read(cid(1)).data == first + more
    assert len(data_files(engine)) == 1


def test_in_place_append_can_be_turned_off(tmp_path: Path) -> None:
    with ChunkEngine(tmp_path, EngineOptions(in_place_append=False)) as eng:
        write(eng, cid(1), 0, b"a" * 1000)
        meta = eng.update(cid(1), 1000, b"b" * 1000, chunk_size=CS, chain_ver=1)
        assert meta.pending.file_id != meta.committed.file_id
        assert eng.read(cid(1), version=2).data == b"a" * 1000 + b"b" * 1000


def test_abort_of_in_place_append_trims_the_file(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"a" * 1000)
    engine.update(cid(1), 1000, b"b" * 5000, chunk_size=CS, chain_ver=1)
    (path,) = data_files(engine)
    assert path.stat().st_size == 6000
    meta = engine.abort(cid(1))
    assert meta is not None and meta.pending is None
    assert path.stat().st_size == 1000
    assert engine.read(cid(1)).data == b"a" * 1000
    assert engine.space_info().used == 1000


def test_abort_of_cow_version_removes_its_file(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"a" * 1000)
    engine.update(cid(1), 0, b"b", chunk_size=CS, chain_ver=1)
    assert len(data_files(engine)) == 2
    with pytest.raises(FS3Error) as err:
        engine.abort(cid(1), version=3)
    assert err.value.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
    engine.abort(cid(1), version=2)
    assert len(data_files(engine)) == 1
    assert engine.read(cid(1)).data == b"a" * 1000
    assert engine.abort(cid(1)).pending is None  # nothing pending: a no-op


def test_abort_of_uncommitted_creation_removes_the_chunk(engine: ChunkEngine) -> None:
    engine.update(cid(1), 0, b"x", chunk_size=CS, chain_ver=1)
    assert engine.abort(cid(1)) is None
    assert engine.get_meta(cid(1)) is None
    assert data_files(engine) == []
    assert engine.space_info().chunk_count == 0


def test_hole_reads_as_zeros(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"abc")
    write(engine, cid(1), 100_000, b"xyz")
    data = engine.read(cid(1)).data
    assert data == b"abc" + bytes(100_000 - 3) + b"xyz"


def test_versions_and_idempotent_commit(engine: ChunkEngine) -> None:
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 0, b"a", chunk_size=CS, chain_ver=1, version=2)  # a missing update
    assert err.value.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
    engine.update(cid(1), 0, b"a", chunk_size=CS, chain_ver=1, version=1)
    # a retried update of the same version replaces the pending one
    meta = engine.update(cid(1), 0, b"b", chunk_size=CS, chain_ver=1, version=1)
    assert engine.read(cid(1), version=1).data == b"b"
    assert len(data_files(engine)) == 1
    with pytest.raises(FS3Error) as err:
        engine.commit(cid(1), 2)
    assert err.value.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
    assert engine.commit(cid(1), 1, chain_ver=7).chain_ver == 7
    assert engine.commit(cid(1), 1) == engine.get_meta(cid(1))  # retried commit: no-op
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 0, b"c", chunk_size=CS, chain_ver=1, version=1)  # stale
    assert err.value.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
    assert meta.pending.crc == crc32c(b"b")
    assert engine.commit(cid(9), 1) is None


def test_check_update_classifies_a_predecessors_version(engine: ChunkEngine) -> None:
    assert check_update(None, 1) is UpdateCheck.APPLY
    assert check_update(None, 2) is UpdateCheck.MISSING
    write(engine, cid(1), 0, b"v1")
    write(engine, cid(1), 0, b"v2")
    meta = engine.get_meta(cid(1))
    assert [check_update(meta, v).name for v in (1, 2, 3, 4)] == [
        "COMMITTED",
        "COMMITTED",
        "APPLY",
        "MISSING",
    ]
    meta = engine.update(cid(1), 0, b"v3", chunk_size=CS, chain_ver=1)
    assert [check_update(meta, v).name for v in (2, 3, 4)] == ["COMMITTED", "STALE", "MISSING"]


def test_sender_checksum_is_verified(engine: ChunkEngine) -> None:
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 0, b"data", chunk_size=CS, chain_ver=1, checksum=crc32c(b"date"))
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
    assert engine.get_meta(cid(1)) is None
    engine.update(cid(1), 0, b"data", chunk_size=CS, chain_ver=1, checksum=crc32c(b"data"))
    # a write of the whole content takes its CRC from the verified checksum: it must be right
    whole = os.urandom(3 * CHECKSUM_BLOCK + 5)
    meta = engine.update(cid(1), 0, whole, chunk_size=CS, chain_ver=1, checksum=crc32c(whole))
    assert meta.pending.crc == crc32c(whole) and engine.commit(cid(1), 1).crc == crc32c(whole)
    meta = engine.replace(cid(1), b"xy", chunk_size=CS, chain_ver=1, version=2, checksum=crc32c(b"xy"))
    assert meta.pending.crc == crc32c(b"xy") and engine.read(cid(1), version=2).data == b"xy"


def test_update_and_truncate_can_commit_at_once(tmp_path: Path) -> None:
    """As the tail of a chain does: the new version is committed in the update's one transaction,
    whichever way the update is stored."""
    eng = ChunkEngine(tmp_path)
    model = bytearray()
    steps = [  # (offset, data), or the length of a truncate
        (0, b"a" * 300_000),  # a new chunk
        (300_000, b"b" * 5000),  # an append in place
        (70_000, b"c" * 100),  # a small overwrite: layered
        (200_000, b"d" * 100),  # another, which folds the first
        (10, b"e" * 250_000),  # a copy
        100_000,
    ]
    for version, step in enumerate(steps, start=1):
        before = eng.commit_stats().transactions
        if isinstance(step, int):
            meta = eng.truncate(cid(1), step, chunk_size=CS, chain_ver=2, commit=True)
            del model[step:]
        else:
            offset, data = step
            meta = eng.update(cid(1), offset, data, chunk_size=CS, chain_ver=1, commit=True)
            model[offset : offset + len(data)] = data
        assert eng.commit_stats().transactions == before + 1, step
        assert (meta.committed_ver, meta.pending) == (version, None), step
        assert meta.committed.crc == crc32c(model) and eng.read(cid(1)).data == model, step
        assert sorted(meta.file_lengths()) == sorted(int(p.suffix[1:], 16) for p in data_files(eng)), step
    eng.close()
    with ChunkEngine(tmp_path) as eng:
        assert eng.read(cid(1)).data == model and len(data_files(eng)) == 1


@pytest.mark.parametrize("size", [0, 1000, 32 * 1024, 3 * 64 * 1024, 128 * MiB, 1 << 40])
def test_bad_chunk_sizes_are_refused(engine: ChunkEngine, size: int) -> None:
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 0, b"x", chunk_size=size, chain_ver=1)
    assert err.value.code is StatusCode.INVALID_ARGUMENT
    assert "power of two" in err.value.message


def test_every_power_of_two_from_64k_to_64m_works(engine: ChunkEngine) -> None:
    for shift in range(16, 27):
        size = 1 << shift
        write(engine, cid(shift), size - 3, b"end", size=size)
        assert engine.get_meta(cid(shift)).chunk_size == size
        assert engine.read(cid(shift), size - 3).data == b"end"


def test_chunk_size_is_fixed_by_the_first_write(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"x", size=64 * 1024)
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 0, b"y", chunk_size=CS, chain_ver=1)
    assert err.value.code is StatusCode.INVALID_ARGUMENT
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 64 * 1024 - 1, b"yz", chunk_size=64 * 1024, chain_ver=1)
    assert err.value.code is StatusCode.STORAGE_CHUNK_TOO_LARGE
    with pytest.raises(FS3Error) as err:
        engine.truncate(cid(1), 64 * 1024 + 1, chunk_size=64 * 1024, chain_ver=1)
    assert err.value.code is StatusCode.STORAGE_CHUNK_TOO_LARGE


def test_bad_ids_and_ranges_are_refused(engine: ChunkEngine) -> None:
    for bad in (b"", b"x" * 65, "text"):
        with pytest.raises(FS3Error) as err:
            engine.read(bad)  # type: ignore[arg-type]
        assert err.value.code is StatusCode.INVALID_ARGUMENT
    with pytest.raises(FS3Error):
        engine.update(cid(1), -1, b"x", chunk_size=CS, chain_ver=1)
    with pytest.raises(FS3Error):
        engine.read(cid(1), -1)


def test_truncate_shrinks_and_extends(engine: ChunkEngine) -> None:
    payload = os.urandom(300_000)
    write(engine, cid(1), 0, payload)
    meta = engine.truncate(cid(1), 1000, chunk_size=CS, chain_ver=1)
    assert engine.read(cid(1)).data == payload  # the shrink is pending: readers still see it all
    engine.commit(cid(1), meta.pending_ver)
    assert engine.read(cid(1)).data == payload[:1000]
    meta = engine.truncate(cid(1), 5000, chunk_size=CS, chain_ver=1)
    engine.commit(cid(1), meta.pending_ver)
    assert engine.read(cid(1)).data == payload[:1000] + bytes(4000)
    meta = engine.truncate(cid(2), 10, chunk_size=CS, chain_ver=1)  # creates the chunk
    engine.commit(cid(2), meta.pending_ver)
    assert engine.read(cid(2)).data == bytes(10)
    assert engine.space_info().used == 5010


def test_remove_is_a_pending_version(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"keep me until commit")
    meta = engine.remove(cid(1), chain_ver=3)
    assert meta is not None and meta.pending.removal and meta.pending_ver == 2
    assert engine.read(cid(1)).data == b"keep me until commit"
    assert engine.commit(cid(1), 2) is None
    assert engine.get_meta(cid(1)) is None
    assert engine.commit(cid(1), 2) is None  # retried
    assert data_files(engine) == []
    assert engine.remove(cid(1), chain_ver=3) is None
    assert engine.space_info().chunk_count == 0


def test_replace_as_pending_and_as_committed(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"old")
    meta = engine.replace(cid(1), b"synced", chunk_size=CS, chain_ver=5, version=7)
    assert (meta.committed_ver, meta.pending_ver) == (1, 7)
    assert engine.read(cid(1)).data == b"old"
    engine.commit(cid(1), 7)
    assert engine.read(cid(1)).data == b"synced"
    with pytest.raises(FS3Error) as err:
        engine.replace(cid(1), b"older", chunk_size=CS, chain_ver=5, version=3)
    assert err.value.code is StatusCode.STORAGE_CHUNK_VERSION_MISMATCH
    engine.update(cid(1), 0, b"in flight", chunk_size=CS, chain_ver=5)
    meta = engine.replace(cid(1), b"authoritative", chunk_size=CS, chain_ver=6, version=4, commit=True)
    assert (meta.committed_ver, meta.pending, meta.chain_ver) == (4, None, 6)
    assert engine.read(cid(1)).data == b"authoritative"
    assert len(data_files(engine)) == 1
    meta = engine.replace(cid(2), b"new", chunk_size=CS, chain_ver=6, version=9, commit=True)
    assert engine.read(cid(2)).version == 9


def test_query_last_chunk_and_remove_range(engine: ChunkEngine) -> None:
    for index in range(5):
        write(engine, cid(7, index), 0, b"x" * (100 + index))
    write(engine, cid(8, 0), 0, b"other file")
    engine.update(cid(7, 9), 0, b"pending only", chunk_size=CS, chain_ver=1)
    last = engine.query_last_chunk(cid(7, 0), cid(8, 0))
    assert (last.chunk_id, last.length, last.count) == (cid(7, 4), 104, 5)
    assert last.total_length == sum(100 + i for i in range(5))
    empty = engine.query_last_chunk(cid(9, 0), cid(10, 0))
    assert (empty.chunk_id, empty.count, empty.total_length) == (None, 0, 0)
    assert engine.remove_range(cid(7, 3), cid(8, 0)) == 3  # chunk 3, 4 and the pending 9
    assert engine.query_last_chunk(cid(7, 0), cid(8, 0)).chunk_id == cid(7, 2)
    assert engine.read(cid(8, 0)).data == b"other file"
    assert engine.remove_range(cid(0)) == 4
    assert data_files(engine) == []
    assert engine.space_info().used == 0


def test_remove_range_crosses_scan_batches(tmp_path: Path) -> None:
    engine = ChunkEngine(tmp_path, EngineOptions(sync=False))
    for index in range(1500):
        engine.replace(cid(1, index), b"z", chunk_size=64 * 1024, chain_ver=1, version=1, commit=True)
    assert len(engine.dump_metadata()) == 1500
    assert engine.remove_range(cid(1, 0), cid(2, 0)) == 1500
    assert engine.space_info().chunk_count == 0
    engine.close()


def test_space_accounting(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"a" * 1000)
    write(engine, cid(2), 0, b"b" * 3000)
    info = engine.space_info()
    assert (info.used, info.chunk_count) == (4000, 2)
    assert 0 < info.free <= info.capacity
    engine.update(cid(1), 0, b"c" * 10, chunk_size=CS, chain_ver=1)  # COW: two files for chunk 1
    assert engine.space_info().used == 5000
    engine.commit(cid(1), 2)
    assert engine.space_info().used == 4000
    engine.update(cid(2), 3000, b"d" * 500, chunk_size=CS, chain_ver=1)  # in place: one file
    assert engine.space_info().used == 4500
    engine.remove(cid(1), chain_ver=1)
    engine.commit(cid(1), 3)
    assert (engine.space_info().used, engine.space_info().chunk_count) == (3500, 1)


def test_dump_metadata_and_pending_chunks(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"a")
    engine.update(cid(2), 0, b"b", chunk_size=CS, chain_ver=4)
    metas = engine.dump_metadata()
    assert [m.chunk_id for m in metas] == [cid(1), cid(2)]
    (pending,) = engine.pending_chunks()
    assert (pending.chunk_id, pending.pending_ver, pending.chain_ver) == (cid(2), 1, 4)


def test_state_survives_reopen(tmp_path: Path) -> None:
    with ChunkEngine(tmp_path) as eng:
        write(eng, cid(1), 0, b"durable")
        eng.update(cid(1), 0, b"pending", chunk_size=CS, chain_ver=2)
    with ChunkEngine(tmp_path) as eng:
        assert eng.read(cid(1)).data == b"durable"
        (pending,) = eng.pending_chunks()
        assert eng.recovery.pending == 1 and pending.pending_ver == 2
        eng.commit(cid(1), 2)
        assert eng.read(cid(1)).data == b"pending"
        assert eng.space_info().used == 7


def test_a_target_opens_in_one_engine_only(tmp_path: Path) -> None:
    with ChunkEngine(tmp_path):
        with pytest.raises(FS3Error) as err:
            ChunkEngine(tmp_path)
        assert err.value.code is StatusCode.FAILED_PRECONDITION
    ChunkEngine(tmp_path).close()


def test_closed_engine_refuses_calls(tmp_path: Path) -> None:
    eng = ChunkEngine(tmp_path)
    eng.close()
    eng.close()
    with pytest.raises(FS3Error) as err:
        eng.get_meta(cid(1))
    assert err.value.code is StatusCode.STORAGE_TARGET_OFFLINE


def test_threads_on_different_chunks(tmp_path: Path) -> None:
    eng = ChunkEngine(tmp_path, EngineOptions(sync=False))
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for round_ in range(20):
                payload = bytes([n, round_]) * 3000
                write(eng, cid(n), round_ * 10, payload)
                assert eng.read(cid(n), round_ * 10, len(payload)).data == payload
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert eng.space_info().chunk_count == 8
    eng.close()


def test_reads_race_commits_on_the_same_chunk(tmp_path: Path) -> None:
    """A reader never sees a torn or failed read while the chunk is rewritten under it."""
    eng = ChunkEngine(tmp_path, EngineOptions(sync=False))
    size = 4 * CHECKSUM_BLOCK
    write(eng, cid(1), 0, bytes([0]) * size)
    stop = threading.Event()
    bad: list[object] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                got = eng.read(cid(1)).data
            except FS3Error as exc:
                bad.append(exc)
                return
            if len(set(got)) != 1:
                bad.append(got[:16])
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        for n in range(1, 60):
            write(eng, cid(1), 0, bytes([n]) * size)
    finally:
        stop.set()
        t.join()
    assert bad == []
    eng.close()


def test_racing_updates_on_one_chunk_take_turns(tmp_path: Path) -> None:
    """Even without the service's chunk lock, racing appends and overwrites never tear a version."""
    eng = ChunkEngine(tmp_path, EngineOptions(sync=False))
    write(eng, cid(1), 0, b"base")
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        barrier.wait()
        try:
            for _ in range(10):
                # appends go in place while nothing is pending, else copy-on-write
                eng.update(cid(1), 4, bytes([n]) * 70_000, chunk_size=CS, chain_ver=1)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    pending = eng.read(cid(1), version=2).data
    assert pending[:4] == b"base" and len(set(pending[4:])) == 1
    assert eng.read(cid(1)).data == b"base"
    eng.commit(cid(1), 2)
    assert len(data_files(eng)) == 1
    eng.close()


async def test_async_wrapper_runs_off_the_loop(tmp_path: Path) -> None:
    eng = await AsyncChunkEngine.open(tmp_path)
    try:
        metas = await asyncio.gather(
            *(eng.update(cid(n), 0, bytes([n]) * 1000, chunk_size=CS, chain_ver=1) for n in range(10))
        )
        await asyncio.gather(*(eng.commit(m.chunk_id, m.pending_ver) for m in metas))
        reads = await asyncio.gather(*(eng.read(cid(n)) for n in range(10)))
        assert [r.data for r in reads] == [bytes([n]) * 1000 for n in range(10)]
        assert (await eng.space_info()).chunk_count == 10
        assert (await eng.query_last_chunk(cid(0), cid(100))).chunk_id == cid(9)
        assert await eng.pending_chunks() == []
    finally:
        await eng.close()


def test_write_of_several_ranges_is_one_version(engine: ChunkEngine) -> None:
    """A write of several ranges (a client's buffered random writes) changes the chunk from one
    version to the next with all of them; the bytes between them are the old version's, and
    ranges past its end leave holes of zeros."""
    model = bytearray(os.urandom(10 * CHECKSUM_BLOCK + 77))
    assert write(engine, cid(4), 0, bytes(model)) == 1

    def several(ranges: list[tuple[int, bytes]], version: int) -> None:
        extents = [(off, len(d)) for off, d in ranges]
        data = b"".join(d for _, d in ranges)
        meta = engine.update(
            cid(4), extents[0][0], data, chunk_size=CS, chain_ver=1, checksum=crc32c(data), extents=extents
        )
        assert meta.pending_ver == version
        assert engine.commit(cid(4), version) is not None
        for off, d in ranges:
            model[len(model) : off + len(d)] = bytes(max(0, off + len(d) - len(model)))
            model[off : off + len(d)] = d
        got = engine.read(cid(4))
        assert (got.data, got.version, got.chunk_crc) == (bytes(model), version, crc32c(bytes(model)))

    # inside one checksum block and across several, small enough for an overlay
    several([(10, b"a" * 5), (100, b"b" * 3)], 2)
    several([(CHECKSUM_BLOCK - 2, b"c" * 4), (3 * CHECKSUM_BLOCK + 1, b"d" * 9)], 3)
    # across the whole chunk (copy-on-write), and past its end (a hole, then data)
    several([(0, b"e"), (5 * CHECKSUM_BLOCK, os.urandom(CHECKSUM_BLOCK)), (len(model) - 1, b"fg")], 4)
    several([(7, b"h" * 3), (len(model) + 1000, b"i" * 20), (len(model) + 50_000, b"j")], 5)
    # after a reopen, the same bytes
    engine.close()
    with ChunkEngine(engine.path) as again:
        assert again.read(cid(4)).data == bytes(model)


@pytest.mark.parametrize(
    "extents, message",
    [
        ([(0, 4), (2, 4)], "not after"),  # overlapping
        ([(0, 4), (4, 4)], "not after"),  # touching: one range
        ([(8, 4), (0, 4)], "not after"),  # out of order
        ([(0, 4), (10, 0)], "empty"),
        ([(0, 4), (10, 3)], "hold length"),  # 7 bytes named, 8 given
        ([(1, 4), (10, 4)], "start at offset"),
    ],
)
def test_write_of_several_ranges_refuses_bad_ranges(engine: ChunkEngine, extents, message) -> None:
    assert write(engine, cid(5), 0, b"z" * 100) == 1
    with pytest.raises(FS3Error) as e:
        engine.update(cid(5), 0, b"y" * 8, chunk_size=CS, chain_ver=1, extents=extents)
    assert e.value.code == StatusCode.INVALID_ARGUMENT and message in e.value.message
    with pytest.raises(FS3Error) as e:
        engine.update(cid(5), 0, b"y" * 8, chunk_size=CS, chain_ver=1, extents=[(0, 4), (CS - 2, 4)])
    assert e.value.code == StatusCode.STORAGE_CHUNK_TOO_LARGE
    assert engine.read(cid(5)).data == b"z" * 100 and engine.get_meta(cid(5)).pending is None


def test_checksum_block_follows_the_chunk_size(engine: ChunkEngine) -> None:
    """New versions of chunks up to 4 MiB verify in 4 KiB blocks (a small read reads 4 KiB, not
    64); larger chunks keep 64 KiB blocks, so no version carries more than 4 KiB of checksums."""
    small = engine.update(cid(6), 0, os.urandom(CS), chunk_size=CS, chain_ver=1, commit=True).committed
    assert small.block == FINE_BLOCK == 4096 and len(small.block_crcs) == 4 * 256
    big = 8 * MiB
    large = engine.update(cid(7), 0, os.urandom(big), chunk_size=big, chain_ver=1, commit=True).committed
    assert large.block == CHECKSUM_BLOCK == 65536 and len(large.block_crcs) == 4 * 128
    # the metadata says which, and says it again after a reopen
    engine.close()
    with ChunkEngine(engine.path) as again:
        assert again.get_meta(cid(6)).committed.block == FINE_BLOCK
        assert again.get_meta(cid(7)).committed.block == CHECKSUM_BLOCK


def test_versions_with_64k_blocks_from_older_builds_stay_readable_and_updatable(
    engine: ChunkEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target written before 4 KiB blocks holds 1 MiB chunks with 64 KiB blocks (format 2). They
    read, take appends and small overwrites in their own blocks, and a rewrite moves them to 4 KiB."""
    model = bytearray(os.urandom(CS - 100_000))
    with monkeypatch.context() as m:
        m.setattr("fs3.storage.chunk_engine.block_size", lambda chunk_size: CHECKSUM_BLOCK)  # an old build
        write(engine, cid(8), 0, bytes(model))
    meta = engine.get_meta(cid(8))
    assert meta.committed.block == CHECKSUM_BLOCK
    # its record as format 2 wrote it decodes the same
    raw = bytearray(encode_meta(meta))
    raw[0] = 2
    assert decode_meta(cid(8), bytes(raw)) == meta
    assert engine.read(cid(8), 70_000, 5).data == model[70_000:70_005]
    # an append and a small overwrite keep the version's 64 KiB blocks (they share its file)
    more = os.urandom(50_000)
    write(engine, cid(8), len(model), more)
    model += more
    write(engine, cid(8), 200_000, b"x" * 3000)
    model[200_000:203_000] = b"x" * 3000
    v = engine.get_meta(cid(8)).committed
    assert v.block == CHECKSUM_BLOCK and v.layered and engine.read(cid(8)).data == bytes(model)
    # a bad byte is still found, in its 64 KiB block
    engine.close()
    with ChunkEngine(engine.path) as again:  # folds the overlay
        assert again.read(cid(8)).data == bytes(model)
        data_file = next(p for p in (again.path / "chunks").rglob("*") if p.is_file())
        with open(data_file, "r+b") as f:
            f.seek(3 * CHECKSUM_BLOCK + 5)
            byte = f.read(1)[0]
            f.seek(3 * CHECKSUM_BLOCK + 5)  # the read moved past it: flip that byte, not the next
            f.write(bytes([byte ^ 1]))
        with pytest.raises(FS3Error) as e:
            again.read(cid(8), 3 * CHECKSUM_BLOCK + 60_000, 4)
        assert e.value.code == StatusCode.STORAGE_CHECKSUM_MISMATCH and "block 3 " in e.value.message
        # a whole rewrite is a new version with 4 KiB blocks
        again.update(cid(8), 0, bytes(model), chunk_size=CS, chain_ver=1, commit=True)
        v = again.get_meta(cid(8)).committed
        assert v.block == FINE_BLOCK and again.read(cid(8)).data == bytes(model)
