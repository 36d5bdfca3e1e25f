"""fs3.client.fuse_wait: one reader registration for a stream of FUSE requests, on a real pipe and
a real event loop (the FUSE device behaves the same for readiness: readable while a request is
queued)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

pyfuse3_asyncio = pytest.importorskip("pyfuse3.asyncio")

from fs3.client import fuse_wait  # noqa: E402


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        yield r, w
    finally:
        fuse_wait.uninstall()
        os.close(r)
        os.close(w)


async def _serve_one(r: int) -> bytes:
    await fuse_wait.wait_readable(r)
    return os.read(r, 1)


async def test_requests_are_handed_over_without_re_registering(pipe: tuple[int, int]) -> None:
    r, w = pipe
    loop = asyncio.get_running_loop()
    calls = {"add": 0, "remove": 0}
    add, remove = loop.add_reader, loop.remove_reader

    def counting_add(fd, cb, *args):  # type: ignore[no-untyped-def]
        calls["add"] += 1
        return add(fd, cb, *args)

    def counting_remove(fd):  # type: ignore[no-untyped-def]
        calls["remove"] += 1
        return remove(fd)

    loop.add_reader, loop.remove_reader = counting_add, counting_remove  # type: ignore[method-assign]
    try:
        got = []
        for i in range(50):  # one waiter at a time, as pyfuse3's read lock makes it
            os.write(w, bytes([i]))
            got.append(await _serve_one(r))
        assert got == [bytes([i]) for i in range(50)]
        assert calls == {"add": 1, "remove": 0}, calls

        # requests queued while nobody waits: the registration goes after two idle wake-ups
        # instead of waking the loop for ever
        os.write(w, b"xyz")
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls["remove"] == 1 and not fuse_wait._devices[r].registered
        # and the next waiter registers again and is woken at once (the bytes are still there)
        assert await asyncio.wait_for(_serve_one(r), 1) == b"x"
        assert calls["add"] == 2
    finally:
        loop.add_reader, loop.remove_reader = add, remove  # type: ignore[method-assign]


async def test_a_cancelled_waiter_leaves_nothing_registered(pipe: tuple[int, int]) -> None:
    r, _ = pipe
    task = asyncio.create_task(fuse_wait.wait_readable(r))
    await asyncio.sleep(0.01)
    assert fuse_wait._devices[r].registered
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not fuse_wait._devices[r].registered
    assert r not in pyfuse3_asyncio._read_futures


async def test_closing_the_device_fails_the_waiter_and_drops_the_reader(pipe: tuple[int, int]) -> None:
    r, _ = pipe
    if not fuse_wait.install():
        pytest.skip("pyfuse3 version not among fuse_wait.CHECKED_VERSIONS")
    waiting = asyncio.create_task(pyfuse3_asyncio.wait_readable(r))
    await asyncio.sleep(0.01)
    pyfuse3_asyncio.notify_closing(r)
    with pytest.raises(pyfuse3_asyncio.ClosedResourceError):
        await waiting
    assert r not in fuse_wait._devices


async def test_two_waiters_at_once_are_refused(pipe: tuple[int, int]) -> None:
    r, w = pipe
    first = asyncio.create_task(fuse_wait.wait_readable(r))
    await asyncio.sleep(0.01)
    with pytest.raises(RuntimeError):
        await fuse_wait.wait_readable(r)
    os.write(w, b"a")
    await asyncio.wait_for(first, 1)


def test_a_device_gone_while_nobody_waits_wakes_the_next_waiter_on_uvloop() -> None:
    """After an unmount the FUSE device polls POLLERR alone. uvloop answers that with one last
    callback and closes its watch, which stays behind dead: with the registration kept between
    requests and no task waiting at that moment, the next wait (pyfuse3's next worker) never woke,
    and the mount never exited (seen in CI: workers waiting, the session over).
    :func:`fuse_wait.device_gone`, which the mount calls when it sees the connection over, wakes it
    and makes later waits return at once."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> bool:
        r, w = os.pipe()  # the write end of a pipe whose read end is closed polls POLLERR alone
        try:
            first = asyncio.ensure_future(fuse_wait.wait_readable(w))
            await asyncio.sleep(0.01)
            dev = fuse_wait._devices[w]
            assert dev.waiter is not None
            dev.waiter.set_result(None)  # as a request would: the waiter woken, the watch kept
            await first
            os.close(r)
            await asyncio.sleep(0.1)  # uvloop's last callback finds nobody waiting
            waiting = asyncio.ensure_future(fuse_wait.wait_readable(w))
            await asyncio.sleep(0.1)
            fuse_wait.device_gone(w)
            await asyncio.wait_for(waiting, 2)  # woken
            await asyncio.wait_for(fuse_wait.wait_readable(w), 2)  # and the next returns at once
            return not dev.registered
        finally:
            fuse_wait.uninstall()
            os.close(w)

    assert uvloop.run(main())
