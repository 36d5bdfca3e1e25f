"""The chunk engine's API as coroutines, for the asyncio storage daemon.

Every call runs in a thread pool: the engine blocks on disk I/O, fsync and LMDB commits, which must
never stall the event loop. File I/O, fsync, CRC32C and LMDB commits release the GIL, so calls on
different chunks overlap for real.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from fs3.errors import FS3Error

from .chunk_engine import ChunkEngine, ChunkRead, EngineOptions, LastChunk, SpaceInfo
from .chunk_meta import ChunkMeta

P = ParamSpec("P")
T = TypeVar("T")


class AsyncChunkEngine:
    """Wraps a :class:`ChunkEngine`; each method awaits the synchronous method of the same name.

    ``executor`` may be shared between the engines of one disk (so that their I/O queues together);
    without one, the wrapper owns a pool of ``max_workers`` threads, shut down by :meth:`close`.
    """

    def __init__(
        self, engine: ChunkEngine, executor: ThreadPoolExecutor | None = None, *, max_workers: int = 16
    ) -> None:
        self.engine = engine
        self._owns_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(max_workers, thread_name_prefix="chunk-io")

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The threads this target's engine calls run in."""
        return self._executor

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        options: EngineOptions | None = None,
        *,
        on_failure: Callable[[FS3Error], None] | None = None,
        executor: ThreadPoolExecutor | None = None,
        max_workers: int = 16,
    ) -> AsyncChunkEngine:
        """Open a target off the event loop (recovery scans every data file).

        ``on_failure`` runs in an I/O thread: a daemon hands it to its loop with
        ``loop.call_soon_threadsafe``.
        """
        engine = await asyncio.get_running_loop().run_in_executor(
            executor, functools.partial(ChunkEngine, path, options, on_failure=on_failure)
        )
        return cls(engine, executor, max_workers=max_workers)

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def get_meta(self, chunk_id: bytes) -> ChunkMeta | None:
        return await self._run(self.engine.get_meta, chunk_id)

    async def read(
        self, chunk_id: bytes, offset: int = 0, length: int | None = None, *, version: int | None = None
    ) -> ChunkRead:
        return await self._run(self.engine.read, chunk_id, offset, length, version=version)

    async def update(
        self,
        chunk_id: bytes,
        offset: int,
        data: bytes | bytearray | memoryview,
        *,
        chunk_size: int,
        chain_ver: int,
        version: int | None = None,
        checksum: int | None = None,
        commit: bool = False,
    ) -> ChunkMeta:
        return await self._run(
            self.engine.update,
            chunk_id,
            offset,
            data,
            chunk_size=chunk_size,
            chain_ver=chain_ver,
            version=version,
            checksum=checksum,
            commit=commit,
        )

    async def truncate(
        self,
        chunk_id: bytes,
        length: int,
        *,
        chunk_size: int,
        chain_ver: int,
        version: int | None = None,
        commit: bool = False,
    ) -> ChunkMeta:
        return await self._run(
            self.engine.truncate,
            chunk_id,
            length,
            chunk_size=chunk_size,
            chain_ver=chain_ver,
            version=version,
            commit=commit,
        )

    async def remove(
        self, chunk_id: bytes, *, chain_ver: int, version: int | None = None
    ) -> ChunkMeta | None:
        return await self._run(self.engine.remove, chunk_id, chain_ver=chain_ver, version=version)

    async def replace(
        self,
        chunk_id: bytes,
        data: bytes | bytearray | memoryview,
        *,
        chunk_size: int,
        chain_ver: int,
        version: int,
        commit: bool = False,
        checksum: int | None = None,
    ) -> ChunkMeta:
        return await self._run(
            self.engine.replace,
            chunk_id,
            data,
            chunk_size=chunk_size,
            chain_ver=chain_ver,
            version=version,
            commit=commit,
            checksum=checksum,
        )

    async def mark_lost(
        self, chunk_id: bytes, *, chunk_size: int, chain_ver: int, version: int, length: int, crc: int
    ) -> ChunkMeta:
        return await self._run(
            self.engine.mark_lost,
            chunk_id,
            chunk_size=chunk_size,
            chain_ver=chain_ver,
            version=version,
            length=length,
            crc=crc,
        )

    async def commit(
        self, chunk_id: bytes, version: int, *, chain_ver: int | None = None
    ) -> ChunkMeta | None:
        return await self._run(self.engine.commit, chunk_id, version, chain_ver=chain_ver)

    async def abort(self, chunk_id: bytes, version: int | None = None) -> ChunkMeta | None:
        return await self._run(self.engine.abort, chunk_id, version)

    async def remove_range(self, begin: bytes, end: bytes | None = None) -> int:
        return await self._run(self.engine.remove_range, begin, end)

    async def query_last_chunk(self, begin: bytes, end: bytes) -> LastChunk:
        return await self._run(self.engine.query_last_chunk, begin, end)

    async def dump_metadata(self, begin: bytes = b"", end: bytes | None = None) -> list[ChunkMeta]:
        return await self._run(self.engine.dump_metadata, begin, end)

    async def pending_chunks(self) -> list[ChunkMeta]:
        return await self._run(self.engine.pending_chunks)

    async def space_info(self) -> SpaceInfo:
        return await self._run(self.engine.space_info)

    async def close(self) -> None:
        """Close the engine once the calls in flight have finished, and the pool if owned."""
        if self._owns_executor:
            await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
        self.engine.close()
