"""The transactional key-value interface every fs3 service uses.

Semantics follow FoundationDB so that code written against the embedded engine works unchanged on
FoundationDB:

* A :class:`Transaction` sees one consistent snapshot of the store as of its first read, plus its own
  writes (read-your-writes).
* Commits are serializable: a transaction whose non-snapshot reads (keys and ranges) were changed by
  another transaction committed after its snapshot fails to commit with ``KV_CONFLICT``. Reads through
  ``tr.snapshot`` add no conflict ranges.
* ``set``/``clear``/``clear_range``/``add``/``atomic_max`` are buffered and take effect atomically at commit.
* ``add`` is FoundationDB's atomic ADD: the operand and the stored value are little-endian unsigned
  integers of the operand's width (a missing key counts as zero); it never conflicts.
  ``atomic_max`` is its MAX: the larger of the two, read the same way (the operand where nothing
  is stored), so that concurrent writers of a time stamp leave the latest, whatever their order.
* The empty key is no key on any engine (LMDB cannot store it): a get or write of it is
  INVALID_ARGUMENT; a range may begin there.
* Limits are FoundationDB's, enforced on every engine: key ≤ 10,000 bytes, value ≤ 100,000 bytes,
  a transaction's mutations plus conflict ranges ≤ 10,000,000 bytes. Violations raise
  :class:`fs3.errors.FS3Error` with KV_KEY_TOO_LARGE / KV_VALUE_TOO_LARGE / KV_TXN_TOO_LARGE at the
  call that breaks them.
* ``Database.run(fn)`` creates a transaction, awaits ``fn(tr)``, commits, and on KV_CONFLICT retries
  with exponential backoff up to ``max_attempts`` times (then KV_RETRY_LIMIT). ``fn`` must therefore be
  safe to re-run. The commit is acknowledged only once it is durable.

All methods that may wait are coroutines and never block the event loop for more than about a
millisecond (commits and fsyncs run on threads).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple, TypeVar

from fs3.errors import FS3Error
from fs3.kv.retry import run_transaction

MAX_KEY_SIZE = 10_000
MAX_VALUE_SIZE = 100_000
MAX_TXN_SIZE = 10_000_000

T = TypeVar("T")


class KeyValue(NamedTuple):
    key: bytes
    value: bytes


class ReadView(abc.ABC):
    """Reads of a transaction: the transaction itself, or its ``snapshot`` view."""

    @abc.abstractmethod
    async def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, or None when absent."""

    @abc.abstractmethod
    async def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        """Pairs with ``begin <= key < end`` in key order (descending when ``reverse``); at most
        ``limit`` of them when ``limit > 0``. With ``reverse`` and a limit, the last ``limit`` keys of
        the range are returned, highest first."""

    async def get_prefix(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        return await self.get_range(prefix, prefix_end(prefix), limit, reverse)


class Transaction(ReadView):
    """One serializable transaction. Not safe to share between concurrent tasks."""

    @property
    @abc.abstractmethod
    def snapshot(self) -> ReadView:
        """Reads that see the same snapshot but add no read-conflict ranges."""

    @abc.abstractmethod
    def set(self, key: bytes, value: bytes) -> None: ...

    @abc.abstractmethod
    def clear(self, key: bytes) -> None: ...

    @abc.abstractmethod
    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Remove every key with ``begin <= key < end``."""

    @abc.abstractmethod
    def add(self, key: bytes, operand: bytes) -> None:
        """Atomic little-endian add of ``operand`` to the value at ``key`` (see module docstring)."""

    @abc.abstractmethod
    def atomic_max(self, key: bytes, operand: bytes) -> None:
        """Atomic little-endian max of ``operand`` and the value at ``key`` (see module docstring)."""

    def add_int(self, key: bytes, delta: int, width: int = 8) -> None:
        self.add(key, (delta % (1 << (8 * width))).to_bytes(width, "little"))

    def use_reserve(self, whole: bool = False) -> None:
        """Let this small transaction commit into the room a full store keeps for removals (the
        lmdb engine's RESERVE): for what must go on however full the store is (a reader's open:
        half of it at most; mgmtd's lease, ``whole``: all of it). Engines without such a reserve
        ignore it."""

    @abc.abstractmethod
    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        """Make the transaction conflict with any commit that writes into ``[begin, end)``."""

    @abc.abstractmethod
    async def commit(self) -> None:
        """Commit; returns once durable. Raises FS3Error(KV_CONFLICT) on a conflict."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Abandon the transaction; later calls raise KV_TXN_CLOSED."""


class CommitStats(NamedTuple):
    """What an engine's group commit has done in this process since the store was opened (the
    ``lmdb`` engine's; other engines report none). Counters only grow."""

    batches: int  # write transactions (groups of callers' commits) committed
    transactions: int  # callers' commits validated in them, conflicts included
    conflicts: int  # of those, the ones refused because a value they read had changed
    commit_seconds: float  # time in write transactions: validation, writes and the data flush
    fsyncs: int  # flushes that made committed batches durable before their callers heard
    fsync_seconds: float  # time in those flushes
    refused: int = 0  # transactions refused because the store was full (KV_STORE_FULL)


class StoreSpace(NamedTuple):
    """Room in a store on a disk of this machine (the ``lmdb`` engine's)."""

    used_bytes: int  # pages holding data (those LMDB may reuse not counted)
    limit_bytes: int  # the most it may hold (LMDB's map_size)
    disk_free_bytes: int  # free on the file system holding it


class Database(abc.ABC):
    """A handle on one store. Open with :func:`fs3.kv.open_database`."""

    def commit_stats(self) -> CommitStats | None:
        """Group commit counters of this process (see :class:`CommitStats`), or None where the
        engine keeps none."""
        return None

    def space(self) -> StoreSpace | None:
        """Room in the store (see :class:`StoreSpace`), or None where the engine cannot tell."""
        return None

    def failure(self) -> FS3Error | None:
        """Why this process can commit nothing any more (an engine that failed its store, e.g.
        on an fsync error), or None while it can."""
        return None

    @abc.abstractmethod
    def create_transaction(self) -> Transaction: ...

    def run(
        self,
        fn: Callable[[Transaction], Awaitable[T]],
        *,
        max_attempts: int = 20,
        read_only: bool = False,
    ) -> Coroutine[Any, Any, T]:
        """Run ``fn`` in a fresh transaction and commit, retrying on conflict (see module docstring).

        With ``read_only=True`` nothing is committed (the result reflects one snapshot). (The
        coroutine of :func:`run_transaction` itself, awaited as this one's would be: a frame fewer.)"""
        return run_transaction(self, fn, max_attempts=max_attempts, read_only=read_only)

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush outstanding commits and release the store."""


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``prefix``."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return b"\xff" * (MAX_KEY_SIZE + 1)
    p[-1] += 1
    return bytes(p)
