"""A write workload whose every acknowledged byte is remembered, and checks of replicas against it
(used by the storage fault and crash tests)."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable, Sequence

from cluster import Cluster, wait_until

from fs3.client.storage_client import StorageClient, crc32c

KiB = 1024
CHUNK = 64 * KiB
BLOCK = 4 * KiB


async def wait_progress(
    count: Callable[[], int],
    n: int,
    tasks: Sequence[asyncio.Task[None]],
    timeout_s: float = 60.0,
    what: str = "progress",
) -> None:
    """Wait until ``count()`` has grown by ``n``; a task of ``tasks`` that ended (a worker that
    failed) raises its error here instead."""
    target = count() + n
    await wait_until(lambda: count() >= target or any(t.done() for t in tasks), timeout_s, what)
    for t in tasks:
        if t.done():
            t.result()


async def finish_workers(stop: asyncio.Event, tasks: Sequence[asyncio.Task[None]]) -> None:
    """Tell the workers to stop, wait for all of them, then raise the first one's failure."""
    stop.set()
    for r in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(r, BaseException):
            raise r


class Workload:
    """Writers that each own one chunk and overwrite 4 KiB blocks of it, one at a time or a few
    apart in one write (as a client's gathered random writes), remembering every acknowledged
    write (the model)."""

    def __init__(self, client: StorageClient, chain_id: int, inode: int, writers: int) -> None:
        self.client = client
        self.chain_id = chain_id
        self.inode = inode
        self.model = {w: bytearray() for w in range(writers)}
        self.acked = 0
        self.stop = asyncio.Event()
        self.tasks = [asyncio.create_task(self._writer(w)) for w in range(writers)]

    async def _writer(self, w: int) -> None:
        rng = random.Random(w)
        seq = 0
        while not self.stop.is_set():
            seq += 1
            if seq % 3:
                blocks = [rng.randrange(0, CHUNK // BLOCK)]
            else:  # several blocks, apart
                blocks = sorted(rng.sample(range(0, CHUNK // BLOCK, 2), rng.randint(2, 6)))
            writes = [(b * BLOCK, os.urandom(BLOCK)) for b in blocks]
            extents = [(off, BLOCK) for off, _ in writes] if len(writes) > 1 else ()
            data = b"".join(d for _, d in writes)
            await self.client.write(self.chain_id, self.inode, w, writes[0][0], data, CHUNK, extents)
            m = self.model[w]
            for off, d in writes:
                if len(m) < off + BLOCK:
                    m.extend(bytes(off + BLOCK - len(m)))
                m[off : off + BLOCK] = d
            self.acked += 1

    async def wait_acked(self, n: int, timeout_s: float = 60.0) -> None:
        await wait_progress(lambda: self.acked, n, self.tasks, timeout_s, "writes")

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


async def verify(
    c: Cluster, client: StorageClient, chain_id: int, inode: int, model: dict[int, bytearray]
) -> None:
    """Every replica holds every chunk committed, with the model's content and checksum."""
    for tid in c.chain_targets[chain_id]:
        metas = {m.key.chunk_index: m for m in await client.dump_chunk_meta(tid, inode)}
        assert sorted(metas) == sorted(model), (tid, sorted(metas))
        for w, content in model.items():
            m = metas[w]
            assert m.pending_version == 0, (tid, w, m)
            assert (m.length, m.crc32c) == (len(content), crc32c(content)), (tid, w)
    for w, content in model.items():
        assert await client.read(chain_id, inode, w, 0, CHUNK) == bytes(content)


class PinnedClient(StorageClient):
    """Reads from one target while it serves (to compare what different replicas answer)."""

    pin: int = 0

    def _pick_reader(self, routing, chain_id, exclude):  # type: ignore[no-untyped-def]
        chain = routing.chain(chain_id)
        if self.pin in chain.serving and self.pin not in exclude:
            return self.pin
        return super()._pick_reader(routing, chain_id, exclude)
