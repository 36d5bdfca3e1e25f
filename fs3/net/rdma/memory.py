"""Registered memory: regions, fixed-slot arenas for SEND/RECV buffers, and a bounded pool of
payload staging buffers.

Memory that an RDMA NIC reads or writes must be registered (pinned, and given keys); registering is
slow (a system call and page pinning), so it happens once per buffer and buffers are reused. The
classes here do the bookkeeping only: they get regions from a :class:`Registrar` (the verbs layer's
``ibv_reg_mr``, or a fake in tests), so they are tested without an RDMA device.

Every region is registered for local access only: no peer can reach it with any key. A peer gets
remote access to exactly the bytes of one operation through an :class:`Exposure` (a memory region
of its own over those bytes, with the remote flags that operation needs), which is withdrawn
(deregistered, so its rkey is dead) as soon as the operation is over; see
:mod:`fs3.net.rdma.connection` for when that happens.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fs3.errors import FS3Error, StatusCode


@dataclass(slots=True, eq=False)
class Region:
    """A registered, contiguous piece of memory: ``view`` (writable, ``length`` bytes) at ``addr``,
    readable and writable by our own NIC through ``lkey``. ``rkey`` is the key the registration
    came with; it opens nothing to peers, since regions are registered without remote access."""

    view: memoryview
    addr: int
    lkey: int
    rkey: int
    length: int
    handle: Any = field(default=None, repr=False)  # the verbs MR (and its backing memory)


@dataclass(slots=True, eq=False)
class Exposure:
    """``length`` bytes at ``addr`` that peers may RDMA-READ (and, with ``write``, RDMA-WRITE)
    with ``rkey`` until the exposure is withdrawn."""

    addr: int
    rkey: int
    length: int
    write: bool
    handle: Any = field(default=None, repr=False)  # the verbs MR of just these bytes


class Registrar(Protocol):
    """Registers and deregisters memory with one protection domain."""

    def register(self, nbytes: int) -> Region:
        """Allocate ``nbytes`` of page-aligned memory and register it for local access only."""

    def deregister(self, region: Region) -> None:
        """Undo :meth:`register` (the region's memory must not be in use by any work request)."""

    def expose(self, region: Region, offset: int, length: int, *, write: bool = False) -> Exposure:
        """Open ``length`` bytes of ``region`` from ``offset`` to peers' RDMA READ (and WRITE, with
        ``write``): a new registration of exactly those bytes with a key of its own."""

    def withdraw(self, exposure: Exposure) -> None:
        """Undo :meth:`expose`: from its return on, the exposure's rkey reaches nothing."""


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]


def buffer_address(obj: Any) -> int:
    """The address of the first byte of a contiguous buffer (bytes, bytearray, memoryview, mmap…),
    read-only ones included (which ``ctypes.c_char.from_buffer`` refuses)."""
    pb = _PyBuffer()
    _get_buffer(obj, ctypes.byref(pb), 0)  # PyBUF_SIMPLE: contiguous bytes, raises otherwise
    try:
        return pb.buf or 0
    finally:
        _release_buffer(ctypes.byref(pb))


class RegionDirectory:
    """Which registered region (if any) a buffer lies in, so registered buffers go out without a copy."""

    def __init__(self) -> None:
        self._regions: list[Region] = []

    def add(self, region: Region) -> None:
        self._regions.append(region)

    def remove(self, region: Region) -> None:
        try:
            self._regions.remove(region)
        except ValueError:
            pass

    def find(self, buf: Any) -> tuple[Region, int] | None:
        """(region, offset) when all of ``buf`` lies inside one registered region, else None."""
        view = memoryview(buf)
        n = view.nbytes
        if not n or not view.contiguous:
            return None
        addr = buffer_address(view)
        for r in self._regions:
            if r.addr <= addr and addr + n <= r.addr + r.length:
                return r, addr - r.addr
        return None


class SlotArena:
    """``count`` buffers of ``size`` bytes carved from one region (a connection's SEND or RECV ring)."""

    __slots__ = ("region", "size", "count", "_free")

    def __init__(self, region: Region, size: int, count: int) -> None:
        if size * count > region.length:
            raise ValueError(f"{count} slots of {size} bytes do not fit a {region.length}-byte region")
        self.region = region
        self.size = size
        self.count = count
        self._free: deque[int] = deque(range(count))

    def acquire(self) -> int | None:
        """A free slot's index, or None when all are in use."""
        return self._free.popleft() if self._free else None

    def release(self, slot: int) -> None:
        """Give a slot back (its work request has completed)."""
        if not 0 <= slot < self.count:
            raise ValueError(f"slot {slot} out of range")
        self._free.append(slot)

    def view(self, slot: int) -> memoryview:
        """The slot's memory."""
        off = slot * self.size
        return self.region.view[off : off + self.size]

    def offset(self, slot: int) -> int:
        """The slot's offset in the region (for a work request's scatter/gather entry)."""
        return slot * self.size

    @property
    def available(self) -> int:
        return len(self._free)


_MIN_SHIFT = 12


@dataclass(slots=True, eq=False)
class PoolBuffer:
    """A staging buffer lent by :class:`RegisteredPool`; ``view`` is exactly the requested size."""

    region: Region
    size: int
    view: memoryview


class RegisteredPool:
    """Registered payload buffers in power-of-two size classes, ``max_bytes`` registered at most.

    ``try_acquire`` returns None when the cap is reached; ``acquire`` (or ``acquire_cb`` from
    non-async code) waits, in FIFO order, for buffers to come back — back-pressure instead of
    unbounded pinned memory. Free buffers of other sizes are deregistered to make room for a
    request that fits under the cap once they are gone.
    """

    def __init__(
        self, registrar: Registrar, max_bytes: int = 256 << 20, max_buffer_bytes: int = 64 << 20
    ) -> None:
        if max_buffer_bytes > max_bytes:
            raise ValueError("max_buffer_bytes exceeds max_bytes")
        self.registrar = registrar
        self.max_bytes = max_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.directory = RegionDirectory()
        self._free: dict[int, list[Region]] = {}
        self._registered = 0
        self._in_use = 0
        self._waiters: deque[tuple[int, Callable[[PoolBuffer], None]]] = deque()
        self._closed = False

    @staticmethod
    def class_size(n: int) -> int:
        return 1 << max(_MIN_SHIFT, (n - 1).bit_length())

    def try_acquire(self, n: int) -> PoolBuffer | None:
        """A buffer of ``n`` bytes, or None if lending it would exceed ``max_bytes``."""
        if self._closed:
            raise FS3Error(StatusCode.RPC_CONNECTION_CLOSED, "registered pool is closed")
        if not 0 < n <= self.max_buffer_bytes:
            raise FS3Error(
                StatusCode.RPC_FRAME_TOO_LARGE,
                f"a {n}-byte staging buffer is beyond the pool's {self.max_buffer_bytes}-byte limit",
            )
        if self._waiters:
            return None  # FIFO: earlier waiters go first
        return self._take(n)

    def _take(self, n: int) -> PoolBuffer | None:
        size = self.class_size(n)
        free = self._free.get(size)
        if free:
            region = free.pop()
        else:
            if not self._make_room(size):
                return None
            region = self.registrar.register(size)
            self._registered += size
            self.directory.add(region)
        self._in_use += size
        return PoolBuffer(region, n, region.view[:n])

    def _make_room(self, size: int) -> bool:
        if self._registered + size <= self.max_bytes:
            return True
        # deregister idle buffers of other sizes while that can make enough room
        if self._registered - self._free_bytes() + size > self.max_bytes:
            return False
        for cls in sorted(self._free, reverse=True):
            lst = self._free[cls]
            while lst and self._registered + size > self.max_bytes:
                self._drop(lst.pop())
        return self._registered + size <= self.max_bytes

    def _free_bytes(self) -> int:
        return sum(cls * len(lst) for cls, lst in self._free.items())

    def _drop(self, region: Region) -> None:
        self.directory.remove(region)
        self._registered -= region.length
        self.registrar.deregister(region)

    def release(self, buf: PoolBuffer) -> None:
        """Return a buffer (no work request may still use it); waiting acquirers are served first."""
        size = buf.region.length
        self._in_use -= size
        if self._closed:
            self._drop(buf.region)
            return
        self._free.setdefault(size, []).append(buf.region)
        while self._waiters:
            n, cb = self._waiters[0]
            got = self._take(n)
            if got is None:
                break
            self._waiters.popleft()
            cb(got)

    def acquire_cb(self, n: int, callback: Callable[[PoolBuffer], None]) -> None:
        """Call ``callback(buffer)`` as soon as a buffer of ``n`` bytes can be lent (maybe now)."""
        got = self.try_acquire(n)
        if got is not None:
            callback(got)
        else:
            self._waiters.append((n, callback))

    async def acquire(self, n: int) -> PoolBuffer:
        """A buffer of ``n`` bytes, waiting for one to be released if the pool is at its cap."""
        got = self.try_acquire(n)
        if got is not None:
            return got
        fut: asyncio.Future[PoolBuffer] = asyncio.get_running_loop().create_future()

        def deliver(b: PoolBuffer) -> None:
            if fut.done():  # the waiter was cancelled: hand the buffer straight back
                self.release(b)
            else:
                fut.set_result(b)

        self._waiters.append((n, deliver))
        return await fut

    @property
    def registered_bytes(self) -> int:
        return self._registered

    @property
    def in_use_bytes(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def close(self) -> None:
        """Deregister every idle buffer; buffers still lent are deregistered as they come back."""
        self._closed = True
        for lst in self._free.values():
            for region in lst:
                self._drop(region)
        self._free.clear()
        self._waiters.clear()
