"""The chunk engine of one storage target: chunk versions in files, their metadata in LMDB.

On disk, under the target directory::

    target.lock         flock held while an engine has the target open (one opener at a time)
    meta/               LMDB: db "chunks" (chunk id -> ChunkMeta), db "target" (format, counters)
    chunks/00 .. ff/    data files, one per chunk version: <chunk id hex>.<file id hex>

Writes never touch bytes a committed version needs, except where noted: an update writes the new
version (the committed content with the update applied) to a new file, fsyncs it, and only then
records it as the chunk's pending version in one LMDB transaction; :meth:`ChunkEngine.commit`
switches the committed version to it in another and then deletes the old file. A crash therefore
leaves every committed version intact, pending versions recorded for the chain to settle, and at
worst files no metadata references, which opening the engine removes.

The engine is thread-safe for calls on different chunks, which run in parallel (file I/O and fsync
release the GIL). Calls that modify one chunk must be serialized by the caller (the CRAQ service's
per-chunk lock); if they are not, the loser gets ABORTED rather than a lost update. Reads need no
lock: they may run while the same chunk is updated, committed or aborted. Every call blocks on disk
I/O: asyncio code uses :class:`fs3.storage.async_engine.AsyncChunkEngine`.

A disk error (any OSError from the data files other than a missing file, or an LMDB error) takes
the target offline: the call and every later one fail with STORAGE_IO_ERROR, or STORAGE_NO_SPACE if
the disk was full, and ``on_failure`` is called once so that the daemon can tell mgmtd. The target
comes back only by reopening the engine (after the operator has dealt with the disk).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import lmdb

from fs3.errors import FS3Error, StatusCode

from .chunk_files import ChunkFiles
from .chunk_meta import (
    CHECKSUM_BLOCK,
    FORMAT_VERSION,
    ChunkMeta,
    ChunkVersion,
    block_count,
    block_crcs,
    check_chunk_id,
    check_chunk_size,
    crc32c,
    decode_meta,
    encode_meta,
)

log = logging.getLogger(__name__)

_STATS = struct.Struct("<QQQ")  # used bytes, chunk count, highest file id ever recorded
_READ_ATTEMPTS = 8
_SCAN_BATCH = 1024


@dataclass(slots=True, frozen=True)
class EngineOptions:
    """Tuning of one engine. ``sync=False`` skips every fsync: for throwaway data only."""

    sync: bool = True
    map_size: int = 4 << 30  # LMDB's address-space reservation; the file grows only as needed
    max_readers: int = 1024
    in_place_append: bool = True


@dataclass(slots=True, frozen=True)
class ChunkRead:
    """Bytes read from one version of a chunk, with that version's identity."""

    data: bytes
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


@dataclass(slots=True, frozen=True)
class RecoveryReport:
    """What opening the engine found and did."""

    orphans_removed: int
    files_trimmed: int
    unknown_files: int
    missing_files: list[tuple[bytes, int]]
    pending: int


class _Corrupt(Exception):
    """A version's bytes on disk do not match its metadata (may be a race; the caller decides)."""


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
        self._closed = False
        self._fid_lock = threading.Lock()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = _lock_target(self.path)
        except OSError as exc:
            raise FS3Error(StatusCode.STORAGE_IO_ERROR, f"cannot open target {self.path}: {exc}") from exc
        try:
            sync = self.options.sync
            self._env = lmdb.open(
                str(self.path / "meta"),
                map_size=self.options.map_size,
                max_dbs=2,
                max_readers=self.options.max_readers,
                sync=sync,
                metasync=sync,
                readahead=False,
            )
            self._chunks = self._env.open_db(b"chunks")
            self._target = self._env.open_db(b"target")
            self._files = ChunkFiles(self.path / "chunks", sync=sync)
            self._init_target()
            self.recovery: RecoveryReport = self._recover()
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

    @property
    def failure(self) -> FS3Error | None:
        """The error that took the target offline, or None while it is healthy."""
        return self._failure

    @property
    def online(self) -> bool:
        return self._failure is None and not self._closed

    def close(self) -> None:
        """Release the target (LMDB, descriptors, the target lock). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._env.close()
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
        self, chunk_id: bytes, offset: int = 0, length: int | None = None, *, version: int | None = None
    ) -> ChunkRead:
        """Read ``length`` bytes (default: to the end) at ``offset`` of one version of a chunk.

        ``version=None`` reads the committed version; a number reads that version, committed or
        pending (CRAQ serves the version the tail says is committed). The result is shorter than
        asked where the version ends. Every block read is checked against its CRC32C.

        Raises STORAGE_CHUNK_NOT_FOUND (no committed version), STORAGE_CHUNK_VERSION_MISMATCH (that
        version is not held, e.g. superseded by a commit) or STORAGE_CHECKSUM_MISMATCH.
        """
        check_chunk_id(chunk_id)
        if offset < 0 or (length is not None and length < 0):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad read range offset={offset} length={length}")
        with self._io("read"):
            for _ in range(_READ_ATTEMPTS):
                meta = self._get(chunk_id)
                v = _select(chunk_id, meta, version)
                end = v.length if length is None else min(v.length, offset + length)
                try:
                    data = self._read_range(chunk_id, v, offset, end)
                except _Corrupt as exc:
                    # A commit or abort may have removed or trimmed the file after we looked up the
                    # metadata; only bytes that still disagree with current metadata are corrupt.
                    if self._get(chunk_id) != meta:
                        continue
                    raise FS3Error(
                        StatusCode.STORAGE_CHECKSUM_MISMATCH,
                        f"chunk {chunk_id.hex()} version {v.version}: {exc}",
                    ) from None
                return ChunkRead(data, v.version, v.chain_ver, v.length, v.crc)
            raise FS3Error(StatusCode.ABORTED, f"chunk {chunk_id.hex()} kept changing during a read")

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
    ) -> ChunkMeta:
        """Write ``data`` at ``offset`` as the pending version ``committed + 1`` of the chunk.

        ``version`` is that number when a predecessor sends it (None on the head). A pending version
        with the same number is replaced (a retried update is rebuilt from the same committed base,
        so it is idempotent); any other pending version must be committed or aborted first. Writing
        past the end leaves a hole of zeros. ``checksum``, if given, is the sender's CRC32C of
        ``data`` and is verified first. The chunk size is fixed by the chunk's first write.

        Raises INVALID_ARGUMENT, STORAGE_CHUNK_TOO_LARGE, STORAGE_CHECKSUM_MISMATCH,
        STORAGE_CHUNK_VERSION_MISMATCH (a version that is not committed + 1: stale or missing).
        """
        check_chunk_id(chunk_id)
        check_chunk_size(chunk_size)
        if offset < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative offset {offset}")
        _check_fits(chunk_id, offset + len(data), chunk_size)
        _check_checksum(chunk_id, data, checksum)
        with self._io("update"):
            meta = self._get(chunk_id)
            _check_size_class(chunk_id, meta, chunk_size)
            new_ver = _next_version(chunk_id, meta, version)
            base = meta.committed if meta else None
            if (
                self.options.in_place_append
                and base is not None
                and meta is not None
                and meta.pending is None
                and offset == base.length
                and len(data) > 0
            ):
                new = self._append_in_place(chunk_id, base, data, new_ver, chain_ver)
            else:
                content = self._content(chunk_id, base)
                if offset > len(content):
                    content.extend(bytes(offset - len(content)))
                content[offset : offset + len(data)] = data
                new = self._write_version(chunk_id, content, new_ver, chain_ver)
            return self._install(meta, ChunkMeta(chunk_id, chunk_size, base, new))

    def truncate(
        self, chunk_id: bytes, length: int, *, chunk_size: int, chain_ver: int, version: int | None = None
    ) -> ChunkMeta:
        """Make the pending version ``committed + 1`` the committed content cut or zero-extended to
        ``length`` (creating the chunk if needed). Versions behave as in :meth:`update`."""
        check_chunk_id(chunk_id)
        check_chunk_size(chunk_size)
        if length < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative length {length}")
        _check_fits(chunk_id, length, chunk_size)
        with self._io("truncate"):
            meta = self._get(chunk_id)
            _check_size_class(chunk_id, meta, chunk_size)
            new_ver = _next_version(chunk_id, meta, version)
            base = meta.committed if meta else None
            content = self._content(chunk_id, base)
            del content[length:]
            content.extend(bytes(length - len(content)))
            new = self._write_version(chunk_id, content, new_ver, chain_ver)
            return self._install(meta, ChunkMeta(chunk_id, chunk_size, base, new))

    def remove(self, chunk_id: bytes, *, chain_ver: int, version: int | None = None) -> ChunkMeta | None:
        """Record the removal of the chunk as its pending version; committing it deletes the chunk.

        Returns None (and records nothing) if the target holds no version of the chunk.
        """
        check_chunk_id(chunk_id)
        with self._io("remove"):
            meta = self._get(chunk_id)
            if meta is None:
                return None
            new_ver = _next_version(chunk_id, meta, version)
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
        _check_fits(chunk_id, len(data), chunk_size)
        _check_checksum(chunk_id, data, checksum)
        if version < 1:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad version {version}")
        with self._io("replace"):
            meta = self._get(chunk_id)
            _check_size_class(chunk_id, meta, chunk_size)
            committed = meta.committed if meta else None
            if not commit and version <= (committed.version if committed else 0):
                raise FS3Error(
                    StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
                    f"chunk {chunk_id.hex()}: replace with version {version} but {committed} is committed",
                )
            new = self._write_version(chunk_id, data, version, chain_ver)
            if commit:
                return self._install(meta, ChunkMeta(chunk_id, chunk_size, new, None))
            return self._install(meta, ChunkMeta(chunk_id, chunk_size, committed, new))

    def commit(self, chunk_id: bytes, version: int, *, chain_ver: int | None = None) -> ChunkMeta | None:
        """Make pending ``version`` the committed one (stamping ``chain_ver`` if given).

        Idempotent: committing a version at or below the committed one changes nothing and returns
        the metadata; a committed removal returns None, as does any commit of an absent chunk.
        Raises STORAGE_CHUNK_VERSION_MISMATCH if ``version`` is above committed but not pending.
        """
        check_chunk_id(chunk_id)
        with self._io("commit"):
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
        with self._io("abort"):
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
        with self._io("remove_range"):
            while True:
                gone: list[ChunkMeta] = []
                with self._env.begin(write=True) as txn:
                    cursor = txn.cursor(db=self._chunks)
                    ok = cursor.set_range(begin)
                    while ok and len(gone) < _SCAN_BATCH:
                        key = cursor.key()
                        if not key or (end is not None and key >= end):
                            break  # an empty key: the cursor ran off the end after a delete
                        gone.append(decode_meta(key, cursor.value()))
                        ok = cursor.delete()
                    used, count, max_fid = _STATS.unpack(txn.get(b"stats", db=self._target))
                    used -= sum(m.physical_bytes() for m in gone)
                    txn.put(b"stats", _STATS.pack(used, count - len(gone), max_fid), db=self._target)
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
            with self._io("iter_metas"), self._env.begin(db=self._chunks) as txn:
                cursor = txn.cursor()
                batch = []
                ok = cursor.set_range(start)
                while ok and (end is None or cursor.key() < end) and len(batch) < _SCAN_BATCH:
                    batch.append(decode_meta(cursor.key(), cursor.value()))
                    ok = cursor.next()
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

    def space_info(self) -> SpaceInfo:
        """Capacity and free space of the file system, and what this target's chunks use."""
        with self._io("space_info"):
            st = os.statvfs(self.path)
            with self._env.begin(db=self._target) as txn:
                used, count, _ = _STATS.unpack(txn.get(b"stats"))
        return SpaceInfo(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, used, count)

    # -- internals --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _io(self, what: str) -> Iterator[None]:
        if self._closed:
            raise FS3Error(StatusCode.STORAGE_TARGET_OFFLINE, f"target {self.path} is closed")
        if self._failure is not None:
            raise FS3Error(self._failure.code, f"target {self.path} is offline: {self._failure.message}")
        try:
            yield
        except FS3Error:
            raise
        except (OSError, lmdb.Error) as exc:
            raise self._fail(what, exc) from exc

    def _fail(self, what: str, exc: BaseException) -> FS3Error:
        full = isinstance(exc, lmdb.MapFullError) or getattr(exc, "errno", None) in (
            errno.ENOSPC,
            errno.EDQUOT,
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

    def _get(self, chunk_id: bytes) -> ChunkMeta | None:
        with self._env.begin(db=self._chunks) as txn:
            raw = txn.get(chunk_id)
        return None if raw is None else decode_meta(chunk_id, raw)

    def _read_range(self, chunk_id: bytes, v: ChunkVersion, offset: int, end: int) -> bytes:
        """Bytes ``[offset, end)`` of version ``v``, verified block by block."""
        if end <= offset:
            return b""
        first, last = offset // CHECKSUM_BLOCK, block_count(end)
        start, stop = first * CHECKSUM_BLOCK, min(last * CHECKSUM_BLOCK, v.length)
        try:
            raw = self._files.read(chunk_id, v.file_id, start, stop - start)
        except FileNotFoundError:
            raise _Corrupt("data file missing") from None
        if len(raw) != stop - start:
            raise _Corrupt(f"data file short: {len(raw)} of {stop - start} bytes at {start}")
        view = memoryview(raw)
        for index in range(first, last):
            pos = (index - first) * CHECKSUM_BLOCK
            if crc32c(view[pos : pos + CHECKSUM_BLOCK]) != v.block_crc(index):
                raise _Corrupt(f"block {index} (bytes {index * CHECKSUM_BLOCK}..) fails its CRC32C")
        if start == 0 and stop == v.length and crc32c(view) != v.crc:
            raise _Corrupt("chunk CRC32C differs from its block CRC32Cs")
        if start == offset and stop == end:
            return raw
        return raw[offset - start : end - start]

    def _content(self, chunk_id: bytes, v: ChunkVersion | None) -> bytearray:
        """The whole verified content of a version (empty for none), as the base of a new one."""
        if v is None:
            return bytearray()
        try:
            return bytearray(self._read_range(chunk_id, v, 0, v.length))
        except _Corrupt as exc:
            raise FS3Error(
                StatusCode.STORAGE_CHECKSUM_MISMATCH,
                f"chunk {chunk_id.hex()} version {v.version}: {exc}; cannot update it",
            ) from None

    def _write_version(
        self, chunk_id: bytes, content: bytes | bytearray | memoryview, version: int, chain_ver: int
    ) -> ChunkVersion:
        with self._fid_lock:
            file_id = self._next_file_id
            self._next_file_id += 1
        self._files.write_new(chunk_id, file_id, content)
        return ChunkVersion(version, chain_ver, len(content), crc32c(content), file_id, block_crcs(content))

    def _append_in_place(
        self,
        chunk_id: bytes,
        base: ChunkVersion,
        data: bytes | bytearray | memoryview,
        version: int,
        chain_ver: int,
    ) -> ChunkVersion:
        # Why appending into the committed version's file is safe:
        #  - readers of the committed version read only [0, committed length) and check those bytes
        #    against the committed block CRCs; this writes only at and after that length;
        #  - it is done only when no pending version exists, so no other version's bytes live past
        #    the committed length of this file;
        #  - if we crash before the metadata transaction, or the version is aborted, the bytes past
        #    the committed length belong to no version, and recovery or abort trims them;
        #  - commit keeps the shared file (it is the new committed version's file).
        # Anything else (overwrite, hole, pending retry, truncate) is copy-on-write.
        self._files.write_at(chunk_id, base.file_id, base.length, data)
        full_blocks = base.length // CHECKSUM_BLOCK
        crcs = bytearray(base.block_crcs[: 4 * full_blocks])
        view = memoryview(data)
        if base.length % CHECKSUM_BLOCK:
            take = min(CHECKSUM_BLOCK - base.length % CHECKSUM_BLOCK, len(view))
            crcs += struct.pack("<I", crc32c(view[:take], base.block_crc(full_blocks)))
            view = view[take:]
        crcs += block_crcs(view)
        length = base.length + len(data)
        return ChunkVersion(version, chain_ver, length, crc32c(data, base.crc), base.file_id, bytes(crcs))

    def _install(self, old: ChunkMeta | None, new: ChunkMeta) -> ChunkMeta:
        """Record ``new`` in place of ``old``; on failure remove the files only ``new`` uses."""
        try:
            self._swap(new.chunk_id, old, new)
        except BaseException:
            for file_id in new.file_lengths().keys() - (old.file_lengths() if old else {}).keys():
                with contextlib.suppress(OSError):
                    self._files.unlink(new.chunk_id, file_id)
            raise
        return new

    def _swap(self, chunk_id: bytes, old: ChunkMeta | None, new: ChunkMeta | None) -> None:
        """One LMDB transaction: replace ``old`` by ``new`` if nobody changed it meanwhile, and keep
        the counters in step; then delete or trim the files ``old`` needed and ``new`` does not."""
        with self._env.begin(write=True) as txn:
            raw = txn.get(chunk_id, db=self._chunks)
            if raw != (None if old is None else encode_meta(old)):
                raise FS3Error(
                    StatusCode.ABORTED, f"chunk {chunk_id.hex()} was changed by a concurrent update"
                )
            if new is None:
                txn.delete(chunk_id, db=self._chunks)
            else:
                txn.put(chunk_id, encode_meta(new), db=self._chunks)
            used, count, max_fid = _STATS.unpack(txn.get(b"stats", db=self._target))
            used += (new.physical_bytes() if new else 0) - (old.physical_bytes() if old else 0)
            count += (new is not None) - (old is not None)
            max_fid = max([max_fid, *(new.file_lengths() if new else ())])
            txn.put(b"stats", _STATS.pack(used, count, max_fid), db=self._target)
        old_files = old.file_lengths() if old else {}
        new_files = new.file_lengths() if new else {}
        for file_id, length in old_files.items():
            if file_id not in new_files:
                self._files.unlink(chunk_id, file_id)
            elif new_files[file_id] < length:
                self._files.truncate(chunk_id, file_id, new_files[file_id])

    def _init_target(self) -> None:
        with self._env.begin(write=True, db=self._target) as txn:
            fmt = txn.get(b"format")
            if fmt is None:
                txn.put(b"format", struct.pack("<I", FORMAT_VERSION))
                txn.put(b"stats", _STATS.pack(0, 0, 0))
            elif struct.unpack("<I", fmt)[0] != FORMAT_VERSION:
                raise FS3Error(
                    StatusCode.STORAGE_IO_ERROR,
                    f"target {self.path} has format {struct.unpack('<I', fmt)[0]}, not {FORMAT_VERSION}",
                )

    def _recover(self) -> RecoveryReport:
        """Remove data files no metadata references, trim bytes past the last version in a file
        (a crashed in-place append), and find referenced files that are missing."""
        orphans = trimmed = unknown = 0
        seen: set[tuple[bytes, int]] = set()
        with self._env.begin(db=self._target) as txn:
            max_fid = _STATS.unpack(txn.get(b"stats"))[2]
        with self._env.begin(db=self._chunks) as txn:
            for found in self._files.scan():
                if found.chunk_id is None:
                    unknown += 1
                    log.warning("unknown file in chunk directory path=%s", found.path)
                    continue
                max_fid = max(max_fid, found.file_id)
                raw = txn.get(found.chunk_id)
                needed = decode_meta(found.chunk_id, raw).file_lengths() if raw is not None else {}
                if found.file_id not in needed:
                    os.unlink(found.path)
                    orphans += 1
                    continue
                seen.add((found.chunk_id, found.file_id))
                if found.size > needed[found.file_id]:
                    os.truncate(found.path, needed[found.file_id])
                    trimmed += 1
            missing: list[tuple[bytes, int]] = []
            pending = 0
            for key, raw in txn.cursor():
                meta = decode_meta(key, raw)
                pending += meta.pending is not None
                missing += [(key, fid) for fid in meta.file_lengths() if (key, fid) not in seen]
        for chunk_id, file_id in missing:
            log.error("data file missing chunk=%s file_id=%x path=%s", chunk_id.hex(), file_id, self.path)
        self._next_file_id = max_fid + 1
        return RecoveryReport(orphans, trimmed, unknown, missing, pending)


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


def _select(chunk_id: bytes, meta: ChunkMeta | None, version: int | None) -> ChunkVersion:
    if meta is None or (version is None and meta.committed is None):
        raise FS3Error(StatusCode.STORAGE_CHUNK_NOT_FOUND, f"chunk {chunk_id.hex()} has no committed version")
    if version is None:
        assert meta.committed is not None
        return meta.committed
    for v in (meta.committed, meta.pending):
        if v is not None and v.version == version and not v.removal:
            return v
    raise FS3Error(
        StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
        f"chunk {chunk_id.hex()} has no version {version} "
        f"(committed {meta.committed_ver}, pending {meta.pending_ver or 'none'})",
    )


def _next_version(chunk_id: bytes, meta: ChunkMeta | None, version: int | None) -> int:
    expected = (meta.committed_ver if meta else 0) + 1
    if version is not None and version != expected:
        raise FS3Error(
            StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
            f"chunk {chunk_id.hex()}: update to version {version} but {expected - 1} is committed",
        )
    if meta is not None and meta.pending is not None and meta.pending.version != expected:
        raise FS3Error(
            StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
            f"chunk {chunk_id.hex()}: pending version {meta.pending.version} must be committed or aborted first",
        )
    return expected


def _check_size_class(chunk_id: bytes, meta: ChunkMeta | None, chunk_size: int) -> None:
    if meta is not None and meta.chunk_size != chunk_size:
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"chunk {chunk_id.hex()} has chunk size {meta.chunk_size}, not {chunk_size}",
        )


def _check_fits(chunk_id: bytes, end: int, chunk_size: int) -> None:
    if end > chunk_size:
        raise FS3Error(
            StatusCode.STORAGE_CHUNK_TOO_LARGE,
            f"chunk {chunk_id.hex()}: {end} bytes do not fit in a chunk of {chunk_size}",
        )


def _check_checksum(chunk_id: bytes, data: bytes | bytearray | memoryview, checksum: int | None) -> None:
    if checksum is not None and crc32c(data) != checksum:
        raise FS3Error(
            StatusCode.STORAGE_CHECKSUM_MISMATCH,
            f"chunk {chunk_id.hex()}: data received does not match the sender's CRC32C",
        )
