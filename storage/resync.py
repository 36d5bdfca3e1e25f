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
the sync's copy of that chunk, so whichever comes last carries the newest content.
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
        self._loop = Periodic(
            "fs3-resync", self._scan_step, interval_s, on_error=lambda _e: log.exception("resync scan failed")
        )
        reg = registry or metrics.registry()
        self.m_total = metrics.gauge(
            "fs3_storage_sync_chunks", "chunks the running resync of a target compares", ("target",), reg
        )
        self.m_done = metrics.gauge(
            "fs3_storage_sync_chunks_done",
            "chunks the running resync of a target has handled",
            ("target",),
            reg,
        )
        self.m_sent = metrics.counter(
            "fs3_storage_sync_sent_chunks", "chunks resync sent (replaces and removals)", ("target",), reg
        )
        self.m_bytes = metrics.counter("fs3_storage_sync_sent_bytes", "bytes resync sent", ("target",), reg)
        self.m_runs = metrics.counter(
            "fs3_storage_sync_runs", "resyncs finished, by outcome", ("target", "outcome"), reg
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
            self._tasks[key] = asyncio.create_task(
                self._sync(t, succ.target_id), name=f"fs3-resync-{t.chain_id}-{succ.target_id}"
            )

    def _still_successor(self, t: LocalTarget, succ_id: int) -> bool:
        chain = self.targets.routing.chains.get(t.chain_id)
        if chain is None or t.local_state != UPTODATE:
            return False
        succ = chain.successor(t.target_id)
        return succ is not None and succ.target_id == succ_id and succ.public_state == common_pb2.SYNCING

    async def _sync(self, t: LocalTarget, succ_id: int) -> None:
        key = (t.chain_id, succ_id)
        label = str(succ_id)
        started = time.monotonic()
        try:
            stats = await self._sync_once(t, succ_id, label)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._retry_at[key] = time.monotonic() + 1.0
            self.m_runs.labels(label, "failed").inc()
            level = logging.INFO if isinstance(e, FS3Error) else logging.ERROR
            log.log(level, "resync failed chain_id=%d target_id=%d error=%s", t.chain_id, succ_id, e)
            return
        self.m_runs.labels(label, "done").inc()
        log.info(
            "resync done chain_id=%d target_id=%d chunks=%d sent=%d removed=%d seconds=%.2f",
            t.chain_id,
            succ_id,
            stats[0],
            stats[1],
            stats[2],
            time.monotonic() - started,
        )

    async def _sync_once(self, t: LocalTarget, succ_id: int, label: str) -> tuple[int, int, int]:
        rep = self.replicator
        chain = self.targets.chain(t.chain_id)
        address = node_address(self.targets.routing, succ_id, backend=True)
        log.info(
            "resync start chain_id=%d from=%d to=%d chain_version=%d",
            t.chain_id,
            t.target_id,
            succ_id,
            chain.version,
        )
        await rep.rpc.call(
            address,
            STORAGE_SERVICE["SyncStart"],
            storage_pb2.SyncStartReq(target_id=succ_id, chain_id=t.chain_id, chain_version=chain.version),
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
        todo, total = await rep._run(_differing, metas, remote)
        self.m_total.labels(label).set(total)
        self.m_done.labels(label).set(total - len(todo))
        sent = removed = 0
        pending = iter(todo)

        async def worker() -> None:
            nonlocal sent, removed
            for cid in pending:
                if not self._still_successor(t, succ_id):
                    raise FS3Error(StatusCode.STORAGE_ROUTING_STALE, "chain changed during resync")
                what = await self._copy_chunk(t, succ_id, cid, label)
                if what == "removed":
                    removed += 1
                else:
                    sent += 1
                self.m_done.labels(label).inc()

        await asyncio.gather(*(worker() for _ in range(_CONCURRENCY)))
        if not self._still_successor(t, succ_id):
            raise FS3Error(StatusCode.STORAGE_ROUTING_STALE, "chain changed during resync")
        chain = self.targets.chain(t.chain_id)
        await rep.rpc.call(
            node_address(self.targets.routing, succ_id, backend=True),
            STORAGE_SERVICE["SyncDone"],
            storage_pb2.SyncDoneReq(target_id=succ_id, chain_id=t.chain_id, chain_version=chain.version),
            timeout=rep.rpc_timeout_s,
        )
        return total, sent, removed

    async def _copy_chunk(self, t: LocalTarget, succ_id: int, cid: bytes, label: str) -> str:
        """Send the successor this chunk's committed version (or its removal), under the lock."""
        rep = self.replicator
        async with rep.locks.hold(t.target_id, cid):
            meta = await t.engine.get_meta(cid)
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
                outcome = "removed"
            else:
                r = await t.engine.read(cid, 0, None, version=meta.committed_ver)
                io.type = storage_pb2.UPDATE_REPLACE
                io.chunk_size = meta.chunk_size
                io.update_version = meta.committed_ver
                io.length = len(r.data)
                io.crc32c = r.chunk_crc
                payload = r.data
                outcome = "sent"
                self.m_bytes.labels(label).inc(len(r.data))
            await rep.rpc.call(
                node_address(self.targets.routing, succ_id, backend=True),
                STORAGE_SERVICE["Update"],
                req,
                payload=payload,
                timeout=rep.rpc_timeout_s,
            )
            self.m_sent.labels(label).inc()
            return outcome


def _differing(metas: list[ChunkMeta], remote: dict[bytes, storage_pb2.ChunkMeta]) -> tuple[list[bytes], int]:
    """Ids of the chunks the successor must be sent (or have removed), in id order, and how many
    chunks were compared."""
    mine = {m.chunk_id: m for m in metas}
    out = [cid for cid, m in mine.items() if cid not in remote or not _same(m, remote[cid])]
    out += [cid for cid in remote if cid not in mine]
    out.sort()
    return out, len(mine.keys() | remote.keys())


def _same(mine: ChunkMeta, theirs: storage_pb2.ChunkMeta) -> bool:
    """Whether the successor's copy matches our committed version (and has nothing pending)."""
    return (
        mine.committed is not None
        and mine.pending is None
        and theirs.pending_version == 0
        and theirs.committed_version == mine.committed_ver
        and theirs.length == mine.committed.length
        and theirs.crc32c == mine.committed.crc
        and theirs.chunk_size == mine.chunk_size
    )
