"""The chunk engine of one storage target: chunk versions in files, their metadata in LMDB.

On disk, under the target directory::

    target.lock         flock held while an engine has the target open (one opener at a time)
    meta/               LMDB: db "chunks" (chunk id -> ChunkMeta), db "target" (format, counters)
    chunks/00 .. ff/    data files, one per chunk version: <chunk id hex>.<file id hex>; the
                        shard is CRC32C(chunk id) & 0xff, its directory made on first use

Writes never touch bytes a committed version needs (an append may extend the committed version's
file in place, past its end: see ChunkFiles.append_version). A small overwrite inside the chunk, or
a write of several small ranges of it (a client's gathered random writes), writes only the checksum
blocks it touches (4 or 64 KiB each), to an overlay file (the runs of blocks back to back), making a
*layered* pending version (the committed version's file plus the overlay), which commit records as
it is. The next update of the chunk (unless it replaces every byte) first folds the overlay into the
data file (whose bytes there no longer belong to the committed version) and its metadata transaction
records the committed version plain, after which the overlay file is deleted; opening the engine
folds every committed layered version (see ``_fold_data``). So a small overwrite writes its blocks
instead of the chunk, for one in-place sync more and no transaction more. (It still reads the whole
committed version and checks every byte it keeps, so that no update builds on a corrupt copy: see
``_write_layered``.) Any other update writes the new version (the committed content with the update
applied) to a new file. Either way the new file is fsynced before the metadata transaction that
records it as the chunk's pending version; :meth:`ChunkEngine.commit` switches the committed version
to it in another and then deletes the old file. A crash therefore leaves every committed version
intact, pending versions recorded for the chain to settle, committed layered versions that opening
the engine folds, and at worst files no metadata references, which opening the engine removes.

Every call that changes a chunk returns only once its metadata is durable, but concurrent calls on
a target share one LMDB write transaction and its syncs (group commit, see
:mod:`fs3.storage.chunk_meta_store`): per-chunk calls already take turns on the striped lock below,
so the changes of one group are to different chunks and cannot conflict. A commit is durable before
it returns too. The chain could live without that (an update's pending version is durable on every
replica before the client hears back, and the chain only ever rolls a pending version forward, by
settling it or by resync, so a replica that lost a commit in a crash ends with it committed all the
same), but LMDB has no safe way to commit a transaction lazily (MDB_NOSYNC risks corrupting the
database on power loss, not only losing the last transactions), so a lazy commit would have to
live in memory with the old version's file kept until it is durable; with group commit its share of
a sync costs little, so it is not worth that.

The engine is thread-safe. Calls on different chunks run in parallel (file I/O, fsync and CRC32C
release the GIL); calls that modify one chunk take turns on a striped lock, so two racing updates
never clobber each other (the CRAQ service still needs its own per-chunk lock to order a whole
update-forward-commit round). Reads take no lock: they may run while the same chunk is updated,
committed or aborted, and retry if a commit removes the file they were reading. Every call blocks on disk
I/O: asyncio code uses :class:`fs3.storage.async_engine.AsyncChunkEngine`.

A disk error (an OSError from the data files other than a missing file, or an LMDB error, that
says the disk or its file system is broken: EIO, EROFS, EUCLEAN, ENODEV, ... and any errno not
known to be harmless) takes the target offline: the call and every later one fail with
STORAGE_IO_ERROR (STORAGE_NO_SPACE for LMDB's map limit, or a device that ran out of space under a
file system that has plenty), and ``on_failure`` is called once so that the daemon can tell mgmtd.
The target comes back only by reopening the engine (after the operator has dealt with the disk).
A data file that is missing (lost to fsck or an operator, not to a failed disk) is damage to its
chunk alone, like bytes that fail their checksums: the chunk's reads, and its updates that need the
file, fail with STORAGE_CHECKSUM_MISMATCH (the chain then sends the whole chunk, which repairs it),
and opening the engine reports the file in ``recovery.missing_files`` and leaves the chunk as it is.

Two kinds of OSError fail only the call, and the target stays online (see ``_error``): a passing
shortage of the process or the machine (EMFILE, ENFILE, ENOMEM, ENOBUFS: a burst of client
connections or of reads), or an interrupted call (EINTR, EAGAIN), as UNAVAILABLE, which clients and
predecessors retry; and a file system that is really full (ENOSPC while statvfs shows it nearly out
of blocks or inodes, or EDQUOT), as STORAGE_NO_SPACE: reads, removes and truncates go on, and writes
resume once space is freed. What a failed call wrote and did not record in the metadata is an
unreferenced file or bytes past a version's end, which later calls ignore and recovery removes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import lmdb

from fs3.errors import FS3Error, StatusCode
from fs3.kv.lmdb_engine import errno_of, file_system_full, lmdb_eio

from .chunk_files import (
    ChunkFiles,
    ColdReads,
    CorruptVersion,
    DirectRead,
    ext4_without_journal_note,
    release_read,
)
from .chunk_meta import (
    ChunkMeta,
    ChunkVersion,
    block_count,
    block_crcs,
    block_runs,
    block_size,
    check_checksum,
    check_chunk_id,
    check_chunk_size,
    check_extents,
    check_fits,
    check_size_class,
    crc32c,
    next_version,
    select_version,
    write_end,
)
from .chunk_meta_store import ChunkMetaStore, CommitStats
from .chunk_recovery import RecoveryReport, recover

log = logging.getLogger(__name__)

_READ_ATTEMPTS = 8
# Errors that say nothing about the disk: the process or the machine ran short of descriptors,
# memory or kernel buffers for a moment, or a call was interrupted. They fail the call alone.
_TRANSIENT_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN, errno.EINTR}
)
# A file system that reports ENOSPC while this fraction of its blocks and of its inodes is still
# free is not full: the device under it ran out (a thin-provisioned volume, a loop device whose
# backing file system is full), which is a disk failure.
_NOT_FULL_FRACTION = 1 / 8
# See ChunkEngine.roomy: the free space a whole-chunk write needs beyond its own bytes to be
# stored while it is forwarded, and how often that is looked at (300 MiB/s fill 30 MiB meanwhile).
ROOMY_MARGIN = 64 << 20
ROOMY_RECHECK_S = 0.1
# Modifications of one chunk serialize on one of these (held only for local I/O, never across a
# call out, so it cannot deadlock with the service's per-chunk lock that spans the chain).
_LOCK_STRIPES = 1024
_SCAN_BATCH = 1024
# layered versions folded at open per metadata transaction (each one durable sync)
_FOLD_BATCH = 256
# threads folding at open: each fold ends with its data file's sync, and syncs of different files
# overlap on the device (serially, a few hundred layered chunks took ~0.3 ms each here)
_FOLD_THREADS = 16


@dataclass(slots=True, frozen=True)
class EngineOptions:
    """Tuning of one engine. ``sync=False`` skips every fsync: for throwaway data only."""

    sync: bool = True
    map_size: int = 4 << 30  # LMDB's address-space reservation; the file grows only as needed
    max_readers: int = 1024
    in_place_append: bool = True
    # a small overwrite writes only the checksum blocks it touches (a layered version) instead of
    # copying the chunk, when those are at most this fraction of the chunk's blocks
    layered_overwrite_max: float = 0.5
    # large chunk writes and reads bypass the page cache (see storage.chunk_files)
    direct_io: bool = True
    # fraction of the file system's capacity that updates leave free (check_room); 0: none
    keep_free: float = 0.0


@dataclass(slots=True, frozen=True)
class ChunkRead:
    """Bytes read from one version of a chunk, with that version's identity."""

    data: bytes | memoryview  # a view only when read with ``lease=True``
    version: int
    chain_ver: int
    chunk_length: int
    chunk_crc: int


@dataclass(slots=True, frozen=True)
class LastChunk:
    """Committed chunks in an id range: the last one (highest id) and totals, for file lengths."""

    chunk_id: bytes | None
    length: int
    total_length: int
    count: int


@dataclass(slots=True, frozen=True)
class SpaceInfo:
    capacity: int  # bytes of the file system holding the target
    free: int  # bytes available there to unprivileged writers
    used: int  # bytes of chunk data files this target holds
    chunk_count: int
    device: int = 0  # st_dev of the target directory: targets sharing a disk report the same one
    available: int = 0  # free less what the target keeps free (EngineOptions.keep_free)
    free_total: int = 0  # free counting the blocks reserved for root (f_bfree): df's "not used"


class StallClock:
    """Where the disk-stall check counts a call's time from: the call's start, unless this process
    was not running since (stopped by SIGSTOP, its VM paused): a check that comes much later than
    its interval restarts the count, since the time nothing here ran says nothing about the disk
    (a storage daemon resumed after 45 s took a sound target offline for good)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.since = 0.0
        self._last: float | None = None

    def tick(self, now: float | None = None) -> float:
        """The time of this check (monotonic); returns ``since`` for ``fail_if_stalled``."""
        now = time.monotonic() if now is None else now
        if self._last is not None and now - self._last > max(5 * self.interval_s, 5.0):
            log.info(
                "the stall check ran %.1f s late (the process was not running): counting afresh",
                now - self._last,
            )
            self.since = now
        self._last = now
        return self.since


class ChunkEngine:
    """The chunks of one target. Opening it runs recovery; see :attr:`recovery`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: EngineOptions | None = None,
        *,
        on_failure: Callable[[FS3Error], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.options = options or EngineOptions()
        self._on_failure = on_failure
        self._failure: FS3Error | None = None
        self._free_seen = 0  # free bytes (root's blocks counted) at the last look of roomy()
        self._free_seen_until = 0.0
        self._closed = False
        self._fid_lock = threading.Lock()
        self._chunk_locks = [threading.Lock() for _ in range(_LOCK_STRIPES)]
        # the calls under way (see _io): call number -> (what, monotonic start), for stalled_call
        self._calls: dict[int, tuple[str, float]] = {}
        self._call_numbers = itertools.count()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = _lock_target(self.path)
        except OSError as exc:
            raise FS3Error(StatusCode.STORAGE_IO_ERROR, f"cannot open target {self.path}: {exc}") from exc
        try:
            sync = self.options.sync
            self._store = ChunkMetaStore(
                self.path / "meta",
                sync=sync,
                map_size=self.options.map_size,
                max_readers=self.options.max_readers,
            )
            try:
                self._files = ChunkFiles(self.path / "chunks", sync=sync, direct=self.options.direct_io)
                note = ext4_without_journal_note(self.path)
                if note is not None:
                    log.warning("target %s", note)
                self.recovery: RecoveryReport
                self.recovery, self._next_file_id = recover(self._store, self._files)
                # chunk -> data files recovery found missing (see damaged)
                self._missing: dict[bytes, set[int]] = {}
                for chunk_id, file_id in self.recovery.missing_files:
                    self._missing.setdefault(chunk_id, set()).add(file_id)
                # committed small overwrites, and a crash between a commit and its fold: fold them
                for start in range(0, len(self.recovery.layered), _FOLD_BATCH):
                    self._fold(self.recovery.layered[start : start + _FOLD_BATCH])
            except BaseException:
                self._store.close()
                raise
        except BaseException as exc:
            os.close(self._lock_fd)
            if isinstance(exc, OSError | lmdb.Error):
                raise FS3Error(StatusCode.STORAGE_IO_ERROR, f"cannot open target {self.path}: {exc}") from exc
            raise
        log.info(
            "chunk engine open path=%s orphans_removed=%d pending=%d missing_files=%d",
            self.path,
            self.recovery.orphans_removed,
            self.recovery.pending,
            len(self.recovery.missing_files),
        )

    # -- state ------------------------------------------------------------------------------------

    def damaged(self, meta: ChunkMeta) -> bool:
        """Whether this target's copy of ``meta``'s committed version cannot be read because a
        data file of it was missing when the target opened (its reads fail; a resync, told so by
        DumpChunkMeta, sends the chain's copy, which has new files). Bytes that fail their
        checksums are found by reads instead (see ``Replicator.repair_soon``)."""
        missing = self._missing.get(meta.chunk_id)
        v = meta.committed
        if not missing or v is None or v.lost or v.removal:
            return False
        return v.file_id in missing or (v.layered and v.overlay_file_id in missing)

    @property
    def failure(self) -> FS3Error | None:
        """The error that took the target offline, or None while it is healthy."""
        return self._failure

    @property
    def online(self) -> bool:
        return self._failure is None and not self._closed

    def stalled_call(self, now: float | None = None) -> tuple[str, float] | None:
        """The call under way that began first (what it does, and how many seconds it has
        taken so far), or None when none is. Safe from any thread."""
        now = time.monotonic() if now is None else now
        for _ in range(8):
            try:
                calls = tuple(self._calls.values())
            except RuntimeError:  # changed size while copied (free threading): copy again
                continue
            if not calls:
                return None
            what, began = min(calls, key=lambda c: c[1])
            return what, now - began
        return None

    def fail_if_stalled(
        self, limit_s: float, now: float | None = None, since: float = 0.0
    ) -> FS3Error | None:
        """Take the target offline if a call has been under way longer than ``limit_s`` (a disk
        that hangs: its calls neither return nor fail, and its chains would wait for them without
        end), counting from ``since`` at the earliest (a monotonic time: see
        :class:`StallClock`); the error, or None."""
        now = time.monotonic() if now is None else now
        stalled = self.stalled_call(now)
        if stalled is None or self._failure is not None or self._closed:
            return None
        what, seconds = stalled[0], min(stalled[1], now - since)
        if seconds <= limit_s:
            return None
        return self._fail(what, TimeoutError(f"the disk has not answered for {seconds:.1f} s"))

    def close(self) -> None:
        """Release the target (LMDB, descriptors, the target lock). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._store.close()
        self._files.close()
        os.close(self._lock_fd)

    def __enter__(self) -> ChunkEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads ------------------------------------------------------------------------------------

    def get_meta(self, chunk_id: bytes) -> ChunkMeta | None:
        """The chunk's metadata, or None if the target holds no version of it."""
        check_chunk_id(chunk_id)
        with self._io("get_meta"):
            return self._get(chunk_id)

    def read(
        self,
        chunk_id: bytes,
        offset: int = 0,
        length: int | None = None,
        *,
        version: int | None = None,
        meta: ChunkMeta | None = None,
        nowait: bool = False,
        lease: bool = False,
    ) -> ChunkRead:
        """Read ``length`` bytes (default: to the end) at ``offset`` of one version of a chunk.

        ``version=None`` reads the committed version; a number reads that version, committed or
        pending (CRAQ serves the version the tail says is committed). The result is shorter than
        asked where the version ends. Every block read is checked against its CRC32C.

        ``meta``: the chunk's metadata as the caller just read it (saves reading it again; if it
        is stale by now, the read finds out as it would by itself and reads it afresh).

        ``nowait``: the caller is the event loop thread: raise
        :class:`~fs3.storage.chunk_files.WouldBlock` rather than wait for a disk that has been slow
        (see :mod:`fs3.storage.chunk_files`). ``lease``: the data may be a view of a lent buffer,
        which the caller gives back with :func:`~fs3.storage.chunk_files.release_read` once it
        has sent the bytes (see :mod:`fs3.storage.chunk_files`).

        Raises STORAGE_CHUNK_NOT_FOUND (no committed version), STORAGE_CHUNK_VERSION_MISMATCH (that
        version is not held, e.g. superseded by a commit) or STORAGE_CHECKSUM_MISMATCH.
        """
        check_chunk_id(chunk_id)
        if offset < 0 or (length is not None and length < 0):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad read range offset={offset} length={length}")
        with self._io("read"):
            for _ in range(_READ_ATTEMPTS):
                if meta is None:
                    meta = self._get(chunk_id)
                v = select_version(chunk_id, meta, version)
                end = v.length if length is None else min(v.length, offset + length)
                try:
                    data = self._files.read_version(chunk_id, v, offset, end, nowait=nowait, lease=lease)
                except CorruptVersion as exc:
                    # A commit or abort may have removed or trimmed the file after we looked up the
                    # metadata; only bytes that still disagree with current metadata are corrupt.
                    if self._get(chunk_id) != meta:
                        meta = None
                        continue
                    raise FS3Error(
                        StatusCode.STORAGE_CHECKSUM_MISMATCH,
                        f"chunk {chunk_id.hex()} version {v.version}: {exc}",
                    ) from None
                return ChunkRead(data, v.version, v.chain_ver, v.length, v.crc)
            raise FS3Error(StatusCode.ABORTED, f"chunk {chunk_id.hex()} kept changing during a read")

    def direct_read_plan(
        self,
        chunk_id: bytes,
        offset: int,
        length: int,
        meta: ChunkMeta,
        max_bytes: int,
        *,
        uncached_only: bool = False,
    ) -> DirectRead | None:
        """For a caller that does the disk I/O itself (AIO on the event loop thread): the O_DIRECT
        read of the committed version's blocks that hold ``[offset, offset + length)``, with
        ``meta`` as the caller just read it; its files are opened (the caller closes ``fds``) and
        nothing is read. None where :meth:`read` must do it: nothing to read, a piece of more than
        ``max_bytes``, no O_DIRECT, or a file gone (a commit that raced, or damage: :meth:`read`
        tells which); with ``uncached_only``, also where the version's bytes
        were not written with O_DIRECT (they may be in the page cache)."""
        check_chunk_id(chunk_id)
        if offset < 0 or length < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad read range offset={offset} length={length}")
        with self._io("read"):
            v = select_version(chunk_id, meta, None)
            end = min(v.length, offset + length)
            if end <= offset:
                return None
            try:
                return self._files.direct_plan(
                    chunk_id, v, offset, end, max_bytes, uncached_only=uncached_only
                )
            except CorruptVersion:
                return None

    def direct_read_now(self, plan: DirectRead) -> ChunkRead | None:
        """:meth:`direct_read_done` of ``plan`` read at once with blocking reads (on the event
        loop: the caller has checked :attr:`cold_reads`); None as there, or if a read fails (the
        caller reads again with :meth:`read`, which takes a failing disk offline)."""
        try:
            raw = self._files.read_plan_now(plan)
        except OSError:
            return None
        return self.direct_read_done(plan, raw)

    def direct_read_done(self, plan: DirectRead, raw: bytes | memoryview) -> ChunkRead | None:
        """The read ``plan`` asked for, from ``raw`` (its pieces' bytes, back to back), checked
        against the version's CRC32Cs; None if they fail (a commit may have replaced the bytes
        since: the caller reads again with :meth:`read`, which tells that from damage)."""
        v = plan.v
        try:
            data = self._files.verify_span(v, plan.offset, plan.end, plan.start, raw)
        except CorruptVersion:
            return None
        return ChunkRead(data, v.version, v.chain_ver, v.length, v.crc)

    # -- updates ----------------------------------------------------------------------------------

    def update(
        self,
        chunk_id: bytes,
        offset: int,
        data: bytes | bytearray | memoryview,
        *,
        chunk_size: int,
        chain_ver: int,
        version: int | None = None,
        checksum: int | None = None,
        commit: bool = False,
        extents: Sequence[tuple[int, int]] = (),
    ) -> ChunkMeta:
        """Write ``data`` at ``offset`` as the pending version ``committed + 1`` of the chunk.

        ``version`` is that number when a predecessor sends it (None on the head). A pending version
        with the same number is replaced (a retried update is rebuilt from the same committed base,
        so it is idempotent); any other pending version must be committed or aborted first. Writing
        past the end leaves a hole of zeros. ``checksum``, if given, is the sender's CRC32C of
        ``data`` and is verified first. The chunk size is fixed by the chunk's first write.

        With ``commit=True`` the new version is committed at once, in the same transaction: what
        the tail of a chain does (one durable sync instead of two).

        ``extents`` (``(offset, length)`` pairs, increasing and apart) makes it a write of several
        ranges at once, their bytes back to back in ``data`` (``offset`` is then the first one's):
        one new version, layered where the blocks they touch are few enough for one small
        overwrite (see ``_overlay_runs``), else built as a write of the span from the first range to
        the end of the last with the bytes between them taken from the committed version.

        Raises INVALID_ARGUMENT, STORAGE_CHUNK_TOO_LARGE, STORAGE_CHECKSUM_MISMATCH,
        STORAGE_CHUNK_VERSION_MISMATCH (a version that is not committed + 1: stale or missing).
        """
        check_chunk_id(chunk_id)
        check_chunk_size(chunk_size)
        if offset < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative offset {offset}")
        if extents:
            check_extents(offset, len(data), extents)
        check_fits(chunk_id, write_end(offset, len(data), extents), chunk_size)
        check_checksum(chunk_id, data, checksum)
        with self._io("update"), self._chunk_lock(chunk_id):
            meta = self._get(chunk_id)
            check_size_class(chunk_id, meta, chunk_size)
            new_ver = next_version(chunk_id, meta, version)
            base = meta.committed if meta else None
            if (
                base is not None
                and base.lost
                and not (len(extents) <= 1 and offset == 0 and len(data) >= base.length)
            ):
                raise _lost(chunk_id, base)
            if (
                base is not None
                and base.layered
                and meta is not None
                and meta.pending is None
                and not (len(extents) <= 1 and offset == 0 and len(data) >= base.length)
            ):
                # fold the previous small overwrite now; the transaction that records the new
                # pending version records the committed one without its overlay (not needed when
                # the update replaces every byte: the new version shares no file with the old)
                base = self._fold_data(chunk_id, base)
            ranges = extents if len(extents) > 1 else ((offset, len(data)),)
            runs = self._overlay_runs(meta, base, offset, data, ranges)
            if runs:
                assert base is not None
                new = self._write_layered(chunk_id, base, data, ranges, runs, new_ver, chain_ver)
                committed, pending = (new, None) if commit else (base, new)
                return self._install(meta, ChunkMeta(chunk_id, chunk_size, committed, pending))
            if len(extents) > 1:
                data, checksum = self._span(chunk_id, base, data, extents), None
            end = offset + len(data)
            if (
                self.options.in_place_append
                and base is not None
                and meta is not None
                and meta.pending is None
                and not base.layered
                and offset == base.length
                and len(data) > 0
            ):
                # a lost data file fails this chunk's update as copy-on-write would, not the target
                with _cannot_update(chunk_id, base):
                    new = self._files.append_version(chunk_id, base, data, new_ver, chain_ver)
            elif offset == 0 and (base is None or end >= base.length):
                # the whole new content is ``data``, whose CRC the sender's checksum may have given
                new = self._write_version(chunk_id, data, new_ver, chain_ver, chunk_size, crc=checksum)
            else:
                # copy-on-write, reading only the old bytes the update keeps
                old_len = base.length if base else 0
                content = self._content(chunk_id, base, 0, min(offset, old_len))
                content.extend(bytes(offset - len(content)))  # a hole reads as zeros
                content += data
                content += self._content(chunk_id, base, end, old_len)
                new = self._write_version(chunk_id, content, new_ver, chain_ver, chunk_size)
            committed, pending = (new, None) if commit else (base, new)
            return self._install(meta, ChunkMeta(chunk_id, chunk_size, committed, pending))

    def truncate(
        self,
        chunk_id: bytes,
        length: int,
        *,
        chunk_size: int,
        chain_ver: int,
        version: int | None = None,
        commit: bool = False,
    ) -> ChunkMeta:
        """Make the pending version ``committed + 1`` the committed content cut or zero-extended to
        ``length`` (creating the chunk if needed). Versions and ``commit`` behave as in :meth:`update`."""
        check_chunk_id(chunk_id)
        check_chunk_size(chunk_size)
        if length < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative length {length}")
        check_fits(chunk_id, length, chunk_size)
        with self._io("truncate"), self._chunk_lock(chunk_id):
            meta = self._get(chunk_id)
            check_size_class(chunk_id, meta, chunk_size)
            new_ver = next_version(chunk_id, meta, version)
            base = meta.committed if meta else None
            if base is not None and base.lost and length > 0:
                raise _lost(chunk_id, base)
            content = self._content(chunk_id, base, 0, length)
            content.extend(bytes(length - len(content)))
            new = self._write_version(chunk_id, content, new_ver, chain_ver, chunk_size)
            committed, pending = (new, None) if commit else (base, new)
            return self._install(meta, ChunkMeta(chunk_id, chunk_size, committed, pending))

    def remove(self, chunk_id: bytes, *, chain_ver: int, version: int | None = None) -> ChunkMeta | None:
        """Record the removal of the chunk as its pending version; committing it deletes the chunk.

        Returns None (and records nothing) if the target holds no version of the chunk.
        """
        check_chunk_id(chunk_id)
        with self._io("remove"), self._chunk_lock(chunk_id):
            meta = self._get(chunk_id)
            if meta is None:
                return None
            new_ver = next_version(chunk_id, meta, version)
            tombstone = ChunkVersion(new_ver, chain_ver, 0, 0, 0, b"", removal=True)
            return self._install(meta, replace(meta, pending=tombstone))

    def replace(
        self,
        chunk_id: bytes,
        data: bytes | bytearray | memoryview,
        *,
        chunk_size: int,
        chain_ver: int,
        version: int,
        commit: bool = False,
        checksum: int | None = None,
    ) -> ChunkMeta:
        """Replace the whole content of the chunk with ``data`` as version ``version``.

        For a syncing successor and resync. With ``commit=False`` the new version becomes pending
        (replacing any pending version) and must be above the committed version. With
        ``commit=True`` it becomes the committed version at once whatever the chunk held before
        (the predecessor is authoritative), and any pending version is dropped.
        """
        check_chunk_id(chunk_id)
        check_chunk_size(chunk_size)
        check_fits(chunk_id, len(data), chunk_size)
        check_checksum(chunk_id, data, checksum)
        if version < 1:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad version {version}")
        with self._io("replace"), self._chunk_lock(chunk_id):
            meta = self._get(chunk_id)
            check_size_class(chunk_id, meta, chunk_size)
            committed = meta.committed if meta else None
            if not commit and version <= (committed.version if committed else 0):
                raise FS3Error(
                    StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
                    f"chunk {chunk_id.hex()}: replace with version {version} but {committed} is committed",
                )
            new = self._write_version(chunk_id, data, version, chain_ver, chunk_size, crc=checksum)
            if commit:
                return self._install(meta, ChunkMeta(chunk_id, chunk_size, new, None))
            return self._install(meta, ChunkMeta(chunk_id, chunk_size, committed, new))

    def mark_lost(
        self, chunk_id: bytes, *, chunk_size: int, chain_ver: int, version: int, length: int, crc: int
    ) -> ChunkMeta:
        """Record committed version ``version`` (of ``length`` bytes, CRC32C ``crc``) as lost: the
        chain committed it and no replica can read it any more (resync, in place of a
        :meth:`replace` with ``commit=True``). Whatever the chunk held before is dropped, so reads
        fail with STORAGE_CHECKSUM_MISMATCH instead of returning older bytes or a hole, and so do
        updates, until one writes the whole content (see ChunkVersion)."""
        check_chunk_id(chunk_id)
        check_chunk_size(chunk_size)
        check_fits(chunk_id, length, chunk_size)
        if version < 1 or length < 1:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad lost version {version} length {length}")
        with self._io("mark_lost"), self._chunk_lock(chunk_id):
            meta = self._get(chunk_id)
            check_size_class(chunk_id, meta, chunk_size)
            gone = ChunkVersion(version, chain_ver, length, crc, 0, block=block_size(chunk_size), lost=True)
            return self._install(meta, ChunkMeta(chunk_id, chunk_size, gone, None))

    def commit(self, chunk_id: bytes, version: int, *, chain_ver: int | None = None) -> ChunkMeta | None:
        """Make pending ``version`` the committed one (stamping ``chain_ver`` if given).

        Idempotent: committing a version at or below the committed one changes nothing and returns
        the metadata; a committed removal returns None, as does any commit of an absent chunk.
        Raises STORAGE_CHUNK_VERSION_MISMATCH if ``version`` is above committed but not pending.
        """
        check_chunk_id(chunk_id)
        with self._io("commit"), self._chunk_lock(chunk_id):
            meta = self._get(chunk_id)
            if meta is None:
                return None
            if version <= meta.committed_ver:
                return meta
            pending = meta.pending
            if pending is None or pending.version != version:
                raise FS3Error(
                    StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
                    f"chunk {chunk_id.hex()}: commit of version {version} but committed is "
                    f"{meta.committed_ver} and pending is {meta.pending_ver or 'none'}",
                )
            if pending.removal:
                self._swap(chunk_id, meta, None)
                return None
            if chain_ver is not None:
                pending = replace(pending, chain_ver=chain_ver)
            return self._install(meta, ChunkMeta(chunk_id, meta.chunk_size, pending, None))

    def abort(self, chunk_id: bytes, version: int | None = None) -> ChunkMeta | None:
        """Drop the pending version (only if it is ``version``, when given); returns the metadata.

        A chunk that was never committed disappears (None).
        """
        check_chunk_id(chunk_id)
        with self._io("abort"), self._chunk_lock(chunk_id):
            meta = self._get(chunk_id)
            if meta is None or meta.pending is None:
                return meta
            if version is not None and meta.pending.version != version:
                raise FS3Error(
                    StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
                    f"chunk {chunk_id.hex()}: abort of version {version} but pending is {meta.pending_ver}",
                )
            if meta.committed is None:
                self._swap(chunk_id, meta, None)
                return None
            return self._install(meta, replace(meta, pending=None))

    def remove_range(self, begin: bytes, end: bytes | None = None) -> int:
        """Delete every chunk with ``begin <= id < end`` (to the last one if ``end`` is None) at
        once, pending versions included, without versions (admin and garbage collection). Returns
        how many chunks went."""
        removed = 0
        while True:
            with self._io("remove_range"):  # one call per batch: a long removal is not a stall
                gone = self._store.delete_range(begin, end, _SCAN_BATCH)
                for meta in gone:
                    for file_id in meta.file_lengths():
                        self._files.unlink(meta.chunk_id, file_id)
            removed += len(gone)
            if len(gone) < _SCAN_BATCH:
                return removed

    # -- queries ----------------------------------------------------------------------------------

    def query_last_chunk(self, begin: bytes, end: bytes) -> LastChunk:
        """The committed chunk with the highest id in ``[begin, end)`` and totals over the range."""
        last: bytes | None = None
        last_len = total = count = 0
        for meta in self.iter_metas(begin, end):
            if meta.committed is not None:
                last, last_len = meta.chunk_id, meta.committed.length
                total += last_len
                count += 1
        return LastChunk(last, last_len, total, count)

    def iter_metas(self, begin: bytes = b"", end: bytes | None = None) -> Iterator[ChunkMeta]:
        """Metadata of every chunk in ``[begin, end)`` in id order (short read transactions, so a
        long scan does not pin old LMDB pages; chunks changed during the scan may show either way)."""
        start = begin
        while True:
            with self._io("iter_metas"):
                batch = self._store.scan(start, end, _SCAN_BATCH)
            yield from batch
            if len(batch) < _SCAN_BATCH:
                return
            start = batch[-1].chunk_id + b"\0"

    def dump_metadata(self, begin: bytes = b"", end: bytes | None = None) -> list[ChunkMeta]:
        """Every chunk's metadata (resync compares these between replicas)."""
        return list(self.iter_metas(begin, end))

    def pending_chunks(self) -> list[ChunkMeta]:
        """Chunks with a pending version, for the chain to commit or abort after a restart."""
        return [meta for meta in self.iter_metas() if meta.pending is not None]

    @property
    def cold_reads(self) -> ColdReads:
        """How long the event loop's reads that missed the page cache took (see ColdReads)."""
        return self._files.cold

    def commit_stats(self) -> CommitStats:
        """Metadata changes recorded since the engine opened, and the LMDB write transactions
        (each one durable sync) they took: concurrent changes share one (group commit)."""
        return self._store.commit_stats()

    def file_sync_stats(self) -> dict[str, tuple[int, float]]:
        """Fsyncs of data files and of their directories since the engine opened, and their
        seconds (see :meth:`ChunkFiles.sync_stats`)."""
        return self._files.sync_stats()

    def check_room(self, nbytes: int) -> None:
        """Refuse an update of ``nbytes`` that would leave the file system with less than
        ``options.keep_free`` of its capacity free: STORAGE_SPACE_KEPT, and the target stays online
        (reads, removes and truncates go on; writes resume once space is freed). A disk found full
        despite this (other users of it, or a race) fails the update with STORAGE_NO_SPACE, and
        the target stays online as well (see ``_error``)."""
        keep = self.options.keep_free
        if keep <= 0 or self._failure is not None or self._closed:
            return  # the update itself says why it cannot run
        with self._io("check_room"):
            _, free, available, _ = self._room()
        if nbytes > available:
            raise FS3Error(
                StatusCode.STORAGE_SPACE_KEPT,
                f"target {self.path} has {free >> 20} MiB free, and keeps {keep:.1%} of its file "
                f"system free: {nbytes} more bytes refused (remove files to make room)",
            )

    def roomy(self, nbytes: int) -> bool:
        """Whether the file system has room for ``nbytes`` and ROOMY_MARGIN more (blocks reserved
        for root counted for root only), from a statvfs at most every ROOMY_RECHECK_S. A write stored while it
        is forwarded (craq's parallel update) must not find the disk full here, where its
        successors may have taken it: that takes the target offline. Without this room it is
        stored first and forwarded after, and a full disk fails it with ENOSPC alone."""
        now = time.monotonic()
        if now >= self._free_seen_until:
            try:
                room = self._room()
                self._free_seen = room[3] if os.geteuid() == 0 else room[1]  # root's blocks for root
            except OSError:
                self._free_seen = 0
            self._free_seen_until = now + ROOMY_RECHECK_S
        return self._free_seen - nbytes >= ROOMY_MARGIN

    def _room(self) -> tuple[int, int, int, int]:
        """(capacity, free, available, free_total) bytes of the target's file system: free to
        unprivileged writers, that less the ``keep_free`` part of the capacity, and free counting
        the blocks reserved for root."""
        st = os.statvfs(self.path)
        capacity, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        available = max(free - int(capacity * self.options.keep_free), 0)
        return capacity, free, available, st.f_bfree * st.f_frsize

    def space_info(self) -> SpaceInfo:
        """Capacity and free space of the file system, and what this target's chunks use."""
        with self._io("space_info"):
            capacity, free, available, free_total = self._room()
            device = os.stat(self.path).st_dev
            stats = self._store.stats()
        return SpaceInfo(capacity, free, stats.used, stats.chunk_count, device, available, free_total)

    # -- internals --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _io(self, what: str) -> Iterator[None]:
        if self._closed:
            raise FS3Error(StatusCode.STORAGE_TARGET_OFFLINE, f"target {self.path} is closed")
        if self._failure is not None:
            raise FS3Error(self._failure.code, f"target {self.path} is offline: {self._failure.message}")
        number = next(self._call_numbers)
        self._calls[number] = (what, time.monotonic())
        try:
            yield
        except FS3Error:
            raise
        except (OSError, lmdb.Error) as exc:
            raise self._error(what, exc) from exc
        finally:
            del self._calls[number]

    def _error(self, what: str, exc: OSError | lmdb.Error) -> FS3Error:
        """The error a call that met ``exc`` fails with; only a disk error takes the target offline."""
        code = errno_of(exc)
        if code in _TRANSIENT_ERRNOS or isinstance(exc, lmdb.ReadersFullError | lmdb.MemoryError):
            log.warning(
                "target call failed, target stays online path=%s op=%s error=%r", self.path, what, exc
            )
            return FS3Error(
                StatusCode.UNAVAILABLE,
                f"{what} on target {self.path}: {exc} (a passing shortage or an interruption: "
                "the target stays online, retry)",
            )
        # LMDB answers a write of its pages that a full disk cut short with EIO
        lmdb_full = lmdb_eio(exc) and self._store.tight and file_system_full(str(self.path))
        if code == errno.EDQUOT or (code == errno.ENOSPC and self._file_system_full()) or lmdb_full:
            log.warning("target full, target stays online path=%s op=%s error=%r", self.path, what, exc)
            return FS3Error(
                StatusCode.STORAGE_NO_SPACE,
                f"{what} on target {self.path}: {exc} (the target stays online: free space to write again)",
            )
        return self._fail(what, exc)

    def _file_system_full(self) -> bool:
        """Whether statvfs shows the target's file system (nearly) out of blocks or inodes, as it
        is when ENOSPC means what it says (see ``_NOT_FULL_FRACTION``)."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return False
        return st.f_bavail < st.f_blocks * _NOT_FULL_FRACTION or (
            st.f_files > 0 and st.f_favail < st.f_files * _NOT_FULL_FRACTION
        )

    def _fail(self, what: str, exc: BaseException) -> FS3Error:
        # LMDB reports a full disk as DiskError with only strerror's text to tell it apart
        full = (
            isinstance(exc, lmdb.MapFullError)
            or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
            or any(os.strerror(e) in str(exc) for e in (errno.ENOSPC, errno.EDQUOT))
        )
        code = StatusCode.STORAGE_NO_SPACE if full else StatusCode.STORAGE_IO_ERROR
        error = FS3Error(code, f"{what} on target {self.path}: {exc}")
        if self._failure is None:
            self._failure = error
            log.error("target offline path=%s op=%s error=%r", self.path, what, exc)
            if self._on_failure is not None:
                try:
                    self._on_failure(error)
                except Exception:
                    log.exception("on_failure callback failed path=%s", self.path)
        return error

    def _chunk_lock(self, chunk_id: bytes) -> threading.Lock:
        return self._chunk_locks[hash(chunk_id) % _LOCK_STRIPES]

    def _get(self, chunk_id: bytes) -> ChunkMeta | None:
        return self._store.get(chunk_id)

    def _content(self, chunk_id: bytes, v: ChunkVersion | None, offset: int, end: int) -> bytearray:
        """Verified bytes ``[offset, end)`` of a version (clipped to it; none for no version), to
        build a new version from."""
        if v is None:
            return bytearray()
        with self._verified(chunk_id, v, offset, end) as data:
            return bytearray(data)

    @contextlib.contextmanager
    def _verified(
        self, chunk_id: bytes, v: ChunkVersion, offset: int, end: int
    ) -> Iterator[bytes | memoryview]:
        """Verified bytes ``[offset, end)`` of a version (clipped to it), maybe a view of a lent
        read buffer that is given back when the block ends."""
        with _cannot_update(chunk_id, v):
            data = self._files.read_version(chunk_id, v, offset, min(end, v.length), lease=True)
        with _released(data):
            yield data

    def _span(
        self,
        chunk_id: bytes,
        base: ChunkVersion | None,
        data: bytes | bytearray | memoryview,
        extents: Sequence[tuple[int, int]],
    ) -> bytearray:
        """The bytes from the first of ``extents`` to the end of the last: theirs (back to back in
        ``data``) with ``base``'s between them (zeros past its end)."""
        start = extents[0][0]
        stop = extents[-1][0] + extents[-1][1]
        region = self._content(chunk_id, base, start, stop)
        region.extend(bytes(stop - start - len(region)))
        view = memoryview(data)
        pos = 0
        for offset, length in extents:
            region[offset - start : offset - start + length] = view[pos : pos + length]
            pos += length
        return region

    def _write_version(
        self,
        chunk_id: bytes,
        content: bytes | bytearray | memoryview,
        version: int,
        chain_ver: int,
        chunk_size: int,
        *,
        crc: int | None = None,
    ) -> ChunkVersion:
        """A new version of ``content`` in a file of its own, with the checksum block of a chunk of
        ``chunk_size`` (``crc``: the CRC32C of ``content`` when already verified, a sender's)."""
        return self._files.write_version(
            chunk_id, self._new_file_id(), content, version, chain_ver, crc, block_size(chunk_size)
        )

    def _new_file_id(self) -> int:
        """A file id never used on this target (ids are not reused; see storage.chunk_files)."""
        with self._fid_lock:
            file_id = self._next_file_id
            self._next_file_id += 1
        return file_id

    def _overlay_runs(
        self,
        meta: ChunkMeta | None,
        base: ChunkVersion | None,
        offset: int,
        data: bytes | bytearray | memoryview,
        extents: Sequence[tuple[int, int]],
    ) -> list[tuple[int, int]]:
        """The block runs a write of ``extents`` (one or several ranges) touches, where it can be a
        layered version of ``base``: inside it, on a plain committed version with no pending one,
        at most ``layered_overwrite_max`` of its blocks; else none."""
        if (
            not data
            or base is None
            or meta is None
            or meta.pending is not None
            or base.layered
            or write_end(offset, len(data), extents) > base.length
        ):
            return []
        runs = block_runs(extents, base.block)
        touched = sum(end - first for first, end in runs)
        if touched > self.options.layered_overwrite_max * block_count(base.length, base.block):
            return []
        return runs

    def _write_layered(
        self,
        chunk_id: bytes,
        base: ChunkVersion,
        data: bytes | bytearray | memoryview,
        extents: Sequence[tuple[int, int]],
        runs: list[tuple[int, int]],
        version: int,
        chain_ver: int,
    ) -> ChunkVersion:
        """The version ``base`` with ``extents`` (their bytes back to back in ``data``) written, as
        a layered version: the block ``runs`` they touch go to a new overlay file, back to back;
        ``base``'s file, the committed version's, is not touched."""
        blk, length = base.block, base.length
        view = memoryview(data)
        pos = 0
        pending = iter(extents)
        ext = next(pending, None)
        regions = []
        crcs = bytearray(base.block_crcs)
        crc = 0  # of the new version's bytes so far
        done = 0
        # Read and verify every byte the new version keeps, as copy-on-write does, not only those of
        # the blocks rewritten: an update never builds on a corrupt copy (the chain then sends the
        # whole chunk, which repairs it), and one that overwrites the bad bytes repairs them.
        with _cannot_update(chunk_id, base):
            kept = self._files.read_kept(chunk_id, base, extents)
        with _released(kept), memoryview(kept) as old:
            for first, end_block in runs:
                start, stop = first * blk, min(end_block * blk, length)
                region = bytearray(old[start:stop])
                while ext is not None and ext[0] < stop:
                    at, n = ext
                    region[at - start : at - start + n] = view[pos : pos + n]
                    pos += n
                    ext = next(pending, None)
                crcs[4 * first : 4 * end_block] = block_crcs(region, blk)
                crc = crc32c(region, crc32c(old[done:start], crc))
                done = stop
                regions.append(region)
            crc = crc32c(old[done:length], crc)
        file_id = self._new_file_id()
        self._files.write_new(chunk_id, file_id, b"".join(regions))
        return ChunkVersion(
            version,
            chain_ver,
            length,
            crc,
            base.file_id,
            bytes(crcs),
            overlay_file_id=file_id,
            overlay_first=runs[0][0],
            overlay_end=runs[-1][1],
            block=blk,
            overlay_runs=tuple(runs) if len(runs) > 1 else (),
        )

    def _fold_data(self, chunk_id: bytes, v: ChunkVersion) -> ChunkVersion:
        """Copy the overlay blocks of the committed layered version ``v`` into its data file, sync
        it, and return ``v`` as a plain version, for the caller to record (that deletes the overlay).

        Safe at any point of a crash: until the plain version is recorded, the metadata takes those
        blocks from the overlay file and never reads the bytes of the data file being overwritten
        (they belonged to an older version, which is no longer committed; a reader that still holds
        that version's metadata fails their checksums and retries with the current one). The caller
        holds the chunk lock, and no pending version shares the data file.

        Raises STORAGE_CHECKSUM_MISMATCH if the overlay is corrupt or the data file is missing
        (then it stays layered)."""
        with _cannot_update(chunk_id, v):
            regions = self._files.read_overlay(chunk_id, v)
            self._files.write_ranges(chunk_id, v.file_id, regions)
        return replace(v, overlay_file_id=0, overlay_first=0, overlay_end=0, overlay_runs=())

    def _fold(self, chunk_ids: Sequence[bytes]) -> None:
        """Fold the committed layered versions of ``chunk_ids`` and record them plain, all in one
        metadata transaction (when the engine opens, before anything else can touch the chunks).

        The chunks fold on several threads at once. Each data file is synced as it is folded (see
        ``_fold_data``), so all of them are durable before the transaction that records their
        versions plain, and each overlay file is deleted only once that transaction is durable: a
        crash at any point leaves every chunk layered or plain, as with one transaction per chunk,
        for one sync of the metadata per batch instead.

        One that cannot be folded (a corrupt overlay, a lost data file, which recovery reports
        among its missing files) stays as it is: its reads fail their checksums until the chain
        sends the whole chunk again, and the rest of the target opens."""
        metas = [self._store.get(chunk_id) for chunk_id in chunk_ids]
        todo = [m for m in metas if m is not None and m.committed is not None and m.committed.layered]

        def fold(meta: ChunkMeta) -> tuple[ChunkMeta, ChunkMeta] | None:
            assert meta.committed is not None
            try:
                plain = self._fold_data(meta.chunk_id, meta.committed)
            except FS3Error as exc:
                # leave it layered: reads of those blocks keep failing their checksums, as they should
                log.error("cannot fold overlay chunk=%s error=%s", meta.chunk_id.hex(), exc)
                return None
            return meta, replace(meta, committed=plain)

        # different chunks, and nothing else runs yet: their folds (and syncs) may overlap
        with ThreadPoolExecutor(min(_FOLD_THREADS, max(1, len(todo))), thread_name_prefix="fold") as pool:
            folded = [pair for pair in pool.map(fold, todo) if pair is not None]
        errors = self._store.swap_many([(old.chunk_id, old, new) for old, new in folded])
        for (old, new), error in zip(folded, errors, strict=True):
            if error is None:
                self._drop_files(new.chunk_id, old, new)
        # as a failed swap of one chunk would have (it cannot happen: nothing else runs yet)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def _install(self, old: ChunkMeta | None, new: ChunkMeta) -> ChunkMeta:
        """Record ``new`` in place of ``old``; if that fails, remove the files only ``new`` uses."""
        try:
            self._store.swap(new.chunk_id, old, new)
        except BaseException:
            for file_id in new.file_lengths().keys() - (old.file_lengths() if old else {}).keys():
                with contextlib.suppress(OSError):
                    self._files.unlink(new.chunk_id, file_id)
            raise
        self._drop_files(new.chunk_id, old, new)
        return new

    def _swap(self, chunk_id: bytes, old: ChunkMeta | None, new: ChunkMeta | None) -> None:
        self._store.swap(chunk_id, old, new)
        self._drop_files(chunk_id, old, new)

    def _drop_files(self, chunk_id: bytes, old: ChunkMeta | None, new: ChunkMeta | None) -> None:
        """After ``new`` replaced ``old`` in the metadata: delete the files ``old`` needed and
        ``new`` does not, and trim a shared file ``new`` needs less of (an aborted append). A crash
        before this only leaves debris that recovery removes."""
        old_files = old.file_lengths() if old else {}
        new_files = new.file_lengths() if new else {}
        for file_id, length in old_files.items():
            if file_id not in new_files:
                self._files.unlink(chunk_id, file_id)
            elif new_files[file_id] < length:
                self._files.truncate(chunk_id, file_id, new_files[file_id])


def _lost(chunk_id: bytes, v: ChunkVersion) -> FS3Error:
    return FS3Error(
        StatusCode.STORAGE_CHECKSUM_MISMATCH,
        f"chunk {chunk_id.hex()} version {v.version} was lost (no replica could read it): only a write"
        " of its whole content replaces it",
    )


class DamagedCopy(FS3Error):
    """STORAGE_CHECKSUM_MISMATCH for an update that had to read this replica's copy of version
    ``version`` (its base) and could not: the bytes fail their checksums, or the file is missing.
    The chain may still hold good copies (see ``Replicator.repair_damaged``)."""

    def __init__(self, code: int, message: str = "", version: int = 0) -> None:
        super().__init__(code, message)
        self.version = version

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (int(self.code), self.message, self.version))


@contextlib.contextmanager
def _cannot_update(chunk_id: bytes, v: ChunkVersion) -> Iterator[None]:
    """CorruptVersion, met reading ``v`` to build on it, as the error an update fails with."""
    try:
        yield
    except CorruptVersion as exc:
        raise DamagedCopy(
            StatusCode.STORAGE_CHECKSUM_MISMATCH,
            f"chunk {chunk_id.hex()} version {v.version}: {exc}; cannot update it",
            v.version,
        ) from None


@contextlib.contextmanager
def _released(data: bytes | memoryview) -> Iterator[None]:
    """Give back the lent buffer ``data`` may be a view of, when the block ends."""
    try:
        yield
    finally:
        release_read(data)


def _lock_target(path: Path) -> int:
    fd = os.open(path / "target.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FS3Error(
            StatusCode.FAILED_PRECONDITION, f"target {path} is open in another chunk engine"
        ) from None
    return fd
