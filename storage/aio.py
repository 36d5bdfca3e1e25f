"""Linux native AIO for the storage daemon's event loop: O_DIRECT reads submitted in batches,
their completions delivered to asyncio through an eventfd.

Why: a small read that misses the page cache used to block the daemon's event loop for the disk's
latency, one read after another (a batch of 18 cold 4 KiB reads waited 18 disk round trips in a
row, and nothing else ran meanwhile), and handing reads to I/O threads instead costs more CPU than
it saves (GIL hand-offs, thread wake-ups; measured in ``storage.chunk_files``). With AIO the loop
submits a whole batch in one ``io_submit`` (the block layer plugs them: one doorbell to the device
for the batch instead of one per read), keeps serving other requests while the device works on all
of them at once, and is woken once by the eventfd when they complete. This is what 3FS's storage
service does with libaio/io_uring for its chunk reads.

The kernel interface is the one of ``<linux/aio_abi.h>``: ``io_setup``, ``io_submit``,
``io_getevents`` and ``io_destroy`` called through ``syscall(2)`` (no libaio needed), ``struct
iocb`` (64 bytes) and ``struct io_event`` (32 bytes). Native AIO is asynchronous only for O_DIRECT
files (buffered AIO reads block in ``io_submit``), so buffers, offsets and lengths are aligned to
``ALIGN``; buffers come from one anonymous mapping cut into ``depth`` slots of ``slot_bytes``.

Where the kernel refuses (no syscall numbers for this machine, ``io_setup`` failing with ENOSYS,
EPERM under a seccomp profile, or EAGAIN when ``fs.aio-max-nr`` is used up), :func:`open_aio`
returns None with the reason logged, and the daemon reads as it did before.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import mmap
import os
import platform
import struct
from collections.abc import Sequence

log = logging.getLogger(__name__)

ALIGN = 4096  # O_DIRECT alignment of buffers, offsets and lengths (the largest logical block size)

# syscall numbers; the generic table (aarch64, riscv64, loongarch64) and x86_64's own
_SYSCALLS = {
    "x86_64": {"io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209},
    "aarch64": {"io_setup": 0, "io_destroy": 1, "io_submit": 2, "io_getevents": 4},
    "riscv64": {"io_setup": 0, "io_destroy": 1, "io_submit": 2, "io_getevents": 4},
}

_IOCB_CMD_PREAD = 0
_IOCB_FLAG_RESFD = 1
# struct iocb, little endian: aio_data, aio_key, aio_rw_flags, aio_lio_opcode, aio_reqprio,
# aio_fildes, aio_buf, aio_nbytes, aio_offset, aio_reserved2, aio_flags, aio_resfd
_IOCB = struct.Struct("<QIIHhIQQqQII")
_EVENT = struct.Struct("<QQqq")  # struct io_event: data, obj, res, res2
assert _IOCB.size == 64 and _EVENT.size == 32


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class AioError(OSError):
    """A read the kernel failed (its errno), or one refused before submission."""


class AioRead:
    """A completed read: ``data`` is a view of the bytes read (shorter than asked at the end of
    the file), valid until :meth:`AioReader.release` gives its slot back."""

    __slots__ = ("slot", "data")

    def __init__(self, slot: int, data: memoryview) -> None:
        self.slot = slot
        self.data = data


class AioReader:
    """Batches of aligned O_DIRECT reads on one event loop. Not thread-safe: every method is called
    on the loop's thread. Use :func:`open_aio` to make one."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, depth: int, slot_bytes: int) -> None:
        if slot_bytes % ALIGN or slot_bytes <= 0 or depth <= 0:
            raise ValueError(f"bad AIO geometry depth={depth} slot_bytes={slot_bytes}")
        nums = _SYSCALLS.get(platform.machine())
        if nums is None or platform.system() != "Linux" or platform.architecture()[0] != "64bit":
            raise OSError(errno.ENOSYS, f"no native AIO syscall numbers for {platform.machine()}")
        self._nums = nums
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = self._libc.syscall
        self._syscall.restype = ctypes.c_long
        self.depth = depth
        self.slot_bytes = slot_bytes
        self._loop = loop
        ctx = ctypes.c_ulong(0)
        if self._call("io_setup", ctypes.c_long(depth), ctypes.byref(ctx)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"io_setup({depth}): {os.strerror(e)}")
        self._ctx = ctx
        self._efd = -1
        self._mem: mmap.mmap | None = None
        try:
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._mem = mmap.mmap(-1, depth * slot_bytes)  # page aligned, so every slot is
            self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._mem))
            self._view = memoryview(self._mem)
            self._iocbs = (ctypes.c_char * (64 * depth))()
            self._iocb_base = ctypes.addressof(self._iocbs)
            self._iocb_view = memoryview(self._iocbs).cast("B")
            self._ptrs = (ctypes.c_void_p * depth)()
            self._events = (ctypes.c_char * (32 * depth))()
            self._events_view = memoryview(self._events).cast("B")
            self._zero = _Timespec(0, 0)
            loop.add_reader(self._efd, self._on_ready)
        except BaseException:
            self._teardown()
            raise
        self._free = list(range(depth - 1, -1, -1))
        self._waiting: dict[int, tuple[asyncio.Future[AioRead], int]] = {}  # slot -> (future, length)
        self._closed = False
        self.submitted = 0  # reads handed to the kernel
        self.batches = 0  # io_submit calls

    def _call(self, name: str, *args: object) -> int:
        return int(self._syscall(ctypes.c_long(self._nums[name]), *args))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    def read_batch(self, reads: Sequence[tuple[int, int, int]]) -> list[asyncio.Future[AioRead]]:
        """Submit ``(fd, offset, length)`` reads (fd opened with O_DIRECT; offset a multiple of
        ALIGN; length at most ``slot_bytes``) in one ``io_submit``. Each future's result is an
        :class:`AioRead` whose slot the caller gives back with :meth:`release`; it fails with
        :class:`AioError` (the read's errno). At most :attr:`free_slots` reads may be submitted.
        The descriptors must stay open until the reads complete."""
        if self._closed:
            raise AioError(errno.EBADF, "AIO reader is closed")
        n = len(reads)
        if n > len(self._free):
            raise AioError(errno.EAGAIN, f"{n} reads but {len(self._free)} free AIO slots")
        futures: list[asyncio.Future[AioRead]] = []
        slots: list[int] = []
        for i, (fd, offset, length) in enumerate(reads):
            if offset % ALIGN or length <= 0 or length > self.slot_bytes:
                for s in slots:
                    self._free.append(s)
                raise AioError(
                    errno.EINVAL, f"unaligned or oversized AIO read offset={offset} length={length}"
                )
            slot = self._free.pop()
            slots.append(slot)
            asked = -(-length // ALIGN) * ALIGN
            _IOCB.pack_into(
                self._iocb_view,
                64 * slot,
                slot,  # aio_data: which slot completed
                0,
                0,
                _IOCB_CMD_PREAD,
                0,
                fd,
                self._base + slot * self.slot_bytes,
                asked,
                offset,
                0,
                _IOCB_FLAG_RESFD,
                self._efd,
            )
            self._ptrs[i] = self._iocb_base + 64 * slot
        done = 0
        while done < n:
            r = self._call(
                "io_submit",
                self._ctx,
                ctypes.c_long(n - done),
                ctypes.byref(self._ptrs, done * ctypes.sizeof(ctypes.c_void_p)),
            )
            if r < 0:
                e = ctypes.get_errno()
                if e == errno.EINTR:
                    continue
                # the reads from `done` on were not submitted: their slots are free again, and
                # the caller learns why through their futures
                for slot in slots[done:]:
                    self._free.append(slot)
                slots = slots[:done]
                for _ in range(n - done):
                    fut = self._loop.create_future()
                    fut.set_exception(AioError(e, f"io_submit: {os.strerror(e)}"))
                    futures.append(fut)
                break
            done += r
            if r == 0:  # pragma: no cover - the kernel returns an error rather than 0
                break
        self.batches += 1
        self.submitted += done
        head = [self._loop.create_future() for _ in range(done)]
        for slot, fut, (_, _, length) in zip(slots, head, reads, strict=False):
            self._waiting[slot] = (fut, length)
        return head + futures

    def release(self, read: AioRead) -> None:
        """Give back a completed read's slot (after its bytes were copied out)."""
        read.data.release()
        self._free.append(read.slot)

    def _on_ready(self) -> None:
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            return
        self._reap()

    def _reap(self) -> None:
        while self._waiting:
            got = self._call(
                "io_getevents",
                self._ctx,
                ctypes.c_long(0),
                ctypes.c_long(self.depth),
                self._events,
                ctypes.byref(self._zero),
            )
            if got < 0:
                e = ctypes.get_errno()
                if e == errno.EINTR:
                    continue
                log.error("io_getevents failed: %s", os.strerror(e))
                return
            if got == 0:
                return
            for i in range(got):
                slot, _, res, _ = _EVENT.unpack_from(self._events_view, 32 * i)
                fut, length = self._waiting.pop(slot)
                if res < 0:
                    self._free.append(slot)
                    if not fut.done():
                        fut.set_exception(AioError(-res, f"AIO read: {os.strerror(-res)}"))
                    continue
                start = slot * self.slot_bytes
                view = self._view[start : start + min(res, length)]
                if fut.done():  # cancelled by its waiter: nobody will release it
                    view.release()
                    self._free.append(slot)
                else:
                    fut.set_result(AioRead(slot, view))
            if got < self.depth:
                return

    async def close(self) -> None:
        """Wait for reads in flight (their buffers belong to the kernel until then), then free
        everything."""
        if self._closed:
            return
        self._closed = True
        while self._waiting:
            await asyncio.sleep(0.001)
            self._reap()
        self._teardown()

    def _teardown(self) -> None:
        if self._efd >= 0:
            self._loop.remove_reader(self._efd)
            os.close(self._efd)
            self._efd = -1
        if self._ctx.value:
            self._call("io_destroy", self._ctx)
            self._ctx = ctypes.c_ulong(0)
        if self._mem is not None:
            if hasattr(self, "_view"):
                self._view.release()
            try:
                self._mem.close()
            except BufferError:  # a view handed out is still alive; the mapping goes with it
                pass
            self._mem = None


def open_aio(
    loop: asyncio.AbstractEventLoop, *, depth: int = 128, slot_bytes: int = 128 << 10
) -> AioReader | None:
    """An :class:`AioReader` on ``loop``, or None (logged, with the reason) where this machine
    cannot do native AIO."""
    try:
        return AioReader(loop, depth=depth, slot_bytes=slot_bytes)
    except OSError as exc:
        log.warning("native AIO unavailable, cold reads use the event loop or I/O threads: %s", exc)
        return None
