"""Corruption is detected on read; recovery removes orphans and trims crashed appends; disk errors
(a read-only or failing file system, made real with a small tmpfs) take the target offline, while a
full file system and passing shortages (descriptors, memory) fail the call alone."""

from __future__ import annotations

import errno
import os
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from mounts import unmount

from fs3.errors import FS3Error, StatusCode
from fs3.storage.chunk_engine import ChunkEngine, EngineOptions
from fs3.storage.chunk_files import ChunkFiles
from fs3.storage.chunk_meta import block_size, crc32c

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


def test_a_layered_chunk_whose_data_file_is_lost_does_not_stop_the_target_opening(tmp_path: Path) -> None:
    """Opening the engine folds a committed layered version into its data file; where that file is
    lost (fsck, an operator), the chunk stays as it is and is reported, like any chunk whose file
    is lost, and the rest of the target opens: resync's whole-chunk write then repairs it."""
    payload = os.urandom(CS)
    with ChunkEngine(tmp_path) as eng:
        write(eng, cid(1), 0, payload)
        write(eng, cid(2), 0, b"untouched")
        eng.update(cid(1), 100, b"x" * 10, chunk_size=CS, chain_ver=1, commit=True)  # a small overwrite
        meta = eng.get_meta(cid(1))
        assert meta.committed.layered
        overlay = eng._files.path(cid(1), meta.committed.overlay_file_id)
        data_file(eng, cid(1)).unlink()
    failures: list[FS3Error] = []
    with ChunkEngine(tmp_path, on_failure=failures.append) as eng:
        assert eng.recovery.missing_files == [(cid(1), meta.committed.file_id)]
        assert eng.get_meta(cid(1)) == meta  # left layered: nothing to fold into
        with pytest.raises(FS3Error) as err:
            eng.read(cid(1))
        assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
        with pytest.raises(FS3Error) as err:
            eng.update(cid(1), 200, b"y", chunk_size=CS, chain_ver=1)  # cannot fold it either
        assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
        assert eng.online and failures == []
        assert eng.read(cid(2)).data == b"untouched"
        eng.replace(cid(1), payload, chunk_size=CS, chain_ver=2, version=5, commit=True)  # as resync does
        assert eng.read(cid(1)).data == payload
        assert not overlay.exists()
    with ChunkEngine(tmp_path) as eng:
        assert eng.recovery.missing_files == []
        assert eng.read(cid(1)).data == payload


@pytest.mark.parametrize("layered", [False, True], ids=["append", "fold"])
def test_an_in_place_update_of_a_chunk_whose_file_is_lost_fails_that_chunk_alone(
    engine: ChunkEngine, layered: bool
) -> None:
    """An update that writes into the committed version's own file (an append, or the fold of a
    previous small overwrite) fails as copy-on-write does where that file is lost: a checksum
    error of that chunk, which the chain repairs by sending the whole chunk, and the target
    stays online."""
    failures: list[FS3Error] = []
    engine._on_failure = failures.append
    payload = os.urandom(3 * BLOCK)
    write(engine, cid(1), 0, payload)
    if layered:
        engine.update(cid(1), 10, b"x", chunk_size=CS, chain_ver=1, commit=True)
        assert engine.get_meta(cid(1)).committed.layered
    meta = engine.get_meta(cid(1))
    data_file(engine, cid(1)).unlink()
    with pytest.raises(FS3Error) as err:
        engine.update(cid(1), len(payload), b"more", chunk_size=CS, chain_ver=1)
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
    assert "missing" in err.value.message
    assert engine.online and failures == []
    assert engine.get_meta(cid(1)) == meta
    write(engine, cid(1), 0, payload + b"more")  # the whole chunk, as a predecessor then sends it
    assert engine.read(cid(1)).data == payload + b"more"
    write(engine, cid(2), 0, b"other chunks go on")
    assert engine.read(cid(2)).data == b"other chunks go on"


def test_aborting_an_append_to_a_chunk_whose_file_is_lost_keeps_the_target_online(
    engine: ChunkEngine,
) -> None:
    """Aborting an in-place append trims the shared file back to the committed length; where the
    file is lost by then there is nothing to trim, and the abort succeeds."""
    failures: list[FS3Error] = []
    engine._on_failure = failures.append
    write(engine, cid(1), 0, b"committed")
    meta = engine.update(cid(1), len(b"committed"), b" appended", chunk_size=CS, chain_ver=1)
    assert meta.pending.file_id == meta.committed.file_id  # appended in place
    data_file(engine, cid(1)).unlink()
    assert engine.abort(cid(1), meta.pending_ver) == replace(meta, pending=None)
    assert engine.online and failures == []
    with pytest.raises(FS3Error) as err:
        engine.read(cid(1))
    assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH


def test_a_version_recorded_lost_fails_reads_and_partial_updates_until_a_whole_write(tmp_path: Path) -> None:
    """What a resync records where no replica could read the chain's committed version: the
    number, length and CRC32C with no bytes. The older version the target held is dropped (not
    served), reads and updates that need the old bytes fail as a checksum error, the record
    survives a reopen, and a write of the whole content replaces it."""
    old = os.urandom(3 * BLOCK)
    lost = os.urandom(2 * BLOCK + 5)
    with ChunkEngine(tmp_path) as eng:
        write(eng, cid(1), 0, old)
        old_file = data_file(eng, cid(1))
        meta = eng.mark_lost(
            cid(1), chunk_size=CS, chain_ver=3, version=7, length=len(lost), crc=crc32c(lost)
        )
        assert (meta.committed_ver, meta.length, meta.crc, meta.committed.lost) == (
            7,
            len(lost),
            crc32c(lost),
            True,
        )
        assert meta.pending is None and meta.physical_bytes() == 0
        assert not old_file.exists()
    with ChunkEngine(tmp_path) as eng:
        assert eng.get_meta(cid(1)) == meta and eng.recovery.missing_files == []
        assert eng.space_info().used == 0
        for offset, length in ((0, None), (BLOCK, 10), (len(lost) - 1, 1)):
            with pytest.raises(FS3Error) as err:
                eng.read(cid(1), offset, length)
            assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH, (offset, length)
            assert "lost" in err.value.message
        assert eng.direct_read_plan(cid(1), 0, BLOCK, meta, CS) is None
        # anything that keeps some of its bytes: an overwrite (small or large), an append, a truncate
        for offset, data in (
            (10, b"x"),
            (0, bytes(BLOCK)),
            (len(lost), b"more"),
            (BLOCK, os.urandom(2 * BLOCK)),
        ):
            with pytest.raises(FS3Error) as err:
                eng.update(cid(1), offset, data, chunk_size=CS, chain_ver=3)
            assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH, offset
        with pytest.raises(FS3Error) as err:
            eng.truncate(cid(1), 10, chunk_size=CS, chain_ver=3)
        assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
        assert eng.get_meta(cid(1)) == meta and eng.online
        # the whole content, as a client (or a predecessor) writes it: the chunk is whole again
        new = os.urandom(len(lost))
        write(eng, cid(1), 0, new)
        assert eng.read(cid(1)).data == new
        assert not eng.get_meta(cid(1)).committed.lost
        # and a lost chunk can be emptied or removed
        eng.mark_lost(cid(2), chunk_size=CS, chain_ver=3, version=2, length=9, crc=1)
        meta = eng.truncate(cid(2), 0, chunk_size=CS, chain_ver=3, commit=True)
        assert meta.length == 0 and eng.read(cid(2)).data == b""
        eng.mark_lost(cid(3), chunk_size=CS, chain_ver=3, version=2, length=9, crc=1)
        eng.commit(cid(3), eng.remove(cid(3), chain_ver=3).pending_ver)
        assert eng.get_meta(cid(3)) is None


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


def test_full_disk_fails_the_write_and_the_target_stays_online(small_fs: Path) -> None:
    """ENOSPC from a file system that is full says nothing about the disk: the write fails with
    STORAGE_NO_SPACE, everything else goes on, and writes work again once there is room."""
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
        assert eng.online and eng.failure is None and failures == []
        for chunk, payload in written.items():
            assert eng.read(chunk).data == payload
        assert eng.space_info().chunk_count == len(written)
        subprocess.run(["mount", "-o", "remount,size=4m", str(small_fs)], check=True)
        payload = os.urandom(64 * 1024)
        write(eng, cid(1000), 0, payload, size=64 * 1024)
        written[cid(1000)] = payload
        assert eng.read(cid(1000)).data == payload
    finally:
        eng.close()
    assert failures == []
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


# -- errors that are not the disk's ----------------------------------------------------------------


def fail_once(monkeypatch: pytest.MonkeyPatch, eng: ChunkEngine, code: int) -> list[int]:
    """The engine's next open of a data file fails with OSError ``code``; returns the errnos
    raised so far (to check the failure happened)."""
    files = eng._files
    real = files._open
    raised: list[int] = []

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not raised:
            raised.append(code)
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)

    monkeypatch.setattr(files, "_open", flaky)
    return raised


TRANSIENT = [errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN, errno.EINTR]


@pytest.mark.parametrize("code", TRANSIENT, ids=[errno.errorcode[c] for c in TRANSIENT])
def test_a_passing_shortage_fails_one_read_and_the_target_stays_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    failures: list[FS3Error] = []
    with ChunkEngine(tmp_path / "target", on_failure=failures.append) as eng:
        payload = os.urandom(3 * BLOCK)
        write(eng, cid(1), 0, payload)
        raised = fail_once(monkeypatch, eng, code)
        with pytest.raises(FS3Error) as err:
            eng.read(cid(1))
        assert raised == [code]
        assert err.value.code is StatusCode.UNAVAILABLE and err.value.retryable
        assert os.strerror(code) in err.value.message
        assert eng.online and eng.failure is None and failures == []
        assert eng.read(cid(1)).data == payload


@pytest.mark.parametrize("code", TRANSIENT, ids=[errno.errorcode[c] for c in TRANSIENT])
def test_a_passing_shortage_fails_one_write_and_the_target_stays_online(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    failures: list[FS3Error] = []
    with ChunkEngine(tmp_path / "target", on_failure=failures.append) as eng:
        write(eng, cid(1), 0, b"before")
        raised = fail_once(monkeypatch, eng, code)
        with pytest.raises(FS3Error) as err:
            eng.update(cid(2), 0, b"refused", chunk_size=CS, chain_ver=1)
        assert raised == [code]
        assert err.value.code is StatusCode.UNAVAILABLE
        assert eng.online and failures == []
        assert eng.get_meta(cid(2)) is None  # nothing of the failed write is recorded
        write(eng, cid(2), 0, b"after")
        assert eng.read(cid(2)).data == b"after"
        assert eng.read(cid(1)).data == b"before"
        assert sorted(m.chunk_id for m in eng.dump_metadata()) == [cid(1), cid(2)]


DISK_ERRORS = [errno.EIO, errno.EROFS, errno.EUCLEAN, errno.ENODEV, errno.ESTALE]


@pytest.mark.parametrize("code", DISK_ERRORS, ids=[errno.errorcode[c] for c in DISK_ERRORS])
def test_a_disk_error_still_takes_the_target_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    failures: list[FS3Error] = []
    with ChunkEngine(tmp_path / "target", on_failure=failures.append) as eng:
        write(eng, cid(1), 0, b"data")
        fail_once(monkeypatch, eng, code)
        with pytest.raises(FS3Error) as err:
            eng.read(cid(1))
        assert err.value.code is StatusCode.STORAGE_IO_ERROR
        assert not eng.online and [f.code for f in failures] == [StatusCode.STORAGE_IO_ERROR]
        with pytest.raises(FS3Error) as err:
            eng.read(cid(1))  # the file opens now, but the target stays offline
        assert err.value.code is StatusCode.STORAGE_IO_ERROR


class _Statvfs:
    """What os.statvfs says about a file system of 1000 blocks and 1000 inodes."""

    def __init__(self, free_blocks: int, free_inodes: int) -> None:
        self.f_blocks, self.f_bavail, self.f_bfree, self.f_frsize = 1000, free_blocks, free_blocks, 4096
        self.f_files, self.f_favail, self.f_ffree = 1000, free_inodes, free_inodes


@pytest.mark.parametrize(
    ("code", "free_blocks", "free_inodes", "offline"),
    [
        (errno.ENOSPC, 10, 900, False),  # out of blocks: full
        (errno.ENOSPC, 900, 0, False),  # out of inodes: full
        (errno.EDQUOT, 900, 900, False),  # a quota: statvfs cannot tell, and no device failed
        (errno.ENOSPC, 900, 900, True),  # room to spare: the device under it failed
    ],
    ids=["no-blocks", "no-inodes", "quota", "device"],
)
def test_no_space_takes_the_target_offline_only_where_the_file_system_has_room(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    free_blocks: int,
    free_inodes: int,
    offline: bool,
) -> None:
    failures: list[FS3Error] = []
    with ChunkEngine(tmp_path / "target", on_failure=failures.append) as eng:
        target = str(eng.path)
        real_statvfs = os.statvfs
        monkeypatch.setattr(
            os,
            "statvfs",
            lambda p: _Statvfs(free_blocks, free_inodes) if str(p) == target else real_statvfs(p),
        )
        fail_once(monkeypatch, eng, code)
        with pytest.raises(FS3Error) as err:
            eng.update(cid(1), 0, b"data", chunk_size=CS, chain_ver=1)
        assert err.value.code is StatusCode.STORAGE_NO_SPACE
        assert eng.online is not offline
        assert [f.code for f in failures] == ([StatusCode.STORAGE_NO_SPACE] if offline else [])
        if not offline:
            write(eng, cid(1), 0, b"data")
            assert eng.read(cid(1)).data == b"data"
