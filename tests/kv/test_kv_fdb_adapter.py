"""The fdb engine's adapter logic against a stand-in for the binding.

The real engine is covered by the conformance suite wherever FoundationDB is installed; this pins,
everywhere, what the adapter itself does: awaiting futures whose callbacks arrive on another thread,
paging ranges, checking limits before the binding sees a call, and translating error codes.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.kv import MAX_KEY_SIZE, Transaction, fdb_engine

pytestmark = pytest.mark.timeout(30)

PAGE = 3  # rows per binding batch, small so paging is exercised


class FakeFDBError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
        self.description = f"fake error {code}"


class Selector(NamedTuple):
    key: bytes
    after: bool  # first key > key (else >= key)

    @staticmethod
    def first_greater_or_equal(key: bytes) -> Selector:
        return Selector(key, False)

    @staticmethod
    def first_greater_than(key: bytes) -> Selector:
        return Selector(key, True)


class Row(NamedTuple):
    key: bytes
    value: bytes


class FakeFuture:
    """Ready at once, but like the binding's, its callbacks run on another thread."""

    def __init__(self, compute: Callable[[], Any]) -> None:
        self._compute = compute

    def on_ready(self, callback: Callable[[Any], None]) -> None:
        threading.Thread(target=callback, args=(self,)).start()

    def wait(self) -> Any:
        return self._compute()

    @property
    def value(self) -> Any:
        return self._compute()

    def cancel(self) -> None:
        pass


class FakeTransaction:
    def __init__(self, db: FakeDatabase) -> None:
        self.db = db
        self.writes: list[tuple] = []
        self.snapshot = self
        self.cancelled = False

    def get(self, key: bytes) -> FakeFuture:
        self.db.calls.append(("get", key))
        return FakeFuture(lambda: self.db.data.get(key))

    def _get_range(self, first, last, limit, mode, iteration, reverse) -> FakeFuture:
        keys = sorted(self.db.data)

        def position(sel: Selector) -> int:
            return (bisect.bisect_right if sel.after else bisect.bisect_left)(keys, sel.key)

        chosen = keys[position(first) : position(last)]
        if reverse:
            chosen.reverse()
        take = min(PAGE, limit) if limit else PAGE
        rows = [Row(k, self.db.data[k]) for k in chosen[:take]]
        return FakeFuture(lambda: (rows, len(rows), int(len(chosen) > take)))

    def set(self, key: bytes, value: bytes) -> None:
        self.writes.append(("set", key, value))

    def clear(self, key: bytes) -> None:
        self.writes.append(("clear", key))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self.writes.append(("clear_range", begin, end))

    def add(self, key: bytes, operand: bytes) -> None:
        self.writes.append(("add", key, operand))

    def max(self, key: bytes, operand: bytes) -> None:
        self.writes.append(("max", key, operand))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self.writes.append(("conflict", begin, end))

    def commit(self) -> FakeFuture:
        def outcome() -> None:
            if self.db.fail_commits:
                raise FakeFDBError(self.db.fail_commits.pop(0))
            for w in self.writes:
                if w[0] == "set":
                    self.db.data[w[1]] = w[2]
                elif w[0] == "clear":
                    self.db.data.pop(w[1], None)
                elif w[0] == "clear_range":
                    for k in [k for k in self.db.data if w[1] <= k < w[2]]:
                        del self.db.data[k]
            self.db.commits += 1

        return FakeFuture(outcome)

    def cancel(self) -> None:
        self.cancelled = True


class FakeDatabase:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.fail_commits: list[int] = []
        self.calls: list[tuple] = []
        self.commits = 0
        self.last: FakeTransaction | None = None

    def create_transaction(self) -> FakeTransaction:
        self.last = FakeTransaction(self)
        return self.last


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDatabase:
    database = FakeDatabase()
    module = SimpleNamespace(
        FDBError=FakeFDBError,
        # libfdb_c's retryable predicate, for the codes these tests use
        predicates=SimpleNamespace(is_retryable=lambda e: e.code in {1007, 1020, 1021, 1039, 1042}),
        KeySelector=Selector,
        StreamingMode=SimpleNamespace(want_all=-2, exact=0),
        open=lambda cluster_file: database,
    )
    monkeypatch.setattr(fdb_engine, "_load_fdb", lambda: module)
    return database


async def test_reads_writes_and_paged_ranges(fake: FakeDatabase) -> None:
    db = fdb_engine.FdbDatabase()

    async def load(tr: Transaction) -> None:
        for i in range(10):
            tr.set(b"k%d" % i, b"v%d" % i)

    await db.run(load)
    keys = sorted(fake.data)
    tr = db.create_transaction()
    assert await tr.get(b"k3") == b"v3"
    assert await tr.snapshot.get(b"nope") is None
    assert [kv.key for kv in await tr.get_range(b"k", b"l")] == keys
    assert [kv.key for kv in await tr.get_range(b"k", b"l", reverse=True)] == keys[::-1]
    assert [kv.key for kv in await tr.get_range(b"k", b"l", limit=7)] == keys[:7]
    assert [kv.key for kv in await tr.get_range(b"k2", b"k8", limit=5, reverse=True)] == keys[2:8][::-1][:5]
    assert await tr.get_range(b"k5", b"k5") == []
    assert len(await tr.get_prefix(b"")) == 10  # prefix_end(b"") is clamped to the user keyspace
    tr.cancel()
    assert fake.last is not None and fake.last.cancelled


async def test_limits_are_checked_before_the_binding(fake: FakeDatabase) -> None:
    db = fdb_engine.FdbDatabase()
    tr = db.create_transaction()
    for call, code in (
        (lambda: tr.set(b"k" * (MAX_KEY_SIZE + 1), b""), StatusCode.KV_KEY_TOO_LARGE),
        (lambda: tr.set(b"k", b"v" * 100_001), StatusCode.KV_VALUE_TOO_LARGE),
        (lambda: tr.set(b"\xff/x", b""), StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(FS3Error) as info:
            call()
        assert info.value.code == code
    assert fake.last is not None and fake.last.writes == []
    tr.cancel()
    with pytest.raises(FS3Error) as info:
        await tr.get(b"k")
    assert info.value.code == StatusCode.KV_TXN_CLOSED


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (2101, StatusCode.KV_TXN_TOO_LARGE),
        (1025, StatusCode.KV_TXN_CLOSED),
        (1500, StatusCode.KV_STORE_FAILED),
    ],
)
async def test_errors_are_translated(fake: FakeDatabase, code: int, expected: StatusCode) -> None:
    db = fdb_engine.FdbDatabase()
    fake.fail_commits = [code]

    async def write(tr: Transaction) -> None:
        tr.set(b"a", b"1")

    with pytest.raises(FS3Error) as info:
        await db.run(write)
    assert info.value.code == expected
    assert fake.commits == 0  # not retried


async def test_retryable_errors_rerun_the_transaction(fake: FakeDatabase) -> None:
    db = fdb_engine.FdbDatabase()
    # not_committed, commit_unknown_result, too_old, and two only libfdb_c's predicate names:
    # cluster_version_changed (an upgrade) and proxy_memory_limit_exceeded (load)
    fake.fail_commits = [1020, 1021, 1007, 1039, 1042]
    attempts = 0

    async def write(tr: Transaction) -> None:
        nonlocal attempts
        attempts += 1
        tr.add_int(b"n", 1)

    await db.run(write)
    assert attempts == 6
    assert fake.commits == 1


async def test_atomic_max_is_fdbs_max_mutation(fake: FakeDatabase) -> None:
    db = fdb_engine.FdbDatabase()

    async def write(tr: Transaction) -> None:
        tr.atomic_max(b"t", b"\x01\x02")

    await db.run(write)
    assert fake.last is not None and fake.last.writes == [("max", b"t", b"\x01\x02")]
