"""Expiry of the IDEM records that make retried non-idempotent requests return their first result.

The records themselves are written by :meth:`fs3.meta.namespace.Namespace._mutate` in the
operation's own transaction. A client retries within seconds, so a record is kept for ``ttl_s``
(default 30 minutes, as in 3FS) and then removed by :func:`expire_idem` in the background.

Records are keyed request id first, and clients draw request ids from their clocks (see
:mod:`fs3.meta.schema`), so the records of the last ``ttl_s`` mostly lie in one key range. Expiry
skips that range instead of reading every live record each round: a record there is removed in a
later round, once the cutoff has passed its request id, at most ``CLOCK_SKEW_S`` after its time.
Whether a record is removed is always decided by its ``created_ns`` (this server's clock), never by
the client's, so a client whose clock is off (or that draws ids at random) loses nothing early and
leaves nothing behind.
"""

from __future__ import annotations

import logging

from fs3.kv import Database, Transaction, prefix_end
from fs3.meta import inode as inodes
from fs3.meta import schema
from fs3.proto import meta_pb2

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 1800.0
# How far ahead of this server's clock a client's clock may run before its records are read (and
# judged by their creation time) on every round rather than skipped as recent.
CLOCK_SKEW_S = 60.0
_U64_MAX = (1 << 64) - 1


async def expire_idem(db: Database, ttl_s: float = DEFAULT_TTL_S, batch: int = 256) -> int:
    """Remove IDEM records older than ``ttl_s``; returns how many (see the module docstring for
    the records a round skips)."""
    now = inodes.now_ns()
    cutoff = now - int(ttl_s * 1e9)
    # Request ids in (cutoff, now + skew]: recent by the clients' clocks, not read this round.
    skip_from = schema.IDEM + schema.encode_u64(min(max(cutoff, 0) + 1, _U64_MAX))
    skip_to = schema.IDEM + schema.encode_u64(min(now + int(CLOCK_SKEW_S * 1e9) + 1, _U64_MAX))
    skip_to = max(skip_to, skip_from)
    removed = await _expire_range(db, cutoff, schema.IDEM, skip_from, batch)
    removed += await _expire_range(db, cutoff, skip_to, prefix_end(schema.IDEM), batch)
    if removed:
        log.info("expired idempotency records count=%d", removed)
    return removed


async def _expire_range(db: Database, cutoff: int, begin: bytes, end: bytes, batch: int) -> int:
    removed = 0
    while begin < end:

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
    return removed
