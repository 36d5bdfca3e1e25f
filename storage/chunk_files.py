"""Chunk data files: one file per chunk version, in 256 sharded directories under the target.

A file is named ``<chunk id in hex>.<file id in hex>`` and lives in ``chunks/<shard>/`` where the
shard is the low byte of the chunk id's CRC32C, so that one file's chunks spread over directories
and no directory grows huge. File ids come from a per-target counter and are never reused, which
lets a new version be written under its final name without a rename: until a metadata transaction
references it, the file is an orphan that recovery removes.

This module also turns bytes into versions: it computes the checksums of what it writes and checks
those of what it reads. Every method raises OSError as the kernel reports it; the engine decides
what an error means.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .chunk_meta import CHECKSUM_BLOCK, ChunkVersion, block_count, block_crcs, crc32c

SHARDS = 256


@dataclass(slots=True, frozen=True)
class DataFile:
    """A file found by :meth:`ChunkFiles.scan`; ``chunk_id`` is None for names fs3 did not write."""

    path: Path
    chunk_id: bytes | None
    file_id: int
    size: int


class CorruptVersion(Exception):
    """A version's bytes on disk do not match its metadata (or a commit removed them meanwhile)."""


class ChunkFiles:
    """The data files of one target. Thread-safe: every call opens its own descriptor."""

    def __init__(self, root: Path, *, sync: bool = True) -> None:
        self.root = root
        self.sync = sync
        self._dir_fds: dict[int, int] = {}
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
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
        fd = self._open(chunk_id, file_id, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            _pwrite_all(fd, data, 0)
            if self.sync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            self.unlink(chunk_id, file_id)
            raise
        os.close(fd)
        if self.sync:
            # fsync of the file does not persist its name; without this a power loss could leave
            # committed metadata pointing at a file that is not there.
            os.fsync(self._dir_fd(self.shard(chunk_id)))

    def write_at(self, chunk_id: bytes, file_id: int, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` of an existing file and make it durable (an in-place append,
        or folding a layered version's overlay into its data file)."""
        fd = self._open(chunk_id, file_id, os.O_WRONLY)
        try:
            _pwrite_all(fd, data, offset)
            if self.sync:
                os.fdatasync(fd)  # persists the file size too, which is all an append changes
        finally:
            os.close(fd)

    def read(self, chunk_id: bytes, file_id: int, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``; shorter only if the file is shorter."""
        fd = self._open(chunk_id, file_id, os.O_RDONLY)
        try:
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
    ) -> ChunkVersion:
        """Write ``content`` as a new file and return the version it is, checksums computed
        (``crc``: the CRC32C of ``content``, if the caller has verified it already)."""
        self.write_new(chunk_id, file_id, content)
        if crc is None:
            crc = crc32c(content)
        return ChunkVersion(version, chain_ver, len(content), crc, file_id, block_crcs(content))

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

    def read_version(self, chunk_id: bytes, v: ChunkVersion, offset: int, end: int) -> bytes:
        """Bytes ``[offset, end)`` of version ``v``, each block read checked against its CRC32C.

        Raises CorruptVersion if the file is missing, short, or fails a checksum.
        """
        if end <= offset:
            return b""
        first, last = offset // CHECKSUM_BLOCK, block_count(end)
        start, stop = first * CHECKSUM_BLOCK, min(last * CHECKSUM_BLOCK, v.length)
        try:
            raw = self._read_span(chunk_id, v, start, stop)
        except FileNotFoundError:
            raise CorruptVersion("data file missing") from None
        if len(raw) != stop - start:
            raise CorruptVersion(f"data file short: {len(raw)} of {stop - start} bytes at {start}")
        view = memoryview(raw)
        for index in range(first, last):
            pos = (index - first) * CHECKSUM_BLOCK
            if crc32c(view[pos : pos + CHECKSUM_BLOCK]) != v.block_crc(index):
                raise CorruptVersion(f"block {index} (bytes {index * CHECKSUM_BLOCK}..) fails its CRC32C")
        if start == 0 and stop == v.length and crc32c(view) != v.crc:
            raise CorruptVersion("chunk CRC32C differs from its block CRC32Cs")
        if start == offset and stop == end:
            return raw
        return raw[offset - start : end - start]

    def _read_span(self, chunk_id: bytes, v: ChunkVersion, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``v`` as stored (unverified): from the overlay file where
        the version is layered, else from its data file."""
        if not v.layered:
            return self.read(chunk_id, v.file_id, start, stop - start)
        over_start, over_end = v.overlay_span()
        parts = []
        if start < over_start:
            parts.append(self.read(chunk_id, v.file_id, start, min(stop, over_start) - start))
        if start < over_end and stop > over_start:
            lo, hi = max(start, over_start), min(stop, over_end)
            parts.append(self.read(chunk_id, v.overlay_file_id, lo - over_start, hi - lo))
        if stop > over_end:
            lo = max(start, over_end)
            parts.append(self.read(chunk_id, v.file_id, lo, stop - lo))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def truncate(self, chunk_id: bytes, file_id: int, length: int) -> None:
        fd = self._open(chunk_id, file_id, os.O_WRONLY)
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


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n == 0:  # pragma: no cover - the kernel reports ENOSPC rather than writing nothing
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view = view[n:]
        offset += n
