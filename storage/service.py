"""The storage service's RPC handlers: validate what came off the wire, then hand it to CRAQ.

Every handler raises :class:`fs3.errors.FS3Error` for bad input or refused requests; the RPC layer
sends the code and message back. Method ids and messages: ``proto/storage.proto``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fs3 import capability, metrics
from fs3.capability import CapabilityVerifier
from fs3.client.storage_client import MAX_BATCH_READ_BYTES, MAX_BATCH_READS
from fs3.errors import FS3Error, StatusCode
from fs3.net import CallContext, inline
from fs3.net.auth import user_scoped_id
from fs3.proto import common_pb2, storage_pb2

from .chain_ops import chunk_id, file_range, split_chunk_id
from .chunk_files import lent_buffer, release_read
from .chunk_meta import ChunkMeta
from .craq import AioPlan, Replicator, read_error
from .target_map import ONLINE, UPTODATE, LocalTarget, TargetMap

log = logging.getLogger(__name__)

# Above this, a batch's results are joined into one reply payload in an I/O thread.
JOIN_OFF_LOOP_BYTES = 4 << 20
# Bytes of one batch read on the event loop thread (Replicator.read_now) before the rest of the
# batch goes to the I/O threads.
INLINE_BATCH_READ_BYTES = 256 << 10
DUMP_PAGE = 1024  # chunk metadata per reply: building a page stays well under a millisecond


#: codes the data-error alert watches (deploy/prometheus/fs3-alerts.yml), and the methods that
#: write chunks: their series are made at 0 when the service starts
_ALERTED = (StatusCode.STORAGE_IO_ERROR, StatusCode.STORAGE_CHECKSUM_MISMATCH, StatusCode.INTERNAL)
_ALERTED_METHODS = ("Write", "Update")


def _code_name(code: int) -> str:
    """A status code's label value: its name, or the number of one this version does not know."""
    return StatusCode(code).name if code in StatusCode._value2member_map_ else str(code)


class StorageService:
    """Handlers of STORAGE_SERVICE (``fs3.client.storage_client``) for one daemon.

    Calls of cluster members (``ctx.user`` None) are served as they come. A user connection
    (:mod:`fs3.capability`) may only write data (Write of type WRITE) and read (BatchRead), each
    chunk with a capability of its file that ``capabilities`` verifies; every other method is
    refused (PERMISSION_DENIED), as is every call when there is no ``capabilities``."""

    def __init__(
        self,
        replicator: Replicator,
        registry: CollectorRegistry | None = None,
        *,
        capabilities: CapabilityVerifier | None = None,
    ) -> None:
        self.rep = replicator
        self.capabilities = capabilities
        self.targets = replicator.targets
        reg = registry or metrics.registry()
        self.m_ops = metrics.counter(
            "fs3_storage_requests", "storage requests by method and outcome", ("method", "code"), reg
        )
        self.m_bytes = metrics.counter(
            "fs3_storage_bytes", "bytes written by clients and read by clients", ("dir",), reg
        )
        self.m_latency = metrics.histogram(
            "fs3_storage_request_seconds", "storage request latency", ("method",), reg
        )
        self.m_damaged = metrics.counter(
            "fs3_storage_damaged_reads",
            "reads that found this target's copy of a chunk damaged (failing its checksums, file missing, or "
            "lost): the reader is sent to another replica and the copy repaired from one",
            ("target",),
            reg,
        )
        self._damaged: dict[int, Any] = {}
        # the labelled children, looked up once (labels() takes a lock and builds a key every call)
        self._ops: dict[tuple[str, int], Any] = {}
        self._latency: dict[str, Any] = {}
        self.m_read_failures = metrics.counter(
            "fs3_storage_read_failures",
            "reads of batch reads that failed, by code (a batch read is one request, counted OK in "
            "fs3_storage_requests_total, its reads each with an outcome of their own)",
            ("code",),
            reg,
        )
        self._read_failures: dict[int, Any] = {}
        # The series alerts watch exist at 0 from the start: increase() over a series that appears
        # at 1 (the first event) is 0, so the first disk error or damaged copy went unseen.
        for code in _ALERTED:
            self._read_failures[int(code)] = self.m_read_failures.labels(code.name)
            for method in _ALERTED_METHODS:
                self._ops[(method, int(code))] = self.m_ops.labels(method, code.name)
        for target_id in replicator.targets.targets:
            self._damaged[target_id] = self.m_damaged.labels(str(target_id))
        self.m_reads = metrics.counter(
            "fs3_storage_batched_reads",
            "reads of batch reads by where they were served: inline (event loop thread: page "
            "cache, or a lone cold read), aio (page cache misses read with native AIO) or "
            "io_thread (large reads, chunks with an update in flight, cold reads of a slow disk "
            "where AIO is unavailable)",
            ("where",),
            reg,
        )
        reg.register(_TargetMetrics(replicator.targets))
        # target -> (chain id, chain version) of the SyncStart it accepted last (see sync_done)
        self._sync_starts: dict[int, tuple[int, int]] = {}
        self._inline_reads = self.m_reads.labels("inline")
        self._thread_reads = self.m_reads.labels("io_thread")
        self._aio_reads = self.m_reads.labels("aio")
        self._read_bytes = self.m_bytes.labels("read")
        self._write_bytes = self.m_bytes.labels("write")

    def _done(self, method: str, start: float, code: int = 0) -> None:
        ops = self._ops.get((method, code))
        if ops is None:
            ops = self._ops[(method, code)] = self.m_ops.labels(method, _code_name(code))
        ops.inc()
        latency = self._latency.get(method)
        if latency is None:
            latency = self._latency[method] = self.m_latency.labels(method)
        latency.observe(time.perf_counter() - start)

    def _read_failed(self, code: int) -> None:
        counter = self._read_failures.get(code)
        if counter is None:
            counter = self._read_failures[code] = self.m_read_failures.labels(_code_name(code))
        counter.inc()

    def _refused(self, method: str, e: FS3Error) -> FS3Error:
        self._done(method, time.perf_counter(), int(e.code))
        return e

    def _members_only(self, method: str) -> FS3Error:
        """The error for a user connection's call of a method only cluster members may call."""
        return self._refused(
            method, FS3Error(StatusCode.PERMISSION_DENIED, f"storage {method} is for cluster members only")
        )

    def _verifier(self, method: str) -> CapabilityVerifier:
        if self.capabilities is None:
            raise self._refused(
                method,
                FS3Error(StatusCode.PERMISSION_DENIED, "this storage service takes no user connections"),
            )
        return self.capabilities

    def _check_user_write(self, request: storage_pb2.WriteReq, user: Any) -> None:
        """A user connection writes data into chunks of a file it holds a WRITE capability of;
        truncating and removing chunks is meta's. Its tag is made its user's (:func:`fs3.net.auth.user_scoped_id`)."""
        if request.io.type != storage_pb2.UPDATE_WRITE:
            raise self._refused(
                "Write",
                FS3Error(
                    StatusCode.PERMISSION_DENIED,
                    "only cluster members truncate or remove chunks (meta does, for a file's truncate "
                    "and removal)",
                ),
            )
        verifier = self._verifier("Write")
        try:
            verifier.check(
                request.capability,
                request.io.key.inode_id,
                capability.WRITE,
                request.io.key.chain_id,
                request.io.chunk_size,
            )
        except FS3Error as e:
            raise self._refused("Write", e) from None
        if request.tag.client_id:
            request.tag.client_id = user_scoped_id(user.uid, request.tag.client_id)

    def _check_user_reads(
        self, ios: Sequence[storage_pb2.ReadIO], outcomes: list[tuple[bytes, int, int] | BaseException | None]
    ) -> int:
        """Refuse each read of a user connection whose capability does not grant reading its
        chunk's file (its outcome becomes the error); returns how many were refused."""
        verifier = self._verifier("BatchRead")
        refused = 0
        for i, io in enumerate(ios):
            try:
                verifier.check(io.capability, io.key.inode_id, capability.READ, io.key.chain_id)
            except FS3Error as e:
                outcomes[i] = e.with_traceback(None)  # see craq.read_error
                refused += 1
        return refused

    async def _timed(self, method: str, coro):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            result = await coro
        except FS3Error as e:
            self._done(method, start, int(e.code))
            raise
        except asyncio.CancelledError:  # the caller went away, or the server stops
            self._done(method, start, int(StatusCode.CANCELLED))
            raise
        except Exception:
            self._done(method, start, int(StatusCode.INTERNAL))
            raise
        self._done(method, start)
        return result

    # -- data path --------------------------------------------------------------------------------

    async def write(
        self, request: storage_pb2.WriteReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.IOResult:
        if ctx.user is not None:
            self._check_user_write(request, ctx.user)
        r = await self._timed("Write", self.rep.client_update(request, payload))
        if request.io.type == storage_pb2.UPDATE_WRITE:
            self._write_bytes.inc(request.io.length)
        return r

    async def update(
        self, request: storage_pb2.UpdateReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.IOResult:
        if ctx.user is not None:
            raise self._members_only("Update")
        return await self._timed("Update", self.rep.chain_update(request, payload, ctx.deadline, ctx.closed))

    @inline  # a small read of a chunk with no update in flight never waits (craq.INLINE_READ_BYTES)
    async def batch_read(
        self, request: storage_pb2.BatchReadReq, payload: memoryview | None, ctx: CallContext
    ) -> tuple[storage_pb2.BatchReadRsp, bytes | None]:
        start = time.perf_counter()
        if len(request.ios) > MAX_BATCH_READS:
            raise self._refused(
                "BatchRead",
                FS3Error(StatusCode.INVALID_ARGUMENT, f"more than {MAX_BATCH_READS} reads in one batch"),
            )
        total = sum(io.length for io in request.ios)
        if total > MAX_BATCH_READ_BYTES:
            raise self._refused(
                "BatchRead",
                FS3Error(
                    StatusCode.INVALID_ARGUMENT,
                    f"batch asks for {total} bytes, more than {MAX_BATCH_READ_BYTES}",
                ),
            )
        outcomes: list[tuple[bytes, int, int] | BaseException | None] = [None] * len(request.ios)
        # a user connection's reads without a capability for their file fail, each on its own
        refused = self._check_user_reads(request.ios, outcomes) if ctx.user is not None else 0
        # Small reads of chunks with no update in flight are served at once (this handler runs
        # inline, so a batch of them costs no task and no trip to the I/O threads), up to a budget
        # that keeps the event loop from stalling on a large batch; the rest go the long way.
        # Cold reads that native AIO can serve come back as plans, submitted together below.
        slow: list[int] = []
        planned: list[tuple[int, AioPlan]] = []
        budget = INLINE_BATCH_READ_BYTES
        lone = len(request.ios) == 1
        for i, io in enumerate(request.ios):
            if refused and outcomes[i] is not None:
                continue
            if io.length <= budget:
                try:
                    o = self.rep.read_now(io, lone=lone)
                except Exception as e:  # noqa: BLE001 - reported per read below, as gather would
                    o = read_error(e)
                if isinstance(o, AioPlan):
                    planned.append((i, o))
                    continue
                if o is not None:
                    outcomes[i] = o
                    budget -= io.length
                    continue
            slow.append(i)
        inline = len(outcomes) - len(slow) - len(planned) - refused
        if inline:
            self._inline_reads.inc(inline)
        if slow or planned:
            ios = request.ios
            done, by_aio, on_loop = await self.rep.read_many(
                [ios[i] for i in slow], [(ios[i], p) for i, p in planned]
            )
            for i, o in zip(slow + [i for i, _ in planned], done, strict=True):
                outcomes[i] = o
            if by_aio:
                self._aio_reads.inc(by_aio)
            if on_loop:
                self._inline_reads.inc(on_loop)
            if len(slow) + len(planned) > by_aio + on_loop:
                self._thread_reads.inc(len(slow) + len(planned) - by_aio - on_loop)
        rsp = storage_pb2.BatchReadRsp()
        parts: list[bytes] = []
        pos = 0
        for io, o in zip(request.ios, outcomes, strict=True):
            res = rsp.results.add()
            if isinstance(o, BaseException):
                if not isinstance(o, FS3Error):
                    if isinstance(o, asyncio.CancelledError):
                        raise o
                    log.error("read failed", exc_info=o)
                    o = FS3Error(StatusCode.INTERNAL, repr(o))
                elif o.code == StatusCode.STORAGE_CHECKSUM_MISMATCH and not request.for_repair:
                    self._damaged_read(io.key, o)
                self._read_failed(int(o.code))
                res.status.code = int(o.code)
                res.status.message = o.message
                continue
            assert o is not None
            data, crc, version = o
            res.length = len(data)
            res.payload_offset = pos
            res.crc32c = crc
            res.committed_version = version
            parts.append(data)
            pos += len(data)
        self._read_bytes.inc(pos)
        self._done("BatchRead", start)
        if not parts:
            return rsp, None
        if len(parts) == 1:
            # an O_DIRECT read's lent buffer goes back once the reply has left
            part = parts[0]
            return (rsp, part, functools.partial(release_read, part)) if lent_buffer(part) else (rsp, part)
        if pos > JOIN_OFF_LOOP_BYTES:
            joined = await asyncio.get_running_loop().run_in_executor(None, b"".join, parts)
        else:
            joined = b"".join(parts)
        for part in parts:
            release_read(part)
        return rsp, joined

    def _damaged_read(self, key: storage_pb2.ChunkKey, error: FS3Error) -> None:
        """A read found this daemon's copy of a chunk damaged (its bytes fail their checksums, its
        file is missing, or the chain lost the version): the reader goes to another replica; this
        copy is counted, and repaired from another replica in the background."""
        try:
            t = self.targets.of_chain(key.chain_id)
        except FS3Error:
            return
        counter = self._damaged.get(t.target_id)
        if counter is None:
            counter = self._damaged[t.target_id] = self.m_damaged.labels(str(t.target_id))
        counter.inc()
        if self.rep.repair_soon(t, chunk_id(key.inode_id, key.chunk_index)):
            log.warning(
                "read found a damaged copy, repairing it from another replica target_id=%d "
                "chain_id=%d inode=%#x chunk_index=%d error=%s",
                t.target_id,
                key.chain_id,
                key.inode_id,
                key.chunk_index,
                error.message,
            )

    async def query_committed(
        self, request: storage_pb2.QueryCommittedReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.QueryCommittedRsp:
        if ctx.user is not None:
            raise self._members_only("QueryCommitted")
        return await self._timed("QueryCommitted", self.rep.query_committed(request))

    # -- file-level operations --------------------------------------------------------------------

    async def query_last_chunk(
        self, request: storage_pb2.QueryLastChunkReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.QueryLastChunkRsp:
        if ctx.user is not None:
            raise self._members_only("QueryLastChunk")

        async def run() -> storage_pb2.QueryLastChunkRsp:
            t = self.targets.of_chain(request.chain_id)
            self.targets.check_readable(t)
            begin, end = file_range(request.inode_id)
            last = await t.engine.query_last_chunk(begin, end)
            if last.chunk_id is None:
                return storage_pb2.QueryLastChunkRsp(found=False)
            return storage_pb2.QueryLastChunkRsp(
                found=True,
                last_chunk_index=split_chunk_id(last.chunk_id)[1],
                last_chunk_length=last.length,
                total_length=last.total_length,
                chunk_count=last.count,
            )

        return await self._timed("QueryLastChunk", run())

    async def remove_chunks(
        self, request: storage_pb2.RemoveChunksReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.RemoveChunksRsp:
        if ctx.user is not None:
            raise self._members_only("RemoveChunks")
        if request.end_index and request.end_index < request.begin_index:
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT,
                f"chunk range {request.begin_index}..{request.end_index} is reversed",
            )
        removed = await self._timed("RemoveChunks", self.rep.remove_chunks(request))
        return storage_pb2.RemoveChunksRsp(removed=removed)

    async def truncate_chunks(
        self, request: storage_pb2.TruncateChunksReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.TruncateChunksRsp:
        if ctx.user is not None:
            raise self._members_only("TruncateChunks")
        return await self._timed("TruncateChunks", self.rep.truncate_chunks(request, ctx.deadline))

    # -- membership -------------------------------------------------------------------------------

    async def sync_start(
        self, request: storage_pb2.SyncStartReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.SyncStartRsp:
        if ctx.user is not None:
            raise self._members_only("SyncStart")
        return await self._timed("SyncStart", self._sync_start(request, ctx))

    async def _sync_start(
        self, request: storage_pb2.SyncStartReq, ctx: CallContext
    ) -> storage_pb2.SyncStartRsp:
        t = self.targets.target(request.target_id)
        await self.rep.check_chain_version(t, request.chain_id, request.chain_version, who="sync predecessor")
        if t.chain_id != request.chain_id or t.public_state != common_pb2.SYNCING or t.local_state != ONLINE:
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE,
                f"target {t.target_id} is {common_pb2.PublicTargetState.Name(t.public_state)}/{t.state_name}, "
                "not SYNCING/ONLINE",
            )
        self._sync_starts[t.target_id] = (request.chain_id, request.chain_version)
        log.info(
            "sync start target_id=%d chain_id=%d chain_version=%d from=%s",
            t.target_id,
            t.chain_id,
            request.chain_version,
            ctx.peer,
        )
        return storage_pb2.SyncStartRsp()

    async def sync_done(
        self, request: storage_pb2.SyncDoneReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.SyncDoneRsp:
        """The predecessor has copied this target everything it lacked: it is UPTODATE.

        Only for the sync whose SyncStart this daemon accepted, at the same chain version: a sync
        that began before the chain changed (this target went OFFLINE and came back SYNCING, say)
        or before this daemon restarted compared chunk lists that miss the writes committed
        without this target meanwhile, and vouches for nothing."""
        if ctx.user is not None:
            raise self._members_only("SyncDone")
        return await self._timed("SyncDone", self._sync_done(request, ctx))

    async def _sync_done(self, request: storage_pb2.SyncDoneReq, ctx: CallContext) -> storage_pb2.SyncDoneRsp:
        t = self.targets.target(request.target_id)
        await self.rep.check_chain_version(t, request.chain_id, request.chain_version, who="sync predecessor")
        if t.public_state != common_pb2.SYNCING or t.local_state == 3:
            raise FS3Error(StatusCode.STORAGE_ROUTING_STALE, f"target {t.target_id} is not syncing")
        started = self._sync_starts.get(t.target_id)
        if started != (request.chain_id, request.chain_version):
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE,
                f"SyncDone for target {t.target_id} at chain {request.chain_id} version "
                f"{request.chain_version}, but its last accepted SyncStart was "
                + (f"at chain {started[0]} version {started[1]}" if started else "none (since a restart)"),
            )
        self.targets.set_state(t, UPTODATE, "resync done")
        return storage_pb2.SyncDoneRsp()

    # -- inspection -------------------------------------------------------------------------------

    async def space_info(
        self, request: storage_pb2.SpaceInfoReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.SpaceInfoRsp:
        if ctx.user is not None:
            raise self._members_only("SpaceInfo")
        return await self._timed("SpaceInfo", self._space_info(request, ctx))

    async def _space_info(
        self, request: storage_pb2.SpaceInfoReq, ctx: CallContext
    ) -> storage_pb2.SpaceInfoRsp:
        ids = list(request.target_ids) or list(self.targets.targets)
        rsp = storage_pb2.SpaceInfoRsp()
        for tid in ids:
            t = self.targets.target(tid)
            s = await t.engine.space_info()
            rsp.targets.add(
                target_id=tid,
                capacity=s.capacity,
                used=s.used,
                free=s.free,
                chunks=s.chunk_count,
                device=s.device,
                available=s.available,
                free_total=s.free_total,
            )
        return rsp

    async def dump_chunk_meta(
        self, request: storage_pb2.DumpChunkMetaReq, payload: memoryview | None, ctx: CallContext
    ) -> storage_pb2.DumpChunkMetaRsp:
        if ctx.user is not None:
            raise self._members_only("DumpChunkMeta")
        return await self._timed("DumpChunkMeta", self._dump_chunk_meta(request, ctx))

    async def _dump_chunk_meta(
        self, request: storage_pb2.DumpChunkMetaReq, ctx: CallContext
    ) -> storage_pb2.DumpChunkMetaRsp:
        t = self.targets.target(request.target_id)
        limit = min(request.limit or DUMP_PAGE, DUMP_PAGE)
        begin, end = file_range(request.inode_id) if request.inode_id else (b"", None)
        if request.after:
            begin = max(begin, request.after + b"\0")
        eng = t.engine.engine

        def page() -> list[ChunkMeta]:
            return list(itertools.islice(eng.iter_metas(begin, end), limit + 1))

        metas = await self.rep._run(t, page)
        rsp = storage_pb2.DumpChunkMetaRsp(more=len(metas) > limit)
        for m in metas[:limit]:
            c = rsp.chunks.add(
                committed_version=m.committed_ver,
                pending_version=m.pending_ver,
                chain_version=m.chain_ver,
                length=m.length,
                crc32c=m.crc,
                chunk_size=m.chunk_size,
                chunk_id=m.chunk_id,
                lost=m.committed is not None and m.committed.lost,
                damaged=eng.damaged(m),
            )
            c.key.chain_id = t.chain_id
            c.key.inode_id, c.key.chunk_index = split_chunk_id(m.chunk_id)
        return rsp


class _TargetMetrics:
    """Per target, from its engine when scraped: its space; the moving average of the event loop's
    reads that waited for the disk, and whether such reads are off the loop (disk slow); the
    chunk-metadata group commit; the fsyncs of chunk files and their directories."""

    def __init__(self, targets: TargetMap) -> None:
        self._targets = targets

    def collect(self) -> Iterator[Metric]:
        targets = list(self._targets.targets.values())
        engines = [(str(t.target_id), t.engine.engine) for t in targets]
        yield from self._space(targets)
        yield from self._cold_reads(engines)
        changes = CounterMetricFamily(
            "fs3_storage_chunk_meta_changes", "chunk metadata changes recorded", labels=("target",)
        )
        commits = CounterMetricFamily(
            "fs3_storage_chunk_meta_commits",
            "LMDB write transactions that recorded them (group commit, two flushes each)",
            labels=("target",),
        )
        commit_s = CounterMetricFamily(
            "fs3_storage_chunk_meta_commit_seconds", "time in those transactions", labels=("target",)
        )
        syncs = CounterMetricFamily(
            "fs3_storage_chunk_file_syncs",
            "fsyncs of chunk data files (what=file) and of new files' directories (what=dir)",
            labels=("target", "what"),
        )
        sync_s = CounterMetricFamily(
            "fs3_storage_chunk_file_sync_seconds", "time in those fsyncs", labels=("target", "what")
        )
        for target, eng in engines:
            st = eng.commit_stats()
            changes.add_metric((target,), st.changes)
            commits.add_metric((target,), st.transactions)
            commit_s.add_metric((target,), st.commit_seconds)
            for what, (count, seconds) in eng.file_sync_stats().items():
                syncs.add_metric((target, what), count)
                sync_s.add_metric((target, what), seconds)
        yield from (changes, commits, commit_s, syncs, sync_s)

    @staticmethod
    def _space(targets: list[LocalTarget]) -> Iterator[Metric]:
        """Its file system's capacity, free bytes and what writes may still use (free less
        ``keep_free``), its chunks' bytes and count, and the low-space flag it reports to mgmtd
        (meta places no new files on its chain while it is 1). A failed target has none."""
        help_ = {
            "capacity_bytes": "size of the file system holding the target",
            "free_bytes": "free bytes of that file system (targets on one disk each report it)",
            "available_bytes": "free bytes writes may still use: free less the part keep_free keeps",
            "used_bytes": "bytes of the target's chunk data files",
            "chunks": "chunks the target holds",
            "low_space": "1 while the target reports itself low on space (under 4% free)",
        }
        gauges = {
            name: GaugeMetricFamily(f"fs3_storage_target_{name}", text, labels=("target",))
            for name, text in help_.items()
        }
        for t in targets:
            try:
                space = t.engine.engine.space_info()
            except FS3Error:
                continue  # failed: nothing to say about its disk
            label = (str(t.target_id),)
            gauges["capacity_bytes"].add_metric(label, space.capacity)
            gauges["free_bytes"].add_metric(label, space.free)
            gauges["available_bytes"].add_metric(label, space.available)
            gauges["used_bytes"].add_metric(label, space.used)
            gauges["chunks"].add_metric(label, space.chunk_count)
            gauges["low_space"].add_metric(label, 1 if t.low_space else 0)
        yield from gauges.values()

    @staticmethod
    def _cold_reads(engines: list[tuple[str, Any]]) -> Iterator[Metric]:
        avg = GaugeMetricFamily(
            "fs3_storage_cold_read_seconds",
            "moving average of small reads the event loop waited for the disk for",
            labels=("target",),
        )
        off = GaugeMetricFamily(
            "fs3_storage_cold_reads_off_loop",
            "1 while the disk is slow: small reads that miss the page cache are read off the event "
            "loop (native AIO, or I/O threads without it)",
            labels=("target",),
        )
        for target, eng in engines:
            cold = eng.cold_reads
            avg.add_metric((target,), cold.avg_s)
            off.add_metric((target,), 1 if cold.off_loop else 0)
        yield avg
        yield off
