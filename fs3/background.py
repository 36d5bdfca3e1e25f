"""Background loops of daemons and clients: one step every interval, or sooner when woken.

Heartbeats, routing refreshes, session extensions, metadata garbage collection and the resync scan
all run this way. A step that raises is reported through ``on_error`` (by default logged with its
traceback) and the loop goes on; only cancellation (``stop``) ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task[object]) -> None:
    """Cancel ``task`` and wait until it has ended. Its CancelledError is swallowed, but not the
    caller's own: a caller cancelled while waiting here is cancelled (``suppress(CancelledError)``
    around the wait would swallow both, and the caller would go on as if nothing happened)."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise


class Periodic:
    """Runs ``step`` every ``interval_s`` seconds, or as soon as :meth:`wake` is called, after at
    least ``min_gap_s`` since the previous step ended (a storm of wake-ups costs one step per gap).

    ``interval_s`` may be changed while the loop runs; it applies from the next wait.
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[object]],
        interval_s: float,
        *,
        on_error: Callable[[Exception], None] | None = None,
        min_gap_s: float = 0.0,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.min_gap_s = min_gap_s
        self._step = step
        self._on_error = on_error or (lambda _e: log.exception("%s failed", name))
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=self.name)

    def wake(self) -> None:
        """Run the step now instead of at the end of the interval; cheap to call often."""
        self._wake.set()

    async def stop(self) -> None:
        """Cancel the loop (a step in progress included) and wait until it has ended."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancel that arrives as
            # the wake-up completes, and stop() would then wait for ever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._on_error(e)
            if self.min_gap_s > 0:
                await asyncio.sleep(self.min_gap_s)
