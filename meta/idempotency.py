"""Expiry of the IDEM records that make retried non-idempotent requests return their first result.

The records themselves are written by :meth:`fs3.meta.namespace.Namespace._mutate` in the
operation's own transaction. A client retries within seconds, so a record is kept for ``ttl_s``
(default 30 minutes, as in 3FS) and then removed by :func:`expire_idem` in the background.
"""

from __future__ import annotations

import logging

from fs3.kv import Database, Transaction, prefix_end
from fs3.meta import inode as inodes
from fs3.meta import schema
from fs3.proto import meta_pb2

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 1800.0


async def expire_idem(db: Database, ttl_s: float = DEFAULT_TTL_S, batch: int = 256) -> int:
    """Remove IDEM records older than ``ttl_s``; returns how many."""
    cutoff = inodes.now_ns() - int(ttl_s * 1e9)
    begin, end = schema.IDEM, prefix_end(schema.IDEM)
    removed = 0
    while True:

        async def step(tr: Transaction, begin: bytes = begin) -> tuple[int, bytes | None]:
            rows = await tr.snapshot.get_range(begin, end, batch)
            n = 0
            for key, value in rows:
                if meta_pb2.IdemRecord.FromString(value).created_ns < cutoff:
                    tr.clear(key)
                    n += 1
            return n, (rows[-1].key + b"\0" if len(rows) == batch else None)

        n, nxt = await db.run(step)
        removed += n
        if nxt is None:
            break
        begin = nxt
    if removed:
        log.info("expired idempotency records count=%d", removed)
    return removed
