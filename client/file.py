"""Open fs3 files: the byte-range I/O of one file over its layout, with a write buffer per handle.

:class:`OpenFile` is what both the native API (:class:`fs3.client.filesystem.File`) and the FUSE
mount hold for an open file. It knows the file's layout (chunk size and chains), so it can split a
byte range at chunk boundaries and send each piece to its chain, and it keeps:

- a **write buffer**: a write that continues where the buffer ends is appended; any other write, a
  full buffer, a read, a truncate, fsync and close flush it. Flushes run in the background, up to
  ``max_flushes`` at a time, so a sequential writer keeps several chunk writes in flight; a flush
  overlapping one still in flight waits for it, so overlapping writes reach storage in order. The
  first error of a background flush is raised by the next write, flush, fsync or close (as a
  write-back file system reports it).
- the **written length**: the end of the highest byte this handle wrote, reported to meta on fsync
  and close (the write session), which settles the file's length.

:class:`InodeState` collects the open handles of one inode in one client, so a read sees writes of
every handle of this client (read-your-writes) and a stat reports the length they wrote.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from fs3.client.storage_client import ReadRequest, StorageClient
from fs3.errors import FS3Error, StatusCode
from fs3.proto import meta_pb2

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 1 << 20


def chain_of(layout: meta_pb2.Layout, chunk_index: int) -> int:
    """The chain holding chunk ``chunk_index`` of a file with ``layout``."""
    chains = layout.chains
    if not chains:
        raise FS3Error(StatusCode.FAILED_PRECONDITION, "the file has no chains in its layout")
    stripe = layout.stripe_count or len(chains)
    return chains[chunk_index % min(stripe, len(chains))]


def chunk_size_of(layout: meta_pb2.Layout) -> int:
    return layout.chunk_size or DEFAULT_CHUNK_SIZE


def split_range(layout: meta_pb2.Layout, inode_id: int, offset: int, length: int) -> list[ReadRequest]:
    """``[offset, offset + length)`` of a file as chunk-sized read requests."""
    size = chunk_size_of(layout)
    out: list[ReadRequest] = []
    pos = offset
    end = offset + length
    while pos < end:
        index, within = divmod(pos, size)
        n = min(size - within, end - pos)
        out.append(ReadRequest(chain_of(layout, index), inode_id, index, within, n))
        pos += n
    return out


@dataclass(slots=True)
class InodeState:
    """What one client knows about a file it has open: its handles and the length they imply."""

    inode: meta_pb2.Inode
    handles: set[OpenFile] = field(default_factory=set)

    @property
    def size(self) -> int:
        """The larger of meta's length and what this client's handles wrote."""
        return max([self.inode.size, *(h.written_length for h in self.handles)])

    async def drain(self) -> None:
        """Flush every handle's buffer and wait for their flushes (before a read or a stat)."""
        for h in list(self.handles):
            if h.writable:
                await h.flush_buffer()

    def truncated(self, size: int) -> None:
        """The file was truncated to ``size``: no handle may report a longer length afterwards."""
        self.inode.size = size
        for h in self.handles:
            h.written_length = min(h.written_length, size)


class OpenFile:
    """One open handle of a file; see the module docstring. Not thread-safe: one event loop."""

    def __init__(
        self,
        storage: StorageClient,
        state: InodeState,
        session_id: int,
        *,
        writable: bool,
        buffer_bytes: int = 4 << 20,
        max_flushes: int = 4,
    ) -> None:
        self.storage = storage
        self.state = state
        self.inode_id = state.inode.id
        self.layout = state.inode.layout
        self.session_id = session_id
        self.writable = writable
        self.buffer_bytes = buffer_bytes
        self.written_length = 0
        self.dirty = False  # wrote since the last report to meta
        self._buf = bytearray()
        self._buf_offset = 0
        self._flushes: dict[asyncio.Task[None], tuple[int, int]] = {}
        self._slots = asyncio.Semaphore(max(1, max_flushes))
        self._error: BaseException | None = None
        self._lock = asyncio.Lock()

    # -- writes -----------------------------------------------------------------------------------

    async def write(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at ``offset`` (buffered); returns its length."""
        if not self.writable:
            raise FS3Error(StatusCode.META_BAD_HANDLE, "the file is not open for writing")
        n = memoryview(data).nbytes
        if n == 0:
            return 0
        self._raise_pending()
        async with self._lock:
            if self._buf and offset == self._buf_offset + len(self._buf):
                self._buf += data
            else:
                await self._start_flush()
                if n >= self.buffer_bytes:
                    # large writes (checkpoints) skip the buffer; a mutable one is copied, since the
                    # caller may reuse it once write returns and the flush runs in the background
                    await self._start_flush_of(offset, data if isinstance(data, bytes) else bytes(data))
                    data = b""
                else:
                    self._buf_offset = offset
                    self._buf += data
            if len(self._buf) >= self.buffer_bytes:
                await self._start_flush()
        self.written_length = max(self.written_length, offset + n)
        self.dirty = True
        return n

    async def write_through(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at ``offset`` now, bypassing the buffer (ordered after earlier writes that
        overlap it); returns its length once storage has it."""
        if not self.writable:
            raise FS3Error(StatusCode.META_BAD_HANDLE, "the file is not open for writing")
        n = memoryview(data).nbytes
        if n == 0:
            return 0
        await self._wait_overlapping(offset, offset + n)
        if self._buf and self._buf_offset < offset + n and offset < self._buf_offset + len(self._buf):
            await self.flush_buffer()
        await self._write_now(offset, data)
        self.written_length = max(self.written_length, offset + n)
        self.dirty = True
        return n

    async def _start_flush(self) -> None:
        if not self._buf:
            return
        # hand the buffer itself to the flush (no copy); later writes start a new one
        data, offset = self._buf, self._buf_offset
        self._buf = bytearray()
        await self._start_flush_of(offset, data)

    async def _start_flush_of(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        end = offset + memoryview(data).nbytes
        await self._wait_overlapping(offset, end)
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(self._flush_task(offset, data))
        self._flushes[task] = (offset, end)
        task.add_done_callback(self._flush_done)

    async def _wait_overlapping(self, begin: int, end: int) -> None:
        while True:
            overlapping = [t for t, (b, e) in self._flushes.items() if b < end and begin < e]
            if not overlapping:
                return
            await asyncio.wait(overlapping)

    async def _flush_task(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        try:
            await self._write_now(offset, data)
        finally:
            self._slots.release()

    def _flush_done(self, task: asyncio.Task[None]) -> None:
        self._flushes.pop(task, None)
        if task.cancelled():
            return
        e = task.exception()
        if e is not None and self._error is None:
            log.warning("background flush failed inode=%#x error=%s", self.inode_id, e)
            self._error = e

    async def _write_now(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        layout = self.layout
        await self.storage.write_range(
            lambda index: chain_of(layout, index), self.inode_id, offset, data, chunk_size_of(layout)
        )

    def _raise_pending(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    async def flush_buffer(self) -> None:
        """Write out the buffer and wait until every flush of this handle is done; raise the first
        error one of them met."""
        async with self._lock:
            await self._start_flush()
        while self._flushes:
            await asyncio.wait(list(self._flushes))
        self._raise_pending()

    # -- reads ------------------------------------------------------------------------------------

    async def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``: short at the end of the file, holes read as zeros."""
        await self.state.drain()
        size = self.state.size
        if offset >= size or length <= 0:
            return b""
        length = min(length, size - offset)
        return await read_range(self.storage, self.state.inode, offset, length)


async def read_range(storage: StorageClient, inode: meta_pb2.Inode, offset: int, length: int) -> bytes:
    """Bytes ``[offset, offset + length)`` of a file (the caller clamps to its length); holes and
    short chunks read as zeros."""
    ios = split_range(inode.layout, inode.id, offset, length)
    if len(ios) == 1:
        part = await storage.read(ios[0].chain_id, ios[0].inode_id, ios[0].chunk_index, ios[0].offset, length)
        return part if len(part) == length else part.ljust(length, b"\0")
    parts = await storage.batch_read(ios)
    return b"".join(
        p if len(p) == io.length else p.ljust(io.length, b"\0") for p, io in zip(parts, ios, strict=True)
    )


async def read_many(storage: StorageClient, pieces: Sequence[tuple[meta_pb2.Inode, int, int]]) -> list[bytes]:
    """Read many ``(inode, offset, length)`` ranges as one storage batch (one call per storage node,
    nodes in parallel). Each range is clamped to the inode's length."""
    ios: list[ReadRequest] = []
    spans: list[tuple[int, int]] = []
    for inode, offset, length in pieces:
        length = max(0, min(length, inode.size - offset))
        first = len(ios)
        if length:
            ios.extend(split_range(inode.layout, inode.id, offset, length))
        spans.append((first, len(ios)))
    parts = await storage.batch_read(ios) if ios else []
    out = []
    for first, last in spans:
        out.append(
            b"".join(
                p if len(p) == io.length else p.ljust(io.length, b"\0")
                for p, io in zip(parts[first:last], ios[first:last], strict=True)
            )
        )
    return out
