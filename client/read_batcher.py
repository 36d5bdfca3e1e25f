"""Coalescing of concurrent small reads into shared storage batches.

A 4 KiB read costs a storage daemon and this client far more in per-call work (a request to
encode, a frame to send and receive, a task to wake) than in bytes moved. When many small reads
are outstanding at once -- a random-read workload at a high queue depth, through FUSE or the native
API -- :class:`ReadBatcher` lets at most ``max_calls`` storage batch reads run at a time and queues
the rest; when a call ends, everything queued leaves as one batch (one RPC per storage node). An
idle client therefore adds no wait to a read, and a busy one sends fewer, fuller calls, so the
storage daemons stay fed with less CPU per read on both sides.

Large reads (more than ``small_bytes``) bypass the queue: they are few, and alone in their call
they are received straight into the caller's buffer.

What a caller may rely on: :meth:`ReadBatcher.read_into` behaves as
:meth:`fs3.client.storage_client.StorageClient.batch_read_into` for its own requests, errors
included -- when a shared batch fails, its requests are retried each on its own, so one bad read
does not fail the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence

from fs3.client.storage_client import ReadRequest, StorageClient

log = logging.getLogger(__name__)

_Entry = tuple[Sequence[ReadRequest], Sequence[memoryview], "asyncio.Future[list[int]]"]


class ReadBatcher:
    """Reads for one :class:`StorageClient`, small ones coalesced; see the module docstring."""

    def __init__(
        self,
        storage: StorageClient,
        *,
        max_calls: int = 6,
        small_bytes: int = 128 << 10,
        max_batch_reads: int = 512,
        max_batch_bytes: int = 8 << 20,
    ) -> None:
        self.storage = storage
        self.max_calls = max(1, max_calls)
        self.small_bytes = small_bytes
        self.max_batch_reads = max_batch_reads
        self.max_batch_bytes = max_batch_bytes
        self._calls = 0
        self._queue: list[tuple[int, int, _Entry]] = []  # (reads, bytes, entry)
        self._tasks: set[asyncio.Task[None]] = set()

    async def read_into(self, ios: Sequence[ReadRequest], sinks: Sequence[memoryview]) -> list[int]:
        """Read ``ios[i]`` into ``sinks[i]`` (writable byte views of at least its length); returns the
        lengths read (short where a chunk ends, 0 where it does not exist)."""
        nbytes = 0
        for io in ios:
            nbytes += io.length
        if nbytes > self.small_bytes:
            return await self.storage.batch_read_into(ios, sinks)
        if self._calls < self.max_calls and not self._queue:
            self._calls += 1
            try:
                return await self.storage.batch_read_into(ios, sinks)
            finally:
                self._calls -= 1
                self._next()
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._queue.append((len(ios), nbytes, (ios, sinks, fut)))
        if self._calls < self.max_calls:
            self._next()
        return await fut

    def _next(self) -> None:
        """Send what is queued as one batch, up to the batch limits, if a call slot is free."""
        if not self._queue or self._calls >= self.max_calls:
            return
        batch: list[_Entry] = []
        reads = nbytes = 0
        taken = 0
        for n, b, entry in self._queue:
            if batch and (reads + n > self.max_batch_reads or nbytes + b > self.max_batch_bytes):
                break
            if not entry[2].cancelled():
                batch.append(entry)
                reads += n
                nbytes += b
            taken += 1
        del self._queue[:taken]
        if not batch:
            self._next()
            return
        self._calls += 1
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Entry]) -> None:
        try:
            if len(batch) == 1:
                ios, sinks, fut = batch[0]
                await self._settle(fut, self.storage.batch_read_into(ios, sinks))
                return
            all_ios: list[ReadRequest] = []
            all_sinks: list[memoryview] = []
            for ios, sinks, _ in batch:
                all_ios.extend(ios)
                all_sinks.extend(sinks)
            try:
                lengths = await self.storage.batch_read_into(all_ios, all_sinks)
            except Exception as e:
                # one request may be at fault: give each its own outcome
                log.debug("batch of %d reads failed, retrying them one by one error=%s", len(batch), e)
                await asyncio.gather(
                    *(self._settle(fut, self.storage.batch_read_into(i, s)) for i, s, fut in batch)
                )
                return
            pos = 0
            for ios, _, fut in batch:
                if not fut.done():
                    fut.set_result(lengths[pos : pos + len(ios)])
                pos += len(ios)
        finally:
            for _, _, fut in batch:
                if not fut.done():  # this task was cancelled (the loop is closing)
                    fut.cancel()
            self._calls -= 1
            self._next()

    @staticmethod
    async def _settle(fut: asyncio.Future[list[int]], read: Awaitable[list[int]]) -> None:
        try:
            result = await read
        except Exception as e:
            if not fut.done():
                fut.set_exception(e)
            return
        if not fut.done():
            fut.set_result(result)
