"""Chunk data files: one file per chunk version, in 256 sharded directories under the target.

A file is named ``<chunk id in hex>.<file id in hex>`` and lives in ``chunks/<shard>/`` where the
shard is the low byte of the chunk id's CRC32C, so that one file's chunks spread over directories
and no directory grows huge. File ids come from a per-target counter and are never reused, which
lets a new version be written under its final name without a rename: until a metadata transaction
references it, the file is an orphan that recovery removes.

This module also turns bytes into versions: it computes the checksums of what it writes and checks
those of what it reads. Every method raises OSError as the kernel reports it, but for a version's
file that is missing, which is CorruptVersion (as for bytes that fail their checksums: a file lost
to fsck or an operator is damage to that chunk, not a failed disk); the engine decides what an
error means.

A new file is made durable with an fsync of the file and, where that does not also make its name
durable, of its directory. POSIX leaves the name to the directory's fsync, but on ext3/ext4 (with
a journal the file's fsync commits the transaction that created the name; without one, ext4 syncs
a new entry's directory itself) and XFS (the create is in the log the file's fsync forces) the
file's fsync covers it -- and on ext4 with a journal an fsync of a directory forces a whole journal
commit of its own (fast commits do not track directories), which on the development VM (Linux 6.18)
made each new version wait ~8 ms more and cost ~10% of the daemons' CPU per replicated 1 MiB write.
:func:`file_fsync_persists_names` tells those file systems from the mount table (a crash test
checks each); on any other (btrfs too: its files' device numbers are not the mount's), or where it
cannot tell, the directory is fsynced as well.

New files of at least ``DIRECT_MIN`` bytes (whole chunk versions, copy-on-write results) are
written, and reads of at least ``DIRECT_READ_MIN`` bytes are read, with O_DIRECT through a
page-aligned buffer per thread, as 3FS does with its chunks: a storage daemon's page cache would
mostly hold a second copy of data that clients cache themselves, and filling it costs far more CPU
than the copy through the aligned buffer (on the development VM: 2.95 ms of CPU per MiB written and
fdatasynced through the page cache against 0.41 ms with O_DIRECT; 0.46 ms per MiB read cold
through it against 0.15). Data that is page-aligned already (a client's chunk as the RPC server
received it, into a pooled ``fs3.net.buffers.AlignedBuffer``) is written as it is, without that
copy. Small files and small reads keep the page cache: a small overwrite reads
back the blocks it lands in, and a 4 KiB read checks a whole 64 KiB block; through O_DIRECT
each would go to the disk every time. Where the file system refuses O_DIRECT
(ramfs; tmpfs before Linux 6.6) chunk I/O falls back to the page cache for good.

Small reads are served on the daemon's event loop thread (see ``storage.craq``), which is right
while a read that misses the page cache costs about what handing it to an I/O thread costs (a
fast SSD; this development VM's virtual disk: 0.05–0.25 ms) and wrong when the disk is slow (a
disk, a throttled or overloaded device: every cold read would stall every other request of the
daemon for the device's latency). So reads made on the loop (``nowait=True``) are timed, and
:class:`ColdReads` averages those that waited for the disk; while that average is high, a loop
read takes its bytes from the page cache alone (``preadv2(RWF_NOWAIT)``) and, on a miss, raises
:class:`WouldBlock` so that the caller hands it to an I/O thread (one miss in 16 is still read on
the loop, to notice a disk that is fast again). While the disk is fast a loop read costs two clock
readings more than before. Where the kernel or file system refuses RWF_NOWAIT, loop reads wait.

Where the daemon has native AIO (``storage.aio``), the cold reads of a request of several reads
are O_DIRECT reads of the version's blocks (:meth:`ChunkFiles.direct_plan`, then
:meth:`ChunkFiles.verify_span` on the bytes) submitted together, a whole batch per
``io_submit``, so that the loop does not wait for the disk; the page cache is not tried for
versions written with O_DIRECT (an RWF_NOWAIT miss would start a buffered read of the same
blocks). A lone read is read on the loop as above, and through AIO while the disk is slow.

An O_DIRECT read made for a client (``lease=True``, by the storage service) lands in a page-aligned
buffer of its own, from :data:`READ_BUFFERS`, and comes back as a view of it, which the service
sends as the reply's payload and then gives back (:func:`release_read`): no copy out of the aligned
buffer (a 1 MiB memmove, ~8% of a daemon's CPU per 1 MiB read). Other callers get bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import shutil
import struct
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .chunk_meta import CHECKSUM_BLOCK, ChunkVersion, block_count, block_crcs, crc32c

SHARDS = 256
# New files at least this long are written with O_DIRECT (see the module docstring); smaller ones
# (the overlays of small overwrites, read back when they are folded) keep the page cache ...
DIRECT_MIN = 256 << 10
# ... in pieces of at most this many bytes, each copied into the thread's aligned buffer first ...
DIRECT_PIECE = 1 << 20
# ... whose offsets and lengths are multiples of this (the largest logical block size in use).
DIRECT_ALIGN = 4096
# Reads of at least this many bytes at an aligned offset use O_DIRECT too; smaller ones (4 KiB
# random reads check a whole 64 KiB block) keep the page cache, which serves them repeatedly.
DIRECT_READ_MIN = 256 << 10
# preadv2's flag for "only what the page cache holds" (Linux 4.14; 0 where Python lacks it)
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
# A read on the event loop that took longer than this waited for the disk (page cache hits of the
# loop's reads, at most 64 KiB, take a few microseconds); only such reads feed ColdReads.
COLD_READ_MIN_S = 50e-6

log = logging.getLogger(__name__)

# File systems whose fsync of a newly created regular file also makes its name durable (see the
# module docstring); the names are those /proc/self/mountinfo gives.
NAMES_DURABLE_WITH_FILE = frozenset({"ext3", "ext4", "xfs"})


def mount_fstype(mountinfo: str, dev: int) -> str | None:
    """The type of the file system mounted from device ``dev`` (``st_dev``) in ``mountinfo``
    (the text of ``/proc/self/mountinfo``), or None if no mount has that device."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    for line in mountinfo.splitlines():
        # id parent major:minor root mountpoint options [optional fields...] - type source options
        fields = line.split()
        if len(fields) < 9 or fields[2] != want:
            continue
        try:
            return fields[fields.index("-", 6) + 1]
        except (ValueError, IndexError):
            continue
    return None


def _fstype_of(path: Path) -> tuple[str | None, int]:
    """The type of the file system holding ``path`` (None if no mount has its device) and that
    device; raises OSError."""
    dev = os.stat(path).st_dev
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        return mount_fstype(f.read(), dev), dev


def file_fsync_persists_names(path: Path) -> bool:
    """Whether the file system holding ``path`` makes a new file's name durable with the file's
    own fsync (see the module docstring); False where that cannot be told."""
    try:
        fstype, _ = _fstype_of(path)
    except OSError:
        return False
    return fstype in NAMES_DURABLE_WITH_FILE


def ext4_without_journal(path: Path) -> bool:
    """Whether ``path`` is on an ext4 file system without a journal; False where that cannot be
    told. Such a file system, when it allocates an inode, passes over every free inode of the group
    that was deleted in the last one to six minutes (``recently_deleted`` in the kernel's
    ``ialloc.c``; only without a journal), so after a large removal each new chunk file costs up to
    ~0.6 ms of kernel CPU instead of ~15 µs (on the development VM: a replicated 1 MiB write run
    fell from 276–344 to 164 MiB/s, 30% of the CPU in that scan). It also needs e2fsck after a
    crash. The storage daemon warns about targets on one."""
    try:
        fstype, dev = _fstype_of(path)
        if fstype != "ext4":
            return False
        name = os.path.basename(os.readlink(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
        with open(f"/sys/fs/ext4/{name}/journal_task", encoding="ascii", errors="replace") as f:
            return f.read().strip() == "<none>"  # else the pid of its jbd2 thread
    except OSError:
        return False


def ext4_without_journal_note(path: Path, *, measure: bool = False) -> str | None:
    """What to tell the user about ``path`` when it is on ext4 without a journal (the storage
    daemon logs it per target, the benchmarks print it, with ``measure`` what a new file costs
    there now: see :func:`file_create_cost`); None elsewhere."""
    if not ext4_without_journal(path):
        return None
    now = ""
    if measure:
        with contextlib.suppress(OSError):
            now = f" (here, now: {file_create_cost(path) * 1e6:.0f} us)"
    return (
        f"{path} is on ext4 without a journal: for minutes after large removals each new chunk file"
        f" costs up to ~0.6 ms of kernel CPU instead of ~15 us{now} (the inode allocator skips"
        " recently deleted inodes), so write figures drop, and a crash needs e2fsck; XFS or ext4"
        " with a journal avoids both"
    )


def file_create_cost(path: Path, files: int = 200) -> float:
    """Seconds of CPU that making one empty file in directory ``path`` costs now: ``files`` are
    made in a new directory there, timed, and removed. A benchmark prints it where the inode
    allocator's scan of recently deleted inodes may slow new chunk files (see
    :func:`ext4_without_journal`)."""
    probe = Path(tempfile.mkdtemp(prefix=".create-cost-", dir=path))
    try:
        start = time.thread_time()
        for i in range(files):
            os.close(os.open(probe / f"{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600))
        return (time.thread_time() - start) / files
    finally:
        shutil.rmtree(probe, ignore_errors=True)


@dataclass(slots=True, frozen=True)
class DirectRead:
    """O_DIRECT reads of the stored blocks ``[start, stop)`` that hold ``[offset, end)`` of
    version ``v``, for a caller that does the I/O itself (AIO): ``pieces`` are ``(fd, file
    offset, length)``, file offsets aligned, to be read and put back to back (one for a plain
    version; up to three, from its data file and its overlay file, for a layered one). The
    caller closes ``fds``; :meth:`ChunkFiles.verify_span` checks what was read."""

    chunk_id: bytes
    v: ChunkVersion
    offset: int
    end: int
    start: int
    stop: int
    pieces: tuple[tuple[int, int, int], ...]
    fds: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class DataFile:
    """A file found by :meth:`ChunkFiles.scan`; ``chunk_id`` is None for names fs3 did not write."""

    path: Path
    chunk_id: bytes | None
    file_id: int
    size: int


class WouldBlock(Exception):
    """A read made on the event loop missed the page cache while this target's disk is slow."""


class ColdReads:
    """Moving average of how long the event loop waited for reads that missed the page cache on
    one target, and whether such reads must leave the loop (with hysteresis). While they are off
    the loop, one in ``SAMPLE_EVERY`` is still read on the loop to measure the disk as the loop
    would see it (reads in the I/O threads queue behind each other, so their times say little)."""

    SLOW_S = 0.004  # the average above this: cold reads go to the I/O threads ...
    FAST_S = 0.001  # ... until it is back below this
    WEIGHT = 0.05  # of each new read in the average
    SAMPLE_EVERY = 16

    def __init__(self) -> None:
        self.avg_s = 0.0
        self.count = 0  # cold reads the loop waited for
        self.off_loop = False
        self._skipped = 0

    def wait_here(self) -> bool:
        """While cold reads are off the loop: whether to read this one on the loop anyway."""
        if not self.off_loop:
            return True
        self._skipped += 1
        if self._skipped < self.SAMPLE_EVERY:
            return False
        self._skipped = 0
        return True

    def record(self, seconds: float) -> None:
        # From 0, so that one slow read among fast ones does not decide alone. Only the event
        # loop thread calls this.
        self.count += 1
        self.avg_s += (seconds - self.avg_s) * self.WEIGHT
        if self.off_loop:
            if self.avg_s < self.FAST_S:
                self.off_loop = False
                log.info("cold reads back on the event loop avg_ms=%.2f", self.avg_s * 1e3)
        elif self.avg_s > self.SLOW_S:
            self.off_loop = True
            log.warning("disk slow: cold reads leave the event loop avg_ms=%.2f", self.avg_s * 1e3)


class CorruptVersion(Exception):
    """A version's bytes on disk do not match its metadata (or a commit removed them meanwhile)."""


def _check_not_lost(v: ChunkVersion) -> None:
    if v.lost:
        raise CorruptVersion("lost: no replica could read this version when the chain resynced this target")


class ChunkFiles:
    """The data files of one target. Thread-safe: every call opens its own descriptor."""

    def __init__(
        self, root: Path, *, sync: bool = True, direct: bool = True, sync_dirs: bool | None = None
    ) -> None:
        """``sync``: make what is written durable. ``sync_dirs``: also fsync a new file's
        directory (None: unless the file system makes the name durable with the file's fsync,
        see the module docstring)."""
        self.root = root
        self.sync = sync
        # O_DIRECT for new files of DIRECT_MIN bytes or more and reads of DIRECT_READ_MIN or more;
        # turned off for good if the file system refuses it
        self.direct = direct and hasattr(os, "O_DIRECT")
        # page-cache-only reads (preadv2 RWF_NOWAIT) for the event loop; off for good where refused
        self.nowait = _RWF_NOWAIT != 0
        self.cold = ColdReads()
        self._dir_fds: dict[int, int] = {}
        self._lock = threading.Lock()
        # fsyncs made, for metrics: "file" (a data file's), "dir" (a new file's directory) ->
        # [count, seconds]; under _sync_lock (the I/O threads sync concurrently)
        self._syncs: dict[str, list] = {"file": [0, 0.0], "dir": [0, 0.0]}  # type: ignore[type-arg]
        self._sync_lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        if sync_dirs is None:
            sync_dirs = not file_fsync_persists_names(root)
        self.sync_dirs = sync and sync_dirs
        # shard directories are made on first use: a target with few chunks stays small to scan
        self._shards = {shard for shard, _ in self._shard_dirs()}

    def close(self) -> None:
        with self._lock:
            for fd in self._dir_fds.values():
                os.close(fd)
            self._dir_fds.clear()

    @staticmethod
    def shard(chunk_id: bytes) -> int:
        return crc32c(chunk_id) & (SHARDS - 1)

    def path(self, chunk_id: bytes, file_id: int) -> Path:
        return self.root / f"{self.shard(chunk_id):02x}" / f"{chunk_id.hex()}.{file_id:x}"

    def _open(self, chunk_id: bytes, file_id: int, flags: int, mode: int = 0o644) -> int:
        # relative to the shard directory's cached descriptor: no Path objects, a one-step lookup
        return os.open(
            f"{chunk_id.hex()}.{file_id:x}",
            flags | os.O_CLOEXEC,
            mode,
            dir_fd=self._dir_fd(self.shard(chunk_id)),
        )

    def write_new(self, chunk_id: bytes, file_id: int, data: bytes | bytearray | memoryview) -> None:
        """Create the file with ``data`` and make it durable, directory entry included.

        On failure the partial file is removed (best effort) and the error re-raised.
        """
        if self.shard(chunk_id) not in self._shards:
            self._make_shard(self.shard(chunk_id))
        fd, direct = self._create(chunk_id, file_id, self.direct and len(data) >= DIRECT_MIN)
        try:
            if direct:
                _pwrite_direct(fd, data)
            else:
                _pwrite_all(fd, data, 0)
            if self.sync:
                self._timed_sync("file", os.fsync, fd)
        except BaseException:
            os.close(fd)
            self.unlink(chunk_id, file_id)
            raise
        os.close(fd)
        if self.sync_dirs:
            # where the file's fsync does not persist its name: without this a power loss could
            # leave committed metadata pointing at a file that is not there
            self._timed_sync("dir", os.fsync, self._dir_fd(self.shard(chunk_id)))

    def _timed_sync(self, what: str, sync: Callable[[int], None], fd: int) -> None:
        start = time.perf_counter()
        try:
            sync(fd)
        finally:
            took = time.perf_counter() - start
            with self._sync_lock:
                counts = self._syncs[what]
                counts[0] += 1
                counts[1] += took

    def sync_stats(self) -> dict[str, tuple[int, float]]:
        """Fsyncs made so far and the seconds they took: ``"file"`` of data files (new versions,
        in-place writes), ``"dir"`` of new files' directories (see the module docstring)."""
        with self._sync_lock:
            return {what: (n, t) for what, (n, t) in self._syncs.items()}

    def _create(self, chunk_id: bytes, file_id: int, direct: bool) -> tuple[int, bool]:
        """A new file's descriptor, and whether it was opened with O_DIRECT (asked for with
        ``direct``; not where the file system refuses it)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        if not direct:
            return self._open(chunk_id, file_id, flags), False
        try:
            return self._open(chunk_id, file_id, flags | os.O_DIRECT), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
        # Linux creates the file before it checks O_DIRECT, so the name may exist now (empty).
        self._no_direct()
        fd = self._open(chunk_id, file_id, os.O_WRONLY | os.O_CREAT)
        os.ftruncate(fd, 0)
        return fd, False

    def _no_direct(self) -> None:
        if self.direct:
            self.direct = False
            log.warning("file system under %s refuses O_DIRECT: chunk I/O uses the page cache", self.root)

    def write_at(self, chunk_id: bytes, file_id: int, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` of an existing file and make it durable (an in-place append,
        or folding a layered version's overlay into its data file). Raises CorruptVersion if the
        file is missing."""
        self.write_ranges(chunk_id, file_id, [(offset, data)])

    def write_ranges(
        self, chunk_id: bytes, file_id: int, ranges: Sequence[tuple[int, bytes | bytearray | memoryview]]
    ) -> None:
        """Write each ``(offset, data)`` of ``ranges`` into an existing file, then make them durable
        with one sync. Raises CorruptVersion if the file is missing."""
        try:
            fd = self._open(chunk_id, file_id, os.O_WRONLY)
        except FileNotFoundError:
            # the file holds a version's bytes (this writes into a version's file only): that
            # version is lost, as a read of it would find, and the disk is not to blame
            raise CorruptVersion("data file missing") from None
        try:
            for offset, data in ranges:
                _pwrite_all(fd, data, offset)
            if self.sync:
                # persists the file size too, which is all an append changes
                self._timed_sync("file", os.fdatasync, fd)
        finally:
            os.close(fd)

    def read(
        self,
        chunk_id: bytes,
        file_id: int,
        offset: int,
        length: int,
        *,
        nowait: bool = False,
        lease: bool = False,
    ) -> bytes | memoryview:
        """Up to ``length`` bytes at ``offset``; shorter only if the file is shorter.

        ``nowait``: the caller is an event loop thread; raise WouldBlock rather than wait for a
        disk that has been slow (see the module docstring). ``lease``: an O_DIRECT read may come
        back as a view of a lent buffer (see the module docstring).
        """
        direct = self.direct and length >= DIRECT_READ_MIN and offset % DIRECT_ALIGN == 0
        if nowait and not direct:
            return self._read_on_loop(chunk_id, file_id, offset, length)
        if direct:
            try:
                return self._read_direct(chunk_id, file_id, offset, length, lease)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._no_direct()
        fd = self._open(chunk_id, file_id, os.O_RDONLY)
        try:
            return _pread_full(fd, length, offset)
        finally:
            os.close(fd)

    def _read_on_loop(self, chunk_id: bytes, file_id: int, offset: int, length: int) -> bytes:
        """read() for an event loop thread: timed, and page-cache-only while the disk is slow."""
        cold = self.cold
        fd = self._open(chunk_id, file_id, os.O_RDONLY)
        try:
            if cold.off_loop and self.nowait:
                try:
                    return _pread_nowait(fd, length, offset)
                except WouldBlock:
                    if not cold.wait_here():
                        raise
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    self.nowait = False
                    log.warning("file system under %s refuses RWF_NOWAIT reads: loop reads wait", self.root)
            start = time.perf_counter()
            data = _pread_full(fd, length, offset)
            took = time.perf_counter() - start
            if took > COLD_READ_MIN_S:
                cold.record(took)
            return data
        finally:
            os.close(fd)

    def _read_direct(
        self, chunk_id: bytes, file_id: int, offset: int, length: int, lease: bool = False
    ) -> bytes | memoryview:
        """read() with O_DIRECT (see _pread_direct)."""
        fd = self._open(chunk_id, file_id, os.O_RDONLY | os.O_DIRECT)
        try:
            return _pread_direct(fd, length, offset, lease)
        finally:
            os.close(fd)

    def write_version(
        self,
        chunk_id: bytes,
        file_id: int,
        content: bytes | bytearray | memoryview,
        version: int,
        chain_ver: int,
        crc: int | None = None,
        block: int = CHECKSUM_BLOCK,
    ) -> ChunkVersion:
        """Write ``content`` as a new file and return the version it is, checksums computed per
        ``block`` bytes (``crc``: the CRC32C of ``content``, if the caller has verified it already)."""
        self.write_new(chunk_id, file_id, content)
        if crc is None:
            crc = crc32c(content)
        return ChunkVersion(
            version, chain_ver, len(content), crc, file_id, block_crcs(content, block), block=block
        )

    def append_version(
        self,
        chunk_id: bytes,
        base: ChunkVersion,
        data: bytes | bytearray | memoryview,
        version: int,
        chain_ver: int,
    ) -> ChunkVersion:
        """Append ``data`` to ``base``'s own file, making the version that extends it."""
        # Why appending into the committed version's file is safe:
        #  - readers of the committed version read only [0, committed length) and check those bytes
        #    against the committed block CRCs; this writes only at and after that length;
        #  - it is done only when no pending version exists, so no other version's bytes live past
        #    the committed length of this file;
        #  - if we crash before the metadata transaction, or the version is aborted, the bytes past
        #    the committed length belong to no version, and recovery or abort trims them;
        #  - commit keeps the shared file (it is the new committed version's file).
        # The one caveat is power loss on a device without atomic sector writes: the page holding
        # the end of the committed data is rewritten (with the same committed bytes) and could
        # tear; EngineOptions(in_place_append=False) makes every update copy-on-write.
        # Anything else (overwrite, hole, pending retry, truncate) is copy-on-write.
        self.write_at(chunk_id, base.file_id, base.length, data)
        block = base.block  # the file's blocks stay what they are
        full_blocks = base.length // block
        crcs = bytearray(base.block_crcs[: 4 * full_blocks])
        view = memoryview(data)
        if base.length % block:
            take = min(block - base.length % block, len(view))
            crcs += struct.pack("<I", crc32c(view[:take], base.block_crc(full_blocks)))
            view = view[take:]
        crcs += block_crcs(view, block)
        length = base.length + len(data)
        return ChunkVersion(
            version, chain_ver, length, crc32c(data, base.crc), base.file_id, bytes(crcs), block=block
        )

    def read_version(
        self,
        chunk_id: bytes,
        v: ChunkVersion,
        offset: int,
        end: int,
        *,
        nowait: bool = False,
        lease: bool = False,
    ) -> bytes | memoryview:
        """Bytes ``[offset, end)`` of version ``v``, each block read checked against its CRC32C.

        Raises CorruptVersion if the file is missing, short, or fails a checksum, or the version
        was lost; with ``nowait`` as for :meth:`read`, WouldBlock (before any byte is checked).
        With ``lease`` the bytes may be a view of a lent buffer (see the module docstring).
        """
        if end <= offset:
            return b""
        _check_not_lost(v)
        start, stop = _span(v, offset, end)
        try:
            raw = self._read_span(chunk_id, v, start, stop, nowait, lease)
        except FileNotFoundError:
            raise CorruptVersion("data file missing") from None
        try:
            return self.verify_span(v, offset, end, start, raw)
        except BaseException:
            release_read(raw)
            raise

    def read_kept(
        self, chunk_id: bytes, v: ChunkVersion, replaced: Sequence[tuple[int, int]]
    ) -> bytes | memoryview:
        """All of ``v`` as stored, for an update that replaces the ``(offset, length)`` ranges
        ``replaced`` (increasing, inside ``v``): one read, and every byte the update keeps checked
        (a block it replaces whole may be bad: rewriting it repairs the chunk). The bytes may be a
        view of a lent buffer (:func:`release_read`).

        Raises CorruptVersion if a file is missing or short, or a kept byte fails its CRC32C."""
        try:
            raw = self._read_span(chunk_id, v, 0, v.length, False, lease=True)
        except FileNotFoundError:
            raise CorruptVersion("data file missing") from None
        try:
            if len(raw) < v.length:
                raise CorruptVersion(f"data file short: {len(raw)} of {v.length} bytes")
            with memoryview(raw) as view:
                if crc32c(view[: v.length]) != v.crc:  # else every block is good
                    block = v.block
                    kept, pos = [], 0
                    for offset, length in replaced:
                        kept.append((pos, offset))
                        pos = offset + length
                    kept.append((pos, v.length))
                    for lo, hi in kept:
                        if lo < hi:
                            start = lo // block * block
                            self.verify_span(v, lo, hi, start, view[start:])
            return raw
        except BaseException:
            release_read(raw)
            raise

    def read_overlay(self, chunk_id: bytes, v: ChunkVersion) -> list[tuple[int, bytes | memoryview]]:
        """The overlay spans of the layered version ``v``, each as ``(offset in the version,
        bytes)``: one read of the overlay file, every block checked against its CRC32C.

        Raises CorruptVersion if the overlay file is missing, short, or fails a checksum."""
        try:
            raw = self.read(chunk_id, v.overlay_file_id, 0, v.overlay_size())
        except FileNotFoundError:
            raise CorruptVersion("overlay file missing") from None
        out = []
        at = 0
        with memoryview(raw) as view:
            for start, stop in v.overlay_spans():
                out.append(
                    (start, bytes(self.verify_span(v, start, stop, start, view[at : at + stop - start])))
                )
                at += stop - start
        return out

    def direct_plan(
        self,
        chunk_id: bytes,
        v: ChunkVersion,
        offset: int,
        end: int,
        max_bytes: int,
        *,
        uncached_only: bool = False,
    ) -> DirectRead | None:
        """A :class:`DirectRead` of ``[offset, end)`` of ``v`` (``offset < end``), or None where
        it cannot be one: O_DIRECT is off (or refused now), or a piece to read exceeds
        ``max_bytes``; with ``uncached_only``, also where the version is shorter than DIRECT_MIN
        (its file was written through the page cache). Raises CorruptVersion if a file is
        missing or the version was lost."""
        _check_not_lost(v)
        if not self.direct or (uncached_only and v.length < DIRECT_MIN):
            return None
        start, stop = _span(v, offset, end)
        parts = _stored_parts(v, start, stop)
        if any(n > max_bytes or at % DIRECT_ALIGN for _, at, n in parts):
            return None
        fds: dict[int, int] = {}
        try:
            for file_id, _, _ in parts:
                if file_id not in fds:
                    fds[file_id] = self._open(chunk_id, file_id, os.O_RDONLY | os.O_DIRECT)
        except BaseException as exc:
            for fd in fds.values():
                os.close(fd)
            if isinstance(exc, FileNotFoundError):
                raise CorruptVersion("data file missing") from None
            if isinstance(exc, OSError) and exc.errno == errno.EINVAL:
                self._no_direct()
                return None
            raise
        pieces = tuple((fds[file_id], at, n) for file_id, at, n in parts)
        return DirectRead(chunk_id, v, offset, end, start, stop, pieces, tuple(fds.values()))

    def read_plan_now(self, plan: DirectRead) -> bytes:
        """The bytes of ``plan``'s pieces, back to back, read here and now with blocking O_DIRECT
        reads (a lone read on the event loop, where an AIO submission costs more than it saves
        while the disk is fast); timed into :attr:`cold` like the loop's other reads."""
        start = time.perf_counter()
        parts = [_pread_direct(fd, n, at) for fd, at, n in plan.pieces]
        took = time.perf_counter() - start
        if took > COLD_READ_MIN_S:
            self.cold.record(took)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def verify_span(
        self, v: ChunkVersion, offset: int, end: int, start: int, raw: bytes | memoryview
    ) -> bytes | memoryview:
        """``[offset, end)`` of ``v`` out of ``raw``, the stored bytes of its blocks from ``start``
        (as :func:`_span` gives them), each block checked against its CRC32C; CorruptVersion if one
        fails or ``raw`` is short."""
        block = v.block
        first, last = offset // block, block_count(end, block)
        stop = min(last * block, v.length)
        if len(raw) < stop - start:
            raise CorruptVersion(f"data file short: {len(raw)} of {stop - start} bytes at {start}")
        view = memoryview(raw)[: stop - start]  # (an O_DIRECT read may bring bytes past the version)
        # The whole version: one pass against its CRC32C (which was computed from the same bytes
        # as its block CRC32Cs) instead of one per block; the blocks only to say which one is bad.
        whole = start == 0 and stop == v.length
        if not whole or crc32c(view) != v.crc:
            for index in range(first, last):
                pos = (index - first) * block
                if crc32c(view[pos : pos + block]) != v.block_crc(index):
                    raise CorruptVersion(f"block {index} (bytes {index * block}..) fails its CRC32C")
            if whole:
                raise CorruptVersion("chunk CRC32C differs from its block CRC32Cs")
        if lent_buffer(raw) is not None:
            return view[offset - start : end - start]  # still the lent buffer: no copy
        if start == offset and stop == end and isinstance(raw, bytes) and len(raw) == stop - start:
            return raw
        return bytes(view[offset - start : end - start])

    def _read_span(
        self, chunk_id: bytes, v: ChunkVersion, start: int, stop: int, nowait: bool, lease: bool = False
    ) -> bytes | memoryview:
        """Bytes ``[start, stop)`` of ``v`` as stored (unverified): from the overlay file where
        the version is layered, else from its data file."""
        pieces = _stored_parts(v, start, stop)
        if len(pieces) == 1:
            f, at, n = pieces[0]
            return self.read(chunk_id, f, at, n, nowait=nowait, lease=lease)
        # A layered version: one read of the data file's bytes (into a lent buffer where it can) and
        # one of the overlay's, laid over them, instead of a read (and an open) per piece.
        raw = self.read(chunk_id, v.file_id, start, stop - start, nowait=nowait, lease=True)
        lent = lent_buffer(raw) is not None
        out: bytearray | memoryview = raw if lent else bytearray(raw)  # type: ignore[assignment]
        try:
            if len(out) < stop - start:
                raise CorruptVersion(f"data file short: {len(out)} of {stop - start} bytes at {start}")
            over = [(at, n) for f, at, n in pieces if f == v.overlay_file_id]
            lo, hi = over[0][0], over[-1][0] + over[-1][1]
            laid = self.read(chunk_id, v.overlay_file_id, lo, hi - lo, nowait=nowait)
            if len(laid) < hi - lo:
                raise CorruptVersion(f"overlay file short: {len(laid)} of {hi - lo} bytes at {lo}")
            pos = start
            for f, at, n in pieces:
                if f == v.overlay_file_id:
                    out[pos - start : pos - start + n] = laid[at - lo : at - lo + n]
                pos += n
        except BaseException:
            release_read(raw)
            raise
        if not lent:
            return memoryview(out)
        if lease:
            return raw
        data = bytes(raw)
        release_read(raw)
        return data

    def truncate(self, chunk_id: bytes, file_id: int, length: int) -> None:
        """Cut the file to ``length`` bytes; a file already gone is fine (there is nothing to cut:
        the version that uses it is lost, which its reads report)."""
        try:
            fd = self._open(chunk_id, file_id, os.O_WRONLY)
        except FileNotFoundError:
            return
        try:
            os.ftruncate(fd, length)
        finally:
            os.close(fd)

    def unlink(self, chunk_id: bytes, file_id: int) -> None:
        """Remove the file; a file already gone is fine (a crash may have removed it before)."""
        try:
            os.unlink(f"{chunk_id.hex()}.{file_id:x}", dir_fd=self._dir_fd(self.shard(chunk_id)))
        except FileNotFoundError:
            pass

    def scan(self) -> Iterator[DataFile]:
        """Every file under the shard directories (for recovery)."""
        for _, shard_dir in self._shard_dirs():
            with os.scandir(shard_dir) as entries:
                for entry in entries:
                    yield _parse(shard_dir, entry)

    def _shard_dirs(self) -> list[tuple[int, Path]]:
        found = []
        with os.scandir(self.root) as entries:
            for entry in entries:
                if len(entry.name) == 2 and entry.is_dir(follow_symlinks=False):
                    try:
                        found.append((int(entry.name, 16), self.root / entry.name))
                    except ValueError:
                        pass
        return sorted(found)

    def _make_shard(self, shard: int) -> None:
        with self._lock:
            if shard in self._shards:
                return
            (self.root / f"{shard:02x}").mkdir(exist_ok=True)
            if self.sync:  # the new directory's name must be durable before files in it are
                fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self._shards.add(shard)

    def _dir_fd(self, shard: int) -> int:
        fd = self._dir_fds.get(shard)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._dir_fds.get(shard)
            if fd is None:
                fd = os.open(self.root / f"{shard:02x}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                self._dir_fds[shard] = fd
            return fd


def _parse(shard_dir: Path, entry: os.DirEntry) -> DataFile:
    path = shard_dir / entry.name
    size = entry.stat(follow_symlinks=False).st_size
    stem, dot, suffix = entry.name.partition(".")
    try:
        if not dot or not entry.is_file(follow_symlinks=False):
            raise ValueError(entry.name)
        return DataFile(path, bytes.fromhex(stem), int(suffix, 16), size)
    except ValueError:
        return DataFile(path, None, 0, size)


class _AlignedBuffer(threading.local):
    """One page-aligned DIRECT_PIECE buffer per thread (an anonymous mapping is page-aligned)."""

    def __init__(self) -> None:
        self.view = memoryview(mmap.mmap(-1, DIRECT_PIECE))


_aligned = _AlignedBuffer()


class _ReadBuffer(mmap.mmap):
    """A page-aligned DIRECT_PIECE buffer lent for one read (see :class:`ReadBuffers`)."""


class ReadBuffers:
    """Page-aligned DIRECT_PIECE buffers for O_DIRECT reads whose bytes leave the daemon as they
    are. Thread-safe. :meth:`acquire` lends a free buffer, or makes one while fewer than
    ``limit`` exist, else returns None (the caller copies through its thread's buffer instead);
    :meth:`release` takes one back. A lent buffer that is never given back is freed with its last
    view and no longer counts, so only callers that know when the bytes are gone give them back.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free: list[_ReadBuffer] = []
        self._lent: weakref.WeakSet[_ReadBuffer] = weakref.WeakSet()
        self._lock = threading.Lock()

    def acquire(self) -> _ReadBuffer | None:
        with self._lock:
            if self._free:
                buf = self._free.pop()
            elif len(self._lent) < self.limit:
                buf = _ReadBuffer(-1, DIRECT_PIECE)
            else:
                return None
            self._lent.add(buf)
        return buf

    def release(self, buf: _ReadBuffer) -> None:
        with self._lock:
            if buf not in self._lent:
                return  # given back twice (it must not be lent twice at once) or not ours
            self._lent.discard(buf)
            self._free.append(buf)

    @property
    def free(self) -> int:
        """Buffers made and not lent now."""
        return len(self._free)

    @property
    def lent(self) -> int:
        """Buffers lent now (neither given back nor freed yet)."""
        return len(self._lent)


# more than the reads a daemon has in flight (its I/O threads' and those waiting to be sent) but
# for many clients' at once: those beyond are copied out, as before
READ_BUFFERS = ReadBuffers(limit=128)


def lent_buffer(data: object) -> _ReadBuffer | None:
    """The lent buffer ``data`` (a read's result) is a view of, if it is one."""
    if type(data) is memoryview:
        obj = data.obj
        if type(obj) is _ReadBuffer:
            return obj
    return None


def release_read(data: object) -> None:
    """Give back the buffer of a read made with ``lease=True`` once nothing uses its bytes any
    more (nothing happens for other data)."""
    buf = lent_buffer(data)
    if buf is not None:
        READ_BUFFERS.release(buf)


def _page_aligned(view: memoryview) -> bool:
    """Whether ``view`` (bytes, ``B`` format) starts on a page boundary. Only a writable buffer
    says where it is (ctypes maps those alone), which the pooled receive buffers of the RPC server
    are; a read-only one counts as unaligned."""
    if view.readonly or not view.nbytes:
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) % mmap.PAGESIZE == 0


def _pwrite_direct(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` at offset 0 of a new O_DIRECT file and cut the file to ``len(data)``.

    Where ``data`` is page-aligned (a payload received into a pooled :class:`AlignedBuffer`) its
    whole 4 KiB blocks go to the file as they are; otherwise, and for a short last block, aligned
    pieces are copied through this thread's buffer, the last one padded with zeros."""
    src = memoryview(data).cast("B")
    size = len(src)
    offset = 0
    if _page_aligned(src):
        offset = size - size % DIRECT_ALIGN
        _pwritev_all(fd, src[:offset], 0)
    while offset < size:
        buf = _aligned.view
        take = min(DIRECT_PIECE, size - offset)
        padded = -(-take // DIRECT_ALIGN) * DIRECT_ALIGN
        buf[:take] = src[offset : offset + take]
        if padded > take:
            buf[take:padded] = bytes(padded - take)
        _pwritev_all(fd, buf[:padded], offset)
        offset += take
    if size % DIRECT_ALIGN:
        os.ftruncate(fd, size)


def _pwritev_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of ``view`` at ``offset`` (for O_DIRECT: aligned, so is every partial write)."""
    done, size = 0, len(view)
    while done < size:
        n = os.pwritev(fd, [view[done:]], offset + done)
        if n <= 0:  # pragma: no cover - the kernel reports ENOSPC rather than writing nothing
            raise OSError(errno.EIO, "pwritev wrote nothing")
        done += n


def _span(v: ChunkVersion, offset: int, end: int) -> tuple[int, int]:
    """The stored bytes ``[start, stop)`` that hold ``[offset, end)`` of ``v``: its whole
    checksum blocks, the last one cut at the version's end."""
    block = v.block
    return offset // block * block, min(block_count(end, block) * block, v.length)


def _stored_parts(v: ChunkVersion, start: int, stop: int) -> list[tuple[int, int, int]]:
    """Where bytes ``[start, stop)`` of ``v`` are stored, in order: ``(file id, offset in that
    file, length)``; the overlay file holds a layered version's overlay spans (back to back), its
    data file the rest."""
    if not v.layered:
        return [(v.file_id, start, stop - start)]
    parts = []
    pos = start
    at = 0  # where the overlay file holds the span
    for lo, hi in v.overlay_spans():
        if pos >= stop:
            break
        if pos < hi:
            if pos < lo:
                parts.append((v.file_id, pos, min(stop, lo) - pos))
                pos = min(stop, lo)
            if pos < stop:
                end = min(stop, hi)
                parts.append((v.overlay_file_id, at + pos - lo, end - pos))
                pos = end
        at += hi - lo
    if pos < stop:
        parts.append((v.file_id, pos, stop - pos))
    return parts


def _pread_direct(fd: int, length: int, offset: int, lease: bool = False) -> bytes | memoryview:
    """Up to ``length`` bytes at ``offset`` (aligned) of an O_DIRECT descriptor, shorter only at
    the end of the file: aligned pieces through this thread's buffer, copied out; with ``lease``
    and at most DIRECT_PIECE bytes, read into a lent buffer (:class:`ReadBuffers`) and returned
    as a view of it (when one is free: see :class:`ReadBuffers`)."""
    lent = READ_BUFFERS.acquire() if lease and length <= DIRECT_PIECE else None
    if lent is not None:
        view = memoryview(lent)
        try:
            n = os.preadv(fd, [view[: -(-length // DIRECT_ALIGN) * DIRECT_ALIGN]], offset)
        except BaseException:
            view.release()
            READ_BUFFERS.release(lent)
            raise
        return view[: min(n, length)]
    buf = _aligned.view
    parts = []
    got = 0
    while got < length:
        want = min(DIRECT_PIECE, -(-(length - got) // DIRECT_ALIGN) * DIRECT_ALIGN)
        n = os.preadv(fd, [buf[:want]], offset + got)
        take = min(n, length - got)
        parts.append(bytes(buf[:take]))
        got += take
        if n < want:
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _pread_nowait(fd: int, length: int, offset: int) -> bytes:
    """Up to ``length`` bytes at ``offset`` (shorter only at the end of the file), all from the
    page cache; WouldBlock if some are not there (some may have been copied: they are dropped)."""
    buf = bytearray(length)
    got = 0
    with memoryview(buf) as view:
        while got < length:
            with view[got:] as rest:
                try:
                    n = os.preadv(fd, [rest], offset + got, _RWF_NOWAIT)
                except BlockingIOError:
                    raise WouldBlock from None
            if n == 0:
                break
            got += n
    if got < length:
        del buf[got:]
    return bytes(buf)


def _pread_full(fd: int, length: int, offset: int) -> bytes:
    """Up to ``length`` bytes at ``offset``, waiting for the disk; shorter only at the end."""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n == 0:  # pragma: no cover - the kernel reports ENOSPC rather than writing nothing
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view = view[n:]
        offset += n
