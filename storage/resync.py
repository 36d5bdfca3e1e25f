"""Resync: the predecessor of a SYNCING target copies it everything it lacks (reference §4.4).

The last SERVING target of a chain whose successor is SYNCING runs one sync task for it:

1. ``SyncStart`` to the successor (it checks it is SYNCING and ONLINE there too);
2. pages through the successor's chunk metadata (``DumpChunkMeta``);
3. compares with its own, chunk by chunk under the chunk's lock, and sends a whole-chunk replace of
   its committed version (installed as committed at once) for every chunk that is missing there,
   differs in version, length or checksum, or has a pending version there; and a removal for every
   chunk only the successor holds;
4. ``SyncDone``: the successor reports UPTODATE and mgmtd makes it SERVING.

Client writes keep flowing meanwhile: the chain forwards them to the SYNCING target as
whole-chunk replaces (:mod:`fs3.storage.craq`), and the per-chunk lock orders each of them against
the sync's copy of that chunk, so whichever comes last carries the newest content. An update the
SYNCING target kept failing is committed without it (``craq.SYNCING_FORWARD_GRACE_S``): the sync
running then ends without SyncDone, and the next one compares again, finding that chunk.

That holds only while the chain stays as it was at ``SyncStart``: a successor that went OFFLINE
meanwhile (and came back SYNCING) missed the writes committed while it was out, which the list of
chunks to copy, made from the metadata both sides had before, does not name. So a sync is for one
chain version: it stops (STORAGE_ROUTING_STALE, and the next one starts afresh, comparing again)
as soon as this daemon's routing shows another, and ``SyncDone`` carries that version, which the
successor accepts only from the sync it accepted the ``SyncStart`` of (``storage.service``). Chunks
the first sync copied compare equal in the next, so a restart costs a metadata comparison, not
the data again.

A chunk whose committed version this target cannot read (a lost or corrupt data file) is read
from another SERVING replica of the chain instead (each holds every committed version), checked
against this target's metadata (version, length, CRC32C), repaired here, and sent. Where no
replica has a good copy, the chain has lost that version: the sync logs it as an error (with the
chunk's id), counts it in ``fs3_storage_sync_lost_chunks``, sends the successor the version's
record marked lost (number, length, CRC32C, no bytes), and finishes, rather than keep every other
chunk of the chain one replica short for ever. The successor drops what it had of that chunk (an
older version, or nothing, which it would otherwise serve as the chunk's content, silently) and
fails its reads as the unreadable copies here do, until a write of the whole content, which
every replica takes without reading what it had, replaces it (see ``ChunkVersion.lost``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prometheus_client import CollectorRegistry

from fs3 import metrics
from fs3.background import Periodic
from fs3.client.storage_client import STORAGE_SERVICE, node_address
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2, storage_pb2

from .chain_ops import split_chunk_id
from .chunk_meta import ChunkMeta
from .craq import Replicator
from .target_map import UPTODATE, LocalTarget

log = logging.getLogger(__name__)

_CONCURRENCY = 8
# A successor resynced at a chain version is not resynced again at that version for this long: it
# shows SYNCING in this daemon's routing until mgmtd, told by its heartbeat, makes it SERVING (a
# new chain version) and pushes that; one still SYNCING after this is resynced again.
SYNCED_HOLD_S = 30.0
# A run stopped by these found the chain changed under it (a target came, went or moved): an
# interrupted run, not a failed one; the next scan starts one for the new chain if it needs it.
_CHAIN_CHANGED = frozenset({StatusCode.STORAGE_ROUTING_STALE, StatusCode.STORAGE_CHAIN_VERSION_MISMATCH})
# Tries to copy a chunk that another replica had to supply while updates kept changing it here.
_COPY_ATTEMPTS = 3


class ResyncWorker:
    """Watches routing for SYNCING successors of this daemon's targets and resyncs them."""

    def __init__(
        self,
        replicator: Replicator,
        *,
        interval_s: float = 0.5,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.replicator = replicator
        self.targets = replicator.targets
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._retry_at: dict[tuple[int, int], float] = {}
        # (chain, successor) -> (chain version, when) of the last resync that finished: this
        # daemon's routing shows the successor SYNCING at that version until mgmtd's next push,
        # and a second run then would only be refused by the successor (see _scan)
        self._synced: dict[tuple[int, int], tuple[int, float]] = {}
        self._loop = Periodic(
            "fs3-resync", self._scan_step, interval_s, on_error=lambda _e: log.exception("resync scan failed")
        )
        reg = registry or metrics.registry()
        self.m_total = metrics.gauge(
            "fs3_storage_sync_chunks",
            "chunks the running (or last finished) resync of a target compares",
            ("target",),
            reg,
        )
        self.m_done = metrics.gauge(
            "fs3_storage_sync_chunks_done",
            "chunks the running (or last finished) resync of a target has handled",
            ("target",),
            reg,
        )
        self.m_sent = metrics.counter(
            "fs3_storage_sync_sent_chunks", "chunks resync sent (replaces and removals)", ("target",), reg
        )
        self.m_bytes = metrics.counter("fs3_storage_sync_sent_bytes", "bytes resync sent", ("target",), reg)
        self.m_runs = metrics.counter(
            "fs3_storage_sync_runs",
            "resyncs finished, by outcome: done, failed, or interrupted (the chain changed during the "
            "run); exported by the predecessor that sends, labelled with the target it resyncs",
            ("target", "outcome"),
            reg,
        )
        self.m_repaired = metrics.counter(
            "fs3_storage_sync_repaired_chunks",
            "chunks resync could not read here and sent as read from another replica",
            ("target",),
            reg,
        )
        self.m_lost = metrics.counter(
            "fs3_storage_sync_lost_chunks",
            "chunks resync could not read here nor from any other replica: the target it resyncs is "
            "sent them marked lost (their reads fail until a write replaces them)",
            ("target",),
            reg,
        )

    def start(self) -> None:
        self._loop.start()

    def poke(self) -> None:
        """Look at routing now (called on every routing change)."""
        self._loop.wake()

    async def stop(self) -> None:
        await self._loop.stop()
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()

    async def _scan_step(self) -> None:
        self._scan()

    def _scan(self) -> None:
        now = time.monotonic()
        for t in list(self.targets.targets.values()):
            if t.local_state != UPTODATE or t.public_state != common_pb2.SERVING or not t.chain_id:
                continue
            chain = self.targets.routing.chains.get(t.chain_id)
            if chain is None:
                continue
            succ = chain.successor(t.target_id)
            if succ is None or succ.public_state != common_pb2.SYNCING:
                continue
            key = (t.chain_id, succ.target_id)
            task = self._tasks.get(key)
            if task is not None and not task.done():
                continue
            if now < self._retry_at.get(key, 0.0):
                continue
            synced = self._synced.get(key)
            if synced is not None and synced[0] == chain.version and now < synced[1] + SYNCED_HOLD_S:
                continue  # done at this version; routing has not caught up with that yet
            self._tasks[key] = asyncio.create_task(
                self._sync(t, succ.target_id), name=f"fs3-resync-{t.chain_id}-{succ.target_id}"
            )

    def _check_chain(self, t: LocalTarget, succ_id: int, version: int) -> None:
        """Raise STORAGE_ROUTING_STALE unless the chain is still at ``version`` (the sync's: see the
        module docstring), with ``t`` up to date and ``succ_id`` its SYNCING successor."""
        chain = self.targets.routing.chains.get(t.chain_id)
        succ = chain.successor(t.target_id) if chain is not None else None
        if (
            chain is None
            or chain.version != version
            or t.local_state != UPTODATE
            or succ is None
            or succ.target_id != succ_id
            or succ.public_state != common_pb2.SYNCING
        ):
            now = f"version {chain.version}" if chain is not None else "gone"
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE,
                f"chain {t.chain_id} changed during the resync of target {succ_id} "
                f"(started at version {version}, now {now})",
            )

    async def _sync(self, t: LocalTarget, succ_id: int) -> None:
        key = (t.chain_id, succ_id)
        label = str(succ_id)
        # the series an alert watches exist at 0 from the first run: increase() over a series
        # that appears at 1 is 0, and the first lost chunk or failed run would go unseen
        self.m_lost.labels(label)
        self.m_runs.labels(label, "failed")
        started = time.monotonic()
        version = self.targets.chain(t.chain_id).version
        try:
            stats = await self._sync_once(t, succ_id, version, label)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._retry_at[key] = time.monotonic() + 1.0
            interrupted = isinstance(e, FS3Error) and e.code in _CHAIN_CHANGED
            self.m_runs.labels(label, "interrupted" if interrupted else "failed").inc()
            level = logging.INFO if isinstance(e, FS3Error) else logging.ERROR
            log.log(
                level,
                "resync %s chain_id=%d target_id=%d error=%s",
                "interrupted" if interrupted else "failed",
                t.chain_id,
                succ_id,
                e,
            )
            return
        self._synced[key] = (version, time.monotonic())
        self.m_runs.labels(label, "done").inc()
        log.log(
            logging.ERROR if stats[3] else logging.INFO,
            "resync done chain_id=%d target_id=%d chunks=%d sent=%d removed=%d lost=%d seconds=%.2f",
            t.chain_id,
            succ_id,
            *stats,
            time.monotonic() - started,
        )

    async def _sync_once(
        self, t: LocalTarget, succ_id: int, version: int, label: str
    ) -> tuple[int, int, int, int]:
        """One sync of ``succ_id`` from ``t`` at chain version ``version``: (chunks compared,
        sent, removed, lost)."""
        rep = self.replicator
        skips = rep.forward_skips(t.chain_id, succ_id)
        address = node_address(self.targets.routing, succ_id, backend=True)
        log.info(
            "resync start chain_id=%d from=%d to=%d chain_version=%d",
            t.chain_id,
            t.target_id,
            succ_id,
            version,
        )
        await rep.rpc.call(
            address,
            STORAGE_SERVICE["SyncStart"],
            storage_pb2.SyncStartReq(target_id=succ_id, chain_id=t.chain_id, chain_version=version),
            timeout=rep.rpc_timeout_s,
        )
        remote: dict[bytes, storage_pb2.ChunkMeta] = {}
        after = b""
        while True:
            rsp, _ = await rep.rpc.call(
                address,
                STORAGE_SERVICE["DumpChunkMeta"],
                storage_pb2.DumpChunkMetaReq(target_id=succ_id, after=after),
                timeout=rep.rpc_timeout_s,
            )
            for m in rsp.chunks:
                remote[m.chunk_id] = m
            if not rsp.more or not rsp.chunks:
                break
            after = rsp.chunks[-1].chunk_id
        metas = await t.engine.dump_metadata()
        # Only the chunks that differ need the chain's attention; finding them is done off the
        # event loop (a target may hold millions of chunks).
        todo, total = await rep._run(t, _differing, metas, remote)
        # the comparison took a while: a successor that left the chain meanwhile missed writes
        # that are not in ``todo``
        self._check_chain(t, succ_id, version)
        self.m_total.labels(label).set(total)
        self.m_done.labels(label).set(total - len(todo))
        try:
            counts = await self._copy_all(t, succ_id, version, todo, label, skips)
        except BaseException:
            # no resync of it runs now: the dashboards' chunks left must not stay at this run's
            # (a finished run's stay: nothing left)
            for gauge in (self.m_total, self.m_done):
                with contextlib.suppress(KeyError):
                    gauge.remove(label)
            raise
        return total, counts["sent"], counts["removed"], counts["lost"]

    async def _copy_all(
        self, t: LocalTarget, succ_id: int, version: int, todo: list[bytes], label: str, skips: int
    ) -> dict[str, int]:
        """Copy the chunks ``todo`` to the successor and end its sync: how many were sent,
        removed and lost. ``skips``: the successor's count of updates not forwarded to it when
        the sync started (``Replicator.forward_skips``): one more since, and it ends unfinished."""
        rep = self.replicator
        counts = {"sent": 0, "removed": 0, "lost": 0}
        pending = iter(todo)

        async def worker() -> None:
            for cid in pending:
                self._check_chain(t, succ_id, version)
                counts[await self._copy_chunk(t, succ_id, cid, label)] += 1
                self.m_done.labels(label).inc()

        workers = [asyncio.create_task(worker()) for _ in range(_CONCURRENCY)]
        try:
            await asyncio.gather(*workers)
        finally:
            # one worker's failure ends the sync: the others must not copy on behind it
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        self._check_chain(t, succ_id, version)
        if rep.forward_skips(t.chain_id, succ_id) != skips:
            # an update this sync may have compared the chunk of before it was written here did
            # not reach the successor: comparing again (the next run) finds it
            raise FS3Error(
                StatusCode.STORAGE_ROUTING_STALE,
                f"updates of chain {t.chain_id} were not forwarded to target {succ_id} during its "
                "resync (it failed them): starting over",
            )
        # from here on (no await between the check above and this), every update waits for it
        rep.sync_done(t.chain_id, succ_id, version)
        await rep.rpc.call(
            node_address(self.targets.routing, succ_id, backend=True),
            STORAGE_SERVICE["SyncDone"],
            storage_pb2.SyncDoneReq(target_id=succ_id, chain_id=t.chain_id, chain_version=version),
            timeout=rep.rpc_timeout_s,
        )
        return counts

    async def _copy_chunk(self, t: LocalTarget, succ_id: int, cid: bytes, label: str) -> str:
        """Send the successor this chunk's committed version (or its removal), under the lock:
        "sent" or "removed"; "lost" where neither this target nor another replica could read the
        committed version (see the module docstring)."""
        rep = self.replicator
        fetched: tuple[ChunkMeta, bytes] | None = None  # another replica's copy, for that metadata
        for _ in range(_COPY_ATTEMPTS):
            async with rep.locks.hold(t.target_id, cid):
                meta = await t.engine.get_meta(cid)
                if meta is None or meta.committed is None:
                    await self._send(t, succ_id, cid, None, b"", label)
                    return "removed"
                data = fetched[1] if fetched is not None and fetched[0] == meta else None
                repaired = data is not None
                if data is not None:
                    await rep.repair_copy(t, cid, meta, data, why="resync")
                else:
                    try:
                        data = (await t.engine.read(cid, 0, None, version=meta.committed_ver)).data
                    except FS3Error as e:
                        if e.code != StatusCode.STORAGE_CHECKSUM_MISMATCH:
                            raise
                        log.warning(
                            "resync cannot read chunk here, asking the other replicas chain_id=%d "
                            "target_id=%d chunk=%s version=%d error=%s",
                            t.chain_id,
                            t.target_id,
                            cid.hex(),
                            meta.committed_ver,
                            e,
                        )
                        data = None
                if data is not None:
                    await self._send(t, succ_id, cid, meta, data, label)
                    if repaired:
                        self.m_repaired.labels(label).inc()
                    return "sent"
            # Outside the lock: a replica asked for its copy may ask this one, the chain's last
            # SERVING target, which version is committed, and that takes the lock.
            copy = await rep.fetch_copy(t, cid, meta)
            if copy is not None:
                fetched = (meta, copy)
                continue
            async with rep.locks.hold(t.target_id, cid):
                if await t.engine.get_meta(cid) == meta:
                    log.error(
                        "resync records a chunk no replica can read as lost on the successor: the "
                        "chain has lost its committed version chain_id=%d target_id=%d successor=%d "
                        "chunk=%s version=%d length=%d",
                        t.chain_id,
                        t.target_id,
                        succ_id,
                        cid.hex(),
                        meta.committed_ver,
                        meta.committed.length,
                    )
                    await self._send(t, succ_id, cid, meta, None, label)
                    self.m_lost.labels(label).inc()
                    return "lost"
            # else an update changed the chunk meanwhile: look at it again
        raise FS3Error(StatusCode.ABORTED, f"chunk {cid.hex()} kept changing during its resync")

    async def _send(
        self, t: LocalTarget, succ_id: int, cid: bytes, meta: ChunkMeta | None, data: bytes | None, label: str
    ) -> None:
        """Send the successor ``data``, the committed version ``meta`` names, installed as committed
        at once; or the chunk's removal where ``meta`` is None; or, where ``data`` is None, that
        version's record as lost. The chunk's lock is held."""
        rep = self.replicator
        chain = self.targets.chain(t.chain_id)
        req = storage_pb2.UpdateReq(target_id=succ_id, syncing=True, commit=True)
        io = req.io
        io.key.chain_id = t.chain_id
        io.key.chain_version = chain.version
        io.key.inode_id, io.key.chunk_index = split_chunk_id(cid)
        payload = None
        if meta is None or meta.committed is None:
            io.type = storage_pb2.UPDATE_REMOVE
            io.update_version = 1
        else:
            io.type = storage_pb2.UPDATE_REPLACE
            io.chunk_size = meta.chunk_size
            io.update_version = meta.committed_ver
            io.crc32c = meta.committed.crc
            if data is None:
                req.lost = True
                io.length = meta.committed.length
            else:
                io.length = len(data)
                payload = data
        await rep.rpc.call(
            node_address(self.targets.routing, succ_id, backend=True),
            STORAGE_SERVICE["Update"],
            req,
            payload=payload,
            timeout=rep.rpc_timeout_s,
        )
        # sent once the successor took it, as the chunk is counted (a failed call sends it again)
        if payload is not None:
            self.m_bytes.labels(label).inc(len(payload))
        self.m_sent.labels(label).inc()


def _differing(metas: list[ChunkMeta], remote: dict[bytes, storage_pb2.ChunkMeta]) -> tuple[list[bytes], int]:
    """Ids of the chunks the successor must be sent (or have removed), in id order, and how many
    chunks were compared."""
    mine = {m.chunk_id: m for m in metas}
    out = [cid for cid, m in mine.items() if cid not in remote or not _same(m, remote[cid])]
    out += [cid for cid in remote if cid not in mine]
    out.sort()
    return out, len(mine.keys() | remote.keys())


def _same(mine: ChunkMeta, theirs: storage_pb2.ChunkMeta) -> bool:
    """Whether the successor's copy matches our committed version (and has nothing pending, and
    can be read there)."""
    return (
        mine.committed is not None
        and mine.pending is None
        and theirs.pending_version == 0
        and not theirs.damaged
        and theirs.committed_version == mine.committed_ver
        and theirs.length == mine.committed.length
        and theirs.crc32c == mine.committed.crc
        and theirs.chunk_size == mine.chunk_size
        and theirs.lost == mine.committed.lost
    )
