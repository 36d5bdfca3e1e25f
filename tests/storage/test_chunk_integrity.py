"""Corruption is detected on read; recovery removes orphans and trims crashed appends; disk errors
(a full or read-only file system, made real with a small tmpfs) take the target offline."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest
from mounts import unmount

from fs3.errors import FS3Error, StatusCode
from fs3.storage.chunk_engine import ChunkEngine, EngineOptions
from fs3.storage.chunk_files import ChunkFiles
from fs3.storage.chunk_meta import block_size

pytestmark = pytest.mark.timeout(60)

CS = 1 << 20
BLOCK = block_size(CS)  # the checksum block of a new version of such a chunk


def cid(inode: int, index: int = 0) -> bytes:
    return struct.pack(">BBQHI", 0, 0, inode, 0, index)


def write(eng: ChunkEngine, chunk: bytes, offset: int, data: bytes, size: int = CS) -> None:
    meta = eng.update(chunk, offset, data, chunk_size=size, chain_ver=1)
    eng.commit(chunk, meta.pending_ver)


def data_file(eng: ChunkEngine, chunk: bytes) -> Path:
    meta = eng.get_meta(chunk)
    return ChunkFiles(eng.path / "chunks").path(chunk, meta.committed.file_id)


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def engine(tmp_path: Path):
    eng = ChunkEngine(tmp_path / "target")
    yield eng
    eng.close()


def test_flipped_bit_is_detected_on_read(engine: ChunkEngine) -> None:
    payload = os.urandom(4 * BLOCK)
    write(engine, cid(1), 0, payload)
    flip_byte(data_file(engine, cid(1)), 2 * BLOCK + 17)
    with pytest.raises(FS3Error) as err:
        engine.read(cid(1))
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
    assert "block 2" in err.value.message
    with pytest.raises(FS3Error) as err:
        engine.read(cid(1), 2 * BLOCK + 100, 10)
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
    # blocks that were not touched still read, and the target stays online: one bad chunk is for
    # resync to repair, not a reason to drop every chunk of the disk
    assert engine.read(cid(1), 0, BLOCK).data == payload[:BLOCK]
    assert engine.online
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), 0, b"x", chunk_size=CS, chain_ver=1)  # no COW from a corrupt base
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
    # an update that rewrites the bad block needs none of its old bytes, so it repairs the chunk
    meta = engine.update(cid(1), 2 * BLOCK, payload[:BLOCK], chunk_size=CS, chain_ver=1)
    engine.commit(cid(1), meta.pending_ver)
    repaired = payload[: 2 * BLOCK] + payload[:BLOCK] + payload[3 * BLOCK :]
    assert engine.read(cid(1)).data == repaired
    flip_byte(data_file(engine, cid(1)), 5)
    engine.replace(cid(1), payload, chunk_size=CS, chain_ver=2, version=5, commit=True)  # as resync does
    assert engine.read(cid(1)).data == payload


def test_flipped_bit_in_a_small_chunk(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"tiny chunk")
    flip_byte(data_file(engine, cid(1)), 0)
    with pytest.raises(FS3Error) as err:
        engine.read(cid(1), 5, 2)
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH


def test_short_or_missing_data_file_is_a_checksum_mismatch(engine: ChunkEngine) -> None:
    write(engine, cid(1), 0, b"a" * 1000)
    write(engine, cid(2), 0, b"b" * 1000)
    os.truncate(data_file(engine, cid(1)), 999)
    data_file(engine, cid(2)).unlink()
    for chunk in (cid(1), cid(2)):
        with pytest.raises(FS3Error) as err:
            engine.read(chunk)
        assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH


def test_recovery_reports_missing_files(tmp_path: Path) -> None:
    with ChunkEngine(tmp_path) as eng:
        write(eng, cid(1), 0, b"gone")
        data_file(eng, cid(1)).unlink()
    with ChunkEngine(tmp_path) as eng:
        assert [chunk for chunk, _ in eng.recovery.missing_files] == [cid(1)]


def test_recovery_removes_orphans_and_trims_crashed_appends(tmp_path: Path) -> None:
    with ChunkEngine(tmp_path) as eng:
        write(eng, cid(1), 0, b"committed")
        write(eng, cid(2), 0, b"also committed")
        eng.update(cid(2), 0, b"pending", chunk_size=CS, chain_ver=1)
        meta2 = eng.get_meta(cid(2))
        files = ChunkFiles(eng.path / "chunks")
        committed1 = data_file(eng, cid(1))
    # what a crash leaves: a new version's file written before its metadata transaction, a file of a
    # chunk that has no metadata at all, bytes appended in place but never recorded, and a stranger
    orphan = files.path(cid(1), 0x999)
    orphan.write_bytes(b"half a version")
    stray = files.path(cid(3), 0x99A)
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"never recorded")
    with open(committed1, "ab") as f:
        f.write(b" appended, not recorded")
    stranger = files.path(cid(1), 1).parent / "README"
    stranger.write_text("not ours")

    with ChunkEngine(tmp_path) as eng:
        report = eng.recovery
        assert (report.orphans_removed, report.files_trimmed, report.unknown_files) == (2, 1, 1)
        assert report.pending == 1 and report.missing_files == []
        assert not orphan.exists() and not stray.exists() and stranger.exists()
        assert committed1.stat().st_size == len(b"committed")
        assert eng.read(cid(1)).data == b"committed"
        assert eng.read(cid(2)).data == b"also committed"
        assert eng.read(cid(2), version=meta2.pending_ver).data == b"pending" + b"also committed"[7:]
        # new files never reuse an id a crash may have left behind
        meta = eng.update(cid(1), 0, b"C", chunk_size=CS, chain_ver=1)
        assert meta.pending.file_id > 0x99A
        eng.commit(cid(1), meta.pending_ver)
        assert eng.read(cid(1)).data == b"Committed"


# -- real disk errors on a small tmpfs -----------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 1 MiB tmpfs, unmounted (lazily, if something still holds it) even when the test fails."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {exc}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def test_full_disk_takes_the_target_offline(small_fs: Path) -> None:
    failures: list[FS3Error] = []
    eng = ChunkEngine(small_fs / "target", on_failure=failures.append)
    written: dict[bytes, bytes] = {}
    try:
        with pytest.raises(FS3Error) as err:
            for n in range(100):
                payload = os.urandom(64 * 1024)
                write(eng, cid(n), 0, payload, size=64 * 1024)
                written[cid(n)] = payload
        assert err.value.code is StatusCode.STORAGE_NO_SPACE
        assert len(written) > 3
        assert not eng.online and eng.failure.code is StatusCode.STORAGE_NO_SPACE
        assert [f.code for f in failures] == [StatusCode.STORAGE_NO_SPACE]
        for call in (lambda: eng.read(cid(0)), eng.space_info, lambda: eng.commit(cid(0), 1)):
            with pytest.raises(FS3Error) as err:
                call()
            assert err.value.code is StatusCode.STORAGE_NO_SPACE
    finally:
        eng.close()
    assert len(failures) == 1
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_fs)], check=True)
    with ChunkEngine(small_fs / "target") as eng:
        for chunk, payload in written.items():
            assert eng.read(chunk).data == payload
        assert eng.space_info().chunk_count == len(written)


def test_read_only_file_system_refuses_to_open(small_fs: Path) -> None:
    with ChunkEngine(small_fs / "target") as eng:
        write(eng, cid(1), 0, b"data")
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    with pytest.raises(FS3Error) as err:
        ChunkEngine(small_fs / "target")
    assert err.value.code is StatusCode.STORAGE_IO_ERROR


@pytest.fixture
def failing_disk(tmp_path: Path):
    """An ext4 file system on a loop device whose backing file lives on a 6 MiB tmpfs but claims
    32 MiB: once the tmpfs is full, the loop device fails writes and ext4 reports EIO, as a dying
    disk would. Everything is unmounted (the loop device detaches itself) even when the test fails."""
    back, mnt = tmp_path / "back", tmp_path / "disk"
    back.mkdir()
    mnt.mkdir()
    image = back / "disk.img"
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(back)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {exc}")
    try:
        image.touch()
        os.truncate(image, 32 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        mounted = subprocess.run(
            ["mount", "-o", "loop,errors=remount-ro", str(image), str(mnt)], capture_output=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a loop device here: {mounted.stderr.decode().strip()}")
        try:
            yield mnt
        finally:
            unmount(mnt)
    finally:
        unmount(back)


@pytest.mark.parametrize("direct_io", [False, True], ids=["page-cache", "direct"])
def test_failing_disk_takes_the_target_offline(failing_disk: Path, direct_io: bool) -> None:
    failures: list[FS3Error] = []
    eng = ChunkEngine(failing_disk / "target", EngineOptions(direct_io=direct_io), on_failure=failures.append)
    # Through the page cache ext4 reports the loop device's failed writeback as EIO; an O_DIRECT
    # write gets the backing file's ENOSPC from the loop device itself. Either takes it offline.
    codes = (
        {StatusCode.STORAGE_IO_ERROR, StatusCode.STORAGE_NO_SPACE}
        if direct_io
        else {StatusCode.STORAGE_IO_ERROR}
    )
    try:
        committed = 0
        with pytest.raises(FS3Error) as err:
            for n in range(30):
                write(eng, cid(n), 0, os.urandom(1 << 20))
                committed += 1
        assert err.value.code in codes
        assert any(m in err.value.message for m in ("Input/output error", "Read-only", "No space left"))
        assert committed >= 1
        assert not eng.online and [f.code for f in failures] == [err.value.code]
        for call in (
            lambda: eng.read(cid(0)),
            lambda: eng.update(cid(0), 0, b"x", chunk_size=CS, chain_ver=1),
        ):
            with pytest.raises(FS3Error) as err2:
                call()
            assert err2.value.code is err.value.code
    finally:
        eng.close()
