"""Several NICs per node: which one a new connection uses, and a cap on one-sided operations per NIC.

Connections to one peer rotate round-robin over the usable NICs, so a client with two NICs spreads
its connections (and a storage node its chain links) over both. Each NIC caps how many RDMA
READ/WRITE operations are outstanding on it at once (3FS: 256 each), so a burst of large reads
queues in the process instead of flooding the NIC's send queues and the fabric.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class NicSelector(Generic[T]):
    """Round-robin over ``nics``, with a separate rotation per peer."""

    def __init__(self, nics: Sequence[T]) -> None:
        if not nics:
            raise ValueError("no usable RDMA NIC")
        self.nics = list(nics)
        self._next: dict[Hashable, int] = {}

    def pick(self, peer: Hashable) -> T:
        """The NIC for the next connection to ``peer``."""
        i = self._next.get(peer, hash(peer) % len(self.nics))  # spread first connections too
        self._next[peer] = (i + 1) % len(self.nics)
        return self.nics[i]


class OneSidedLimiter:
    """At most ``limit`` one-sided operations outstanding; the rest wait in FIFO order.

    Usable from callbacks (:meth:`submit` runs a start function once a slot is free) and from
    coroutines (:meth:`acquire`). Every granted slot must be given back with :meth:`release`.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the one-sided operation limit must be at least 1")
        self.limit = limit
        self.outstanding = 0
        self.peak = 0
        self._queue: deque[Callable[[], None]] = deque()

    def submit(self, start: Callable[[], None]) -> None:
        """Run ``start()`` now if a slot is free, else when one is released."""
        if self.outstanding < self.limit and not self._queue:
            self._grant()
            start()
        else:
            self._queue.append(start)

    async def acquire(self) -> None:
        """Wait for a slot."""
        if self.outstanding < self.limit and not self._queue:
            self._grant()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def granted() -> None:
            if fut.done():  # cancelled while queued: pass the slot on
                self.release()
            else:
                fut.set_result(None)

        self._queue.append(granted)
        await fut

    def _grant(self) -> None:
        self.outstanding += 1
        self.peak = max(self.peak, self.outstanding)

    def release(self) -> None:
        """An operation finished; start the next queued one."""
        if self.outstanding <= 0:
            raise RuntimeError("release without a granted slot")
        self.outstanding -= 1
        if self._queue:
            self._grant()
            self._queue.popleft()()

    @property
    def queued(self) -> int:
        return len(self._queue)
