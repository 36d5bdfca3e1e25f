"""Waiting for the FUSE device to be readable without two ``epoll_ctl`` calls per request.

pyfuse3's asyncio layer (``pyfuse3.asyncio.wait_readable``) registers a reader on the FUSE device
for every request it waits for and removes it once woken: an ``epoll_ctl(ADD)`` and an
``epoll_ctl(DEL)`` system call, a future and a callback per FUSE request, on the mount's one
thread. pyfuse3 lets only one of its worker tasks wait at a time (under its read lock), so one
reader can stay registered while requests keep coming: :func:`wait_readable` hands each
readiness to the task waiting, and drops the registration only when the device stays readable
with nobody waiting (every worker busy), so that the loop never spins on it.

:func:`install` replaces pyfuse3's function for the versions this was checked against (their
session loop calls it through the module, one waiter at a time); with any other it leaves
pyfuse3 as it is and says so.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

# pyfuse3 versions whose session loop waits for the device through pyfuse3.asyncio.wait_readable,
# one task at a time (worker_data.read_lock)
CHECKED_VERSIONS = ("3.3", "3.4", "3.5")
# readiness callbacks in a row with no task waiting before the registration is dropped: one is
# normal (the woken task has not read its request yet when the loop polls again)
IDLE_CALLBACKS = 2


class _Device:
    __slots__ = ("fd", "loop", "waiter", "registered", "idle", "gone")

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self.fd = fd
        self.loop = loop
        self.waiter: asyncio.Future[None] | None = None
        self.registered = False
        self.idle = 0
        self.gone = False  # the connection is over (device_gone): waits return at once

    def ready(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            self.waiter = None
            self.idle = 0
            waiter.set_result(None)
            return
        self.idle += 1
        if self.idle >= IDLE_CALLBACKS:
            self.loop.remove_reader(self.fd)
            self.registered = False
            self.idle = 0


_devices: dict[int, _Device] = {}
_originals: dict[str, Any] = {}  # pyfuse3's functions, while install() has replaced them


async def wait_readable(fd: Any) -> None:
    """``pyfuse3.asyncio.wait_readable`` with the reader kept registered between requests."""
    import pyfuse3.asyncio as paio

    loop = asyncio.get_running_loop()
    dev = _devices.get(fd)
    if dev is None or dev.loop is not loop:
        dev = _devices[fd] = _Device(fd, loop)
    if dev.gone:
        return  # the read that follows fails with ENODEV, and pyfuse3's worker ends
    if dev.waiter is not None and not dev.waiter.done():
        raise RuntimeError("two tasks wait for the FUSE device at once")
    future: asyncio.Future[None] = loop.create_future()
    dev.waiter = future
    dev.idle = 0
    paio._read_futures[fd].add(future)  # notify_closing fails it when the device closes
    try:
        if not dev.registered:
            loop.add_reader(fd, dev.ready)
            dev.registered = True
        await future
    except BaseException:
        if dev.registered:
            loop.remove_reader(fd)
            dev.registered = False
        raise
    finally:
        if dev.waiter is future:
            dev.waiter = None
        paio._read_futures[fd].discard(future)
        if not paio._read_futures[fd]:
            del paio._read_futures[fd]


def device_gone(fd: int | None = None) -> None:
    """The kernel has ended the FUSE connection on ``fd`` (the device polls POLLERR: an unmount, an
    abort). uvloop answers an error on a watched descriptor with one last callback and closes its
    watch, which stays behind as a dead one: if no task was waiting at that moment (every worker
    busy with a request, as when a RELEASE is served while the unmount comes), the registration
    kept here would never wake anybody again, and pyfuse3's main loop, and the mount, would never
    end. So the task waiting, if any, is woken, the watch dropped, and every later wait returns at
    once (the read after it fails with ENODEV, which ends pyfuse3's workers). ``fd`` None: every
    device this process waits for (a mount has one)."""
    if fd is None:
        for known in list(_devices):
            device_gone(known)
        return
    dev = _devices.get(fd)
    if dev is None or dev.gone:
        return
    dev.gone = True
    if dev.registered:
        try:
            dev.loop.remove_reader(fd)  # also drops a dead watch uvloop left behind
        except (ValueError, OSError, RuntimeError):
            pass
        dev.registered = False
    waiter, dev.waiter = dev.waiter, None
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def install() -> bool:
    """Use :func:`wait_readable` in pyfuse3's asyncio layer (after ``pyfuse3.asyncio.enable()``);
    False, and pyfuse3 unchanged, where its version was not checked."""
    import pyfuse3
    import pyfuse3.asyncio as paio

    version = getattr(pyfuse3, "__version__", "")
    if not version.startswith(CHECKED_VERSIONS) or not hasattr(paio, "_read_futures"):
        log.info("pyfuse3 %s: its own wait for the FUSE device is kept", version)
        return False
    if _originals:
        return True
    _originals.update(wait_readable=paio.wait_readable, notify_closing=paio.notify_closing)
    original_notify = paio.notify_closing

    def notify_closing(fd: Any) -> None:
        dev = _devices.pop(fd, None)
        if dev is not None and dev.registered:
            dev.loop.remove_reader(fd)  # before pyfuse3 closes the device
            dev.registered = False
        # pyfuse3 fails every waiter's future: one woken already (ready, device_gone) but not yet
        # run would make that raise InvalidStateError, inside the signal handler that stops
        waiting = paio._read_futures.get(fd)
        if waiting:
            waiting.difference_update([f for f in waiting if f.done()])
        original_notify(fd)

    paio.wait_readable = wait_readable  # type: ignore[assignment]
    paio.notify_closing = notify_closing  # type: ignore[assignment]
    return True


def uninstall() -> None:
    """Drop the registrations (before pyfuse3 closes the device, after its main loop ends) and
    give pyfuse3 its own functions back."""
    for dev in list(_devices.values()):
        if dev.registered:
            try:
                dev.loop.remove_reader(dev.fd)
            except (ValueError, OSError, RuntimeError):
                pass
            dev.registered = False
    _devices.clear()
    if _originals:
        import pyfuse3.asyncio as paio

        for name, fn in _originals.items():
            setattr(paio, name, fn)
        _originals.clear()
