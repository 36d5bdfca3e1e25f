"""What one replica does to its own chunks for CRAQ (:mod:`fs3.storage.craq` drives the chain).

Chunk ids (inode id and chunk index, big-endian, so one file's chunks are one key range), the
:class:`Op` an update becomes once validated (:func:`client_op`, :func:`forwarded_op`), applying it
to the chunk engine in an I/O thread (:func:`apply_op`), reading a version with the CRC32C of the
bytes read (:func:`read_or_meta`, :func:`read_version`), per-chunk locks and the result cache that
makes a client's retried update exactly-once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fs3.errors import FS3Error, StatusCode
from fs3.proto import storage_pb2

from .chunk_engine import ChunkEngine, ChunkRead
from .chunk_meta import ChunkMeta, check_chunk_size, check_extents, crc32c, write_end

log = logging.getLogger(__name__)

_CHUNK_ID = struct.Struct(">QQ")


def chunk_id(inode_id: int, chunk_index: int) -> bytes:
    """The engine's id of a file's chunk: big-endian inode id then chunk index, so a file's chunks
    sort together and in order."""
    return _CHUNK_ID.pack(inode_id, chunk_index)


def file_range(inode_id: int, begin_index: int = 0, end_index: int = 0) -> tuple[bytes, bytes | None]:
    """Chunk ids ``[begin, end)`` of a file's chunks ``begin_index <= index < end_index`` (0: to the
    last); ``end`` is None past the very last inode."""
    begin = chunk_id(inode_id, begin_index)
    if end_index:
        return begin, chunk_id(inode_id, end_index)
    return begin, chunk_id(inode_id + 1, 0) if inode_id < (1 << 64) - 1 else None


def split_chunk_id(cid: bytes) -> tuple[int, int]:
    if len(cid) != _CHUNK_ID.size:
        return (0, 0)
    return _CHUNK_ID.unpack(cid)


def io_result(meta: ChunkMeta | None, chain_version: int) -> storage_pb2.IOResult:
    if meta is None:
        return storage_pb2.IOResult(commit_chain_version=chain_version)
    return storage_pb2.IOResult(
        length=meta.length,
        committed_version=meta.committed_ver,
        update_version=meta.update_ver,
        crc32c=meta.crc,
        commit_chain_version=chain_version,
    )


class ChunkLocks:
    """One asyncio lock per (target, chunk), created on demand and dropped when unused."""

    def __init__(self) -> None:
        self._locks: dict[tuple[int, bytes], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, target_id: int, cid: bytes) -> AsyncIterator[None]:
        key = (target_id, cid)
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


@dataclass(slots=True)
class Op:
    """One chunk update as a replica applies it."""

    type: int  # storage_pb2.UpdateType
    chunk_size: int
    offset: int = 0
    length: int = 0  # WRITE/REPLACE: bytes of data; TRUNCATE: the new chunk length
    data: memoryview | None = None
    crc: int | None = None
    # WRITE of several ranges: (offset, length) each, data back to back (see UpdateIO.extents)
    extents: tuple[tuple[int, int], ...] = ()


class ResultCache:
    """Results of recent client updates by (client id, channel), for exactly-once retries. The
    head stores what it answered; every other replica what it committed of a forwarded client
    update (the tag travels with it), so a retry that finds a new head after the old one died is
    recognised there too.

    Users' tags (a user connection's client ids, made its user's: ``fs3.net.auth.user_scoped_id``,
    the top bit set) are kept apart, each kind up to ``capacity`` entries, so that a user sending
    updates with ever new tags pushes out only users' records, never cluster members'."""

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, int], tuple[int, int, storage_pb2.IOResult]] = OrderedDict()
        self._users: OrderedDict[tuple[int, int], tuple[int, int, storage_pb2.IOResult]] = OrderedDict()

    def lookup(self, tag: storage_pb2.UpdateTag) -> storage_pb2.IOResult | None:
        if not tag.client_id:
            return None
        entry = (self._users if tag.client_id >> 63 else self._entries).get((tag.client_id, tag.channel))
        if entry is None:
            return None
        seq, rid, result = entry
        if tag.seqnum < seq:
            raise FS3Error(
                StatusCode.FAILED_PRECONDITION,
                f"update seqnum {tag.seqnum} on channel {tag.channel} of client {tag.client_id:#x} is older "
                f"than {seq}: a retry of an update the client has moved past",
            )
        if tag.seqnum == seq and tag.request_id == rid:
            return result
        return None

    def store(self, tag: storage_pb2.UpdateTag, result: storage_pb2.IOResult) -> None:
        if not tag.client_id:
            return
        key = (tag.client_id, tag.channel)
        entries = self._users if tag.client_id >> 63 else self._entries
        known = entries.get(key)
        if known is not None and known[0] > tag.seqnum:
            return  # a forward arriving after the channel's next update was stored here
        entries[key] = (tag.seqnum, tag.request_id, result)
        entries.move_to_end(key)
        while len(entries) > self.capacity:
            entries.popitem(last=False)


def apply_op(
    eng: ChunkEngine, cid: bytes, op: Op, version: int | None, chain_ver: int, commit: bool
) -> tuple[str, ChunkMeta | None, ChunkMeta | None]:
    """In an I/O thread: apply ``op`` as pending version ``version`` (``committed + 1`` when None)
    and, with ``commit``, commit it. Returns ``(kind, meta, new)``: "settle" (a pending version is
    in the way; meta), "stale" (``version`` is committed already; meta), "absent" (a removal of
    nothing), "pending" (new: the pending metadata) or "committed" (new, and meta after commit)."""
    meta = eng.get_meta(cid)
    if version is None and meta is not None and meta.pending is not None:
        return "settle", meta, None
    committed = meta.committed_ver if meta else 0
    if version is not None:
        if version <= committed:
            return "stale", meta, None
        if version > committed + 1 and op.type not in (storage_pb2.UPDATE_REPLACE, storage_pb2.UPDATE_REMOVE):
            raise FS3Error(
                StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
                f"chunk {cid.hex()}: update to version {version} but {committed} is committed "
                "(missing updates; send the whole chunk)",
            )
    new: ChunkMeta | None
    if op.type == storage_pb2.UPDATE_WRITE:
        assert op.data is not None
        new = eng.update(
            cid,
            op.offset,
            op.data,
            chunk_size=op.chunk_size,
            chain_ver=chain_ver,
            version=version,
            checksum=op.crc,
            commit=commit,
            extents=op.extents,
        )
    elif op.type == storage_pb2.UPDATE_TRUNCATE:
        new = eng.truncate(
            cid, op.length, chunk_size=op.chunk_size, chain_ver=chain_ver, version=version, commit=commit
        )
    elif op.type == storage_pb2.UPDATE_REPLACE:
        assert op.data is not None and version is not None
        new = eng.replace(
            cid, op.data, chunk_size=op.chunk_size, chain_ver=chain_ver, version=version, checksum=op.crc
        )
    elif op.type == storage_pb2.UPDATE_REMOVE:
        if meta is None:
            return "absent", None, None
        if version is not None and version != committed + 1:
            # a removal that skips versions this replica missed: drop what it has outright
            eng.remove_range(cid, cid + b"\0")
            return "absent", None, None
        if meta.pending is not None and version is not None:
            eng.abort(cid)
        new = eng.remove(cid, chain_ver=chain_ver, version=version)
    else:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"unknown update type {op.type}")
    if new is None:
        return "absent", None, None
    if commit:
        if op.type in (storage_pb2.UPDATE_WRITE, storage_pb2.UPDATE_TRUNCATE):
            return "committed", new, new  # recorded and committed in one metadata transaction
        return "committed", eng.commit(cid, new.pending_ver, chain_ver=chain_ver), new
    return "pending", None, new


# What the engine refuses before it writes anything, for reasons that lie in the update itself (its
# bytes, checksum and sizes) or in metadata every replica holds alike: a successor refuses it too.
REFUSED_EVERYWHERE = frozenset(
    {StatusCode.STORAGE_CHECKSUM_MISMATCH, StatusCode.INVALID_ARGUMENT, StatusCode.STORAGE_CHUNK_TOO_LARGE}
)


def parallel_version(meta: ChunkMeta | None, op: Op, version: int | None) -> int:
    """The version a write from offset 0 becomes if it may be stored here and forwarded at the same
    time (else 0): it must replace the whole content (no base to read, whose corruption could fail
    it here alone), and no pending version may be in the way (settling it comes first). ``meta``
    is read on the event loop (an LMDB read takes no lock); the chunk's lock keeps it current."""
    if meta is not None and meta.pending is not None:
        return 0
    committed = meta.committed if meta is not None else None
    if committed is not None and committed.length > op.length:
        return 0
    expected = (committed.version if committed is not None else 0) + 1
    if version is not None and version != expected:
        return 0  # a retry, or a replica that missed updates: the sequential round answers those
    return expected


def check_same(
    chain_id: int, cid: bytes, version: int, mine: int, successor: int, *, syncing: bool = False
) -> None:
    """Log a successor that answered a forward with this version committed but other bytes.
    A SYNCING successor may: it can hold a stale copy under the same number (the chunk was
    removed and written again while it was away), which its resync replaces before it serves."""
    if mine != successor:
        log.log(
            logging.INFO if syncing else logging.ERROR,
            "replica diverged%s chain_id=%d chunk=%s version=%d crc=%08x successor_crc=%08x",
            " (a syncing successor's stale copy; its resync replaces it)" if syncing else "",
            chain_id,
            cid.hex(),
            version,
            mine,
            successor,
        )


def removed_result(version: int, chain_ver: int) -> storage_pb2.IOResult:
    return storage_pb2.IOResult(
        committed_version=version, update_version=version, commit_chain_version=chain_ver
    )


def client_op(io: storage_pb2.UpdateIO, payload: memoryview | None) -> Op:
    """Validate a client's update before anything is locked or touched."""
    if io.update_version != 0:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, "a client update must not carry an update version")
    if io.type == storage_pb2.UPDATE_REMOVE:
        return Op(io.type, 0)
    check_chunk_size(io.chunk_size)
    if io.type == storage_pb2.UPDATE_WRITE:
        data = payload_slice(io, payload)
        if io.length == 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "empty write")
        extents = write_extents(io)
        if write_end(io.offset, io.length, extents) > io.chunk_size:
            raise FS3Error(
                StatusCode.STORAGE_CHUNK_TOO_LARGE,
                f"write of {io.length} bytes at {io.offset} exceeds the chunk size {io.chunk_size}",
            )
        return Op(io.type, io.chunk_size, io.offset, io.length, data, io.crc32c, extents)
    if io.type == storage_pb2.UPDATE_TRUNCATE:
        if io.length > io.chunk_size:
            raise FS3Error(
                StatusCode.STORAGE_CHUNK_TOO_LARGE,
                f"truncate to {io.length} exceeds the chunk size {io.chunk_size}",
            )
        return Op(io.type, io.chunk_size, length=io.length)
    raise FS3Error(StatusCode.INVALID_ARGUMENT, f"clients may not send update type {io.type}")


def forwarded_op(
    io: storage_pb2.UpdateIO, payload: memoryview | None, syncing: bool, lost: bool = False
) -> Op:
    if io.type == storage_pb2.UPDATE_REMOVE:
        return Op(io.type, io.chunk_size or 0)
    check_chunk_size(io.chunk_size)
    if lost:
        # a resync's record of a version no replica can read: its length and CRC32C, no bytes
        if io.type != storage_pb2.UPDATE_REPLACE or not 0 < io.length <= io.chunk_size:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"a lost chunk of {io.length} bytes, type {io.type}")
        return Op(io.type, io.chunk_size, 0, io.length, None, io.crc32c)
    if io.type in (storage_pb2.UPDATE_WRITE, storage_pb2.UPDATE_REPLACE):
        data = payload_slice(io, payload)
        extents = write_extents(io) if io.type == storage_pb2.UPDATE_WRITE else ()
        if write_end(io.offset, io.length, extents) > io.chunk_size:
            raise FS3Error(StatusCode.STORAGE_CHUNK_TOO_LARGE, "update exceeds the chunk size")
        return Op(io.type, io.chunk_size, io.offset, io.length, data, io.crc32c, extents)
    if io.type == storage_pb2.UPDATE_TRUNCATE:
        return Op(io.type, io.chunk_size, length=io.length)
    raise FS3Error(StatusCode.INVALID_ARGUMENT, f"unknown update type {io.type}")


def write_extents(io: storage_pb2.UpdateIO) -> tuple[tuple[int, int], ...]:
    """The ranges of a WRITE of several (empty for one), checked as UpdateIO.extents requires."""
    if not io.extents:
        return ()
    extents = tuple((e.offset, e.length) for e in io.extents)
    check_extents(io.offset, io.length, extents)
    return extents


def payload_slice(io: storage_pb2.UpdateIO, payload: memoryview | None) -> memoryview:
    size = 0 if payload is None else payload.nbytes
    if io.payload_offset + io.length > size:
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"update names payload bytes {io.payload_offset}..{io.payload_offset + io.length} of {size}",
        )
    assert payload is not None
    return payload[io.payload_offset : io.payload_offset + io.length]


def read_or_meta(
    eng: ChunkEngine, cid: bytes, offset: int, length: int, *, nowait: bool = False, lease: bool = False
) -> tuple[bytes, int, int] | ChunkMeta:
    """In an I/O thread or, with ``nowait`` (see ChunkEngine.read), on the event loop: the
    committed bytes if no update is pending, else the metadata (the caller must ask the tail which
    version to serve). ``lease`` as for ChunkEngine.read."""
    return read_meta_or_data(eng, cid, eng.get_meta(cid), offset, length, nowait=nowait, lease=lease)


def read_meta_or_data(
    eng: ChunkEngine,
    cid: bytes,
    meta: ChunkMeta | None,
    offset: int,
    length: int,
    *,
    nowait: bool = False,
    lease: bool = False,
) -> tuple[bytes, int, int] | ChunkMeta:
    """:func:`read_or_meta` with the chunk's metadata as the caller just read it."""
    if meta is None or (meta.pending is None and meta.committed is None):
        raise FS3Error(StatusCode.STORAGE_CHUNK_NOT_FOUND, f"chunk {cid.hex()} does not exist")
    if meta.pending is not None:
        return meta
    # whatever is committed by the time of the read: a version committed here is committed at the
    # tail, and one that started after this read began need not be seen
    r = eng.read(cid, offset, length, meta=meta, nowait=nowait, lease=lease)
    return r.data, data_crc(offset, r), r.version  # type: ignore[return-value]


def read_version(
    eng: ChunkEngine, cid: bytes, offset: int, length: int, version: int, lease: bool = False
) -> tuple[bytes, int, int]:
    r = eng.read(cid, offset, length, version=version, lease=lease)
    return r.data, data_crc(offset, r), r.version  # type: ignore[return-value]


def data_crc(offset: int, r: ChunkRead) -> int:
    """CRC32C of the bytes read: the version's own (which the engine checked them against) when
    they are the whole chunk, saving a pass over a large read."""
    if offset == 0 and len(r.data) == r.chunk_length:
        return r.chunk_crc
    return crc32c(r.data)
