"""The ``mem`` engine: an in-process store for unit tests, with the same semantics as the others.

The store is a sorted key list plus a dict. Snapshots are copy-on-write: a transaction's first read
pins the current state, and a commit copies the state before changing it only while some open
transaction still pins it. So open snapshots stay frozen without locks, a lone caller never copies,
and concurrent callers pay one O(n) copy per commit, which is fine for the small stores of unit
tests (use the lmdb engine for anything large).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import Database, Transaction
from fs3.kv.txn import BufferedTransaction, CommitRequest, validate_and_apply


class _State:
    __slots__ = ("keys", "data", "pins")

    def __init__(self, keys: list[bytes], data: dict[bytes, bytes]) -> None:
        self.keys = keys
        self.data = data
        # ids of the open snapshots pinning this state; set.add/discard are atomic, so snapshots
        # can unpin from __del__ without taking the database lock.
        self.pins: set[int] = set()

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def iter_range(self, begin: bytes, end: bytes, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        keys, data = self.keys, self.data
        lo = bisect.bisect_left(keys, begin)
        hi = bisect.bisect_left(keys, end, lo)
        if reverse:
            for i in range(hi - 1, lo - 1, -1):
                yield keys[i], data[keys[i]]
        else:
            for i in range(lo, hi):
                yield keys[i], data[keys[i]]

    # Mutations; only ever applied to an unshared state.

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self.data:
            bisect.insort(self.keys, key)
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        if self.data.pop(key, None) is not None:
            del self.keys[bisect.bisect_left(self.keys, key)]

    def delete_range(self, begin: bytes, end: bytes) -> None:
        lo = bisect.bisect_left(self.keys, begin)
        hi = bisect.bisect_left(self.keys, end, lo)
        for key in self.keys[lo:hi]:
            del self.data[key]
        del self.keys[lo:hi]


class _MemSnapshot:
    __slots__ = ("get", "iter_range", "_pins")

    def __init__(self, state: _State) -> None:
        self.get = state.get
        self.iter_range = state.iter_range
        self._pins = state.pins
        self._pins.add(id(self))

    def release(self) -> None:
        self._pins.discard(id(self))

    def version(self) -> None:
        return None  # (this engine validates each commit by reading; see fs3.kv.txn.BatchValidator)

    def __del__(self) -> None:  # an abandoned transaction must not pin its state forever
        self._pins.discard(id(self))


class MemoryDatabase(Database):
    """An in-memory :class:`~fs3.kv.base.Database`; contents vanish with the object.

    Safe to use from several threads and event loops at once.
    """

    def __init__(self) -> None:
        self._state = _State([], {})
        self._lock = threading.Lock()
        self._closed = False

    def _open_snapshot(self) -> _MemSnapshot:
        with self._lock:
            if self._closed:
                raise FS3Error(StatusCode.KV_STORE_FAILED, "database is closed")
            return _MemSnapshot(self._state)

    async def _submit(self, req: CommitRequest) -> None:
        with self._lock:
            if self._closed:
                raise FS3Error(StatusCode.KV_STORE_FAILED, "database is closed")
            state = self._state
            if state.pins:
                state = self._state = _State(list(state.keys), dict(state.data))
            if not validate_and_apply(state, req):
                raise FS3Error(StatusCode.KV_CONFLICT, "a value read by this transaction changed")

    def create_transaction(self) -> Transaction:
        return BufferedTransaction(self._open_snapshot, self._submit)

    async def close(self) -> None:
        with self._lock:
            self._closed = True
