"""The ``fdb`` engine: FoundationDB through the official ``foundationdb`` binding.

FoundationDB already has the semantics :mod:`fs3.kv.base` describes, so this module is a thin
adapter. Its two jobs: never block the event loop (every binding future is awaited through
``on_ready``, whose callback runs on FoundationDB's network thread and hands the result to the loop),
and translate ``FDBError`` codes into :class:`fs3.errors.FS3Error` status codes. The binding and
``libfdb_c`` are imported only when an ``fdb`` database is opened.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import MAX_TXN_SIZE, Database, KeyValue, ReadView, Transaction
from fs3.kv.txn import SYSTEM_KEYS, check_key, check_value, check_write_key, clamp_end

log = logging.getLogger(__name__)

API_VERSION = 710

# FoundationDB errors its own retry loop (``on_error``) retries; re-running the transaction function
# is the right response to each, so they surface as KV_CONFLICT. 1021 (commit_unknown_result) is
# among them, exactly as in ``@fdb.transactional``: transaction functions must be idempotent. Which
# errors those are is libfdb_c's to say (``fdb.predicates.is_retryable``: cluster_version_changed
# during an upgrade, proxy memory limits and throttling under load, ...); this set only names the
# common ones, so they are known without a call into the library.
_RETRYABLE = {1007, 1009, 1020, 1021, 1037, 1038, 1213}
_CODES = {
    1025: StatusCode.KV_TXN_CLOSED,  # transaction_cancelled
    2101: StatusCode.KV_TXN_TOO_LARGE,
    2102: StatusCode.KV_KEY_TOO_LARGE,
    2103: StatusCode.KV_VALUE_TOO_LARGE,
}

_load_lock = threading.Lock()


def _load_fdb() -> Any:
    with _load_lock:
        try:
            import fdb
        except ImportError as e:
            raise FS3Error(StatusCode.KV_STORE_FAILED, f"foundationdb binding unavailable: {e}") from e
        if not fdb.is_api_version_selected():
            try:
                fdb.api_version(API_VERSION)
            except Exception as e:  # libfdb_c missing or too old
                raise FS3Error(StatusCode.KV_STORE_FAILED, f"cannot load libfdb_c: {e}") from e
        return fdb


def _translate(fdb: Any, e: BaseException) -> BaseException:
    if isinstance(e, fdb.FDBError):
        if e.code in _RETRYABLE or fdb.predicates.is_retryable(e):
            return FS3Error(StatusCode.KV_CONFLICT, f"fdb {e.code}: {e.description}")
        code = _CODES.get(e.code, StatusCode.KV_STORE_FAILED)
        return FS3Error(code, f"fdb {e.code}: {e.description}")
    return e


class _Reads(ReadView):
    """Reads through one binding transaction (or its ``snapshot``)."""

    def __init__(self, owner: FdbTransaction, reader: Any) -> None:
        self._owner = owner
        self._reader = reader

    async def get(self, key: bytes) -> bytes | None:
        self._owner._usable()
        check_key(key)
        if key >= SYSTEM_KEYS:
            return None
        value = self._reader.get(key)
        await self._owner._ready(value)
        try:
            return value.value
        except Exception as e:
            raise _translate(self._owner._fdb, e) from e

    async def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        self._owner._usable()
        if limit < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative range limit {limit}")
        end = clamp_end(end)
        if begin >= end:
            return []
        fdb = self._owner._fdb
        selector = fdb.KeySelector.first_greater_or_equal
        first, last = selector(begin), selector(end)
        mode = fdb.StreamingMode.exact if limit else fdb.StreamingMode.want_all
        out: list[KeyValue] = []
        iteration = 1
        # The binding's public get_range blocks while iterating; _get_range is the one-batch future
        # it is built on, paged here the same way.
        while True:
            fut = self._reader._get_range(first, last, limit, mode, iteration, reverse)
            await self._owner._ready(fut)
            try:
                kvs, count, more = fut.wait()
            except Exception as e:
                raise _translate(fdb, e) from e
            out += [KeyValue(kv.key, kv.value) for kv in kvs]
            if limit:
                limit -= count
            if not count or not more or (limit <= 0 and mode == fdb.StreamingMode.exact):
                return out
            iteration += 1
            if reverse:
                last = selector(kvs[-1].key)
            else:
                first = fdb.KeySelector.first_greater_than(kvs[-1].key)


class FdbTransaction(Transaction):
    """A FoundationDB transaction with fs3's limits checked before the binding sees the call."""

    def __init__(self, fdb: Any, tr: Any) -> None:
        self._fdb = fdb
        self._tr = tr
        self._closed = False
        self._size = 0

    def _usable(self) -> None:
        if self._closed:
            raise FS3Error(StatusCode.KV_TXN_CLOSED, "transaction already committed or cancelled")

    async def _ready(self, fut: Any) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_ready(_: Any) -> None:  # runs on FoundationDB's network thread
            loop.call_soon_threadsafe(_settle, done)

        fut.on_ready(on_ready)
        try:
            await done
        except asyncio.CancelledError:
            fut.cancel()
            raise

    def _grow(self, n: int) -> None:
        self._size += n
        if self._size > MAX_TXN_SIZE:
            raise FS3Error(
                StatusCode.KV_TXN_TOO_LARGE, f"transaction of {self._size} bytes exceeds {MAX_TXN_SIZE}"
            )

    @property
    def snapshot(self) -> ReadView:
        # made when asked for, not kept: a reader kept here (it refers to this transaction) would
        # be a reference cycle keeping every transaction until a cyclic collection
        return _Reads(self, self._tr.snapshot)

    async def get(self, key: bytes) -> bytes | None:
        return await _Reads(self, self._tr).get(key)

    async def get_range(
        self, begin: bytes, end: bytes, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        return await _Reads(self, self._tr).get_range(begin, end, limit, reverse)

    def _writing(self, key: bytes, value: bytes) -> Any:
        """Check a mutation of ``key`` with ``value`` (or operand) and count it against the size
        limit; the native transaction to apply it to."""
        self._usable()
        check_write_key(key)
        check_value(value)
        self._grow(len(key) + len(value))
        return self._tr

    def set(self, key: bytes, value: bytes) -> None:
        self._writing(key, value).set(key, value)

    def clear(self, key: bytes) -> None:
        self._usable()
        check_write_key(key)
        self._grow(len(key))
        self._tr.clear(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._usable()
        check_write_key(begin, point=False)
        end = clamp_end(end)
        if begin >= end:
            return
        self._grow(len(begin) + len(end))
        self._tr.clear_range(begin, end)

    def add(self, key: bytes, operand: bytes) -> None:
        self._writing(key, operand).add(key, operand)

    def atomic_max(self, key: bytes, operand: bytes) -> None:
        self._writing(key, operand).max(key, operand)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._usable()
        end = clamp_end(end)
        if begin >= end:
            return
        self._grow(len(begin) + len(end))
        self._tr.add_read_conflict_range(begin, end)

    async def commit(self) -> None:
        self._usable()
        self._closed = True
        fut = self._tr.commit()
        await self._ready(fut)
        try:
            fut.wait()
        except Exception as e:
            raise _translate(self._fdb, e) from e

    def cancel(self) -> None:
        if not self._closed:
            self._closed = True
            self._tr.cancel()


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class FdbDatabase(Database):
    """A FoundationDB database named by ``cluster_file`` (None: the binding's default lookup)."""

    def __init__(self, cluster_file: str | None = None) -> None:
        self._fdb = _load_fdb()
        try:
            self._db = self._fdb.open(cluster_file)
        except Exception as e:
            raise FS3Error(StatusCode.KV_STORE_FAILED, f"cannot open fdb {cluster_file}: {e}") from e
        log.info("kv fdb opened cluster_file=%s", cluster_file)

    def create_transaction(self) -> Transaction:
        return FdbTransaction(self._fdb, self._db.create_transaction())

    async def close(self) -> None:
        # The binding keeps one network thread per process for its lifetime; nothing to release.
        self._db = None
