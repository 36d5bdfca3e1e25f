"""Everything meta asks of storage, behind one small interface (DESIGN §7: file length, truncate, GC).

:class:`ChunkStore` is what the namespace uses; :class:`StorageChunks` implements it over the
storage client (``fs3.client.storage_client.StorageClient``), :class:`NoStorage` for a meta that runs
without storage (lengths then come from the clients' reports alone). Tests substitute a fake.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from fs3.meta.layout import DEFAULT_CHUNK_SIZE
from fs3.proto import meta_pb2

# remove_chunks' end index 0 means "through the last chunk".
TO_THE_END = 0


class ChunkStore(Protocol):
    """The storage operations meta needs; every method may raise FS3Error (retried later by GC)."""

    async def file_length(self, layout: meta_pb2.Layout, inode_id: int) -> int | None:
        """The length the file's chunks imply (max over its chains of the end of the last chunk), or
        None when storage cannot tell."""
        ...

    async def truncate(
        self, layout: meta_pb2.Layout, inode_id: int, length: int, *, timeout_s: float | None = None
    ) -> None:
        """Remove the chunks past ``length`` and shorten the one containing it; with ``timeout_s``,
        nothing of it is done after that many seconds (DEADLINE_EXCEEDED)."""
        ...

    async def remove(self, layout: meta_pb2.Layout, inode_id: int) -> None:
        """Remove every chunk of the file (idempotent)."""
        ...

    async def space(self) -> tuple[int, int, int]:
        """(capacity, used, available) bytes of the storage behind the file system, for statfs;
        available is what writes may still use (free less what storage keeps free)."""
        ...


class NoStorage:
    """No storage attached: lengths are unknown, truncates and removals have nothing to do."""

    async def file_length(self, layout: meta_pb2.Layout, inode_id: int) -> int | None:
        return None

    async def truncate(
        self, layout: meta_pb2.Layout, inode_id: int, length: int, *, timeout_s: float | None = None
    ) -> None:
        return None

    async def remove(self, layout: meta_pb2.Layout, inode_id: int) -> None:
        return None

    async def space(self) -> tuple[int, int, int]:
        return 0, 0, 0


class StorageChunks:
    """:class:`ChunkStore` over a ``StorageClient`` (query_last_chunk, truncate_chunks,
    remove_chunks per chain); the calls for a file's chains run concurrently."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def file_length(self, layout: meta_pb2.Layout, inode_id: int) -> int | None:
        chunk = layout.chunk_size or DEFAULT_CHUNK_SIZE
        results = await asyncio.gather(
            *(self.client.query_last_chunk(chain, inode_id) for chain in layout.chains)
        )
        length = 0
        for found, last_index, last_length, *_ in results:
            if found:
                length = max(length, last_index * chunk + last_length)
        return length

    async def truncate(
        self, layout: meta_pb2.Layout, inode_id: int, length: int, *, timeout_s: float | None = None
    ) -> None:
        chunk = layout.chunk_size or DEFAULT_CHUNK_SIZE
        await asyncio.gather(
            *(
                self.client.truncate_chunks(chain, inode_id, chunk, length, timeout_s=timeout_s)
                for chain in layout.chains
            )
        )

    async def space(self) -> tuple[int, int, int]:
        """(capacity, used, available) bytes of the disks behind the storage targets, each disk
        counted once (several targets share a disk, and a test cluster's nodes share one host),
        raw: every replica takes space, as on the disks themselves. ``used`` is everything not
        free, root's reserved blocks counted free, as df reports it; ``available``, what an
        unprivileged writer may use less what the targets keep free."""
        routing = self.client.routing.routing
        nodes = sorted({t.node_id for t in routing.targets.values()})
        results = await asyncio.gather(*(self.client.space_info(n) for n in nodes), return_exceptions=True)
        disks: dict[tuple[str, int], tuple[int, int, int]] = {}
        for node_id, r in zip(nodes, results, strict=True):
            if isinstance(r, BaseException):
                continue
            host = routing.node(node_id).hostname or str(node_id)
            for t in r:
                available = t.available if t.HasField("available") else t.free  # an older daemon
                free = t.free_total if t.HasField("free_total") else t.free
                disks[(host, t.device or t.target_id)] = (t.capacity, free, available)
        capacity = sum(c for c, _, _ in disks.values())
        free = sum(f for _, f, _ in disks.values())
        return capacity, max(capacity - free, 0), sum(a for _, _, a in disks.values())

    async def remove(self, layout: meta_pb2.Layout, inode_id: int) -> None:
        await asyncio.gather(
            *(self.client.remove_chunks(chain, inode_id, 0, TO_THE_END) for chain in layout.chains)
        )
