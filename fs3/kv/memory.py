"""The ``mem`` engine: an in-process store for unit tests, with the same semantics as the others.

The store is a sorted key list plus a dict. Snapshots are copy-on-write: a transaction's first read
marks the current state shared, and the next commit copies it before changing it, so any number of
open snapshots cost one copy per commit at most and stay frozen without locks.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import Database, Transaction
from fs3.kv.txn import BufferedTransaction, CommitRequest, validate_and_apply


class _State:
    __slots__ = ("keys", "data", "shared")

    def __init__(self, keys: list[bytes], data: dict[bytes, bytes]) -> None:
        self.keys = keys
        self.data = data
        self.shared = False

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
    __slots__ = ("get", "iter_range")

    def __init__(self, state: _State) -> None:
        self.get = state.get
        self.iter_range = state.iter_range

    def release(self) -> None:
        pass


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
            self._state.shared = True
            return _MemSnapshot(self._state)

    async def _submit(self, req: CommitRequest) -> None:
        with self._lock:
            if self._closed:
                raise FS3Error(StatusCode.KV_STORE_FAILED, "database is closed")
            state = self._state
            if state.shared:
                state = self._state = _State(list(state.keys), dict(state.data))
            if not validate_and_apply(state, req):
                raise FS3Error(StatusCode.KV_CONFLICT, "a value read by this transaction changed")

    def create_transaction(self) -> Transaction:
        return BufferedTransaction(self._open_snapshot, self._submit)

    async def close(self) -> None:
        with self._lock:
            self._closed = True
