"""A pool of reusable receive buffers for frame payloads.

Allocating a fresh multi-megabyte ``bytearray`` per frame costs a zero fill and page faults on every
byte, which at loopback speeds is as expensive as receiving the data; reusing buffers avoids both.
Buffers come in power-of-two size classes; a released buffer is kept only while the pool's retained
bytes stay under ``max_retained_bytes``, so an idle process does not pin a burst's worth of memory.

Buffers of ``ALIGNED_MIN`` bytes or more are anonymous private mappings (:class:`AlignedBuffer`),
which start on a page boundary: a storage daemon writes a received chunk to its O_DIRECT file
straight from the buffer the chunk arrived in (see ``storage.chunk_files``) instead of copying it
into an aligned buffer first. Below that size a ``bytearray`` costs less (one mapping per small
buffer would be one more kernel memory area each).
"""

from __future__ import annotations

import logging
import mmap
import threading

log = logging.getLogger(__name__)

_MIN_CLASS_SHIFT = 12  # 4 KiB: smaller payloads are not worth pooling
#: Size classes from this size up are page-aligned mappings (glibc maps blocks this large anyway).
ALIGNED_MIN = 128 << 10


class AlignedBuffer(mmap.mmap):
    """A page-aligned, writable buffer of the pool (an anonymous private mapping)."""


def _new_buffer(size: int) -> bytearray | AlignedBuffer:
    if size >= ALIGNED_MIN:
        return AlignedBuffer(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return bytearray(size)


class BufferPool:
    """Hands out writable buffers of at least a requested size and takes them back.

    ``acquire(n)`` returns a buffer (a ``bytearray``, or an :class:`AlignedBuffer` from
    ``ALIGNED_MIN`` bytes up) whose length is ``n`` rounded up to its size class; callers use
    ``memoryview(buf)[:n]``. Release only buffers that nothing (a transport's write queue
    included) still reads. Thread-safe, although fs3 uses one pool per event loop thread.
    """

    def __init__(self, max_retained_bytes: int = 256 << 20, max_buffer_bytes: int = 64 << 20) -> None:
        self.max_retained_bytes = max_retained_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self._free: dict[int, list[bytearray | AlignedBuffer]] = {}
        self._retained = 0
        self._lock = threading.Lock()

    @staticmethod
    def _class_size(n: int) -> int:
        return 1 << max(_MIN_CLASS_SHIFT, (n - 1).bit_length())

    def acquire(self, n: int) -> bytearray | AlignedBuffer:
        """A buffer of at least ``n`` bytes (contents undefined)."""
        if n > self.max_buffer_bytes:
            return bytearray(n)
        size = self._class_size(n)
        with self._lock:
            free = self._free.get(size)
            if free:
                self._retained -= size
                return free.pop()
        return _new_buffer(size)

    def release(self, buf: bytearray | AlignedBuffer) -> None:
        """Give ``buf`` back; it must have come from :meth:`acquire` (others are simply dropped)."""
        size = len(buf)
        if size & (size - 1) or size < 1 << _MIN_CLASS_SHIFT or size > self.max_buffer_bytes:
            return
        with self._lock:
            if self._retained + size > self.max_retained_bytes:
                return
            self._retained += size
            self._free.setdefault(size, []).append(buf)

    @property
    def retained_bytes(self) -> int:
        """Bytes currently held for reuse."""
        return self._retained

    def clear(self) -> None:
        """Drop every retained buffer."""
        with self._lock:
            self._free.clear()
            self._retained = 0


_default_pool = BufferPool()


def default_pool() -> BufferPool:
    """The process-wide pool used by endpoints that are not given one."""
    return _default_pool
