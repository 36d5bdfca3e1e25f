"""CRAQ on one storage daemon: chunk updates along the chain, commits back up it, and reads.

Write path (DESIGN §6, reference notes §3.2). The head takes the chunk's lock, checks the chain
version, stores the update as pending version ``committed + 1`` and forwards it to its successor
with that version; each replica does the same and the tail commits first; each predecessor
commits once its successor has answered, and the head answers the client last. The lock is held
for the whole round, so updates of one chunk are serialized and updates of different chunks run in
parallel. A write of a chunk's whole content (from offset 0, at least as long as the committed
version) is stored locally and forwarded at the same time, on the head and the middle replicas
alike: with no base to read, only the disk can fail it locally, and a replica whose disk fails it
after the successor may have taken it goes offline (see ``Replicator._update_parallel``). A
replica whose process is out of file descriptors (EMFILE) for an update it applies in turn leaves
its chain too, to be resynced (``Replicator._apply``): until descriptors are back it could apply
none, and its predecessor would retry each for ``forward_timeout_s``.

Invariants that make retries and failures safe:

- A replica never replaces a pending version with different content. Before a new update of a
  chunk that still holds a pending version (left by a failed forward or a crash), the replica
  *settles* it: forwards it again as a full-chunk replace and commits it. So every pending or
  committed version ``v`` of a chunk has the same content on every replica that holds it.
- A successor answers an update of a version it already committed as a success (a retry), and
  one that skips versions with STORAGE_CHUNK_VERSION_MISMATCH, upon which the predecessor sends
  the whole chunk instead.
- Forwarding to a SYNCING successor always sends the whole chunk (it may lack the base version).
  A SYNCING successor that keeps failing an update for ``SYNCING_FORWARD_GRACE_S`` (it cannot
  accept connections, out of descriptors; a link down between the two) is left behind: the
  update commits here as at the tail, and the resync of that successor, which this replica runs
  (the last SERVING one), starts over instead of ending (``Replicator.forward_skips``). Else every
  write of the chain waited ``forward_timeout_s`` on a replica that serves nothing yet. Never
  after that resync has sent its SyncDone at this chain version: the successor may then become
  SERVING with what it holds (``Replicator.sync_done``).
- A replica takes itself for the tail (committing without forwarding) only while it holds the
  place the update found it in: a forwarded update is checked against the chain version again
  once it holds the chunk's lock, and a replica that mgmtd took out of the chain during a round
  fails the update (``Replicator._check_round``). Else it would commit, and its predecessors
  acknowledge, a version that no replica after its old place holds.

Reads (apportioned queries). A replica whose chunk has no pending version serves its committed
version. One holding a pending version asks the chain's last SERVING target which version is
committed and serves that one (it still holds both). The last SERVING target answers from its
committed version after settling any pending version it holds outside an update in flight: it
may have become the tail after the old tail committed that version.

What a replica does to its own chunks (validating an update into an ``Op``, applying it in an I/O
thread, reading a version) is in :mod:`fs3.storage.chain_ops`; this module moves updates along the
chain and answers the protocol's questions.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

from fs3.background import cancel_and_wait
from fs3.client.routing import ChainView, RoutingCache
from fs3.client.storage_client import STORAGE_SERVICE, node_address
from fs3.errors import FS3Error, StatusCode
from fs3.log import Repeats
from fs3.net import RpcClient
from fs3.proto import common_pb2, storage_pb2

from .aio import AioRead, AioReader
from .chain_ops import (
    REFUSED_EVERYWHERE,
    ChunkLocks,
    Op,
    ResultCache,
    apply_op,
    check_same,
    chunk_id,
    client_op,
    data_crc,
    file_range,
    forwarded_op,
    io_result,
    parallel_version,
    read_meta_or_data,
    read_or_meta,
    read_version,
    removed_result,
    split_chunk_id,
)
from .chunk_engine import DamagedCopy
from .chunk_files import DirectRead, WouldBlock
from .chunk_meta import ChunkMeta, check_chunk_size, crc32c
from .target_map import UPTODATE, LocalTarget, TargetMap

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_CHUNK_BYTES = 64 << 20
# Reads up to this size may be served on the event loop thread (Replicator.read_now): a metadata
# lookup (an LMDB read, which takes no lock) and a pread of at most two checksum blocks cost less
# than the thread switches and GIL hand-overs of a trip to the I/O threads.
INLINE_READ_BYTES = 64 << 10


class AioPlan:
    """A read :meth:`Replicator.read_many` does through AIO: the target, and the O_DIRECT read
    (whose file is open)."""

    __slots__ = ("target", "read", "_open")

    def __init__(self, target: LocalTarget, read: DirectRead) -> None:
        self.target = target
        self.read = read
        self._open = True

    def close(self) -> None:
        """Close the read's files (once)."""
        if self._open:
            self._open = False
            for fd in self.read.fds:
                os.close(fd)


def _local_error(stored: asyncio.Future) -> BaseException | None:  # type: ignore[type-arg]
    """The error of a parallel update's finished local half, if it failed (cancelled counts)."""
    if stored.cancelled():
        return FS3Error(StatusCode.CANCELLED, "local write cancelled")
    return stored.exception()


# Tries of a client update at a head whose copy of the chunk is damaged, each after a repair
# (Replicator.client_update)
_DAMAGED_TRIES = 3
# Repairs of damaged copies that failed reads start at once (Replicator.repair_soon): at most this
# many (a disk whose every chunk fails would otherwise start one per chunk read)
MAX_READ_REPAIRS = 8


class Replicator:
    """The CRAQ protocol for the targets of one daemon.

    Each target's blocking engine calls run in its AsyncChunkEngine's threads; ``rpc`` calls
    other storage daemons; ``forward_timeout_s`` bounds how long a replica retries
    forwarding an update before it fails the update (leaving it pending, to be settled later).
    """

    def __init__(
        self,
        targets: TargetMap,
        routing: RoutingCache,
        rpc: RpcClient,
        *,
        forward_timeout_s: float = 30.0,
        rpc_timeout_s: float = 10.0,
        aio: AioReader | None = None,
    ) -> None:
        self.targets = targets
        self.routing = routing
        self.rpc = rpc
        self.forward_timeout_s = forward_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.locks = ChunkLocks()
        # (target, chunk) -> the local write of a parallel update, until it is stored
        self._applying: dict[tuple[int, bytes], asyncio.Future] = {}  # type: ignore[type-arg]
        self.results = ResultCache()
        # The tags of client updates whose round failed with their version left pending here,
        # (target id, chunk) -> (version, tag): whoever settles that version records its result
        # under the tag, so the client's retry is answered, not applied again over later writes.
        self._pending_tags: dict[tuple[int, bytes], tuple[int, storage_pb2.UpdateTag]] = {}
        # successors whose failing forwards were warned about lately (see FORWARD_WARN_AFTER_S)
        self._forward_warned = Repeats(FORWARD_WARN_EVERY_S)
        # Native AIO for the cold reads of multi-read requests, and of a slow disk (read_many)
        self.aio = aio
        # (target, chunk) -> the repair a failed read started (see repair_soon)
        self._repairs: dict[tuple[int, bytes], asyncio.Task[None]] = {}
        self._repairs_stopped = False
        # (chain, SYNCING successor) -> updates not forwarded to it (see SYNCING_FORWARD_GRACE_S),
        # and the chain version at which its resync sent SyncDone (none skipped from then on)
        self._skips: dict[tuple[int, int], int] = {}
        self._sync_done: dict[tuple[int, int], int] = {}
        self._skip_logged: dict[tuple[int, int], int] = {}  # chain version of the last warning

    def forward_skips(self, chain_id: int, succ_id: int) -> int:
        """How many updates this daemon did not forward to ``succ_id``, SYNCING in ``chain_id``,
        so far: a resync of it that saw this number change has not copied everything."""
        return self._skips.get((chain_id, succ_id), 0)

    def sync_done(self, chain_id: int, succ_id: int, chain_version: int) -> None:
        """The resync of ``succ_id`` is sending SyncDone at ``chain_version``: every update is
        forwarded to it from now on (at that chain version), however long it takes."""
        self._sync_done[(chain_id, succ_id)] = chain_version

    def _skip_syncing(
        self, t: LocalTarget, chain: ChainView, succ_id: int, cid: bytes, version: int, error: FS3Error
    ) -> bool:
        """Leave SYNCING ``succ_id`` behind for this update (see the module docstring) where that
        is safe: ``t`` is the chain's last SERVING target, so the resync of ``succ_id`` is this
        daemon's; it has not sent SyncDone at this chain version; and mgmtd last heard the
        successor report ONLINE (not UPTODATE, which mgmtd makes SERVING: a SyncDone at an
        earlier version, the chain changed by an admin command since)."""
        key = (chain.chain_id, succ_id)
        info = self.targets.routing.targets.get(succ_id)
        if (
            t.local_state != UPTODATE
            or chain.state_of(t.target_id) != common_pb2.SERVING
            or self._sync_done.get(key) == chain.version
            or info is None
            or info.local_state != common_pb2.ONLINE
        ):
            return False
        self._skips[key] = self._skips.get(key, 0) + 1
        log.log(
            logging.DEBUG if self._skip_logged.get(key) == chain.version else logging.WARNING,
            "update not forwarded to a SYNCING target, its resync starts over target_id=%d succ=%d "
            "chunk=%s version=%d chain_version=%d error=%s",
            t.target_id,
            succ_id,
            cid.hex(),
            version,
            chain.version,
            error,
        )
        self._skip_logged[key] = chain.version
        return True

    async def _run(self, t: LocalTarget, fn, *args):  # type: ignore[no-untyped-def]
        """``fn(*args)`` in the I/O threads of ``t`` (each target has its own: a disk that hangs
        holds only its own target's threads)."""
        return await asyncio.get_running_loop().run_in_executor(t.engine.executor, fn, *args)

    # -- damaged copies ---------------------------------------------------------------------------

    async def fetch_copy(self, t: LocalTarget, cid: bytes, meta: ChunkMeta) -> bytes | None:
        """The committed version ``meta`` names, read from another SERVING replica of the chain and
        checked against ``meta`` (version, length, CRC32C); None where none has it. Not under the
        chunk's lock: a replica asked for its copy may ask this one which version is committed."""
        v = meta.committed
        assert v is not None
        chain = self.targets.chain(t.chain_id)
        for other in chain.targets:
            if other.target_id == t.target_id or other.public_state != common_pb2.SERVING:
                continue
            req = storage_pb2.BatchReadReq(for_repair=True)
            io = req.ios.add(offset=0, length=v.length)
            io.key.chain_id = t.chain_id
            io.key.chain_version = chain.version
            io.key.inode_id, io.key.chunk_index = split_chunk_id(cid)
            try:
                rsp, payload = await self.rpc.call(
                    node_address(self.targets.routing, other.target_id, backend=True),
                    STORAGE_SERVICE["BatchRead"],
                    req,
                    timeout=self.rpc_timeout_s,
                )
            except FS3Error as e:
                log.warning(
                    "could not ask for a copy of a damaged chunk target_id=%d chunk=%s error=%s",
                    other.target_id,
                    cid.hex(),
                    e,
                )
                continue
            res = rsp.results[0] if len(rsp.results) == 1 else None
            if res is None or res.status.code != StatusCode.OK:
                continue
            data = bytes(payload[res.payload_offset : res.payload_offset + res.length]) if payload else b""
            if res.committed_version == v.version and len(data) == v.length and crc32c(data) == v.crc:
                log.info(
                    "found a good copy of a damaged chunk chunk=%s version=%d target_id=%d",
                    cid.hex(),
                    v.version,
                    other.target_id,
                )
                return data
        return None

    async def repair_copy(
        self, t: LocalTarget, cid: bytes, meta: ChunkMeta, data: bytes, *, why: str
    ) -> bool:
        """Replace this target's unreadable copy of the committed version ``meta`` names with
        ``data`` (checked against it already), unless a pending version would be dropped with it
        (the chain settles that one). The chunk's lock is held. A failure only leaves it unreadable.
        Whether it was replaced."""
        v = meta.committed
        if v is None or meta.pending is not None:
            return False
        try:
            await t.engine.replace(
                cid,
                data,
                chunk_size=meta.chunk_size,
                chain_ver=v.chain_ver,
                version=v.version,
                commit=True,
                checksum=v.crc,
            )
        except FS3Error as e:
            log.warning(
                "could not repair a damaged chunk (%s) target_id=%d chunk=%s error=%s",
                why,
                t.target_id,
                cid.hex(),
                e,
            )
            return False
        log.warning(
            "repaired a damaged chunk from another replica (%s) target_id=%d chunk=%s version=%d",
            why,
            t.target_id,
            cid.hex(),
            v.version,
        )
        return True

    async def repair_damaged(self, t: LocalTarget, cid: bytes, version: int, *, why: str) -> bool:
        """Replace this target's unreadable copy of committed version ``version`` of chunk ``cid``
        with another SERVING replica's (see :meth:`fetch_copy`), for an update that must build on it
        or a read that failed on it. Not under the chunk's lock. Whether the copy here was
        replaced; not where the chunk has moved on meanwhile, has a pending version, or no other
        replica has a good copy."""
        meta = await t.engine.get_meta(cid)
        if (
            meta is None
            or meta.committed is None
            or meta.committed.lost  # no replica had it: nothing to ask for
            or meta.committed_ver != version
            or meta.pending is not None
        ):
            return False
        data = await self.fetch_copy(t, cid, meta)
        if data is None:
            return False
        async with self.locks.hold(t.target_id, cid):
            if await t.engine.get_meta(cid) != meta:
                return False  # an update or another repair changed it meanwhile
            return await self.repair_copy(t, cid, meta, data, why=why)

    def repair_soon(self, t: LocalTarget, cid: bytes) -> bool:
        """A read found this target's copy of chunk ``cid`` damaged (the reader was answered
        STORAGE_CHECKSUM_MISMATCH and reads another replica): repair it from another replica in
        the background, one repair per chunk at a time, at most MAX_READ_REPAIRS at once. Whether
        a repair started."""
        key = (t.target_id, cid)
        if self._repairs_stopped or key in self._repairs or len(self._repairs) >= MAX_READ_REPAIRS:
            return False
        try:
            meta = t.engine.engine.get_meta(cid)  # (LMDB, as the reads on the loop)
        except FS3Error:  # the target failed or closed meanwhile: nothing to repair here
            return False
        v = meta.committed if meta is not None else None
        # a version the chain lost has no good copy anywhere; a pending one is the chain's to settle
        if v is None or v.lost or meta.pending is not None:  # type: ignore[union-attr]
            return False
        task = asyncio.get_running_loop().create_task(
            self._read_repair(t, cid, v.version), name="fs3-read-repair"
        )
        self._repairs[key] = task
        task.add_done_callback(lambda _: self._repairs.pop(key, None))
        return True

    async def _read_repair(self, t: LocalTarget, cid: bytes, version: int) -> None:
        try:
            await self.repair_damaged(t, cid, version, why="a read failed on it")
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a repair that fails leaves the copy as it was
            log.exception("read repair failed target_id=%d chunk=%s", t.target_id, cid.hex())

    async def stop_repairs(self) -> None:
        """Cancel the repairs that failed reads started, and start no more (at the daemon's stop,
        once its servers have stopped)."""
        self._repairs_stopped = True
        for task in list(self._repairs.values()):
            await cancel_and_wait(task)  # (_read_repair logs its own errors)

    async def _repairing(
        self, t: LocalTarget, cid: bytes, attempt: Callable[[], Awaitable[T]], *, why: str
    ) -> T:
        """``attempt()``: an update or a truncate at the head, taking the chunk's lock. Where it
        finds this replica's copy of the chunk, which it builds on, damaged (DamagedCopy), the copy
        is repaired from another replica (the successors' are repaired by a whole-chunk forward,
        see _forward) outside the lock, and it runs again, _DAMAGED_TRIES times in all. An update
        of the same chunk waiting meanwhile may have repaired it first (this repair then finds the
        chunk changed and does nothing): the next try tells."""
        tries = 0
        while True:
            tries += 1
            try:
                return await attempt()
            except DamagedCopy as e:
                if tries == _DAMAGED_TRIES:
                    raise
                damaged = e.version
            await self.repair_damaged(t, cid, damaged, why=why)

    # -- chain version checks ---------------------------------------------------------------------

    async def local_target(self, chain_id: int, version: int, *, who: str) -> LocalTarget:
        """This daemon's target of ``chain_id``, once the chain version ``who`` sent checks out
        (see :meth:`check_chain_version`)."""
        await self._catch_up(chain_id, version)
        t = self.targets.of_chain(chain_id)
        await self.check_chain_version(t, chain_id, version, who=who)
        return t

    async def check_chain_version(self, t: LocalTarget, chain_id: int, version: int, *, who: str) -> None:
        """The request's chain version must be the one this daemon acts on (after
        :meth:`_catch_up` with the sender's routing)."""
        await self._catch_up(chain_id, version)
        chain = self.targets.chain(chain_id)
        if version != chain.version:
            raise FS3Error(
                StatusCode.STORAGE_CHAIN_VERSION_MISMATCH,
                f"{who} sent chain {chain_id} version {version}; target {t.target_id} is at version "
                f"{chain.version}",
            )

    async def _catch_up(self, chain_id: int, version: int) -> None:
        """A sender may know a newer routing than this daemon's: a newer version of the chain, or
        the chain itself (a daemon restarted moments ago fetches routing after it starts
        listening). Then refresh and wait briefly for ours to catch up."""
        chain = self.targets.routing.chains.get(chain_id)
        if chain is not None and chain.version >= version:
            return
        self.routing.refresh_soon()
        with contextlib.suppress(FS3Error):
            await self.routing.wait_for(
                lambda r: chain_id in r.chains and r.chains[chain_id].version >= version, 1.0
            )

    # -- client updates (head) --------------------------------------------------------------------

    async def client_update(
        self, req: storage_pb2.WriteReq, payload: memoryview | None
    ) -> storage_pb2.IOResult:
        """A client's update of one chunk, at the head."""
        io = req.io
        key = io.key
        op = client_op(io, payload)
        t = await self.local_target(key.chain_id, key.chain_version, who="client")
        self.targets.check_head(t, self.targets.chain(key.chain_id))
        cached = self.results.lookup(req.tag)
        if cached is not None:
            return cached
        cid = chunk_id(key.inode_id, key.chunk_index)

        async def attempt() -> tuple[storage_pb2.IOResult, bool]:
            async with self.locks.hold(t.target_id, cid):
                cached = self.results.lookup(req.tag)  # the first try may have finished meanwhile
                if cached is not None:
                    return cached, False
                chain = self.targets.chain(key.chain_id)
                if chain.version != key.chain_version:
                    raise FS3Error(
                        StatusCode.STORAGE_CHAIN_VERSION_MISMATCH,
                        f"chain {key.chain_id} changed to version {chain.version} while the update waited",
                    )
                self.targets.check_head(t, chain)
                _check_room(t, op)  # after the retry cache: a retry of a done write is answered
                return await self._update_locked(t, cid, key.chain_id, op, None, tag=req.tag), True

        result, fresh = await self._repairing(t, cid, attempt, why="an update builds on it")
        if fresh:
            self.results.store(req.tag, result)
        return result

    # -- forwarded updates (successors) -----------------------------------------------------------

    async def chain_update(
        self,
        req: storage_pb2.UpdateReq,
        payload: memoryview | None,
        deadline: float | None = None,
        caller_gone: Callable[[], bool] | None = None,
    ) -> storage_pb2.IOResult:
        """An update forwarded by the predecessor (or sent by resync); ``deadline`` (event loop
        time), the predecessor's, past which it has given up on this try, as it has once
        ``caller_gone`` (its connection ended)."""
        io = req.io
        key = io.key
        t = self.targets.target(req.target_id) if req.target_id else self.targets.of_chain(key.chain_id)
        if t.chain_id != key.chain_id:
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE, f"target {t.target_id} is not in chain {key.chain_id} here"
            )
        await self.check_chain_version(t, key.chain_id, key.chain_version, who="predecessor")
        self.targets.check_replica(t)
        if req.lost and not (req.syncing and req.commit):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "only a resync copy of a chunk may say it was lost")
        op = forwarded_op(io, payload, req.syncing, req.lost)
        if io.update_version < 1:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "forwarded update without an update version")
        cid = chunk_id(key.inode_id, key.chunk_index)
        return await self._chain_update_locked(t, req, op, cid, deadline, caller_gone)

    @contextlib.contextmanager
    def _room_to_sync(self, t: LocalTarget) -> Iterator[None]:
        """Around what this target itself stores of a forward or a resync copy: a refusal for want
        of space while it is SYNCING takes it offline (see :meth:`_no_room_to_sync`)."""
        try:
            yield
        except FS3Error as e:
            if e.code not in _NO_ROOM or t.public_state != common_pb2.SYNCING:
                raise
            self._no_room_to_sync(t, e)
            # the predecessor retries its forward (not so a space refusal, which would fail the
            # client's write) until the chain goes on without this target
            raise FS3Error(
                StatusCode.STORAGE_TARGET_OFFLINE,
                f"target {t.target_id} went offline: no room for chain {t.chain_id}'s data ({e.message})",
            ) from None

    def _no_room_to_sync(self, t: LocalTarget, error: FS3Error) -> None:
        """A SYNCING target whose disk cannot take the chain's data: refusing the chain's writes
        would fail every client write of the chain while its SERVING replicas have room, and the
        resync would fill the disk and fail on and on. It goes offline instead (until the daemon
        restarts), and the chain goes on without it."""
        if t.failed:
            return
        log.error(
            "target has no room for its chain's data while syncing: taken offline so that the "
            "chain's writes go on; free space or remove it from the chain (fs3 admin update-chain "
            "--mode remove), then restart this daemon target_id=%d chain_id=%d error=%s",
            t.target_id,
            t.chain_id,
            error,
        )
        self.targets.fail(
            t.target_id,
            FS3Error(
                error.code, f"target {t.target_id} has no room for chain {t.chain_id}'s data: {error.message}"
            ),
        )

    async def _chain_update_locked(
        self,
        t: LocalTarget,
        req: storage_pb2.UpdateReq,
        op: Op,
        cid: bytes,
        deadline: float | None,
        caller_gone: Callable[[], bool] | None,
    ) -> storage_pb2.IOResult:
        """:meth:`chain_update` under the chunk's lock."""
        io = req.io
        key = io.key
        eng = t.engine
        async with self.locks.hold(t.target_id, cid):
            # Checked again now the lock is held: the update may have waited for it (behind its own
            # first try, say) while mgmtd took this target out of its place, where it would find no
            # successor and commit as the tail what no replica after its old place holds.
            self._check_still_replica(t, key.chain_id, key.chain_version)
            if req.syncing and not req.commit:
                # A chain write to this SYNCING target that waited past its predecessor's try:
                # that predecessor may have gone on without it (SYNCING_FORWARD_GRACE_S), and later
                # updates of the chunk (a removal) may reach it before this one would be applied.
                _check_deadline(deadline)
                if caller_gone is not None and caller_gone():
                    raise FS3Error(
                        StatusCode.RPC_CONNECTION_CLOSED,
                        "the predecessor's connection closed before this update was applied: not applied",
                    )
            if req.syncing and req.commit:
                # resync: the predecessor's committed chunk, installed as committed at once; only
                # a SYNCING target may be overwritten like that
                if t.public_state != common_pb2.SYNCING:
                    raise FS3Error(
                        StatusCode.STORAGE_ROUTING_STALE,
                        f"target {t.target_id} is not syncing; it takes no resync copies",
                    )
                with self._room_to_sync(t):
                    return await self._resync_copy(t, io, op, cid, lost=req.lost)
            # Resync copies (above) and settles are not refused (see UpdateReq), nor a version this
            # replica holds already: a retried forward whose answer was lost must get that answer,
            # or the predecessor would drop a version the chain below it has.
            meta = eng.engine.get_meta(cid)
            committed, pending = (meta.committed_ver, meta.pending_ver) if meta else (0, 0)
            if not req.settle and io.update_version > committed and io.update_version != pending:
                with self._room_to_sync(t):
                    _check_room(t, op)
            result = await self._update_locked(
                t, cid, key.chain_id, op, io.update_version, settle=req.settle, tag=req.tag
            )
        # Committed here: should this replica become the head, a retry of the client's update is
        # answered rather than applied again (a settle's carries no tag: that of the update that
        # left the version pending here, if any, is recorded).
        self.results.store(req.tag, result)
        self._settled(t, cid, io.update_version, result)
        return result

    async def _apply(
        self, t: LocalTarget, cid: bytes, op: Op, version: int | None, chain_ver: int, tail: bool
    ) -> tuple[str, ChunkMeta | None, ChunkMeta | None]:
        """``apply_op`` of this target's own copy of an update, in its I/O threads; a SYNCING
        target's disk found full by it takes the target offline (see :meth:`_room_to_sync`)."""
        with self._room_to_sync(t):
            try:
                return await self._run(t, apply_op, t.engine.engine, cid, op, version, chain_ver, tail)
            except FS3Error as e:
                if (
                    isinstance(e.__cause__, OSError)
                    and e.__cause__.errno in _OUT_OF_DESCRIPTORS
                    and t.public_state == common_pb2.SERVING
                ):
                    # This process cannot open the chunk's file: no update of this target can be
                    # applied until descriptors are back, and its predecessor (or the client)
                    # would retry each for as long as it waits. It leaves its chain for a resync.
                    # (Not when SYNCING: out already, it is left behind, SYNCING_FORWARD_GRACE_S;
                    # going OFFLINE again would only change its chain over and over.)
                    self.targets.rejoin(t.target_id, e)
                raise

    async def _resync_copy(
        self, t: LocalTarget, io: storage_pb2.UpdateIO, op: Op, cid: bytes, *, lost: bool
    ) -> storage_pb2.IOResult:
        """Install a resync copy (the predecessor's committed chunk, or its removal, or the record
        that no replica could read it) as committed at once. The chunk's lock is held."""
        key = io.key
        eng = t.engine
        if op.type == storage_pb2.UPDATE_REMOVE:
            await eng.remove_range(cid, cid + b"\0")
            return io_result(None, key.chain_version)
        if lost:
            meta = await eng.mark_lost(
                cid,
                chunk_size=op.chunk_size,
                chain_ver=key.chain_version,
                version=io.update_version,
                length=op.length,
                crc=op.crc,
            )
            return io_result(meta, key.chain_version)
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

    def _check_still_replica(self, t: LocalTarget, chain_id: int, version: int) -> None:
        """A forwarded update, once it holds the chunk's lock: the chain must still be at the
        version the predecessor sent it with (so this target is where the predecessor took it to
        be), and ``t`` one of its replicas. Otherwise STORAGE_CHAIN_VERSION_MISMATCH (or the
        replica check's error): the predecessor reads routing again and retries, to the right
        successor."""
        chain = self.targets.chain(chain_id)
        if t.chain_id != chain_id:
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE, f"target {t.target_id} left chain {chain_id} meanwhile"
            )
        if chain.version != version:
            raise FS3Error(
                StatusCode.STORAGE_CHAIN_VERSION_MISMATCH,
                f"chain {chain_id} changed to version {chain.version} while the update of version "
                f"{version} waited at target {t.target_id}",
            )
        self.targets.check_replica(t)

    def _check_round(self, t: LocalTarget, serving: bool) -> None:
        """Before a replica acts on its place in the chain during an update's round (decides that
        it is the tail, forwards, or finds no successor and commits): it must still be a replica
        of its chain, and one that was SERVING when the round began must still be SERVING and up
        to date. mgmtd takes a SERVING target out only by making it OFFLINE and moving it to the
        chain's end, from where it may come back as SYNCING, with no successor after it, before
        this daemon looks again: carrying on, it would take itself for the tail. (A SYNCING
        target is the last one a write reaches anyway; the last SERVING one resyncs it.)"""
        self.targets.check_replica(t)
        if serving and (t.public_state != common_pb2.SERVING or t.local_state != UPTODATE):
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE,
                f"target {t.target_id} left its place in chain {t.chain_id} during an update",
            )

    # -- the round: apply, forward, commit --------------------------------------------------------

    async def _update_locked(
        self,
        t: LocalTarget,
        cid: bytes,
        chain_id: int,
        op: Op,
        version: int | None,
        *,
        settle: bool = False,
        tag: storage_pb2.UpdateTag | None = None,
    ) -> storage_pb2.IOResult:
        """Apply ``op`` as pending version ``version`` (``committed + 1`` on the head, when None),
        forward it, commit it. The chunk's lock is held. ``settle``: the update finishes a pending
        version (see :meth:`_settle_locked`) and is forwarded as such. ``tag``: the client
        update's, forwarded with it."""
        eng = t.engine.engine
        serving = t.public_state == common_pb2.SERVING  # where the round began (see _check_round)
        for _ in range(3):
            chain = self.targets.chain(chain_id)
            chain_ver = chain.version
            # Again after a settle, which may have seen the chain change: the head must still be
            # the head, and no replica may take itself for the tail having lost its place.
            if version is None:
                self.targets.check_head(t, chain)
            self._check_round(t, serving)
            # At the tail, apply and commit in one trip to the I/O threads.
            tail = chain.successor(t.target_id) is None
            if not tail and op.type == storage_pb2.UPDATE_WRITE and op.offset == 0 and not op.extents:
                parallel = parallel_version(eng.get_meta(cid), op, version)
                if parallel and eng.roomy(op.length):
                    return await self._update_parallel(
                        t, cid, chain_id, op, parallel, chain_ver, serving, tag
                    )
            try:
                kind, meta, new = await self._apply(t, cid, op, version, chain_ver, tail)
            except FS3Error as e:
                if e.code != StatusCode.STORAGE_NO_SPACE:
                    raise
                # The disk found full by this update itself: nothing of it is stored here, nor
                # forwarded (this round stores before it forwards), so no replica after this one
                # holds it. Refused as the space kept free is, so that the predecessors drop their
                # pending copies (_drop_refused): kept, they settled the version once there was
                # room, and the write the client was told failed came back with the chunk's next
                # update (or a truncate over it).
                raise FS3Error(StatusCode.STORAGE_SPACE_KEPT, e.message) from None
            if kind == "settle":
                assert meta is not None
                await self._settle_locked(t, cid, chain_id, meta, serving)
                if tag is not None and (done := self.results.lookup(tag)) is not None:
                    return done  # the version settled was this very update's first try
                continue
            if kind == "stale":
                return io_result(meta, chain_ver)  # a retry of an update this replica committed
            if kind == "absent":
                return io_result(None, chain_ver)  # removal of a chunk this replica does not hold
            assert new is not None
            v = new.pending_ver or new.committed_ver
            if kind == "pending":
                try:
                    await self._forward(t, cid, chain_id, op, v, new, serving=serving, settle=settle, tag=tag)
                except FS3Error as e:
                    await self._drop_refused(t, cid, v, e)
                    self._left_pending(t, cid, v, tag)
                    raise
                meta = await t.engine.commit(cid, v, chain_ver=self.targets.chain(chain_id).version)
            elif self.targets.chain(chain_id).successor(t.target_id) is not None:
                # Committed here as the tail, but the chain gained a successor meanwhile: a target
                # back as SYNCING, whose resync may have compared chunk metadata before this
                # commit landed and found nothing to copy (then declared it in sync without this
                # version). It gets the version before the client is answered.
                removal = meta is None
                again = Op(
                    storage_pb2.UPDATE_REMOVE if removal else storage_pb2.UPDATE_REPLACE, op.chunk_size
                )
                await self._forward(t, cid, chain_id, again, v, None, serving=serving, full=True, settle=True)
            return io_result(meta, chain_ver) if meta is not None else removed_result(v, chain_ver)
        raise FS3Error(StatusCode.ABORTED, f"chunk {cid.hex()} kept a pending version")

    async def _update_parallel(
        self,
        t: LocalTarget,
        cid: bytes,
        chain_id: int,
        op: Op,
        version: int,
        chain_ver: int,
        serving: bool,
        tag: storage_pb2.UpdateTag | None,
    ) -> storage_pb2.IOResult:
        """:meth:`_update_locked` for a write of the whole content (see :func:`parallel_version`):
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
        stored = asyncio.ensure_future(self._apply(t, cid, op, version, chain_ver, False))
        self._applying[key] = stored
        stored.add_done_callback(functools.partial(self._local_done, t, cid))
        try:
            forwarded = await self._forward(
                t, cid, chain_id, op, version, None, serving=serving, local=stored, tag=tag
            )
        except BaseException as e:
            await self._local_outcome(t, cid, stored)
            if isinstance(e, FS3Error):
                await self._drop_refused(t, cid, version, e)
            self._left_pending(t, cid, version, tag)
            raise  # as in the sequential round: the pending version is settled later
        kind, _, new = await self._local_outcome(t, cid, stored)
        assert kind == "pending" and new is not None, kind
        pending = new.pending
        if forwarded is not None and pending is not None and forwarded.committed_version == version:
            succ = self.targets.chain(chain_id).successor(t.target_id)
            syncing = succ is not None and succ.public_state == common_pb2.SYNCING
            check_same(chain_id, cid, version, pending.crc, forwarded.crc32c, syncing=syncing)
        meta = await t.engine.commit(cid, version, chain_ver=self.targets.chain(chain_id).version)
        return io_result(meta, chain_ver)

    async def _local_outcome(self, t: LocalTarget, cid: bytes, stored: asyncio.Future) -> tuple:  # type: ignore[type-arg]
        """The result of the local half of a parallel update; if it failed, its error is raised
        (the target went offline already, see :meth:`_local_done`)."""
        # Its outcome is looked at, not raised here: raised through this frame (and the callers'),
        # which hold ``stored``, the error it holds would take them into its traceback, a reference
        # cycle keeping the update's bytes until the cyclic GC ran (seldom: fs3.daemon.settle_gc).
        if not stored.done():
            await asyncio.wait((stored,))  # a cancelled caller leaves the local write running
        error = _local_error(stored)
        if error is None:
            return stored.result()  # type: ignore[no-any-return]
        if isinstance(error, FS3Error):
            raise FS3Error(error.code, error.message)
        raise FS3Error(StatusCode.STORAGE_IO_ERROR, f"storing chunk {cid.hex()} failed: {error!r}")

    def _local_done(self, t: LocalTarget, cid: bytes, stored: asyncio.Future) -> None:  # type: ignore[type-arg]
        """Done callback of the local half of a parallel update, run before any read of the chunk
        here goes on (reads wait for ``stored`` through callbacks added after this one): ends the
        wait, and if the local write failed, takes the target offline unless every replica refuses
        the update alike: for a passing reason (UNAVAILABLE: EMFILE...) until a resync has brought
        it up to date (``TargetMap.rejoin``), for a disk error until its daemon restarts. At once,
        not when the forward returns: the successors may commit the version meanwhile, and this
        replica, holding no pending version, would serve the old one."""
        key = (t.target_id, cid)
        if self._applying.get(key) is stored:
            del self._applying[key]
        error = _local_error(stored)
        if error is None or (isinstance(error, FS3Error) and error.code in REFUSED_EVERYWHERE):
            return  # stored, or refused by the successors the same way: none of them took it
        if not isinstance(error, FS3Error):
            log.error(
                "parallel update failed here target_id=%d chunk=%s", t.target_id, cid.hex(), exc_info=error
            )
        why = FS3Error(
            error.code if isinstance(error, FS3Error) else StatusCode.STORAGE_IO_ERROR,
            f"could not store chunk {cid.hex()}, which its successor may hold: "
            + (error.message if isinstance(error, FS3Error) else repr(error)),
        )
        if why.code == StatusCode.UNAVAILABLE:
            # a passing shortage (EMFILE...): the engine is sound, only this chunk may be behind
            # its successors; a resync brings it up to date without a restart
            self.targets.rejoin(t.target_id, why)
        else:
            self.targets.fail(t.target_id, why)

    async def _drop_refused(self, t: LocalTarget, cid: bytes, version: int, error: FS3Error) -> None:
        """After a successor refused pending ``version`` to keep its free space: drop it here too.

        That refusal comes before the refusing replica stores or forwards anything
        (``_check_room``), and every replica between it and this one dropped the version before passing
        the refusal on, so no replica holds it: the client's write failed with ENOSPC and nothing
        of it remains, where settling it later would make a refused write appear after all (and
        need the space that is missing). Other errors leave the version to be settled."""
        if error.code == StatusCode.STORAGE_SPACE_KEPT:
            log.info(
                "successor refused an update for want of space, dropping it target_id=%d chunk=%s version=%d",
                t.target_id,
                cid.hex(),
                version,
            )
            await t.engine.abort(cid, version)

    async def _settle_locked(
        self, t: LocalTarget, cid: bytes, chain_id: int, meta: ChunkMeta, serving: bool
    ) -> ChunkMeta | None:
        """Finish a pending version no update is carrying any more: forward it as a whole-chunk
        replace (or removal) and commit it. The chunk's lock is held; ``serving`` as for
        :meth:`_check_round`."""
        pending = meta.pending
        assert pending is not None
        log.info(
            "settling pending version target_id=%d chunk=%s version=%d",
            t.target_id,
            cid.hex(),
            pending.version,
        )
        op = Op(storage_pb2.UPDATE_REMOVE if pending.removal else storage_pb2.UPDATE_REPLACE, meta.chunk_size)
        await self._forward(
            t, cid, chain_id, op, pending.version, meta, serving=serving, full=True, settle=True
        )
        chain_ver = self.targets.chain(chain_id).version
        committed = await t.engine.commit(cid, pending.version, chain_ver=chain_ver)
        self._settled(t, cid, pending.version, io_result(committed, chain_ver))
        return committed

    def _left_pending(
        self, t: LocalTarget, cid: bytes, version: int, tag: storage_pb2.UpdateTag | None
    ) -> None:
        """A client update's round failed: if its version stays pending here, keep its tag for
        whoever settles it (see :meth:`_settled`)."""
        if tag is None or not tag.client_id:
            return
        meta = t.engine.engine.get_meta(cid)
        if meta is None or meta.pending_ver != version:
            return  # dropped (refused for space), or never stored here
        kept = storage_pb2.UpdateTag()
        kept.CopyFrom(tag)
        tags = self._pending_tags
        tags.pop((t.target_id, cid), None)
        tags[(t.target_id, cid)] = (version, kept)
        while len(tags) > self.results.capacity:
            del tags[next(iter(tags))]

    def _settled(self, t: LocalTarget, cid: bytes, version: int, result: storage_pb2.IOResult) -> None:
        """``version`` of the chunk is committed here: if a client update whose round failed had
        left it pending, its retry is answered with ``result`` from now on (on this replica, and
        on any that becomes the head: every replica that held the version records it)."""
        entry = self._pending_tags.get((t.target_id, cid))
        if entry is not None and entry[0] <= version:
            del self._pending_tags[(t.target_id, cid)]
            if entry[0] == version:
                self.results.store(entry[1], result)

    def _warn_failing_forward(
        self, target_id: int, succ: int, chain_id: int, failing_s: float, error: FS3Error
    ) -> None:
        """Log a forward to ``succ`` that has failed ``failing_s`` (see FORWARD_WARN_AFTER_S)."""
        if failing_s < FORWARD_WARN_AFTER_S or not self._forward_warned.due(succ):
            return
        try:
            address: object = node_address(self.targets.routing, succ, backend=True)
        except FS3Error:
            address = "unknown"
        log.warning(
            "forwarding to the next target of the chain keeps failing target_id=%d succ=%d address=%s "
            "chain_id=%d failing_s=%.1f forward_timeout_s=%.0f error=%s",
            target_id,
            succ,
            address,
            chain_id,
            failing_s,
            self.forward_timeout_s,
            error,
        )

    async def _forward(
        self,
        t: LocalTarget,
        cid: bytes,
        chain_id: int,
        op: Op,
        version: int,
        meta: ChunkMeta | None,
        *,
        serving: bool,
        full: bool = False,
        local: asyncio.Future | None = None,  # type: ignore[type-arg]
        settle: bool = False,
        tag: storage_pb2.UpdateTag | None = None,
    ) -> storage_pb2.IOResult | None:
        """Send pending ``version`` to the successor, retrying (with the newest routing each time)
        until it answers or ``forward_timeout_s`` passes. Returns None at the tail. ``local``, in
        a parallel update, is the local write still in progress: sending the whole chunk waits for
        it. ``meta`` (the local metadata, when known) checks the successor's checksum. ``serving``:
        whether ``t`` was SERVING when the round began (see :meth:`_check_round`). ``settle``: the
        version finishes a pending one, which no successor refuses for space."""
        began = time.monotonic()
        deadline = began + self.forward_timeout_s
        # (SYNCING successor, when the first of its failed tries began): the grace it gets
        failing: tuple[int, float] | None = None
        no_room_until: float | None = None  # see NO_SPACE_RETRY_S
        backoff = 0.02
        whole: tuple[bytes, int] | None = None
        while True:
            routing = self.targets.routing
            chain = self.targets.chain(chain_id)
            self._check_round(t, serving)
            succ = chain.successor(t.target_id)
            if succ is None:
                return None
            syncing = succ.public_state == common_pb2.SYNCING
            req = storage_pb2.UpdateReq(target_id=succ.target_id, syncing=syncing, settle=settle)
            if tag is not None and tag.client_id:
                req.tag.CopyFrom(tag)
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
                        # looked at, not awaited (see _local_outcome): its error raised here would
                        # take these frames, which hold it, into its traceback, a reference cycle
                        await asyncio.wait((local,))  # a cancelled caller leaves it running
                        if local.cancelled() or local.exception() is not None:
                            # the caller raises the local write's own error (_local_outcome)
                            raise FS3Error(StatusCode.ABORTED, f"chunk {cid.hex()}: the local write failed")
                    r = await t.engine.read(cid, 0, None, version=version)
                    whole = (r.data, r.chunk_crc)
                io.type = storage_pb2.UPDATE_REPLACE
                payload, io.length, io.crc32c = whole[0], len(whole[0]), whole[1]
            elif op.type == storage_pb2.UPDATE_WRITE:
                io.type = storage_pb2.UPDATE_WRITE
                io.offset, io.length = op.offset, op.length
                for offset, length in op.extents:
                    io.extents.add(offset=offset, length=length)
                if op.crc is not None:
                    io.crc32c = op.crc
                payload = op.data
            else:
                io.type = op.type
                io.length = op.length
            tried = time.monotonic()
            try:
                address = node_address(routing, succ.target_id, backend=True)
                remaining = deadline - tried
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
                if e.code in (
                    StatusCode.INVALID_ARGUMENT,
                    StatusCode.STORAGE_CHECKSUM_MISMATCH,
                    StatusCode.STORAGE_SPACE_KEPT,  # a successor keeping its free space: the write fails
                ):
                    raise
                if e.code == StatusCode.STORAGE_NO_SPACE:
                    now = time.monotonic()
                    if no_room_until is None:
                        no_room_until = now + NO_SPACE_RETRY_S
                    elif now >= no_room_until:
                        raise FS3Error(
                            StatusCode.STORAGE_NO_SPACE,
                            f"forwarding chunk {cid.hex()} v{version} of chain {chain_id}: target "
                            f"{succ.target_id} has no space: {e.message}",
                        ) from None
                now = time.monotonic()
                if syncing and (failing is None or failing[0] != succ.target_id):
                    failing = (succ.target_id, tried)
                if (
                    syncing
                    and failing is not None
                    and now - failing[1] >= SYNCING_FORWARD_GRACE_S
                    and self._skip_syncing(t, chain, succ.target_id, cid, version, e)
                ):
                    return None  # committed here as at the tail; the successor's resync starts over
                remaining = deadline - now
                if remaining <= 0:
                    raise FS3Error(
                        StatusCode.UNAVAILABLE,
                        f"forwarding chunk {cid.hex()} v{version} of chain {chain_id} to target "
                        f"{succ.target_id} failed: {e}",
                    ) from None
                log.debug("forward retry target_id=%d succ=%d error=%s", t.target_id, succ.target_id, e)
                self._warn_failing_forward(t.target_id, succ.target_id, chain_id, now - began, e)
                self.routing.refresh_soon()
                await asyncio.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, 0.5)
                continue
            if meta is not None and op.type != storage_pb2.UPDATE_REMOVE and rsp.committed_version == version:
                if meta.pending is not None and meta.pending.version == version:
                    check_same(chain_id, cid, version, meta.pending.crc, rsp.crc32c, syncing=syncing)
            return rsp

    # -- reads ------------------------------------------------------------------------------------

    def read_now(
        self, rio: storage_pb2.ReadIO, *, lone: bool = False
    ) -> tuple[bytes, int, int] | AioPlan | None:
        """A small read served right here on the event loop thread, without waiting: like
        :meth:`read`; or, with native AIO and when the read is not alone in its request
        (``lone``), an :class:`AioPlan` for :meth:`read_many` if the chunk's version was written
        with O_DIRECT (so is not in the page cache); or None when it must take
        :meth:`read_many`'s way instead (larger than ``INLINE_READ_BYTES``, the chunk has an
        update pending, or its bytes are not in the page cache while the target's disk is slow:
        see :mod:`storage.chunk_files`).

        A lone read is read on the loop as it always was (through the page cache, timed): alone,
        a submission and its wake-up cost more than they save, and the page cache's read-ahead
        serves later reads nearby (storage_bench's single-read requests: 7,700-8,500 reads/s
        that way against 5,500-6,700 through AIO)."""
        if rio.length > INLINE_READ_BYTES:
            return None
        t, cid = self._read_target(rio)
        if (t.target_id, cid) in self._applying:
            return None
        eng = t.engine.engine
        meta = eng.get_meta(cid)
        if self.aio is not None and not lone:
            plan = self._plan(t, cid, meta, rio, uncached_only=True)
            if plan is not None:
                return plan
        try:
            outcome = read_meta_or_data(eng, cid, meta, rio.offset, rio.length, nowait=True)
        except WouldBlock:
            return None
        return outcome if isinstance(outcome, tuple) else None

    async def read(self, rio: storage_pb2.ReadIO) -> tuple[bytes, int, int]:
        """One read of a batch: ``(data, crc32c of data, committed version served)``. Its first
        step is a trip to the I/O threads, so a caller outside any task (an inline RPC handler)
        has become a task before anything else happens. The data may be a view of a lent buffer
        (O_DIRECT reads): the caller gives it back with ``chunk_files.release_read`` once sent."""
        t, cid = self._read_target(rio)
        key = rio.key
        eng = t.engine.engine
        for _ in range(8):
            applying = self._applying.get((t.target_id, cid))
            if applying is not None:
                # a parallel update is storing a version the tail may have committed already:
                # once it is stored here (pending), the usual rule below serves the right one
                # (waited for, not awaited: its error is not this read's, nor kept in its frames)
                await asyncio.wait((applying,))
                # a failed one took the target out (_local_done): what is committed here may be
                # older than what its successors committed
                self.targets.check_readable(t)
            outcome = await self._run(
                t, functools.partial(read_or_meta, lease=True), eng, cid, rio.offset, rio.length
            )
            if isinstance(outcome, tuple):
                return outcome
            meta = outcome
            committed = await self._query_committed(t, key.chain_id, cid)
            if committed == 0 or (
                meta.pending is not None and meta.pending.removal and committed == meta.pending_ver
            ):
                raise FS3Error(StatusCode.STORAGE_CHUNK_NOT_FOUND, f"chunk {cid.hex()} does not exist")
            try:
                r = await self._run(t, read_version, eng, cid, rio.offset, rio.length, committed, True)
            except FS3Error as e:
                if e.code == StatusCode.STORAGE_CHUNK_VERSION_MISMATCH:
                    continue  # committed or aborted meanwhile: look again
                raise
            return r
        raise FS3Error(StatusCode.ABORTED, f"chunk {cid.hex()} kept changing during a read")

    async def read_many(
        self, rios: Sequence[storage_pb2.ReadIO], planned: Sequence[tuple[storage_pb2.ReadIO, AioPlan]] = ()
    ) -> tuple[list[tuple[bytes, int, int] | BaseException], int, int]:
        """Reads that :meth:`read_now` could not serve (``rios``) and those it planned for AIO
        (``planned``): each outcome as :meth:`read` returns it (or the exception it raised), those
        of ``rios`` first, how many were served through AIO, and how many read at once on the
        event loop instead (a lone cold read while the disk is fast). With native AIO, reads of
        committed chunks with no update in flight are read with O_DIRECT, all in one submission,
        and checked on the event loop; the rest (and any AIO read that fails or whose bytes do not
        check out) take :meth:`read`'s way, which decides what a failure means."""
        n = len(rios)
        outcomes: list[tuple[bytes, int, int] | BaseException | None] = [None] * (n + len(planned))
        plans = [(n + j, rio, plan) for j, (rio, plan) in enumerate(planned)]
        rest: list[tuple[int, storage_pb2.ReadIO]] = []
        aio = self.aio
        for i, rio in enumerate(rios):
            plan = None
            if aio is not None:
                try:
                    plan = self._direct_plan(rio)
                except Exception as e:  # noqa: BLE001 - reported as read() would report it
                    outcomes[i] = read_error(e)
                    continue
            if plan is None:
                rest.append((i, rio))
            else:
                plans.append((i, rio, plan))
        if plans:
            assert aio is not None
            slots = aio.free_slots  # one per piece; reads beyond them take the I/O threads
            kept = []
            for i, rio, plan in plans:
                if len(plan.read.pieces) <= slots:
                    slots -= len(plan.read.pieces)
                    kept.append((i, rio, plan))
                else:
                    plan.close()
                    rest.append((i, rio))
            plans = kept
        if len(plans) == 1 and not rest:
            # A lone cold read costs less read at once on the loop than submitted and waited for
            # (no task, no eventfd wake-up), while the disk is fast: as loop reads without AIO
            # do, it is timed, and while the disk is slow it goes through AIO after all.
            i, rio, plan = plans[0]
            eng = plan.target.engine.engine
            if not eng.cold_reads.off_loop:
                try:
                    r = eng.direct_read_now(plan.read)
                finally:
                    plan.close()
                if r is None:
                    outcomes[i] = (await self._read_outcome(rio))[0]
                    return outcomes, 0, 0  # type: ignore[return-value]
                outcomes[i] = (r.data, data_crc(rio.offset, r), r.version)
                return outcomes, 0, 1  # type: ignore[return-value]
        if not plans:
            if len(rest) == 1:  # no task for a lone read
                outcomes[rest[0][0]] = (await self._read_outcome(rest[0][1]))[0]
                return outcomes, 0, 0  # type: ignore[return-value]
            done = await asyncio.gather(*(self._read_outcome(rio) for _, rio in rest))
            for (i, _), (o, _) in zip(rest, done, strict=True):
                outcomes[i] = o
            return outcomes, 0, 0  # type: ignore[return-value]
        assert aio is not None
        flat = aio.read_batch([piece for _, _, p in plans for piece in p.read.pieces])
        futures: list[list[asyncio.Future[AioRead]]] = []
        for _, _, p in plans:
            futures.append(flat[: len(p.read.pieces)])
            del flat[: len(p.read.pieces)]
        others = asyncio.gather(*(self._read_outcome(rio) for _, rio in rest)) if rest else None
        by_aio = 0
        current = 0  # the AIO read being waited for; it cleans up after itself if that fails
        try:
            # one coroutine for the whole submission (no task per read): all of them are at the
            # device already, so waiting for each in turn costs no more than the slowest
            for current, ((i, rio, plan), submitted) in enumerate(zip(plans, futures, strict=True)):  # noqa: B007
                o, direct = await self._direct_outcome(rio, plan, submitted)
                outcomes[i] = o
                by_aio += direct
            current = len(plans)
            if others is not None:
                for (i, _), (o, _) in zip(rest, await others, strict=True):
                    outcomes[i] = o
        except BaseException:
            for (_, _, plan), submitted in zip(plans[current + 1 :], futures[current + 1 :], strict=True):
                self._abandon(plan, submitted)
            if others is not None:
                others.cancel()
            raise
        return outcomes, by_aio, 0  # type: ignore[return-value]

    async def _read_outcome(
        self, rio: storage_pb2.ReadIO
    ) -> tuple[tuple[bytes, int, int] | BaseException, bool]:
        """:meth:`read`'s outcome (its result or exception), and False: not read through AIO."""
        try:
            return await self.read(rio), False
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the caller reports it per read
            return e, False

    def _direct_plan(self, rio: storage_pb2.ReadIO) -> AioPlan | None:
        t, cid = self._read_target(rio)
        if (t.target_id, cid) in self._applying:
            return None
        return self._plan(t, cid, t.engine.engine.get_meta(cid), rio)

    def _plan(
        self,
        t: LocalTarget,
        cid: bytes,
        meta: ChunkMeta | None,
        rio: storage_pb2.ReadIO,
        *,
        uncached_only: bool = False,
    ) -> AioPlan | None:
        """The AIO read of ``rio`` from the committed version ``meta`` names, or None where
        :meth:`read` must serve it (no committed version or an update pending: it raises the
        right error or asks the tail; or the engine cannot plan it)."""
        if meta is None or meta.pending is not None or meta.committed is None:
            return None
        assert self.aio is not None
        plan = t.engine.engine.direct_read_plan(
            cid, rio.offset, rio.length, meta, self.aio.slot_bytes, uncached_only=uncached_only
        )
        return None if plan is None else AioPlan(t, plan)

    async def _direct_outcome(
        self, rio: storage_pb2.ReadIO, plan: AioPlan, submitted: list[asyncio.Future[AioRead]]
    ) -> tuple[tuple[bytes, int, int] | BaseException, bool]:
        """The outcome of one AIO read (as :meth:`_read_outcome`'s), and whether AIO served it.
        ``submitted``: the reads of its pieces."""
        aio = self.aio
        assert aio is not None
        got: list[AioRead] = []
        r = None
        k = 0
        try:
            try:
                for k, piece in enumerate(submitted):  # noqa: B007
                    got.append(await piece)
                k = len(submitted)
            except OSError as e:
                log.warning(
                    "AIO read failed target_id=%d chunk=%s error=%s; reading it again the usual way",
                    plan.target.target_id,
                    plan.read.chunk_id.hex(),
                    e,
                )
            else:
                raw = got[0].data if len(got) == 1 else b"".join(g.data for g in got)
                r = plan.target.engine.engine.direct_read_done(plan.read, raw)
        finally:
            for piece in submitted[k + 1 :]:
                self._drop(piece)
            for g in got:
                aio.release(g)
            plan.close()
        if r is None:
            return await self._read_outcome(rio)
        return (r.data, data_crc(rio.offset, r), r.version), True

    def _abandon(self, plan: AioPlan, submitted: list[asyncio.Future[AioRead]]) -> None:
        """Give up on an AIO read whose outcome nobody waits for."""
        plan.close()  # the kernel holds the files until the reads complete
        for piece in submitted:
            self._drop(piece)

    def _drop(self, piece: asyncio.Future[AioRead]) -> None:
        """Give up on one AIO read: its slot comes back when it completes (or now, if it has)."""
        if not piece.done():
            piece.cancel()
        elif not piece.cancelled() and piece.exception() is None:
            assert self.aio is not None
            self.aio.release(piece.result())

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
            self.targets.check_readable(t, tail=True)  # again: it may have left its place meanwhile
            meta = await t.engine.get_meta(cid)
            if meta is not None and meta.pending is not None:
                meta = await self._settle_locked(t, cid, chain_id, meta, True)
            return meta.committed_ver if meta is not None else 0

    async def query_committed(self, req: storage_pb2.QueryCommittedReq) -> storage_pb2.QueryCommittedRsp:
        key = req.key
        t = self.targets.of_chain(key.chain_id)
        self.targets.check_readable(t, tail=True)
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
        t = await self.local_target(req.chain_id, req.chain_version, who="client")
        self.targets.check_head(t, self.targets.chain(req.chain_id))
        metas = await t.engine.dump_metadata(*file_range(req.inode_id, req.begin_index, req.end_index))
        return await self._remove_all(t, req.chain_id, metas)

    async def _remove_all(
        self, t: LocalTarget, chain_id: int, metas: list[ChunkMeta], deadline: float | None = None
    ) -> int:
        sem = asyncio.Semaphore(16)

        async def one(meta: ChunkMeta) -> int:
            async with sem, self.locks.hold(t.target_id, meta.chunk_id):
                _check_deadline(deadline)
                r = await self._update_locked(
                    t, meta.chunk_id, chain_id, Op(storage_pb2.UPDATE_REMOVE, meta.chunk_size), None
                )
                return 1 if r.update_version else 0

        return sum(await asyncio.gather(*(one(m) for m in metas)))

    async def _truncate_last(
        self,
        t: LocalTarget,
        req: storage_pb2.TruncateChunksReq,
        cid: bytes,
        rest: int,
        deadline: float | None,
    ) -> bool:
        """Cut the chunk the new length ends inside to ``rest`` bytes (see truncate_chunks):
        whether it holds anything."""
        async with self.locks.hold(t.target_id, cid):
            _check_deadline(deadline)
            meta = await t.engine.get_meta(cid)
            if meta is not None and meta.chunk_size != req.chunk_size:
                raise FS3Error(
                    StatusCode.INVALID_ARGUMENT,
                    f"chunk {cid.hex()} has chunk size {meta.chunk_size}, not {req.chunk_size}",
                )
            if meta is not None and meta.pending is not None:
                # A pending version (of a write whose forward failed) is committed by whatever
                # comes next: settled now, the truncate applies on top of it; left, the next
                # update would settle it over the truncate and bring the bytes cut back.
                self.targets.check_head(t, self.targets.chain(req.chain_id))
                meta = await self._settle_locked(t, cid, req.chain_id, meta, True)
            if meta is None or meta.committed is None:
                return False
            if meta.committed.length != rest:
                await self._update_locked(
                    t,
                    cid,
                    req.chain_id,
                    Op(storage_pb2.UPDATE_TRUNCATE, req.chunk_size, length=rest),
                    None,
                )
            return True

    async def truncate_chunks(
        self, req: storage_pb2.TruncateChunksReq, deadline: float | None = None
    ) -> storage_pb2.TruncateChunksRsp:
        """Fit a file's chunks on this chain to a new length, at the head. No chunk is changed once
        the caller's ``deadline`` (event loop time) has passed: meta truncates storage before it
        commits, and a truncate whose caller gave up (and retried, maybe through another meta
        server, then wrote) must not land after that."""
        check_chunk_size(req.chunk_size)
        t = await self.local_target(req.chain_id, req.chain_version, who="client")
        self.targets.check_head(t, self.targets.chain(req.chain_id))
        last_index, rest = divmod(req.length, req.chunk_size)
        first_gone = last_index + 1 if rest else last_index
        metas = await t.engine.dump_metadata(*file_range(req.inode_id, first_gone))
        removed = await self._remove_all(t, req.chain_id, metas, deadline)
        truncated = False
        if rest:
            cid = chunk_id(req.inode_id, last_index)
            truncated = await self._repairing(
                t,
                cid,
                lambda: self._truncate_last(t, req, cid, rest, deadline),
                why="a truncate builds on it",
            )
        return storage_pb2.TruncateChunksRsp(removed=removed, truncated=truncated)


def read_error(e: Exception) -> FS3Error:
    """What a list of read outcomes keeps of a read's error: without its traceback, whose frames
    include the one holding the list (a reference cycle keeping every read's bytes until a cyclic
    collection); an error other than an FS3Error is logged here, with its traceback, as INTERNAL."""
    if isinstance(e, FS3Error):
        return e.with_traceback(None)
    log.error("read failed", exc_info=e)
    return FS3Error(StatusCode.INTERNAL, repr(e))


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and asyncio.get_running_loop().time() >= deadline:
        raise FS3Error(StatusCode.DEADLINE_EXCEEDED, "the caller's deadline passed: nothing more changed")


#: a target's refusals for want of space (the space kept free, or a disk found full)
_NO_ROOM = frozenset({StatusCode.STORAGE_SPACE_KEPT, StatusCode.STORAGE_NO_SPACE})
#: how long a forward retries a successor whose disk is full (STORAGE_NO_SPACE) before the update
#: fails with it (ENOSPC to the client; the version stays pending, settled once there is room):
#: retried for the whole forward timeout, the client's own deadline (as long) ran out first and
#: its write failed after a minute with ETIMEDOUT
NO_SPACE_RETRY_S = 2.0
#: a forward to one successor that has failed this long is logged as a WARNING (at most one per
#: successor every FORWARD_WARN_EVERY_S): a successor this daemon cannot reach while it still
#: heartbeats mgmtd is not taken out of its chains (README), and its writes wait meanwhile
FORWARD_WARN_AFTER_S = 5.0
FORWARD_WARN_EVERY_S = 30.0
#: a local update failing with these (the process, or the machine, out of file descriptors)
#: takes the target out of its chain to be resynced (see Replicator._apply)
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
#: how long a replica retries forwarding an update to a SYNCING successor before it leaves that
#: successor behind (see the module docstring): long enough for a restarting connection or a
#: routing change to pass, short against the writes of the whole chain waiting meanwhile
SYNCING_FORWARD_GRACE_S = 2.0


def _check_room(t: LocalTarget, op: Op) -> None:
    """Refuse a write that would eat into the space the target keeps free (ChunkEngine.check_room),
    before anything of it is stored: STORAGE_SPACE_KEPT, which the client reports as ENOSPC and a
    predecessor passes back without retrying, dropping its pending copy (``_drop_refused``). A
    disk found full by the write itself (other users of it, or a race) is STORAGE_NO_SPACE: the
    target stays online (ChunkEngine._error); a replica that found it so storing the update before
    forwarding it passes it back as STORAGE_SPACE_KEPT (see Replicator._update_locked), one that
    stored it while forwarding it (a whole chunk's write) as STORAGE_NO_SPACE, which the
    predecessor retries for NO_SPACE_RETRY_S, then fails the update with, the version left pending
    to be settled once there is room (a successor may hold it)."""
    if op.type in (storage_pb2.UPDATE_WRITE, storage_pb2.UPDATE_REPLACE):
        t.engine.engine.check_room(op.length)
