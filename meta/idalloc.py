"""Inode ids from sharded counters, reserved in blocks (reference notes §1.5).

Each of :data:`SHARDS` counters lives in its own key. Reserving a block is one transaction that
reads and increments one shard (chosen round-robin from a per-process shuffled order, so concurrent
meta processes rarely touch the same key); block ``b`` of shard ``s`` covers the ids
``((b * SHARDS + s) << BLOCK_BITS) + [0, 2**BLOCK_BITS)``. The store is touched once per block, ids
are unique across every process sharing the store, and never reused. Block 0 of shard 0 is skipped so
the ids below ``2**BLOCK_BITS`` stay free for fixed inodes (the root is 1).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections import deque

from fs3.kv import Database, Transaction
from fs3.meta import schema

SHARDS = 32
BLOCK_BITS = 12
MAX_ID = (1 << 63) - 1


class InodeIdAllocator:
    """Hands out fresh inode ids; refills its local block in the background when half used."""

    def __init__(self, db: Database, *, block_bits: int = BLOCK_BITS) -> None:
        self._db = db
        self._block_bits = block_bits
        self._ids: deque[int] = deque()
        order = list(range(SHARDS))
        random.shuffle(order)
        self._order = order
        self._next_shard = 0
        self._lock = asyncio.Lock()
        self._refill: asyncio.Task[None] | None = None
        self.blocks_reserved = 0

    def take(self) -> int:
        """A fresh inode id at once, or 0 when the local block is used up (then :meth:`allocate`
        waits for the next): ``ids.take() or await ids.allocate()`` spares the usual call a
        coroutine."""
        ids = self._ids
        if len(ids) < (1 << self._block_bits) // 2 and self._refill is None:
            self._refill = self._start_fill()
        return ids.popleft() if ids else 0

    async def allocate(self) -> int:
        """One fresh inode id."""
        inode_id = self.take()
        if inode_id:
            return inode_id
        ids = self._ids
        while not ids:
            refill = self._refill
            if refill is None:
                refill = self._refill = self._start_fill()
            try:
                await asyncio.shield(refill)
            finally:
                del refill  # a failure's traceback holds this frame: no cycle through the task
        return ids.popleft()

    def _start_fill(self) -> asyncio.Task[None]:
        # in a context of its own: the block serves every caller, not only the one whose call's
        # deadline (fs3.kv.txn.COMMIT_DEADLINE) would call its commit off
        return asyncio.get_running_loop().create_task(self._fill(), context=contextvars.Context())

    async def _fill(self) -> None:
        try:
            async with self._lock:
                shard = self._order[self._next_shard % SHARDS]
                self._next_shard += 1
                key = schema.alloc_shard_key(shard)

                async def reserve(tr: Transaction) -> int:
                    block = schema.decode_u64(await tr.get(key))
                    if block == 0 and shard == 0:
                        block = 1  # keeps the low ids for fixed inodes such as the root
                    tr.set(key, schema.encode_u64(block + 1))
                    return block

                block = await self._db.run(reserve)
                base = (block * SHARDS + shard) << self._block_bits
                if base + (1 << self._block_bits) > MAX_ID:
                    raise OverflowError("inode id space exhausted")
                self._ids.extend(range(base, base + (1 << self._block_bits)))
                self.blocks_reserved += 1
        finally:
            self._refill = None
