"""The garbage collector: removes the chunks and inodes of unlinked files once no session is open on
them, and takes apart trees detached by a recursive rmdir (DESIGN §7).

GC entries (``GCQU`` + inode) are written by unlink, rename-over and rmdir in the same transaction
that drops the last link, so nothing is leaked. The collector only ever removes chunks of an inode
with no links and no sessions, and it deletes the inode and the entry in a transaction that checks
both again, so nothing is removed while reachable. Any number of meta processes may collect at once:
chunk removal is idempotent and the final transaction is conflict-checked.

A file meta issued a write capability for (to a user connection, fs3/capability.py) is collected
the same way, but its GC entry stays, naming its layout, until that capability can no longer be
used (``Inode.write_caps_until_ns`` and storage's clock skew allowance): then its chunks are removed
once more, as storage would take writes with it without knowing the file is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from fs3.background import Periodic
from fs3.capability import CLOCK_SKEW_S
from fs3.errors import FS3Error
from fs3.kv import Transaction, prefix_end
from fs3.meta import inode as inodes
from fs3.meta import schema
from fs3.meta.entries import delete_dir, drop_link, queue_gc
from fs3.meta.namespace import DIRECTORY, Namespace
from fs3.proto import meta_pb2

log = logging.getLogger(__name__)

BATCH = 256
DIR_BATCH = 128
# Unlinked files finished in one transaction.
FILE_BATCH = 64
RIPE_MARGIN_S = 0.02


class Collector:
    """Runs :meth:`collect_once` every ``interval_s`` (and at once after :meth:`wake`)."""

    def __init__(
        self,
        ns: Namespace,
        interval_s: float,
        session_timeout_s: float = 0.0,
        live_clients: Callable[[], Awaitable[frozenset[int] | None]] | None = None,
        grace_s: float = 0.0,
    ) -> None:
        """``live_clients`` names the clients whose sessions must not expire (None when that is
        unknown right now: then nothing expires this round); without it, age alone decides.
        ``grace_s``: an unlinked file is claimed no sooner than this after it was queued, so that
        an open whose lookup came just before the unlink (or a rename over the name) opens it."""
        self.ns = ns
        self.grace_s = grace_s
        self.session_timeout_s = session_timeout_s
        self.live_clients = live_clients
        self._loop = Periodic(
            "fs3-meta-gc", self._round, interval_s, on_error=lambda _e: log.exception("gc round failed")
        )
        self.removed_files = 0
        self.removed_dirs = 0
        # a wake when a young entry's grace ends, and when (loop time; uvloop's handles do not say)
        self._ripe: asyncio.Handle | None = None
        self._ripe_at = 0.0
        self._woken = False  # wake() asked for the next round
        # passes wake again for young entries ripening up to here: the latest a woken pass saw
        self._ripe_until = 0

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        if self._ripe is not None:
            self._ripe.cancel()
            self._ripe = None
        await self._loop.stop()

    def _wake_at(self, ripe_ns: int) -> None:
        """Wake the loop once a young entry's grace has run out (``ripe_ns``, this meta's clock):
        a wake spent on it (the last close of an unlinked file) would otherwise leave it to the
        next periodic round, up to ``interval_s`` later."""
        loop = asyncio.get_running_loop()
        # a little late rather than early (uvloop's timers fire to the millisecond, some early):
        # a pass that found the entry still young would not wake for it again
        when = loop.time() + max(0.0, (ripe_ns - inodes.now_ns()) / 1e9) + RIPE_MARGIN_S
        if self._ripe is not None:
            if self._ripe_at <= when:
                return
            self._ripe.cancel()

        def ripe() -> None:
            self._ripe = None
            self._loop.wake()  # not wake(): this round extends no _ripe_until

        self._ripe, self._ripe_at = loop.call_at(when, ripe), when

    def wake(self) -> None:
        self._woken = True
        self._loop.wake()

    async def _round(self) -> None:
        woken, self._woken = self._woken, False
        await self.expire_sessions()
        await self.ns.finish_abandoned_truncates()
        await self.collect_once(wake_when_ripe=woken)

    async def expire_sessions(self) -> int:
        """Prune sessions untouched for ``session_timeout_s`` whose clients are not live."""
        if self.session_timeout_s <= 0:
            return 0
        keep: frozenset[int] = frozenset()
        if self.live_clients is not None:
            live = await self.live_clients()
            if live is None:
                return 0
            keep = live
        expiry = inodes.now_ns() - int(self.session_timeout_s * 1e9)
        return await self.ns.prune_sessions(older_than_ns=expiry, keep_clients=keep)  # type: ignore[attr-defined]

    async def collect_once(self, *, wake_when_ripe: bool = False) -> int:
        """One pass over the queue; returns how many entries were finished. ``wake_when_ripe`` (a
        pass run on :meth:`wake`: the last close of an unlinked file): the entries this pass leaves
        within their grace are collected as each grace ends, each such pass waking the next, rather
        than at the next periodic round. Entries queued later wait for that round as before: were
        every pass to wake the next, while unlinks streamed in the collector would read the whole
        queue back to back."""
        done = 0
        begin = schema.GCQU
        end = prefix_end(schema.GCQU)
        while True:

            async def scan(tr: Transaction, begin: bytes = begin) -> list[tuple[bytes, bytes]]:
                return [tuple(kv) for kv in await tr.snapshot.get_range(begin, end, BATCH)]

            rows = await self.ns.db.run(scan, read_only=True)
            files: list[int] = []
            ripe_ns: int | None = None  # when the first entry skipped as young ripens
            last_ripe = 0  # and the last
            now, grace, skew = inodes.now_ns(), int(self.grace_s * 1e9), int(CLOCK_SKEW_S * 1e9)
            for _key, value in rows:
                entry = meta_pb2.GcEntry.FromString(value)
                # A later round (see grace_s). An entry another meta server stamped ahead of this
                # one's clock waits out that skew too, up to the skew meta allows for.
                young = now - grace < entry.queued_ns <= now + skew
                if young and grace and not entry.sweep_after_ns and entry.type != DIRECTORY:
                    ripe = entry.queued_ns + grace
                    ripe_ns = ripe if ripe_ns is None else min(ripe_ns, ripe)
                    last_ripe = max(last_ripe, ripe)
                    continue
                if entry.sweep_after_ns:
                    done += await self._sweep(entry)
                    continue
                if entry.type != DIRECTORY:
                    files.append(entry.inode_id)
                    continue
                try:
                    done += await self._collect_dir(entry.inode_id)
                except FS3Error as e:
                    log.warning("gc entry failed inode=%d error=%s", entry.inode_id, e)
            for at in range(0, len(files), FILE_BATCH):
                group = files[at : at + FILE_BATCH]
                try:
                    done += await self._collect_files(group)
                except FS3Error as e:
                    log.warning("gc entries failed inodes=%d..%d error=%s", group[0], group[-1], e)
            if wake_when_ripe:
                self._ripe_until = max(self._ripe_until, last_ripe)
            if ripe_ns is not None and ripe_ns <= self._ripe_until:
                self._wake_at(ripe_ns)
            if len(rows) < BATCH:
                return done
            begin = rows[-1][0] + b"\0"

    async def _collect_files(self, inode_ids: list[int]) -> int:
        """Finish the GC entries of unlinked files ``inode_ids`` that no session holds open: their
        chunks, then their inodes and entries, in one transaction for the whole group (a
        transaction and a commit per file cost more than the work itself)."""
        db = self.ns.db
        if self.ns.read_sessions is not None:
            await self.ns.read_sessions.settled()  # sessions of read opens this process answered

        async def look(tr: Transaction) -> list[tuple[int, meta_pb2.Inode | None, bool]]:
            rv = tr.snapshot
            out = []
            for inode_id in inode_ids:
                raw = await rv.get(schema.inode_key(inode_id))
                ino = meta_pb2.Inode.FromString(raw) if raw is not None else None
                sprefix = schema.session_prefix(inode_id)
                out.append((inode_id, ino, bool(await rv.get_range(sprefix, prefix_end(sprefix), 1))))
            return out

        async def claim(tr: Transaction, ids: list[int]) -> list[meta_pb2.Inode]:
            """The unlinked files among ``ids`` that no session holds, marked ``collecting`` in
            this transaction, which a session opened meanwhile conflicts with: once marked, a
            file takes no new session (SessionOps.open), so its chunks can go."""
            out = []
            for inode_id in ids:
                raw = await tr.get(schema.inode_key(inode_id))
                if raw is None:
                    continue
                ino = meta_pb2.Inode.FromString(raw)
                sprefix = schema.session_prefix(inode_id)
                if ino.nlink > 0 or await tr.get_range(sprefix, prefix_end(sprefix), 1):
                    continue
                if not ino.collecting:
                    ino.collecting = True
                    inodes.store(tr, ino)
                out.append(ino)
            return out

        stale: list[int] = []  # entries of linked inodes (never written so): just dropped
        ready: list[int] = []
        removing: dict[int, int] = {}  # inode id -> when its chunks' removal began (ns)
        unclaimed: list[int] = []
        for inode_id, ino, open_ in await db.run(look, read_only=True):
            if ino is None:
                ready.append(inode_id)
            elif ino.nlink > 0:
                stale.append(inode_id)
            elif not open_:  # still open somewhere: the last close comes first
                unclaimed.append(inode_id)
        for ino in await db.run(lambda tr: claim(tr, unclaimed)) if unclaimed else ():
            removing[ino.id] = inodes.now_ns()
            try:
                await self.ns.chunks.remove(ino.layout, ino.id)
            except FS3Error as e:
                log.warning("gc entry failed inode=%d error=%s", ino.id, e)
                continue
            ready.append(ino.id)

        async def finish(tr: Transaction) -> list[int]:
            removed = []
            for inode_id in stale:
                tr.clear(schema.gc_key(inode_id))
            for inode_id in ready:
                raw = await tr.get(schema.inode_key(inode_id))
                if raw is None:
                    # Collected meanwhile (another collector; or this transaction, committed once
                    # already and run again): its entry may be the second pass's now, which stays.
                    entry = await tr.get(schema.gc_key(inode_id))
                    if entry is not None and not meta_pb2.GcEntry.FromString(entry).sweep_after_ns:
                        tr.clear(schema.gc_key(inode_id))
                        removed.append(inode_id)
                    continue
                ino = meta_pb2.Inode.FromString(raw)
                sprefix = schema.session_prefix(inode_id)
                if ino.nlink > 0 or await tr.get_range(sprefix, prefix_end(sprefix), 1):
                    continue
                tr.clear(schema.inode_key(inode_id))
                tr.add_int(schema.INODE_COUNT_KEY, -1)
                removed.append(inode_id)
                sweep_after = ino.write_caps_until_ns + int(CLOCK_SKEW_S * 1e9)
                if ino.write_caps_until_ns and sweep_after > removing.get(inode_id, 0):
                    # A write capability of it may be used after its chunks' removal began (a
                    # user connection's, which storage checks without knowing the file is gone):
                    # its chunks are removed once more after that, or they would stay for good.
                    sweep = meta_pb2.GcEntry(
                        inode_id=inode_id,
                        type=ino.type,
                        queued_ns=inodes.now_ns(),
                        sweep_after_ns=sweep_after,
                    )
                    sweep.layout.CopyFrom(ino.layout)
                    tr.set(schema.gc_key(inode_id), sweep.SerializeToString())
                else:
                    tr.clear(schema.gc_key(inode_id))
            return removed

        if not stale and not ready:
            return 0
        removed = await db.run(finish)
        self.removed_files += len(removed)
        for inode_id in removed:
            log.debug("gc removed file inode=%d", inode_id)
        return len(stale) + len(removed)

    async def _sweep(self, entry: meta_pb2.GcEntry) -> int:
        """The second removal of a collected file's chunks (see :meth:`_collect_files`), once no
        write capability of it can be used any more; 1 when done, 0 when not due yet or failed."""
        if entry.sweep_after_ns > inodes.now_ns():
            return 0
        try:
            await self.ns.chunks.remove(entry.layout, entry.inode_id)
        except FS3Error as e:
            log.warning("gc sweep failed inode=%d error=%s", entry.inode_id, e)
            return 0
        key = schema.gc_key(entry.inode_id)

        async def finish(tr: Transaction) -> None:
            raw = await tr.get(key)
            if raw is not None and meta_pb2.GcEntry.FromString(raw).sweep_after_ns == entry.sweep_after_ns:
                tr.clear(key)

        await self.ns.db.run(finish)
        log.debug("gc swept file inode=%d", entry.inode_id)
        return 1

    async def _collect_dir(self, dir_id: int) -> int:
        """Detach a batch of the directory's entries (subdirectories become GC entries of their
        own); remove the directory once it is empty."""
        prefix = schema.dentry_prefix(dir_id)

        async def step(tr: Transaction) -> bool:
            raw = await tr.get(schema.inode_key(dir_id))
            if raw is None:
                tr.clear(schema.gc_key(dir_id))
                return True
            d = meta_pb2.Inode.FromString(raw)
            rows = await tr.get_range(prefix, prefix_end(prefix), DIR_BATCH)
            now = inodes.now_ns()
            for key, value in rows:
                child_id = meta_pb2.DirEntry.FromString(value).inode_id
                tr.clear(key)
                child_raw = await tr.get(schema.inode_key(child_id))
                if child_raw is None:
                    continue
                child = meta_pb2.Inode.FromString(child_raw)
                if child.type == DIRECTORY:
                    child.nlink = 0
                    inodes.store(tr, child)
                    queue_gc(tr, child)
                else:
                    drop_link(tr, child, now)
            if len(rows) < DIR_BATCH:
                delete_dir(tr, d, 0)
                tr.clear(schema.gc_key(dir_id))
                return True
            return False

        while not await self.ns.db.run(step):
            pass
        self.removed_dirs += 1
        return 1
