"""MetaStore: the whole metadata service as a library over one fs3.kv database.

::

    db = await open_database("lmdb", path=...)
    store = MetaStore(db, layouts=ChainAllocator(static_tables([ChainTable(1, 1, (101, 102))])))
    await store.start()                     # creates the root if needed, starts the collector
    cred = Credentials(uid=1000, gid=1000)
    f = await store.create(cred, ROOT_ID, b"a.txt", 0o644, session=True, client_id=7)
    ...
    await store.stop()

Any number of MetaStores (in any number of processes) may share one database. Every method raises
:class:`fs3.errors.FS3Error` with the status code whose errno POSIX prescribes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from fs3.kv import Database
from fs3.meta.attrs import AttrOps
from fs3.meta.entries import EntryOps
from fs3.meta.gc import Collector
from fs3.meta.idalloc import InodeIdAllocator
from fs3.meta.idempotency import DEFAULT_TTL_S, expire_idem
from fs3.meta.layout import ChainAllocator
from fs3.meta.read_sessions import ReadSessions
from fs3.meta.sessions import SessionOps
from fs3.meta.storage_io import ChunkStore

log = logging.getLogger(__name__)


class MetaStore(AttrOps, SessionOps, EntryOps):
    """Every namespace operation (see the ``*Ops`` classes), the collector and IDEM expiry."""

    def __init__(
        self,
        db: Database,
        *,
        layouts: ChainAllocator | None = None,
        chunks: ChunkStore | None = None,
        ids: InodeIdAllocator | None = None,
        gc_interval_s: float = 5.0,
        session_timeout_s: float = 0.0,
        idem_ttl_s: float = DEFAULT_TTL_S,
        live_clients: Callable[[], Awaitable[frozenset[int] | None]] | None = None,
        gc_grace_s: float = 0.0,
    ) -> None:
        super().__init__(db, layouts=layouts, chunks=chunks, ids=ids)
        self.collector = Collector(self, gc_interval_s, session_timeout_s, live_clients, gc_grace_s)
        self.read_sessions = ReadSessions(db)
        self.grace_s = lambda: self.collector.grace_s
        self.idem_ttl_s = idem_ttl_s
        self._expiry: asyncio.Task[None] | None = None

    async def start(self, *, background: bool = True) -> None:
        """Create the root if missing; with ``background``, run the collector and IDEM expiry."""
        await self.ensure_root()
        if background:
            self.collector.start()
            self._expiry = asyncio.create_task(self._expire_loop(), name="fs3-meta-idem-expiry")

    async def stop(self) -> None:
        await self.read_sessions.stop()
        await self.collector.stop()
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
            self._expiry = None

    async def _expire_loop(self) -> None:
        while True:
            # from the TTL of now: a pushed config may change it (meta.daemon's hot settings)
            await asyncio.sleep(min(60.0, max(self.idem_ttl_s / 4, 0.05)))
            try:
                await expire_idem(self.db, self.idem_ttl_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("idempotency record expiry failed")
