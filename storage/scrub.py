"""Scrub: read every committed chunk copy of this daemon's targets back, slowly, and repair the
damaged ones.

Every read checks the CRC32C of each block it reads, and a read that finds this daemon's copy
damaged has it repaired from another replica (``Replicator.repair_soon``); but a copy nobody reads
(a checkpoint kept for months) could rot unseen on one disk while its other replicas rot on
theirs. The scrubber (off unless ``scrub_mib_per_s`` is set) reads each target's committed chunks
in id order, at most ``bytes_per_s`` for the whole daemon (each chunk costing at least
CHUNK_COST_MIN), through the same checked read as clients; a copy that fails its checksums (or
misses a file) is counted, logged and repaired from another SERVING replica
(``Replicator.repair_damaged``). A pass starts ``start_delay_s`` after the daemon starts and then
every ``interval_s`` (back to back when a pass takes longer). Only targets that are SERVING and up
to date are scrubbed: a SYNCING one is being made whole by its resync.

A read races with updates: the version it reads may be replaced (its files removed) while it
reads. Each chunk's metadata is read again just before its read, and a failure counts only when
that metadata is unchanged after it. A read error of the disk (EIO) takes the target offline, as
a client's read does (see ``ChunkEngine._error``): not repaired here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from prometheus_client import CollectorRegistry

from fs3 import metrics
from fs3.background import cancel_and_wait
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2

from .chunk_meta import ChunkMeta
from .craq import Replicator
from .target_map import UPTODATE, LocalTarget

log = logging.getLogger(__name__)

_PAGE = 256  # chunk metadata read per trip to a target's I/O threads
# bytes of a chunk read back at once (each read checks the checksum blocks it covers)
READ_WINDOW = 4 << 20
# the least a chunk costs of the scrub's rate, however small
CHUNK_COST_MIN = 64 << 10
# what a read of a version an update replaced or removed meanwhile fails with
_CHANGED = frozenset({StatusCode.STORAGE_CHUNK_NOT_FOUND, StatusCode.STORAGE_CHUNK_VERSION_MISMATCH})


class Scrubber:
    """Reads every committed chunk copy back, ``bytes_per_s`` at most (see the module docstring)."""

    def __init__(
        self,
        replicator: Replicator,
        *,
        bytes_per_s: float,
        interval_s: float,
        start_delay_s: float,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.replicator = replicator
        self.targets = replicator.targets
        self.bytes_per_s = bytes_per_s
        self.interval_s = interval_s
        self.start_delay_s = start_delay_s
        self._task: asyncio.Task[None] | None = None
        reg = registry or metrics.registry()
        self.m_bytes = metrics.counter(
            "fs3_storage_scrub_bytes", "bytes of committed chunk copies scrub read back", ("target",), reg
        )
        self.m_damaged = metrics.counter(
            "fs3_storage_scrub_damaged_chunks",
            "chunk copies scrub found damaged (failing their checksums, or a file missing)",
            ("target",),
            reg,
        )
        self.m_repaired = metrics.counter(
            "fs3_storage_scrub_repaired_chunks",
            "damaged chunk copies scrub had repaired from another replica",
            ("target",),
            reg,
        )
        self.m_passes = metrics.counter("fs3_storage_scrub_passes", "scrub passes finished", (), reg)

    def start(self) -> None:
        if self.bytes_per_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fs3-scrub")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        await asyncio.sleep(self.start_delay_s)
        while True:
            began = time.monotonic()
            try:
                await self.scrub_pass()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.exception("scrub pass failed")
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))

    async def scrub_pass(self) -> tuple[int, int]:
        """Read every SERVING target's committed chunks back once: (chunks read, damaged found)."""
        began = time.monotonic()
        read = damaged = 0
        for t in list(self.targets.targets.values()):
            try:
                r, d = await self._scrub_target(t)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the other targets are scrubbed all the same
                log.exception("scrub of a target failed target_id=%d", t.target_id)
                continue
            read += r
            damaged += d
        self.m_passes.inc()
        log.info("scrub pass done chunks=%d damaged=%d seconds=%.1f", read, damaged, time.monotonic() - began)
        return read, damaged

    @staticmethod
    def _scrubbable(t: LocalTarget) -> bool:
        return not t.failed and t.public_state == common_pb2.SERVING and t.local_state == UPTODATE

    async def _scrub_target(self, t: LocalTarget) -> tuple[int, int]:
        label = str(t.target_id)
        self.m_damaged.labels(label)  # at 0 from the first pass: an alert's increase() sees the first
        eng = t.engine.engine
        after = b""
        read = damaged = 0
        while self._scrubbable(t):

            def page(begin: bytes = after) -> list[ChunkMeta]:
                return list(itertools.islice(eng.iter_metas(begin, None), _PAGE))

            metas = await self.replicator._run(t, page)
            for listed in metas:
                if not self._scrubbable(t):
                    break
                # as it is now: the page may be minutes old at the rate limit
                meta = await t.engine.get_meta(listed.chunk_id)
                v = meta.committed if meta is not None else None
                if v is None or v.removal or v.lost or meta.pending is not None:  # type: ignore[union-attr]
                    continue  # nothing to read, nothing any replica could give, the chain's to settle
                read += 1
                if not await self._check(t, meta):  # type: ignore[arg-type]
                    damaged += 1
                self.m_bytes.labels(label).inc(v.length)
                # each chunk costs at least CHUNK_COST_MIN of the rate: small ones cost more than
                # their bytes (a trip to the I/O threads, the metadata)
                await asyncio.sleep(max(v.length, CHUNK_COST_MIN) / self.bytes_per_s)
            if len(metas) < _PAGE:
                break
            after = metas[-1].chunk_id + b"\0"
        return read, damaged

    async def _check(self, t: LocalTarget, meta: ChunkMeta) -> bool:
        """Read ``meta``'s committed version back; repair it if damaged. Whether it was sound."""
        v = meta.committed
        assert v is not None
        cid = meta.chunk_id
        try:
            # in windows: a 64 MiB chunk read whole would cost twice that in memory for a moment
            for offset in range(0, v.length, READ_WINDOW):
                await t.engine.read(cid, offset, min(READ_WINDOW, v.length - offset), version=v.version)
            return True
        except FS3Error as e:
            if e.code in _CHANGED:
                return True  # an update replaced or removed the version meanwhile
            if e.code != StatusCode.STORAGE_CHECKSUM_MISMATCH:
                # a disk error (the engine takes the target offline, which ends its scrub) or the
                # like: not this copy's damage
                log.warning(
                    "scrub could not read a chunk target_id=%d chunk=%s error=%s", t.target_id, cid.hex(), e
                )
                return True
            if await t.engine.get_meta(cid) != meta:
                return True  # an update replaced the version while it was read: not damage
            error = e
        label = str(t.target_id)
        self.m_damaged.labels(label).inc()
        log.warning(
            "scrub found a damaged copy, repairing it from another replica target_id=%d chunk=%s "
            "version=%d error=%s",
            t.target_id,
            cid.hex(),
            v.version,
            error.message,
        )
        if await self.replicator.repair_damaged(t, cid, v.version, why="scrub"):
            self.m_repaired.labels(label).inc()
        return False
