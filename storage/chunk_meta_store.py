"""The per-target LMDB that holds chunk metadata and the target's counters.

Database ``chunks`` maps a chunk id to its encoded :class:`ChunkMeta`; ids sort bytewise, so the
chunks of one file are adjacent and range scans (last chunk, remove range) are cursor walks.
Database ``target`` holds the format version and the counters (used bytes, chunk count, highest
file id), which every transaction that changes a chunk updates, so they are exact after a crash.

Only one process may open a target: the engine holds an flock on ``target.lock`` (LMDB itself would
let several in). Methods raise lmdb.Error as LMDB reports it; the engine decides what it means.

Group commit. LMDB has one writer at a time and a durable commit costs two fdatasyncs, so one
transaction per change caps a target at a few hundred changes a second however many threads write.
:meth:`ChunkMetaStore.swap` therefore queues its change; the first caller to find no transaction
in progress becomes the leader, takes every change queued so far, applies them in order in one
write transaction, commits it (one durable sync) and wakes the callers, each of which returns only
then. Changes that queue while a leader syncs form the next group, whose oldest caller the leader
wakes to lead it, so a lone caller waits for no one and a busy target amortizes the sync over every
change in flight. Each caller waits on a lock of its own and is woken only for its own change: with
one condition for all, every group's end woke every waiting I/O thread, most of them only to go
back to sleep.

Why changes in one group cannot conflict: each change carries the metadata it was built on
(``old``) and is applied only if the stored value still is ``old`` when its turn in the group
comes, so the group behaves exactly like the same changes committed one by one in queue order; a
change whose base moved fails alone with ABORTED and the rest of the group commits. In practice
that never happens: the engine calls swap with the chunk's striped lock held, so at most one change
per chunk is ever queued, and no change in a group reads what another in it writes (other than the
counters, which are summed in order).

If the transaction fails (an LMDB or disk error), every change of the group fails with that error,
none of them is recorded, and every caller sees it, just as if each had failed alone.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import lmdb

from fs3.errors import FS3Error, StatusCode, fresh_error
from fs3.kv.lmdb_engine import FileExtender

from .chunk_meta import FORMAT_VERSION, READABLE_FORMATS, ChunkMeta, decode_meta, encode_meta

log = logging.getLogger(__name__)

_STATS = struct.Struct("<QQQ")  # used bytes, chunk count, highest file id ever recorded
_FORMAT = struct.Struct("<I")
# A group bigger than this leaves the rest for the next one, so no transaction grows unbounded.
_MAX_GROUP = 512


@dataclass(slots=True, frozen=True)
class TargetStats:
    used: int  # bytes of data files
    chunk_count: int  # chunks with metadata (committed or only pending)
    max_file_id: int  # highest data file id any transaction recorded


@dataclass(slots=True, frozen=True)
class CommitStats:
    """How many changes :meth:`ChunkMetaStore.swap` recorded, in how many write transactions."""

    changes: int
    transactions: int
    queued: int  # changes waiting for the transaction in progress to finish
    committing: int  # changes in the transaction in progress (0: none)
    commit_seconds: float = 0.0  # time in the transactions, their two flushes included


class _Change:
    __slots__ = ("chunk_id", "old", "new", "done", "error", "wake")

    def __init__(self, chunk_id: bytes, old: ChunkMeta | None, new: ChunkMeta | None) -> None:
        self.chunk_id = chunk_id
        self.old = old
        self.new = new
        self.done = False
        self.error: BaseException | None = None
        # Held until this change's caller is to wake up: its change is recorded (done), or it is
        # to lead the next group. Each caller is woken once per reason, never by others' groups.
        self.wake = threading.Lock()
        self.wake.acquire()


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
        self._group_lock = threading.Lock()
        # the last write transaction began with less room ahead of LMDB's data than the extender
        # keeps where it can (FileExtender.LOW): it may have had to grow the file
        self.tight = False
        self._queue: list[_Change] = []
        self._leading = False  # a leader is committing a group
        self._committing = 0  # the size of that group
        self._changes = self._transactions = 0
        self._commit_seconds = 0.0
        try:
            self._chunks = self._env.open_db(b"chunks")
            self._target = self._env.open_db(b"target")
            self._init_target(path)
            # Zeros ahead of LMDB's data, so a group's fdatasync seldom has a new file size to
            # commit (see FileExtender); extended inside _commit_group's write transaction. Made
            # last, so nothing after it can fail and leave its descriptor open.
            self._extender = FileExtender(self._env, str(path))
        except BaseException:
            self._env.close()
            raise

    def close(self) -> None:
        self._extender.close()
        self._env.close()

    def get(self, chunk_id: bytes) -> ChunkMeta | None:
        with self._env.begin(db=self._chunks) as txn:
            raw = txn.get(chunk_id)
        return None if raw is None else decode_meta(chunk_id, raw)

    def swap(self, chunk_id: bytes, old: ChunkMeta | None, new: ChunkMeta | None) -> None:
        """Replace ``old`` by ``new`` (None: absent) and update the counters, durably (when the
        store syncs) by the time it returns; concurrent calls share one transaction (group commit).

        Raises ABORTED if the stored metadata is no longer ``old``: another thread changed the chunk
        since the caller read it, and the caller's new version was built on a stale base.
        """
        change = _Change(chunk_id, old, new)
        with self._group_lock:
            self._queue.append(change)
            lead = not self._leading
            self._leading = True
        while True:
            if not lead:
                change.wake.acquire()  # released once: recorded, or this caller leads next
                if change.done:
                    break
            # lead: the oldest queued changes (ours among them, or in a later group when more
            # than _MAX_GROUP were queued ahead of it: then we lead again)
            with self._group_lock:
                group, self._queue = self._queue[:_MAX_GROUP], self._queue[_MAX_GROUP:]
                self._committing = len(group)
            try:
                self._commit_group(group)
            except BaseException as exc:
                log.error("chunk metadata commit of %d changes failed", len(group), exc_info=exc)
                kept = fresh_error(exc)  # not exc: its traceback holds this frame, and so group
                for c in group:  # each caller raises its own copy of it (see below)
                    c.error = kept
            finally:
                with self._group_lock:
                    for c in group:
                        c.done = True
                    self._committing = 0
                    # Leadership passes to the oldest queued change's caller, unless ours is
                    # still queued (we lead again) or nothing is (the next caller leads).
                    heir = self._queue[0] if change.done and self._queue else None
                    if change.done and heir is None:
                        self._leading = False
                for c in group:
                    if c is not change:
                        c.wake.release()
                if heir is not None:
                    heir.wake.release()
            if change.done:
                break
            lead = True
        if change.error is not None:
            # a copy without the traceback: the error is the whole group's, raised by each of its
            # callers in its own thread, and one raised through this frame would hold it (a cycle)
            raise fresh_error(change.error)

    def swap_many(
        self, changes: Sequence[tuple[bytes, ChunkMeta | None, ChunkMeta | None]]
    ) -> list[BaseException | None]:
        """Apply several ``(chunk id, old, new)`` swaps in one write transaction (one durable sync,
        when the store syncs) and return each one's error (None: recorded), which is ABORTED where
        the stored metadata was no longer its ``old``, as :meth:`swap` raises; the others commit.
        If the transaction fails, raises its error and records none of them.

        For a caller with many changes to different chunks at hand at once (the engine's fold at
        open), so it need not queue them one by one: the changes do not join :meth:`swap`'s
        groups, whose transactions LMDB orders with this one. The caller bounds their number.
        """
        group = [_Change(chunk_id, old, new) for chunk_id, old, new in changes]
        if group:
            self._commit_group(group)
        return [c.error for c in group]

    def commit_stats(self) -> CommitStats:
        """Changes recorded by :meth:`swap` and :meth:`swap_many` since the store was opened, and
        transactions used."""
        with self._group_lock:
            return CommitStats(
                self._changes, self._transactions, len(self._queue), self._committing, self._commit_seconds
            )

    def _commit_group(self, group: list[_Change]) -> None:
        """Apply ``group`` in order in one write transaction; a change whose base moved fails alone."""
        applied = 0
        start = time.perf_counter()
        with self._env.begin(write=True) as txn:
            # under the write lock, as it must be; the room left says whether an EIO of this
            # transaction may be a full disk's (see ChunkEngine._error)
            self.tight = self._extender.extend_if_needed() < FileExtender.LOW
            stats = self._stats(txn)
            used, count, max_fid = stats.used, stats.chunk_count, stats.max_file_id
            for c in group:
                if not _holds(c.chunk_id, txn.get(c.chunk_id, db=self._chunks), c.old):
                    c.error = FS3Error(
                        StatusCode.ABORTED, f"chunk {c.chunk_id.hex()} was changed by a concurrent update"
                    )
                    continue
                old, new = c.old, c.new
                if new is None:
                    txn.delete(c.chunk_id, db=self._chunks)
                else:
                    txn.put(c.chunk_id, encode_meta(new), db=self._chunks)
                    max_fid = max(max_fid, *new.file_lengths(), 0)
                used += (new.physical_bytes() if new else 0) - (old.physical_bytes() if old else 0)
                count += (new is not None) - (old is not None)
                applied += 1
            if applied:
                txn.put(b"stats", _STATS.pack(used, count, max_fid), db=self._target)
        took = time.perf_counter() - start
        with self._group_lock:
            self._changes += applied
            self._transactions += 1
            self._commit_seconds += took

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
            elif _FORMAT.unpack(raw)[0] == FORMAT_VERSION:
                pass
            elif (found := _FORMAT.unpack(raw)[0]) in READABLE_FORMATS:
                # older formats are subsets of this one: from now on the target may hold either
                txn.put(b"format", _FORMAT.pack(FORMAT_VERSION))
                log.warning(
                    "target metadata %s upgraded from format %d to %d: the fs3 versions that wrote "
                    "format %d cannot open this target any more (a rollback of this node needs this "
                    "version or a newer one)",
                    path,
                    found,
                    FORMAT_VERSION,
                    found,
                )
            else:
                newer = found > FORMAT_VERSION
                raise FS3Error(
                    StatusCode.STORAGE_IO_ERROR,
                    f"target metadata {path} has format {found}, not {FORMAT_VERSION}"
                    + (" (written by a newer fs3: run that version or a later one)" if newer else ""),
                )


def _holds(chunk_id: bytes, raw: bytes | None, meta: ChunkMeta | None) -> bool:
    """Whether the stored record ``raw`` (None: absent) is ``meta``. One that an older format wrote
    (its first byte says which) is compared decoded: this build encodes the same content with its
    own format's byte."""
    if raw is None or meta is None:
        return raw is None and meta is None
    if raw[0] == FORMAT_VERSION:
        return raw == encode_meta(meta)
    return decode_meta(chunk_id, raw) == meta
