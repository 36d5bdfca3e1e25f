"""The per-target LMDB that holds chunk metadata and the target's counters.

Database ``chunks`` maps a chunk id to its encoded :class:`ChunkMeta`; ids sort bytewise, so the
chunks of one file are adjacent and range scans (last chunk, remove range) are cursor walks.
Database ``target`` holds the format version and the counters (used bytes, chunk count, highest
file id), which every transaction that changes a chunk updates, so they are exact after a crash.

Only one process may open a target: the engine holds an flock on ``target.lock`` (LMDB itself would
let several in). Methods raise lmdb.Error as LMDB reports it; the engine decides what it means.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import lmdb

from fs3.errors import FS3Error, StatusCode

from .chunk_meta import FORMAT_VERSION, ChunkMeta, decode_meta, encode_meta

_STATS = struct.Struct("<QQQ")  # used bytes, chunk count, highest file id ever recorded
_FORMAT = struct.Struct("<I")


@dataclass(slots=True, frozen=True)
class TargetStats:
    used: int  # bytes of data files
    chunk_count: int  # chunks with metadata (committed or only pending)
    max_file_id: int  # highest data file id any transaction recorded


class ChunkMetaStore:
    """Chunk metadata of one target. Thread-safe (LMDB serializes write transactions)."""

    def __init__(self, path: Path, *, sync: bool, map_size: int, max_readers: int) -> None:
        self._env = lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=2,
            max_readers=max_readers,
            sync=sync,
            metasync=sync,
            readahead=False,  # random point lookups; readahead would only evict useful pages
        )
        try:
            self._chunks = self._env.open_db(b"chunks")
            self._target = self._env.open_db(b"target")
            self._init_target(path)
        except BaseException:
            self._env.close()
            raise

    def close(self) -> None:
        self._env.close()

    def get(self, chunk_id: bytes) -> ChunkMeta | None:
        with self._env.begin(db=self._chunks) as txn:
            raw = txn.get(chunk_id)
        return None if raw is None else decode_meta(chunk_id, raw)

    def swap(self, chunk_id: bytes, old: ChunkMeta | None, new: ChunkMeta | None) -> None:
        """In one transaction: replace ``old`` by ``new`` (None: absent) and update the counters.

        Raises ABORTED if the stored metadata is no longer ``old``: another thread changed the chunk
        since the caller read it, and the caller's new version was built on a stale base.
        """
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
            stats = self._stats(txn)
            used = stats.used + (new.physical_bytes() if new else 0) - (old.physical_bytes() if old else 0)
            count = stats.chunk_count + (new is not None) - (old is not None)
            max_fid = max([stats.max_file_id, *(new.file_lengths() if new else ())])
            txn.put(b"stats", _STATS.pack(used, count, max_fid), db=self._target)

    def delete_range(self, begin: bytes, end: bytes | None, limit: int) -> list[ChunkMeta]:
        """Delete up to ``limit`` chunks from ``[begin, end)`` in one transaction; return them."""
        gone: list[ChunkMeta] = []
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor(db=self._chunks)
            ok = cursor.set_range(begin)
            while ok and len(gone) < limit:
                key = cursor.key()
                if not key or (end is not None and key >= end):
                    break  # an empty key: the cursor ran off the end after a delete
                gone.append(decode_meta(key, cursor.value()))
                ok = cursor.delete()
            stats = self._stats(txn)
            used = stats.used - sum(m.physical_bytes() for m in gone)
            txn.put(
                b"stats", _STATS.pack(used, stats.chunk_count - len(gone), stats.max_file_id), db=self._target
            )
        return gone

    def scan(self, begin: bytes, end: bytes | None, limit: int) -> list[ChunkMeta]:
        """Up to ``limit`` chunks from ``[begin, end)`` in id order, from one read transaction."""
        batch: list[ChunkMeta] = []
        with self._env.begin(db=self._chunks) as txn:
            cursor = txn.cursor()
            ok = cursor.set_range(begin)
            while ok and len(batch) < limit:
                key = cursor.key()
                if end is not None and key >= end:
                    break
                batch.append(decode_meta(key, cursor.value()))
                ok = cursor.next()
        return batch

    def stats(self) -> TargetStats:
        with self._env.begin() as txn:
            return self._stats(txn)

    def _stats(self, txn: lmdb.Transaction) -> TargetStats:
        return TargetStats(*_STATS.unpack(txn.get(b"stats", db=self._target)))

    def _init_target(self, path: Path) -> None:
        with self._env.begin(write=True, db=self._target) as txn:
            raw = txn.get(b"format")
            if raw is None:
                txn.put(b"format", _FORMAT.pack(FORMAT_VERSION))
                txn.put(b"stats", _STATS.pack(0, 0, 0))
            elif _FORMAT.unpack(raw)[0] != FORMAT_VERSION:
                raise FS3Error(
                    StatusCode.STORAGE_IO_ERROR,
                    f"target metadata {path} has format {_FORMAT.unpack(raw)[0]}, not {FORMAT_VERSION}",
                )
