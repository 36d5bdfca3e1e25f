"""CRAQ on one storage daemon: chunk updates along the chain, commits back up it, and reads.

Write path (DESIGN §6, reference notes §3.2). The head takes the chunk's lock, checks the chain
version, stores the update as pending version ``committed + 1`` and forwards it to its successor
with that version; each replica does the same and the tail commits first; each predecessor
commits once its successor has answered, and the head answers the client last. The lock is held
for the whole round, so updates of one chunk are serialized and updates of different chunks run in
parallel. A write of a chunk's whole content (from offset 0, at least as long as the committed
version) is stored locally and forwarded at the same time, on the head and the middle replicas
alike: with no base to read, only the disk can fail it locally, and a replica whose disk fails it
after the successor may have taken it goes offline (see ``Replicator._update_parallel``).

Invariants that make retries and failures safe:

- A replica never replaces a pending version with different content. Before a new update of a
  chunk that still holds a pending version (left by a failed forward or a crash), the replica
  *settles* it: forwards it again as a full-chunk replace and commits it. So every pending or
  committed version ``v`` of a chunk has the same content on every replica that holds it.
- A successor answers an update of a version it already committed as a success (a retry), and
  one that skips versions with STORAGE_CHUNK_VERSION_MISMATCH, upon which the predecessor sends
  the whole chunk instead.
- Forwarding to a SYNCING successor always sends the whole chunk (it may lack the base version).

Reads (apportioned queries). A replica whose chunk has no pending version serves its committed
version. One holding a pending version asks the chain's last SERVING target which version is
committed and serves that one (it still holds both). The last SERVING target answers from its
committed version after settling any pending version it holds outside an update in flight: it
may have become the tail after the old tail committed that version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from dataclasses import dataclass

from fs3.client.routing import RoutingCache
from fs3.client.storage_client import STORAGE_SERVICE, node_address
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient
from fs3.proto import common_pb2, storage_pb2

from .chunk_engine import ChunkEngine, ChunkRead
from .chunk_meta import ChunkMeta, check_chunk_size, crc32c
from .target_map import LocalTarget, TargetMap

log = logging.getLogger(__name__)

_CHUNK_ID = struct.Struct(">QQ")
MAX_CHUNK_BYTES = 64 << 20
# Reads up to this size may be served on the event loop thread (Replicator.read_now): a metadata
# lookup (an LMDB read, which takes no lock) and a pread of at most two checksum blocks cost less
# than the thread switches and GIL hand-overs of a trip to the I/O threads.
INLINE_READ_BYTES = 64 << 10


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


class _ResultCache:
    """Results of recent client updates by (client id, channel), for exactly-once retries."""

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, int], tuple[int, int, storage_pb2.IOResult]] = OrderedDict()

    def lookup(self, tag: storage_pb2.UpdateTag) -> storage_pb2.IOResult | None:
        if not tag.client_id:
            return None
        entry = self._entries.get((tag.client_id, tag.channel))
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
        self._entries[key] = (tag.seqnum, tag.request_id, result)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


class Replicator:
    """The CRAQ protocol for the targets of one daemon.

    ``executor`` runs the engines' blocking calls (the same pool their AsyncChunkEngines use);
    ``rpc`` calls other storage daemons; ``forward_timeout_s`` bounds how long a replica retries
    forwarding an update before it fails the update (leaving it pending, to be settled later).
    """

    def __init__(
        self,
        targets: TargetMap,
        routing: RoutingCache,
        rpc: RpcClient,
        executor: Executor,
        *,
        forward_timeout_s: float = 30.0,
        rpc_timeout_s: float = 10.0,
    ) -> None:
        self.targets = targets
        self.routing = routing
        self.rpc = rpc
        self.executor = executor
        self.forward_timeout_s = forward_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.locks = ChunkLocks()
        # (target, chunk) -> the local write of a parallel update, until it is stored
        self._applying: dict[tuple[int, bytes], asyncio.Future] = {}  # type: ignore[type-arg]
        self.results = _ResultCache()

    async def _run(self, fn, *args):  # type: ignore[no-untyped-def]
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # -- chain version checks ---------------------------------------------------------------------

    async def check_chain_version(self, t: LocalTarget, chain_id: int, version: int, *, who: str) -> None:
        """The request's chain version must be the one this daemon acts on. When the sender knows a
        newer one, wait briefly for ours to catch up first."""
        chain = self.targets.chain(chain_id)
        if version > chain.version:
            self.routing.refresh_soon()
            with contextlib.suppress(FS3Error):
                await self.routing.wait_for(
                    lambda r: chain_id in r.chains and r.chains[chain_id].version >= version, 1.0
                )
            chain = self.targets.chain(chain_id)
        if version != chain.version:
            raise FS3Error(
                StatusCode.STORAGE_CHAIN_VERSION_MISMATCH,
                f"{who} sent chain {chain_id} version {version}; target {t.target_id} is at version "
                f"{chain.version}",
            )

    # -- client updates (head) --------------------------------------------------------------------

    async def client_update(
        self, req: storage_pb2.WriteReq, payload: memoryview | None
    ) -> storage_pb2.IOResult:
        """A client's update of one chunk, at the head."""
        io = req.io
        key = io.key
        t = self.targets.of_chain(key.chain_id)
        op = _client_op(io, payload)
        await self.check_chain_version(t, key.chain_id, key.chain_version, who="client")
        self.targets.check_head(t, self.targets.chain(key.chain_id))
        cached = self.results.lookup(req.tag)
        if cached is not None:
            return cached
        cid = chunk_id(key.inode_id, key.chunk_index)
        async with self.locks.hold(t.target_id, cid):
            cached = self.results.lookup(req.tag)  # the first try may have finished meanwhile
            if cached is not None:
                return cached
            chain = self.targets.chain(key.chain_id)
            if chain.version != key.chain_version:
                raise FS3Error(
                    StatusCode.STORAGE_CHAIN_VERSION_MISMATCH,
                    f"chain {key.chain_id} changed to version {chain.version} while the update waited",
                )
            self.targets.check_head(t, chain)
            result = await self._update_locked(t, cid, key.chain_id, op, None)
        self.results.store(req.tag, result)
        return result

    # -- forwarded updates (successors) -----------------------------------------------------------

    async def chain_update(
        self, req: storage_pb2.UpdateReq, payload: memoryview | None
    ) -> storage_pb2.IOResult:
        """An update forwarded by the predecessor (or sent by resync)."""
        io = req.io
        key = io.key
        t = self.targets.target(req.target_id) if req.target_id else self.targets.of_chain(key.chain_id)
        if t.chain_id != key.chain_id:
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE, f"target {t.target_id} is not in chain {key.chain_id} here"
            )
        await self.check_chain_version(t, key.chain_id, key.chain_version, who="predecessor")
        self.targets.check_replica(t)
        op = _forwarded_op(io, payload, req.syncing)
        if io.update_version < 1:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "forwarded update without an update version")
        cid = chunk_id(key.inode_id, key.chunk_index)
        eng = t.engine
        async with self.locks.hold(t.target_id, cid):
            if req.syncing and req.commit:
                # resync: the predecessor's committed chunk, installed as committed at once; only
                # a SYNCING target may be overwritten like that
                if t.public_state != common_pb2.SYNCING:
                    raise FS3Error(
                        StatusCode.STORAGE_ROUTING_STALE,
                        f"target {t.target_id} is not syncing; it takes no resync copies",
                    )
                if op.type == storage_pb2.UPDATE_REMOVE:
                    await eng.remove_range(cid, cid + b"\0")
                    return io_result(None, key.chain_version)
                assert op.data is not None
                meta = await eng.replace(
                    cid,
                    op.data,
                    chunk_size=op.chunk_size,
                    chain_ver=key.chain_version,
                    version=io.update_version,
                    commit=True,
                    checksum=op.crc,
                )
                return io_result(meta, key.chain_version)
            return await self._update_locked(t, cid, key.chain_id, op, io.update_version)

    # -- the round: apply, forward, commit --------------------------------------------------------

    async def _update_locked(
        self, t: LocalTarget, cid: bytes, chain_id: int, op: Op, version: int | None
    ) -> storage_pb2.IOResult:
        """Apply ``op`` as pending version ``version`` (``committed + 1`` on the head, when None),
        forward it, commit it. The chunk's lock is held."""
        eng = t.engine.engine
        for _ in range(3):
            chain = self.targets.chain(chain_id)
            chain_ver = chain.version
            # At the tail, apply and commit in one trip to the I/O threads.
            tail = chain.successor(t.target_id) is None
            if not tail and op.type == storage_pb2.UPDATE_WRITE and op.offset == 0:
                parallel = _parallel_version(eng.get_meta(cid), op, version)
                if parallel:
                    return await self._update_parallel(t, cid, chain_id, op, parallel, chain_ver)
            kind, meta, new = await self._run(_apply, eng, cid, op, version, chain_ver, tail)
            if kind == "settle":
                assert meta is not None
                await self._settle_locked(t, cid, chain_id, meta)
                continue
            if kind == "stale":
                return io_result(meta, chain_ver)  # a retry of an update this replica committed
            if kind == "absent":
                return io_result(None, chain_ver)  # removal of a chunk this replica does not hold
            assert new is not None
            v = new.pending_ver or new.committed_ver
            if kind == "pending":
                await self._forward(t, cid, chain_id, op, v, new)
                meta = await t.engine.commit(cid, v, chain_ver=self.targets.chain(chain_id).version)
            return io_result(meta, chain_ver) if meta is not None else _removed_result(v, chain_ver)
        raise FS3Error(StatusCode.ABORTED, f"chunk {cid.hex()} kept a pending version")

    async def _update_parallel(
        self, t: LocalTarget, cid: bytes, chain_id: int, op: Op, version: int, chain_ver: int
    ) -> storage_pb2.IOResult:
        """:meth:`_update_locked` for a write of the whole content (see :func:`_parallel_version`):
        store it here and forward it at the same time, then commit. The chunk's lock is held.

        Two things make the overlap safe. Until the local copy exists, reads of the chunk here wait
        for it (``_applying``): the tail may commit the version before this replica holds it as
        pending, and a read here must not serve the old version after the tail served the new
        one. And the local write, which needs no base, can fail only with the disk (or a bug):
        once the version may have reached the successors, a replica that failed to store it would
        hand out a version number they hold with other content, so it is taken offline instead,
        to be resynced. (A refusal of the update itself, a bad checksum say, is the same on every
        replica and fails the write only.)
        """
        key = (t.target_id, cid)
        stored = asyncio.ensure_future(self._run(_apply, t.engine.engine, cid, op, version, chain_ver, False))
        self._applying[key] = stored
        stored.add_done_callback(lambda f: self._applying.pop(key) if self._applying.get(key) is f else None)
        try:
            forwarded = await self._forward(t, cid, chain_id, op, version, None, local=stored)
        except BaseException:
            await self._local_outcome(t, cid, stored)
            raise  # as in the sequential round: the pending version is settled later
        kind, _, new = await self._local_outcome(t, cid, stored)
        assert kind == "pending" and new is not None, kind
        pending = new.pending
        if forwarded is not None and pending is not None and forwarded.committed_version == version:
            _check_same(chain_id, cid, version, pending.crc, forwarded.crc32c)
        meta = await t.engine.commit(cid, version, chain_ver=self.targets.chain(chain_id).version)
        return io_result(meta, chain_ver)

    async def _local_outcome(self, t: LocalTarget, cid: bytes, stored: asyncio.Future) -> tuple:  # type: ignore[type-arg]
        """The result of the local half of a parallel update; if it failed, the target goes
        offline (see :meth:`_update_parallel`) and the error is raised."""
        try:
            return await asyncio.shield(stored)
        except asyncio.CancelledError:
            if not stored.done():
                raise
            error: BaseException = FS3Error(StatusCode.CANCELLED, "local write cancelled")
        except Exception as e:
            error = e
        if isinstance(error, FS3Error) and error.code in _REFUSED_EVERYWHERE:
            raise error  # the successors refuse the same bytes the same way: none of them took it
        if not isinstance(error, FS3Error):
            log.error(
                "parallel update failed here target_id=%d chunk=%s", t.target_id, cid.hex(), exc_info=error
            )
            error = FS3Error(StatusCode.STORAGE_IO_ERROR, f"storing chunk {cid.hex()} failed: {error!r}")
        self.targets.fail(
            t.target_id,
            FS3Error(
                error.code,
                f"could not store chunk {cid.hex()}, which its successor may hold: {error.message}",
            ),
        )
        raise error

    async def _settle_locked(
        self, t: LocalTarget, cid: bytes, chain_id: int, meta: ChunkMeta
    ) -> ChunkMeta | None:
        """Finish a pending version no update is carrying any more: forward it as a whole-chunk
        replace (or removal) and commit it. The chunk's lock is held."""
        pending = meta.pending
        assert pending is not None
        log.info(
            "settling pending version target_id=%d chunk=%s version=%d",
            t.target_id,
            cid.hex(),
            pending.version,
        )
        op = Op(storage_pb2.UPDATE_REMOVE if pending.removal else storage_pb2.UPDATE_REPLACE, meta.chunk_size)
        await self._forward(t, cid, chain_id, op, pending.version, meta, full=True)
        return await t.engine.commit(cid, pending.version, chain_ver=self.targets.chain(chain_id).version)

    async def _forward(
        self,
        t: LocalTarget,
        cid: bytes,
        chain_id: int,
        op: Op,
        version: int,
        meta: ChunkMeta | None,
        *,
        full: bool = False,
        local: asyncio.Future | None = None,  # type: ignore[type-arg]
    ) -> storage_pb2.IOResult | None:
        """Send pending ``version`` to the successor, retrying (with the newest routing each time)
        until it answers or ``forward_timeout_s`` passes. Returns None at the tail. ``local``, in
        a parallel update, is the local write still in progress: sending the whole chunk waits for
        it. ``meta`` (the local metadata, when known) checks the successor's checksum."""
        deadline = time.monotonic() + self.forward_timeout_s
        backoff = 0.02
        whole: tuple[bytes, int] | None = None
        while True:
            routing = self.targets.routing
            chain = self.targets.chain(chain_id)
            self.targets.check_replica(t)
            succ = chain.successor(t.target_id)
            if succ is None:
                return None
            syncing = succ.public_state == common_pb2.SYNCING
            req = storage_pb2.UpdateReq(target_id=succ.target_id, syncing=syncing)
            io = req.io
            io.key.chain_id = chain_id
            io.key.chain_version = chain.version
            io.key.inode_id, io.key.chunk_index = split_chunk_id(cid)
            io.chunk_size = op.chunk_size
            io.update_version = version
            payload: bytes | memoryview | None = None
            if op.type == storage_pb2.UPDATE_REMOVE:
                io.type = storage_pb2.UPDATE_REMOVE
            elif full or syncing or op.type == storage_pb2.UPDATE_REPLACE:
                if whole is None:
                    if local is not None:
                        await asyncio.shield(local)
                    r = await t.engine.read(cid, 0, None, version=version)
                    whole = (r.data, r.chunk_crc)
                io.type = storage_pb2.UPDATE_REPLACE
                payload, io.length, io.crc32c = whole[0], len(whole[0]), whole[1]
            elif op.type == storage_pb2.UPDATE_WRITE:
                io.type = storage_pb2.UPDATE_WRITE
                io.offset, io.length = op.offset, op.length
                if op.crc is not None:
                    io.crc32c = op.crc
                payload = op.data
            else:
                io.type = op.type
                io.length = op.length
            try:
                address = node_address(routing, succ.target_id, backend=True)
                remaining = deadline - time.monotonic()
                rsp, _ = await self.rpc.call(
                    address,
                    STORAGE_SERVICE["Update"],
                    req,
                    payload=payload,
                    timeout=max(0.01, min(self.rpc_timeout_s, remaining)),
                )
            except FS3Error as e:
                if e.code == StatusCode.STORAGE_CHUNK_VERSION_MISMATCH and not full:
                    full = True  # the successor missed updates: send it the whole chunk
                    continue
                if e.code == StatusCode.STORAGE_CHECKSUM_MISMATCH and not full:
                    # The successor's copy (the base an update is applied to) is corrupt or missing,
                    # or the bytes were damaged on the way: a whole-chunk replace needs no base and
                    # repairs that replica, where failing would fail the client's write for it.
                    log.warning(
                        "forward checksum error, sending the whole chunk target_id=%d succ=%d chunk=%s "
                        "error=%s",
                        t.target_id,
                        succ.target_id,
                        cid.hex(),
                        e,
                    )
                    full = True
                    continue
                if e.code in (StatusCode.INVALID_ARGUMENT, StatusCode.STORAGE_CHECKSUM_MISMATCH):
                    raise
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise FS3Error(
                        StatusCode.UNAVAILABLE,
                        f"forwarding chunk {cid.hex()} v{version} of chain {chain_id} to target "
                        f"{succ.target_id} failed: {e}",
                    ) from None
                log.debug("forward retry target_id=%d succ=%d error=%s", t.target_id, succ.target_id, e)
                self.routing.refresh_soon()
                await asyncio.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, 0.5)
                continue
            if meta is not None and op.type != storage_pb2.UPDATE_REMOVE and rsp.committed_version == version:
                if meta.pending is not None and meta.pending.version == version:
                    _check_same(chain_id, cid, version, meta.pending.crc, rsp.crc32c)
            return rsp

    # -- reads ------------------------------------------------------------------------------------

    def read_now(self, rio: storage_pb2.ReadIO) -> tuple[bytes, int, int] | None:
        """A small read served right here on the event loop thread, without waiting: like
        :meth:`read`, or None when it must take that way instead (larger than
        ``INLINE_READ_BYTES``, or the chunk has an update pending)."""
        if rio.length > INLINE_READ_BYTES:
            return None
        t, cid = self._read_target(rio)
        if (t.target_id, cid) in self._applying:
            return None
        outcome = _read_or_meta(t.engine.engine, cid, rio.offset, rio.length)
        return outcome if isinstance(outcome, tuple) else None

    async def read(self, rio: storage_pb2.ReadIO) -> tuple[bytes, int, int]:
        """One read of a batch: ``(data, crc32c of data, committed version served)``. Its first
        step is a trip to the I/O threads, so a caller outside any task (an inline RPC handler)
        has become a task before anything else happens."""
        t, cid = self._read_target(rio)
        key = rio.key
        eng = t.engine.engine
        for _ in range(8):
            applying = self._applying.get((t.target_id, cid))
            if applying is not None:
                # a parallel update is storing a version the tail may have committed already:
                # once it is stored here (pending), the usual rule below serves the right one
                with contextlib.suppress(Exception):
                    await asyncio.shield(applying)
            outcome = await self._run(_read_or_meta, eng, cid, rio.offset, rio.length)
            if isinstance(outcome, tuple):
                return outcome
            meta = outcome
            committed = await self._query_committed(t, key.chain_id, cid)
            if committed == 0 or (
                meta.pending is not None and meta.pending.removal and committed == meta.pending_ver
            ):
                raise FS3Error(StatusCode.STORAGE_CHUNK_NOT_FOUND, f"chunk {cid.hex()} does not exist")
            try:
                r = await self._run(_read_version, eng, cid, rio.offset, rio.length, committed)
            except FS3Error as e:
                if e.code == StatusCode.STORAGE_CHUNK_VERSION_MISMATCH:
                    continue  # committed or aborted meanwhile: look again
                raise
            return r
        raise FS3Error(StatusCode.ABORTED, f"chunk {cid.hex()} kept changing during a read")

    def _read_target(self, rio: storage_pb2.ReadIO) -> tuple[LocalTarget, bytes]:
        key = rio.key
        t = self.targets.of_chain(key.chain_id)
        self.targets.check_readable(t)
        if rio.offset + rio.length > MAX_CHUNK_BYTES:
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT, f"read of {rio.offset}+{rio.length} is past any chunk"
            )
        return t, chunk_id(key.inode_id, key.chunk_index)

    async def _query_committed(self, t: LocalTarget, chain_id: int, cid: bytes) -> int:
        chain = self.targets.chain(chain_id)
        serving = chain.serving
        if not serving:
            raise FS3Error(StatusCode.STORAGE_TARGET_NOT_SERVING, f"chain {chain_id} has no serving target")
        tail = serving[-1]
        if tail == t.target_id:
            return await self.committed_at_tail(t, chain_id, cid)
        req = storage_pb2.QueryCommittedReq()
        req.key.chain_id = chain_id
        req.key.chain_version = chain.version
        req.key.inode_id, req.key.chunk_index = split_chunk_id(cid)
        rsp, _ = await self.rpc.call(
            node_address(self.targets.routing, tail, backend=True),
            STORAGE_SERVICE["QueryCommitted"],
            req,
            timeout=self.rpc_timeout_s,
        )
        return rsp.committed_version if rsp.found else 0

    async def committed_at_tail(self, t: LocalTarget, chain_id: int, cid: bytes) -> int:
        """The committed version of a chunk at the chain's last SERVING target, after settling a
        pending version that no update in flight carries."""
        async with self.locks.hold(t.target_id, cid):
            meta = await t.engine.get_meta(cid)
            if meta is not None and meta.pending is not None:
                meta = await self._settle_locked(t, cid, chain_id, meta)
            return meta.committed_ver if meta is not None else 0

    async def query_committed(self, req: storage_pb2.QueryCommittedReq) -> storage_pb2.QueryCommittedRsp:
        key = req.key
        t = self.targets.of_chain(key.chain_id)
        self.targets.check_readable(t)
        chain = self.targets.chain(key.chain_id)
        if not chain.serving or chain.serving[-1] != t.target_id:
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE,
                f"target {t.target_id} is not the last serving target of chain {key.chain_id}",
            )
        v = await self.committed_at_tail(t, key.chain_id, chunk_id(key.inode_id, key.chunk_index))
        return storage_pb2.QueryCommittedRsp(committed_version=v, found=v > 0)

    # -- ranges -----------------------------------------------------------------------------------

    async def remove_chunks(self, req: storage_pb2.RemoveChunksReq) -> int:
        """Remove a file's chunks in an index range, one chain round per chunk, at the head."""
        t = self.targets.of_chain(req.chain_id)
        await self.check_chain_version(t, req.chain_id, req.chain_version, who="client")
        self.targets.check_head(t, self.targets.chain(req.chain_id))
        metas = await t.engine.dump_metadata(*file_range(req.inode_id, req.begin_index, req.end_index))
        return await self._remove_all(t, req.chain_id, metas)

    async def _remove_all(self, t: LocalTarget, chain_id: int, metas: list[ChunkMeta]) -> int:
        sem = asyncio.Semaphore(16)

        async def one(meta: ChunkMeta) -> int:
            async with sem, self.locks.hold(t.target_id, meta.chunk_id):
                r = await self._update_locked(
                    t, meta.chunk_id, chain_id, Op(storage_pb2.UPDATE_REMOVE, meta.chunk_size), None
                )
                return 1 if r.update_version else 0

        return sum(await asyncio.gather(*(one(m) for m in metas)))

    async def truncate_chunks(self, req: storage_pb2.TruncateChunksReq) -> storage_pb2.TruncateChunksRsp:
        """Fit a file's chunks on this chain to a new length, at the head."""
        check_chunk_size(req.chunk_size)
        t = self.targets.of_chain(req.chain_id)
        await self.check_chain_version(t, req.chain_id, req.chain_version, who="client")
        self.targets.check_head(t, self.targets.chain(req.chain_id))
        last_index, rest = divmod(req.length, req.chunk_size)
        first_gone = last_index + 1 if rest else last_index
        metas = await t.engine.dump_metadata(*file_range(req.inode_id, first_gone))
        removed = await self._remove_all(t, req.chain_id, metas)
        truncated = False
        if rest:
            cid = chunk_id(req.inode_id, last_index)
            async with self.locks.hold(t.target_id, cid):
                meta = await t.engine.get_meta(cid)
                if meta is not None and meta.committed is not None:
                    if meta.chunk_size != req.chunk_size:
                        raise FS3Error(
                            StatusCode.INVALID_ARGUMENT,
                            f"chunk {cid.hex()} has chunk size {meta.chunk_size}, not {req.chunk_size}",
                        )
                    if meta.committed.length != rest:
                        await self._update_locked(
                            t,
                            cid,
                            req.chain_id,
                            Op(storage_pb2.UPDATE_TRUNCATE, req.chunk_size, length=rest),
                            None,
                        )
                    truncated = True
        return storage_pb2.TruncateChunksRsp(removed=removed, truncated=truncated)


def _apply(
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
_REFUSED_EVERYWHERE = frozenset(
    {StatusCode.STORAGE_CHECKSUM_MISMATCH, StatusCode.INVALID_ARGUMENT, StatusCode.STORAGE_CHUNK_TOO_LARGE}
)


def _parallel_version(meta: ChunkMeta | None, op: Op, version: int | None) -> int:
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


def _check_same(chain_id: int, cid: bytes, version: int, mine: int, successor: int) -> None:
    if mine != successor:
        log.error(
            "replica diverged chain_id=%d chunk=%s version=%d crc=%08x successor_crc=%08x",
            chain_id,
            cid.hex(),
            version,
            mine,
            successor,
        )


def _removed_result(version: int, chain_ver: int) -> storage_pb2.IOResult:
    return storage_pb2.IOResult(
        committed_version=version, update_version=version, commit_chain_version=chain_ver
    )


def _client_op(io: storage_pb2.UpdateIO, payload: memoryview | None) -> Op:
    """Validate a client's update before anything is locked or touched."""
    if io.update_version != 0:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, "a client update must not carry an update version")
    if io.type == storage_pb2.UPDATE_REMOVE:
        return Op(io.type, 0)
    check_chunk_size(io.chunk_size)
    if io.type == storage_pb2.UPDATE_WRITE:
        data = _payload_slice(io, payload)
        if io.length == 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "empty write")
        if io.offset + io.length > io.chunk_size:
            raise FS3Error(
                StatusCode.STORAGE_CHUNK_TOO_LARGE,
                f"write of {io.length} bytes at {io.offset} exceeds the chunk size {io.chunk_size}",
            )
        return Op(io.type, io.chunk_size, io.offset, io.length, data, io.crc32c)
    if io.type == storage_pb2.UPDATE_TRUNCATE:
        if io.length > io.chunk_size:
            raise FS3Error(
                StatusCode.STORAGE_CHUNK_TOO_LARGE,
                f"truncate to {io.length} exceeds the chunk size {io.chunk_size}",
            )
        return Op(io.type, io.chunk_size, length=io.length)
    raise FS3Error(StatusCode.INVALID_ARGUMENT, f"clients may not send update type {io.type}")


def _forwarded_op(io: storage_pb2.UpdateIO, payload: memoryview | None, syncing: bool) -> Op:
    if io.type == storage_pb2.UPDATE_REMOVE:
        return Op(io.type, io.chunk_size or 0)
    check_chunk_size(io.chunk_size)
    if io.type in (storage_pb2.UPDATE_WRITE, storage_pb2.UPDATE_REPLACE):
        data = _payload_slice(io, payload)
        if io.offset + io.length > io.chunk_size:
            raise FS3Error(StatusCode.STORAGE_CHUNK_TOO_LARGE, "update exceeds the chunk size")
        return Op(io.type, io.chunk_size, io.offset, io.length, data, io.crc32c)
    if io.type == storage_pb2.UPDATE_TRUNCATE:
        return Op(io.type, io.chunk_size, length=io.length)
    raise FS3Error(StatusCode.INVALID_ARGUMENT, f"unknown update type {io.type}")


def _payload_slice(io: storage_pb2.UpdateIO, payload: memoryview | None) -> memoryview:
    size = 0 if payload is None else payload.nbytes
    if io.payload_offset + io.length > size:
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"update names payload bytes {io.payload_offset}..{io.payload_offset + io.length} of {size}",
        )
    assert payload is not None
    return payload[io.payload_offset : io.payload_offset + io.length]


def _read_or_meta(
    eng: ChunkEngine, cid: bytes, offset: int, length: int
) -> tuple[bytes, int, int] | ChunkMeta:
    """In an I/O thread: the committed bytes if no update is pending, else the metadata (the
    caller must ask the tail which version to serve)."""
    meta = eng.get_meta(cid)
    if meta is None or (meta.pending is None and meta.committed is None):
        raise FS3Error(StatusCode.STORAGE_CHUNK_NOT_FOUND, f"chunk {cid.hex()} does not exist")
    if meta.pending is not None:
        return meta
    # whatever is committed by the time of the read: a version committed here is committed at the
    # tail, and one that started after this read began need not be seen
    r = eng.read(cid, offset, length)
    return r.data, _data_crc(offset, r), r.version


def _read_version(
    eng: ChunkEngine, cid: bytes, offset: int, length: int, version: int
) -> tuple[bytes, int, int]:
    r = eng.read(cid, offset, length, version=version)
    return r.data, _data_crc(offset, r), r.version


def _data_crc(offset: int, r: ChunkRead) -> int:
    """CRC32C of the bytes read: the version's own (which the engine checked them against) when
    they are the whole chunk, saving a pass over a large read."""
    if offset == 0 and len(r.data) == r.chunk_length:
        return r.chunk_crc
    return crc32c(r.data)
