"""Ctrl-C in a blocking call of the synchronous API (fs3.client.sync_api): the call is cancelled
before KeyboardInterrupt reaches the caller. It went on in the client's loop thread: a read
interrupted so finished after the caller's next seek and moved the position to the end, and an
interrupted write went on writing."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from fs3.client.sync_api import _LoopThread

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def ctrl_c() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt, as in a program run from a terminal (a test process started
    in the background, as CI may run it, inherits SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_cancels_the_call_and_waits_for_its_end() -> None:
    loop = _LoopThread()
    effects: list[str] = []

    async def call() -> None:
        try:
            # Ctrl-C, to the main thread, waiting (sent to the process, the kernel may hand it to
            # this thread: the waiting one then saw it only once the call had finished; CI run)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            await asyncio.sleep(2)
            effects.append("finished")  # as a read moving the position would
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # a call that takes a while to wind down is waited for
            effects.append("cancelled")
            raise

    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(call())
        assert effects == ["cancelled"]
        time.sleep(2.2)
        assert effects == ["cancelled"]
        assert loop.run(asyncio.sleep(0, "still usable")) == "still usable"
    finally:
        loop.stop()


def test_ctrl_c_handled_by_another_thread_still_cancels_the_call() -> None:
    """A Ctrl-C whose C-level handler ran while the caller was going to sleep, or in another
    thread (here: the caller's thread blocks SIGINT, so the kernel gives it to the loop's), did not
    wake the caller: Python ran its handler only once the call had finished (a CI run: the
    KeyboardInterrupt came after "finished")."""
    loop = _LoopThread()  # its thread starts before the mask below: it takes SIGINT
    effects: list[str] = []

    async def call() -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(2)
            effects.append("finished")
        except asyncio.CancelledError:
            effects.append("cancelled")
            raise

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(call())
        assert effects == ["cancelled"]
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        loop.stop()


class _SlowClient:
    """Stands for a SyncFileSystem whose close writes what its open files hold; the user presses
    Ctrl-C ``presses`` times meanwhile."""

    def __init__(self, presses: int) -> None:
        self.presses = presses
        self.closed = False

    def close(self) -> None:
        for _ in range(self.presses):
            os.kill(os.getpid(), signal.SIGINT)  # (its handler runs here, in this thread)
            time.sleep(0.05)
        self.closed = True


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_while_files_left_open_are_written_at_exit(capsys, presses: int) -> None:
    """A Ctrl-C during the exit-time close of clients cancelled it: writes write() had taken were
    lost (a 300 MiB file ended at 0 to 114 MiB) and the session was left to expire. The first is
    held now, and said so; a second abandons the writes."""
    from fs3.client import sync_api

    slow = _SlowClient(presses)
    sync_api._OPEN_CLIENTS.add(slow)
    try:
        sync_api._close_at_exit()
        err = capsys.readouterr().err
        assert "Ctrl-C again to abandon it" in err
        assert slow.closed is (presses == 1)
        assert ("abandoned the writes" in err) is (presses == 2)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (the fixture's)
    finally:
        sync_api._OPEN_CLIENTS.discard(slow)
