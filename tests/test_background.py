"""fs3.background.Periodic: the loop behind heartbeats, routing refreshes, GC and resync scans."""

from __future__ import annotations

import asyncio
import time

import pytest

from fs3.background import Periodic


async def test_steps_run_every_interval_and_at_once_when_woken():
    times: list[float] = []

    async def step() -> None:
        times.append(time.monotonic())

    loop = Periodic("t", step, 3600)
    loop.start()
    try:
        await asyncio.sleep(0.05)
        assert times == []  # the first step waits for the interval (or a wake-up)
        loop.wake()
        loop.wake()  # several wake-ups before the step runs are one step
        await asyncio.sleep(0.05)
        assert len(times) == 1
        loop.interval_s = 0.02  # applies from the next wait
        loop.wake()
        await asyncio.sleep(0.3)
        assert len(times) >= 4
    finally:
        await loop.stop()
    assert not loop.running
    count = len(times)
    await asyncio.sleep(0.1)
    assert len(times) == count  # stopped for good


async def test_a_failing_step_is_reported_and_the_loop_goes_on():
    errors: list[Exception] = []
    calls = 0
    fourth = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 4:
            fourth.set()
        if calls <= 2:
            raise ValueError(f"failure {calls}")

    loop = Periodic("t", step, 0.01, on_error=errors.append)
    loop.start()
    try:
        await asyncio.wait_for(fourth.wait(), 5)
    finally:
        await loop.stop()
    assert calls >= 4
    assert [str(e) for e in errors] == ["failure 1", "failure 2"]


async def test_the_default_error_report_logs_the_traceback(caplog):
    async def step() -> None:
        raise RuntimeError("boom")

    loop = Periodic("fs3-test-loop", step, 3600)
    loop.start()
    loop.wake()
    await asyncio.sleep(0.05)
    await loop.stop()
    [record] = [r for r in caplog.records if "fs3-test-loop failed" in r.getMessage()]
    assert record.exc_info is not None and "boom" in str(record.exc_info[1])


async def test_stop_cancels_a_step_in_progress():
    started = asyncio.Event()
    cancelled = False

    async def step() -> None:
        nonlocal cancelled
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled = True
            raise

    loop = Periodic("t", step, 3600)
    loop.start()
    loop.wake()
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(loop.stop(), 5)
    assert cancelled


async def test_stop_right_after_a_wake_up_ends_the_loop():
    """The wake-up completes the loop's wait in the same turn as the cancel arrives; on Python 3.11
    asyncio.wait_for dropped such a cancel, and stop() then waited for ever."""
    steps: list[int] = []

    async def step() -> None:
        steps.append(1)

    for _ in range(20):
        loop = Periodic("t", step, 3600)
        loop.start()
        await asyncio.sleep(0.005)  # the loop waits for a wake-up
        task = loop._task
        loop.wake()
        stopping = asyncio.ensure_future(loop.stop())
        done, _ = await asyncio.wait([stopping], timeout=5)
        assert done and task is not None and task.done(), "stop() did not end the loop"


async def test_wake_ups_are_spaced_by_the_minimum_gap():
    times: list[float] = []

    async def step() -> None:
        times.append(time.monotonic())

    loop = Periodic("t", step, 3600, min_gap_s=0.2)
    loop.start()
    try:
        for _ in range(10):
            loop.wake()
            await asyncio.sleep(0.03)
    finally:
        await loop.stop()
    assert 1 <= len(times) <= 3
    assert all(b - a >= 0.2 for a, b in zip(times, times[1:], strict=False))


@pytest.mark.parametrize("interval", [0.0, 0.001])
async def test_a_short_interval_does_not_starve_the_event_loop(interval):
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1

    loop = Periodic("t", step, interval)
    loop.start()
    other = asyncio.create_task(asyncio.sleep(0.05))
    await asyncio.wait_for(other, 2)  # other tasks still run
    await loop.stop()
    assert calls > 0
