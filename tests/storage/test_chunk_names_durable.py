"""A new chunk file's name survives a crash without an fsync of its directory, on the file systems
where ``storage.chunk_files`` leaves that fsync out (ext3, ext4, XFS), and the directory is still
fsynced everywhere else; and every chunk-metadata change a caller saw acknowledged survives a
crash (``storage.chunk_meta_store``'s group commit).

The crash is the kernel's own: the file system is shut down with its log unflushed
(``FS_IOC_SHUTDOWN`` with ``NOLOGFLUSH``, what xfstests uses to simulate a power cut), so nothing
written after the last fsync reaches the disk; remounting replays the journal. Needs root,
``losetup`` and the ``mkfs`` of each file system; skips, saying which is missing, elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from mounts import unmount

from fs3.storage import chunk_files
from fs3.storage.chunk_engine import ChunkEngine
from fs3.storage.chunk_files import (
    ChunkFiles,
    ext4_without_journal,
    ext4_without_journal_note,
    file_fsync_persists_names,
    mount_fstype,
)
from fs3.storage.chunk_meta import ChunkMeta, ChunkVersion
from fs3.storage.chunk_meta_store import ChunkMetaStore

# _IOR('X', 125, __u32): EXT4_IOC_SHUTDOWN / XFS_IOC_GOINGDOWN; flag 2: do not flush the log
FS_IOC_SHUTDOWN = 0x8004587D
SHUTDOWN_NOLOGFLUSH = 2

MKFS = {
    "ext4": ["mkfs.ext4", "-q", "-F"],
    "ext4-nojournal": ["mkfs.ext4", "-q", "-F", "-O", "^has_journal"],
    "ext3": ["mkfs.ext3", "-q", "-F"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
}

MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
24 22 0:22 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw,inode64
30 22 7:0 / /mnt/a rw,relatime shared:20 master:3 - xfs /dev/loop0 rw,attr2,inode64
31 22 7:1 / /mnt/b rw,relatime - ext2 /dev/loop1 rw
32 22 0:45 / /mnt/c rw,relatime shared:21 - nfs4 server:/export rw,vers=4.2
"""


def test_mount_fstype_reads_the_type_of_the_mount_with_that_device() -> None:
    assert mount_fstype(MOUNTINFO, os.makedev(254, 0)) == "ext4"
    assert mount_fstype(MOUNTINFO, os.makedev(7, 0)) == "xfs"  # past two optional fields
    assert mount_fstype(MOUNTINFO, os.makedev(7, 1)) == "ext2"  # no optional field
    assert mount_fstype(MOUNTINFO, os.makedev(0, 22)) == "tmpfs"
    assert mount_fstype(MOUNTINFO, os.makedev(0, 45)) == "nfs4"
    assert mount_fstype(MOUNTINFO, os.makedev(8, 1)) is None
    assert mount_fstype("garbage\n\n1 2 254:0 /\n", os.makedev(254, 0)) is None


def test_which_file_systems_keep_the_directory_fsync(tmp_path: Path) -> None:
    # the decision follows the file system type, as findmnt (not our parser) reports it
    if shutil.which("findmnt") is None:
        pytest.skip("findmnt (util-linux) is not installed")
    for path in (tmp_path, Path("/dev/shm"), Path("/proc")):
        if not path.exists():
            continue
        fstype = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE", "--target", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert file_fsync_persists_names(path) == (fstype in {"ext3", "ext4", "xfs"}), (path, fstype)
    assert not file_fsync_persists_names(tmp_path / "missing")
    assert chunk_files.NAMES_DURABLE_WITH_FILE == {"ext3", "ext4", "xfs"}


def test_the_directory_is_fsynced_where_the_file_system_needs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[bool] = []  # per fsync: was it a directory's?
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(chunk_files.os, "fsync", fsync)
    for sync_dirs, want in ((True, [False, True]), (False, [False])):
        files = ChunkFiles(tmp_path / f"chunks-{sync_dirs}", sync_dirs=sync_dirs)
        files.write_new(b"\x01" * 16, 1, b"warm the shard up")  # makes (and fsyncs) the shard
        synced.clear()
        files.write_new(b"\x01" * 16, 2, os.urandom(4096))
        assert synced == want
        files.close()
    # without sync nothing is fsynced, whatever the file system
    files = ChunkFiles(tmp_path / "nosync", sync=False, sync_dirs=True)
    synced.clear()
    files.write_new(b"\x02" * 16, 1, b"x")
    assert synced == [] and not files.sync_dirs
    files.close()


@contextlib.contextmanager
def scratch_fs(tmp_path: Path, fstype: str) -> Iterator[tuple[Path, str]]:
    """A fresh file system of ``fstype`` on a loop device over a sparse file, mounted: (mount
    point, loop device); unmounted and detached afterwards, whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("loop devices and file system shutdown need root")
    mkfs = MKFS[fstype]
    for tool in ("losetup", mkfs[0]):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    image, mnt = tmp_path / f"{fstype}.img", tmp_path / f"{fstype}.mnt"
    with open(image, "wb") as f:
        f.truncate(320 << 20)  # XFS wants at least 300 MiB
    subprocess.run([*mkfs, str(image)], check=True, capture_output=True)
    attach = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
    if attach.returncode != 0:
        pytest.skip(f"no loop device: {attach.stderr.strip()}")
    dev = attach.stdout.strip()
    try:
        mnt.mkdir()
        mounted = subprocess.run(["mount", dev, str(mnt)], capture_output=True, text=True)
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount {fstype}: {mounted.stderr.strip()}")
        try:
            yield mnt, dev
        finally:
            unmount(mnt)
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)  # (a busy one detaches when freed)


def crash(mnt: Path) -> None:
    """Cut the file system off as a power loss would: nothing more reaches its disk."""
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SHUTDOWN, struct.pack("I", SHUTDOWN_NOLOGFLUSH))
    finally:
        os.close(fd)
    with pytest.raises(OSError):  # shut down: it accepts no more writes
        (mnt / "after").write_bytes(b"lost")


def remount(mnt: Path, dev: str) -> None:
    subprocess.run(["umount", str(mnt)], check=True, capture_output=True)
    subprocess.run(["mount", dev, str(mnt)], check=True, capture_output=True)


@pytest.mark.parametrize("fstype", sorted(MKFS))
def test_ext4_without_a_journal_is_told_apart(tmp_path: Path, fstype: str, caplog) -> None:
    """The storage daemon warns about targets on ext4 without a journal (see ext4_without_journal)."""
    with scratch_fs(tmp_path, fstype) as (mnt, _dev):
        assert ext4_without_journal(mnt) == (fstype == "ext4-nojournal")
        with caplog.at_level(logging.WARNING, logger="fs3.storage.chunk_engine"):
            ChunkEngine(mnt / "target").close()
        warned = [r for r in caplog.records if "ext4 without a journal" in r.getMessage()]
        assert len(warned) == (fstype == "ext4-nojournal")
        # a benchmark's note says what a new file costs there now, and leaves nothing behind
        note = ext4_without_journal_note(mnt, measure=True)
        assert (note is not None) == (fstype == "ext4-nojournal")
        if note is not None:
            assert re.search(r"\(here, now: \d+ us\)", note), note
        assert sorted(p.name for p in mnt.iterdir() if p.name != "lost+found") == ["target"]
    assert not ext4_without_journal(Path("/dev/shm")) and not ext4_without_journal(tmp_path / "gone")


@pytest.mark.parametrize("fstype", sorted(MKFS))
def test_new_chunk_files_survive_a_crash_without_a_directory_fsync(tmp_path: Path, fstype: str) -> None:
    with scratch_fs(tmp_path, fstype) as (mnt, dev):
        files = ChunkFiles(mnt / "chunks")
        assert files.sync and not files.sync_dirs  # the case under test: no directory fsync
        written = []
        for i in range(24):  # several shards, small files (page cache) and large (O_DIRECT)
            chunk_id = i.to_bytes(4, "big") * 4
            data = os.urandom(4096 if i % 2 else 1 << 20)
            written.append((chunk_id, files.write_version(chunk_id, i + 1, data, 1, 1), data))
        files.close()
        crash(mnt)
        remount(mnt, dev)
        files = ChunkFiles(mnt / "chunks")
        try:
            for chunk_id, version, data in written:
                assert files.read_version(chunk_id, version, 0, len(data)) == data
        finally:
            files.close()


def _meta(n: int, version: int) -> ChunkMeta:
    return ChunkMeta(
        n.to_bytes(16, "big"), 1 << 20, ChunkVersion(version, 1, 4096, 0, version, bytes(4)), None
    )


def test_acknowledged_chunk_metadata_changes_survive_a_crash(tmp_path: Path) -> None:
    """Eight threads change 16 chunks each (so groups form and share flushes) and stop; then the
    file system is cut off. After remounting, every chunk holds the version of its last
    acknowledged change: no group's callers heard before its changes were flushed, the last
    group's included. (Acknowledging a group once LMDB has committed it with ``metasync=False``,
    before its meta page is flushed, fails this test.)"""
    with scratch_fs(tmp_path, "ext4") as (mnt, dev):
        store = ChunkMetaStore(mnt / "meta", sync=True, map_size=64 << 20, max_readers=64)
        acked: dict[int, int] = {}
        lock = threading.Lock()

        def writer(w: int) -> None:
            prev: dict[int, ChunkMeta] = {}
            for i in range(400):
                n = w * 100 + i % 16
                old = prev.get(n)
                new = _meta(n, old.committed.version + 1 if old and old.committed else 1)
                store.swap(new.chunk_id, old, new)
                prev[n] = new
                with lock:
                    acked[n] = new.committed.version

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = store.commit_stats()
        assert stats.changes == 8 * 400 and stats.transactions < stats.changes, stats  # grouped
        try:
            crash(mnt)
        finally:
            try:
                store.close()
            except (OSError, lmdb.Error):
                pass  # its flush at close fails on a shut-down file system
        remount(mnt, dev)
        store = ChunkMetaStore(mnt / "meta", sync=True, map_size=64 << 20, max_readers=64)
        try:
            found = {n: store.get(n.to_bytes(16, "big")) for n in acked}
            got = {n: m.committed.version if m and m.committed else None for n, m in found.items()}
            assert got == acked
        finally:
            store.close()
