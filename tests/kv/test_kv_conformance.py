"""The fs3.kv contract, checked against every engine present (see conftest.py)."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.kv import MAX_KEY_SIZE, MAX_VALUE_SIZE, Database, KeyValue, Transaction, prefix_end

pytestmark = pytest.mark.timeout(60)


async def put(db: Database, items: dict[bytes, bytes]) -> None:
    async def fn(tr: Transaction) -> None:
        for k, v in items.items():
            tr.set(k, v)

    await db.run(fn)


async def read(db: Database, key: bytes) -> bytes | None:
    return await db.run(lambda tr: tr.get(key), read_only=True)


async def rows(db: Database, begin: bytes = b"", end: bytes = b"\xff", limit: int = 0, reverse: bool = False):
    return await db.run(lambda tr: tr.get_range(begin, end, limit, reverse), read_only=True)


def keys(pairs: list[KeyValue]) -> list[bytes]:
    return [kv.key for kv in pairs]


async def expect_code(code: StatusCode, coro) -> None:
    with pytest.raises(FS3Error) as info:
        await coro
    assert info.value.code == code


# -- basic reads and writes ----------------------------------------------------------------------


async def test_set_get_clear(db: Database) -> None:
    await put(db, {b"a": b"1", b"b": b""})
    assert await read(db, b"a") == b"1"
    assert await read(db, b"b") == b""  # an empty value is present, not absent
    assert await read(db, b"c") is None

    async def clear(tr: Transaction) -> None:
        tr.clear(b"a")
        tr.clear(b"never-existed")

    await db.run(clear)
    assert await read(db, b"a") is None
    assert keys(await rows(db)) == [b"b"]


async def test_read_your_writes(db: Database) -> None:
    await put(db, {b"k1": b"old", b"k2": b"two", b"k3": b"three"})
    tr = db.create_transaction()
    tr.set(b"k1", b"new")
    tr.clear(b"k2")
    tr.set(b"k4", b"four")
    assert await tr.get(b"k1") == b"new"
    assert await tr.get(b"k2") is None
    assert await tr.snapshot.get(b"k4") == b"four"
    assert await tr.get_range(b"k", b"l") == [
        KeyValue(b"k1", b"new"),
        KeyValue(b"k3", b"three"),
        KeyValue(b"k4", b"four"),
    ]
    assert keys(await tr.get_range(b"k", b"l", limit=2, reverse=True)) == [b"k4", b"k3"]
    await tr.commit()
    assert keys(await rows(db)) == [b"k1", b"k3", b"k4"]


async def test_clear_range_then_set_inside(db: Database) -> None:
    await put(db, {bytes([c]): b"x" for c in b"abcdef"})
    tr = db.create_transaction()
    tr.set(b"c", b"before-clear")  # dropped by the clear below
    tr.clear_range(b"b", b"e")
    tr.set(b"d", b"after-clear")
    assert await tr.get(b"c") is None
    assert await tr.get_range(b"a", b"z") == [
        KeyValue(b"a", b"x"),
        KeyValue(b"d", b"after-clear"),
        KeyValue(b"e", b"x"),
        KeyValue(b"f", b"x"),
    ]
    await tr.commit()
    assert keys(await rows(db)) == [b"a", b"d", b"e", b"f"]


# -- ranges ---------------------------------------------------------------------------------------


async def test_range_boundaries(db: Database) -> None:
    await put(db, {k: k for k in (b"a", b"a\x00", b"ab", b"b", b"b\x00", b"c")})
    assert keys(await rows(db, b"a", b"b")) == [b"a", b"a\x00", b"ab"]  # begin in, end out
    assert keys(await rows(db, b"a\x00", b"b\x00")) == [b"a\x00", b"ab", b"b"]
    assert keys(await rows(db, b"aa", b"ab")) == []
    assert keys(await rows(db, b"ab", b"ab")) == []  # empty
    assert keys(await rows(db, b"c", b"a")) == []  # inverted
    assert keys(await rows(db, b"", b"\xff")) == [b"a", b"a\x00", b"ab", b"b", b"b\x00", b"c"]
    assert keys(await rows(db, b"c")) == [b"c"]
    assert keys(await rows(db, b"c\x00")) == []


async def test_reverse_ranges_with_limits(db: Database) -> None:
    await put(db, {b"r%02d" % i: b"%d" % i for i in range(20)})
    assert keys(await rows(db, b"r", b"s", limit=3, reverse=True)) == [b"r19", b"r18", b"r17"]
    assert keys(await rows(db, b"r05", b"r08", reverse=True)) == [b"r07", b"r06", b"r05"]
    assert keys(await rows(db, b"r05", b"r08", limit=10, reverse=True)) == [b"r07", b"r06", b"r05"]
    assert keys(await rows(db, b"r05", b"r08", limit=1)) == [b"r05"]
    assert len(await rows(db, b"r", b"s", limit=0)) == 20
    await expect_code(StatusCode.INVALID_ARGUMENT, rows(db, b"r", b"s", limit=-1))


async def test_get_prefix_and_prefix_end(db: Database) -> None:
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") > b"\xff\xff" + b"\xff" * (MAX_KEY_SIZE - 2)
    await put(db, {b"DENT\x00\x01a": b"1", b"DENT\x00\x01b": b"2", b"DENT\x00\x02a": b"3"})
    tr = db.create_transaction()
    assert keys(await tr.get_prefix(b"DENT\x00\x01")) == [b"DENT\x00\x01a", b"DENT\x00\x01b"]
    assert keys(await tr.get_prefix(b"DENT", limit=1, reverse=True)) == [b"DENT\x00\x02a"]
    assert len(await tr.get_prefix(b"")) == 3  # the whole user keyspace
    tr.cancel()


async def test_long_keys_keep_byte_order(db: Database) -> None:
    # Keys around the lmdb engine's 448-byte bucket threshold and up to the 10,000-byte limit.
    stem = b"L" * 440
    ks = sorted(
        {
            stem + b"a" * n + bytes([tail])
            for n in (0, 6, 7, 8, 9, 40, MAX_KEY_SIZE - 441)
            for tail in (0x00, 0x61, 0xFE)
        }
        | {stem, stem[:-1], stem + b"b"}
    )
    ks = [k for k in ks if len(k) <= MAX_KEY_SIZE]
    await put(db, {k: k[-8:] for k in ks})
    assert keys(await rows(db)) == ks
    assert keys(await rows(db, reverse=True)) == ks[::-1]
    for i in range(0, len(ks), 3):
        for j in range(i, len(ks), 4):
            assert keys(await rows(db, ks[i], ks[j])) == ks[i:j]
            assert keys(await rows(db, ks[i], ks[j], limit=2, reverse=True)) == ks[i:j][::-1][:2]
    for k in ks:
        assert await read(db, k) == k[-8:]
    for bound in (stem + b"a" * 600 + b"\x05", stem + b"a" * 7 + b"\x01", stem + b"a" * 8):
        below = [k for k in ks if k < bound]
        assert keys(await rows(db, b"", bound)) == below
        assert keys(await rows(db, b"", bound, reverse=True)) == below[::-1]
        assert keys(await rows(db, bound, b"\xff")) == [k for k in ks if k >= bound]

    async def trim(tr: Transaction) -> None:
        tr.clear_range(ks[2], ks[-3])
        tr.clear(ks[-1])

    await db.run(trim)
    assert keys(await rows(db)) == ks[:2] + ks[-3:-1]


# -- atomic add -------------------------------------------------------------------------------------


async def test_atomic_add(db: Database) -> None:
    async def adds(tr: Transaction) -> None:
        tr.add_int(b"n", 5)  # missing key counts as zero
        tr.add_int(b"n", 7)
        tr.set(b"w", b"\xff\x00")
        tr.add(b"w", b"\x01")  # width of the operand: the stored value is truncated to 1 byte
        tr.add_int(b"neg", -1)

    await db.run(adds)
    assert await read(db, b"n") == (12).to_bytes(8, "little")
    assert await read(db, b"w") == b"\x00"  # 0xff + 1 wraps in one byte
    assert await read(db, b"neg") == b"\xff" * 8

    tr = db.create_transaction()
    tr.add(b"short", b"\x01\x00\x00\x00")
    tr.add_int(b"n", 1)
    assert await tr.get(b"n") == (13).to_bytes(8, "little")  # reads see pending adds
    await tr.commit()
    assert await read(db, b"short") == b"\x01\x00\x00\x00"


async def test_atomic_add_does_not_conflict(db: Database) -> None:
    await put(db, {b"ctr": (0).to_bytes(8, "little")})
    trs = [db.create_transaction() for _ in range(5)]
    for tr in trs:
        await tr.snapshot.get(b"other")
        tr.add_int(b"ctr", 1)
    for tr in trs:
        await tr.commit()
    assert int.from_bytes(await read(db, b"ctr"), "little") == 5


async def test_atomic_max(db: Database) -> None:
    def le(n: int, width: int = 8) -> bytes:
        return n.to_bytes(width, "little")

    async def maxes(tr: Transaction) -> None:
        tr.atomic_max(b"m", le(5))  # nothing stored: the operand
        tr.atomic_max(b"m", le(3))
        tr.set(b"s", le(9))
        tr.atomic_max(b"s", le(0x100))  # compared as little-endian integers, not bytes
        tr.set(b"w", b"\x07\x00\x01")
        tr.atomic_max(b"w", b"\x05\x00")  # the stored value truncated to the operand's width first
        tr.clear(b"c")
        tr.atomic_max(b"c", b"\x02")

    await put(db, {b"c": b"\x09"})
    await db.run(maxes)
    assert await read(db, b"m") == le(5)
    assert await read(db, b"s") == le(0x100)
    assert await read(db, b"w") == b"\x07\x00"
    assert await read(db, b"c") == b"\x02"

    tr = db.create_transaction()
    tr.atomic_max(b"m", le(4))
    tr.atomic_max(b"short", b"\x01")
    assert await tr.get(b"m") == le(5)  # reads see pending maxes against the stored value
    tr.atomic_max(b"m", le(8))
    assert await tr.get(b"m") == le(8)
    await tr.commit()
    assert await read(db, b"short") == b"\x01"


async def test_atomic_max_keeps_the_largest_whatever_the_commit_order(db: Database) -> None:
    """Concurrent writers of a time stamp: the one with the earlier stamp commits last, and the
    later stamp stays (a set would take it back)."""
    early, late = db.create_transaction(), db.create_transaction()
    for tr in (early, late):
        await tr.get(b"other")  # both have their snapshots before either commits
    late.atomic_max(b"t", (2000).to_bytes(8, "little"))
    early.atomic_max(b"t", (1000).to_bytes(8, "little"))
    await late.commit()
    await early.commit()  # no conflict: maxes read nothing
    assert int.from_bytes(await read(db, b"t"), "little") == 2000


# -- isolation and conflicts ------------------------------------------------------------------------


async def test_snapshot_isolation(db: Database) -> None:
    await put(db, {b"x": b"1", b"y": b"1"})
    reader = db.create_transaction()
    assert await reader.get(b"x") == b"1"
    await put(db, {b"x": b"2", b"y": b"2", b"z": b"2"})
    # The reader keeps seeing the store as of its first read, for keys and ranges alike.
    assert await reader.get(b"y") == b"1"
    assert await reader.get_range(b"", b"\xff") == [KeyValue(b"x", b"1"), KeyValue(b"y", b"1")]
    await reader.commit()  # read-only: nothing to conflict with
    fresh = db.create_transaction()
    assert await fresh.get(b"z") == b"2"
    fresh.cancel()


async def test_read_write_conflict(db: Database) -> None:
    await put(db, {b"acct": b"100"})
    t1, t2 = db.create_transaction(), db.create_transaction()
    assert await t1.get(b"acct") == b"100"
    assert await t2.get(b"acct") == b"100"
    t1.set(b"acct", b"150")
    t2.set(b"acct", b"80")
    await t1.commit()
    await expect_code(StatusCode.KV_CONFLICT, t2.commit())
    assert await read(db, b"acct") == b"150"


async def _commit_together(*trs: Transaction) -> list[StatusCode | None]:
    """Commit ``trs`` at once (on lmdb: one batch, in this order); each one's error code, or None."""
    outcomes = await asyncio.gather(*(tr.commit() for tr in trs), return_exceptions=True)
    for o in outcomes:
        if o is not None and not isinstance(o, FS3Error):
            raise o
    return [o.code if isinstance(o, FS3Error) else None for o in outcomes]


async def _readers(db: Database, n: int, *keys_read: bytes) -> list[Transaction]:
    trs = [db.create_transaction() for _ in range(n)]
    for tr in trs:
        for key in keys_read:
            await tr.get(key)
    return trs


async def test_transactions_committed_together_conflict_on_what_the_others_wrote(db: Database) -> None:
    """Transactions that read the latest state and commit at once: the one whose read another
    wrote first conflicts (lmdb reads that key again; a later member's other reads it need not)."""
    await put(db, {b"acct": b"100", b"other": b"1"})
    t1, t2 = await _readers(db, 2, b"acct")
    t1.set(b"acct", b"150")
    t2.set(b"acct", b"80")
    (t3,) = await _readers(db, 1, b"other", b"missing")
    t3.set(b"other", b"2")
    codes = await _commit_together(t1, t2, t3)
    assert set(codes[:2]) == {None, StatusCode.KV_CONFLICT}  # one of the two
    assert codes[2] is None  # it read nothing the others wrote
    assert await read(db, b"acct") == (b"150" if codes[0] is None else b"80")
    assert await read(db, b"other") == b"2"


async def test_transactions_committed_together_conflict_on_a_range_another_wrote_into(db: Database) -> None:
    await put(db, {b"d/a": b"1"})
    trs = [db.create_transaction() for _ in range(2)]
    for n, tr in enumerate(trs):
        assert keys(await tr.get_range(b"d/", b"d0")) == [b"d/a"]
        tr.set(b"d/%d" % n, b"new")
    codes = await _commit_together(*trs)
    assert set(codes) == {None, StatusCode.KV_CONFLICT}  # one of the two
    assert len(await rows(db, b"d/", b"d0")) == 2


async def test_transactions_committed_together_conflict_on_a_key_another_cleared(db: Database) -> None:
    await put(db, {b"c/x": b"1", b"c/y": b"1"})
    t1, t2 = await _readers(db, 2, b"c/x")
    t1.clear_range(b"c/", b"c0")
    t2.set(b"c/z", b"2")
    codes = await _commit_together(t1, t2)
    assert set(codes) == {None, StatusCode.KV_CONFLICT}  # one of the two
    assert keys(await rows(db, b"c/", b"c0")) == ([] if codes[0] is None else [b"c/x", b"c/y", b"c/z"])


async def test_a_conflicting_transaction_is_freed_by_reference_counting(db: Database) -> None:
    """What a conflicting commit wrote is gone once the caller drops it: the conflict's traceback
    holds no cycle (through the commit's future) that would keep it until a cyclic collection."""
    await put(db, {b"acct": b"100"})
    value = b"v" * 100_000
    base = sys.getrefcount(value)
    gc.collect()
    gc.disable()
    try:
        t1, t2 = db.create_transaction(), db.create_transaction()
        assert await t1.get(b"acct") == await t2.get(b"acct") == b"100"
        t1.set(b"acct", b"150")
        t2.set(b"acct", value)
        await t1.commit()
        try:  # not pytest.raises, whose ExceptionInfo in a frame of the traceback is a cycle itself
            await t2.commit()
        except FS3Error as e:
            assert e.code == StatusCode.KV_CONFLICT
        else:
            pytest.fail("no conflict")
        del t1, t2
        for _ in range(500):  # the engine's threads let go of the batch just after answering it
            if sys.getrefcount(value) == base:
                break
            await asyncio.sleep(0.01)
        assert sys.getrefcount(value) == base
    finally:
        gc.enable()


async def test_a_transaction_that_read_its_snapshot_is_freed_by_reference_counting(db: Database) -> None:
    """A transaction that read through ``tr.snapshot`` (meta's stats and lookups all do), and what
    it wrote, are gone once it is dropped: the snapshot view it handed out is no cycle. (Cancelled,
    not committed: the in-memory engine would keep the value itself.)"""
    await put(db, {b"k": b"1"})
    value = b"w" * 100_000
    base = sys.getrefcount(value)
    gc.collect()
    gc.disable()
    try:
        tr = db.create_transaction()
        assert await tr.snapshot.get(b"k") == b"1"
        assert [kv.key for kv in await tr.snapshot.get_range(b"k", b"l")] == [b"k"]
        tr.set(b"k2", value)
        tr.cancel()
        del tr
        assert sys.getrefcount(value) == base
    finally:
        gc.enable()


async def test_phantom_insert_into_read_range_conflicts(db: Database) -> None:
    await put(db, {b"d/a": b"1"})
    t1 = db.create_transaction()
    assert keys(await t1.get_range(b"d/", b"d0")) == [b"d/a"]
    t1.set(b"count", b"1")
    await put(db, {b"d/b": b"2"})
    await expect_code(StatusCode.KV_CONFLICT, t1.commit())


async def test_limited_range_conflicts_only_up_to_last_key(db: Database) -> None:
    await put(db, {b"q1": b"", b"q2": b"", b"q5": b""})
    t1 = db.create_transaction()
    assert keys(await t1.get_range(b"q", b"r", limit=2)) == [b"q1", b"q2"]
    t1.set(b"out", b"1")
    await put(db, {b"q3": b"beyond the read"})
    await t1.commit()

    t2 = db.create_transaction()
    assert keys(await t2.get_range(b"q", b"r", limit=2, reverse=True)) == [b"q5", b"q3"]
    t2.set(b"out", b"2")
    await put(db, {b"q4": b"inside the read"})
    await expect_code(StatusCode.KV_CONFLICT, t2.commit())


async def test_snapshot_reads_and_blind_writes_do_not_conflict(db: Database) -> None:
    await put(db, {b"s": b"1"})
    t1 = db.create_transaction()
    assert await t1.snapshot.get(b"s") == b"1"
    assert len(await t1.snapshot.get_range(b"", b"\xff")) == 1
    t1.set(b"s", b"from-t1")
    t2 = db.create_transaction()
    t2.set(b"s", b"from-t2")  # never read
    await put(db, {b"s": b"2", b"s2": b"2"})
    await t1.commit()
    await t2.commit()
    assert await read(db, b"s") == b"from-t2"


async def test_add_read_conflict_range(db: Database) -> None:
    t1 = db.create_transaction()
    t1.add_read_conflict_range(b"lock/", b"lock0")
    t1.set(b"x", b"1")
    await put(db, {b"lock/a": b"held"})
    await expect_code(StatusCode.KV_CONFLICT, t1.commit())


async def test_concurrent_increments_lose_nothing(db: Database) -> None:
    async def incr(tr: Transaction) -> None:
        value = int(await tr.get(b"ctr") or b"0")
        await asyncio.sleep(0)  # let the other tasks read the same value
        tr.set(b"ctr", b"%d" % (value + 1))

    async def worker() -> None:
        for _ in range(10):
            await db.run(incr, max_attempts=1000)

    await asyncio.gather(*(worker() for _ in range(8)))
    assert await read(db, b"ctr") == b"80"


# -- retry loop --------------------------------------------------------------------------------------


async def test_run_retries_conflicts_and_returns_result(db: Database) -> None:
    calls = 0

    async def fn(tr: Transaction) -> str:
        nonlocal calls
        calls += 1
        await tr.get(b"hot")
        if calls < 3:
            await put(db, {b"hot": b"%d" % calls})  # a rival commit after our read
        tr.set(b"mine", b"done")
        return "ok"

    assert await db.run(fn) == "ok"
    assert calls == 3
    assert await read(db, b"mine") == b"done"


async def test_run_gives_up_after_max_attempts(db: Database) -> None:
    calls = 0

    async def always_conflicts(tr: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tr.get(b"hot")
        await put(db, {b"hot": b"%d" % calls})
        tr.set(b"x", b"never")

    await expect_code(StatusCode.KV_RETRY_LIMIT, db.run(always_conflicts, max_attempts=4))
    assert calls == 4
    assert await read(db, b"x") is None


async def test_run_does_not_retry_other_errors(db: Database) -> None:
    calls = 0

    async def fails(tr: Transaction) -> None:
        nonlocal calls
        calls += 1
        tr.set(b"partial", b"1")
        raise ValueError("application error")

    with pytest.raises(ValueError):
        await db.run(fails)
    assert calls == 1
    assert await read(db, b"partial") is None


async def test_read_only_run_commits_nothing(db: Database) -> None:
    async def fn(tr: Transaction) -> int:
        tr.set(b"ro", b"1")
        return 7

    assert await db.run(fn, read_only=True) == 7
    assert await read(db, b"ro") is None


# -- limits and lifetime ----------------------------------------------------------------------------


async def test_limits(db: Database) -> None:
    tr = db.create_transaction()
    tr.set(b"k" * MAX_KEY_SIZE, b"v" * MAX_VALUE_SIZE)  # exactly at the limits: fine
    with pytest.raises(FS3Error) as info:
        tr.set(b"k" * (MAX_KEY_SIZE + 1), b"v")
    assert info.value.code == StatusCode.KV_KEY_TOO_LARGE
    with pytest.raises(FS3Error) as info:
        tr.set(b"k", b"v" * (MAX_VALUE_SIZE + 1))
    assert info.value.code == StatusCode.KV_VALUE_TOO_LARGE
    await expect_code(StatusCode.KV_KEY_TOO_LARGE, tr.get(b"k" * (MAX_KEY_SIZE + 1)))
    with pytest.raises(FS3Error) as info:
        for i in range(200):  # 200 x 100 KB > 10 MB
            tr.set(b"big%d" % i, b"v" * MAX_VALUE_SIZE)
    assert info.value.code == StatusCode.KV_TXN_TOO_LARGE
    tr.cancel()
    tr = db.create_transaction()
    with pytest.raises(FS3Error) as info:
        tr.set(b"\xff/system", b"v")
    assert info.value.code == StatusCode.INVALID_ARGUMENT
    tr.cancel()


async def test_large_values_round_trip(db: Database) -> None:
    big = bytes(range(256)) * (MAX_VALUE_SIZE // 256)
    await put(db, {b"big": big, b"k" * MAX_KEY_SIZE: b"long key"})
    assert await read(db, b"big") == big
    assert await read(db, b"k" * MAX_KEY_SIZE) == b"long key"


async def test_closed_transaction_refuses_use(db: Database) -> None:
    tr = db.create_transaction()
    tr.set(b"a", b"1")
    await tr.commit()
    await expect_code(StatusCode.KV_TXN_CLOSED, tr.get(b"a"))
    with pytest.raises(FS3Error) as info:
        tr.set(b"a", b"2")
    assert info.value.code == StatusCode.KV_TXN_CLOSED
    await expect_code(StatusCode.KV_TXN_CLOSED, tr.commit())
    tr2 = db.create_transaction()
    tr2.set(b"b", b"1")
    tr2.cancel()
    await expect_code(StatusCode.KV_TXN_CLOSED, tr2.commit())
    assert await read(db, b"b") is None


async def test_conflicts_on_reads_of_many_rows(db: Database) -> None:
    # Past 10,000 rows the embedded engines validate a hash of the rows read (fs3.kv.txn.RangeDigest).
    async def load(tr: Transaction) -> None:
        for i in range(12_000):
            tr.set(b"m%06d" % i, b"")

    await db.run(load)
    quiet = db.create_transaction()
    assert len(await quiet.get_range(b"m", b"n")) == 12_000
    quiet.set(b"summary", b"12000")
    await quiet.commit()  # nothing committed meanwhile: no conflict

    t1, t2 = db.create_transaction(), db.create_transaction()
    assert len(await t1.get_range(b"m", b"n")) == 12_000
    t1.set(b"summary", b"t1")
    t2.add_read_conflict_range(b"m", b"n")
    t2.set(b"summary", b"t2")
    await put(db, {b"m999999": b"inserted"})
    await expect_code(StatusCode.KV_CONFLICT, t1.commit())
    await expect_code(StatusCode.KV_CONFLICT, t2.commit())
