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

import pytest

from fs3.client.sync_api import _LoopThread

pytestmark = pytest.mark.timeout(60)


def test_ctrl_c_cancels_the_call_and_waits_for_its_end() -> None:
    loop = _LoopThread()
    effects: list[str] = []

    async def call() -> None:
        try:
            await asyncio.sleep(2)
            effects.append("finished")  # as a read moving the position would
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # a call that takes a while to wind down is waited for
            effects.append("cancelled")
            raise

    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            loop.run(call())
        assert effects == ["cancelled"]
        time.sleep(2.2)
        assert effects == ["cancelled"]
        assert loop.run(asyncio.sleep(0, "still usable")) == "still usable"
    finally:
        loop.stop()
