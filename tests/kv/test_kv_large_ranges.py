"""Conflict checks of range reads of more than EXACT_RANGE_ROWS rows, on every engine present.

The embedded engines remember such a read as a count and hash of its rows rather than the rows
themselves; the outcomes must be those of a small read (and of FoundationDB): a conflict exactly
when some row inside the range read changed, appeared or vanished, whatever else was committed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.kv import Database, Transaction, open_database, prefix_end
from fs3.kv.txn import EXACT_RANGE_ROWS
from fs3.meta.layout import ChainAllocator, ChainTable, static_tables
from fs3.meta.permissions import ROOT, Credentials
from fs3.meta.schema import ROOT_ID
from fs3.meta.store import MetaStore

pytestmark = pytest.mark.timeout(120)

ROWS = EXACT_RANGE_ROWS + 500
P = b"p/"
# A limited read returns more rows than EXACT_RANGE_ROWS but stops short of the range's end.
LIMIT = EXACT_RANGE_ROWS + 100


def row(i: int) -> bytes:
    return b"p/%06d" % i


async def load(db: Database, n: int = ROWS) -> None:
    async def fn(tr: Transaction) -> None:
        for i in range(n):
            tr.set(row(i), b"v%d" % i)

    await db.run(fn)


async def wipe(tr: Transaction) -> None:
    tr.clear_range(P, prefix_end(P))


async def put(db: Database, items: dict[bytes, bytes | None]) -> None:
    async def fn(tr: Transaction) -> None:
        for k, v in items.items():
            if v is None:
                tr.clear(k)
            else:
                tr.set(k, v)

    await db.run(fn)


async def expect_conflict(coro) -> None:
    with pytest.raises(FS3Error) as info:
        await coro
    assert info.value.code == StatusCode.KV_CONFLICT


# How each test reads the prefix: (limit, reverse), and which row indexes the read returns.
READS = {
    "forward": (0, False),
    "reverse": (0, True),
    "limited": (LIMIT, False),
    "limited-reverse": (LIMIT, True),
}


def returned(mode: str) -> range:
    limit, reverse = READS[mode]
    if not limit:
        return range(ROWS)
    return range(ROWS - limit, ROWS) if reverse else range(limit)


async def read_prefix(tr: Transaction, mode: str) -> None:
    limit, reverse = READS[mode]
    got = await tr.get_range(P, prefix_end(P), limit, reverse)
    want = returned(mode)
    assert len(got) == len(want) > EXACT_RANGE_ROWS
    assert got[0].key == row(want[-1] if reverse else want[0])


@pytest.mark.parametrize("mode", READS)
async def test_commits_outside_a_large_read_do_not_conflict(db: Database, mode: str) -> None:
    await load(db)
    tr = db.create_transaction()
    await read_prefix(tr, mode)
    await put(db, {b"elsewhere": b"1", b"q/1": b"2"})
    await put(db, {b"elsewhere": None})
    tr.set(b"summary", b"done")
    await tr.commit()
    assert await db.run(lambda t: t.get(b"summary"), read_only=True) == b"done"


@pytest.mark.parametrize("mode", READS)
async def test_own_writes_in_a_large_read_do_not_conflict(db: Database, mode: str) -> None:
    """Validation checks what the store held, not the view merged with the transaction's writes;
    the range is read before and after writing into it, and others commit meanwhile."""
    await load(db)
    tr = db.create_transaction()
    await read_prefix(tr, mode)
    tr.set(row(5), b"mine")
    tr.clear(row(ROWS - 5))
    tr.set(row(7) + b"+", b"new")
    tr.clear_range(row(20), row(30))
    limit, reverse = READS[mode]
    merged = await tr.get_range(P, prefix_end(P), limit, reverse)
    assert len(merged) > EXACT_RANGE_ROWS
    await put(db, {b"elsewhere": b"1"})
    await tr.commit()
    stored = await db.run(lambda t: t.get_range(P, prefix_end(P)), read_only=True)
    assert len(stored) == ROWS - 10  # one cleared, one added, ten cleared by the range


def beside(i: int, reverse: bool) -> bytes:
    """A new key next to row ``i``, on the side a limited read in that direction has read."""
    if reverse:
        return row(i) + b"+"
    key = row(i)
    return key[:-1] + bytes([key[-1] - 1]) + b"+"  # between rows i - 1 and i


CHANGES = {
    "set": lambda i, reverse: {row(i): b"changed"},
    "insert": lambda i, reverse: {beside(i, reverse): b"new"},
    "delete": lambda i, reverse: {row(i): None},
}


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("mode", READS)
async def test_changes_inside_a_large_read_conflict(db: Database, mode: str, change: str) -> None:
    want = returned(mode)
    # The ends of what a limited read returned are the ends of the range it conflicts on.
    for i in (want[0], want[len(want) // 2], want[-1]):
        await db.run(wipe)
        await load(db)
        tr = db.create_transaction()
        await read_prefix(tr, mode)
        await put(db, CHANGES[change](i, READS[mode][1]))
        tr.set(b"summary", b"stale")
        await expect_conflict(tr.commit())


@pytest.mark.parametrize("mode", ["limited", "limited-reverse"])
async def test_changes_just_past_a_limited_read_do_not_conflict(db: Database, mode: str) -> None:
    await load(db)
    want = returned(mode)
    if READS[mode][1]:
        outside = want[0] - 1  # the row below the lowest one returned
        changes = {row(outside): b"changed", row(outside) + b"+": b"new"}
    else:
        outside = want[-1] + 1
        changes = {row(want[-1]) + b"\x00": b"new", row(outside): None}
    tr = db.create_transaction()
    await read_prefix(tr, mode)
    await put(db, changes)
    tr.set(b"summary", b"fine")
    await tr.commit()


async def test_a_large_read_twice(db: Database) -> None:
    await load(db)
    tr = db.create_transaction()
    await read_prefix(tr, "forward")
    await read_prefix(tr, "reverse")
    await put(db, {b"elsewhere": b"1"})
    tr.set(b"summary", b"1")
    await tr.commit()

    tr = db.create_transaction()
    await read_prefix(tr, "forward")
    await read_prefix(tr, "limited-reverse")
    await put(db, {row(0): b"changed"})  # returned by the first read only
    tr.set(b"summary", b"2")
    await expect_conflict(tr.commit())


async def test_a_large_read_conflict_range(db: Database) -> None:
    await load(db)
    tr = db.create_transaction()
    tr.add_read_conflict_range(P, prefix_end(P))
    tr.set(b"summary", b"1")
    await put(db, {b"elsewhere": b"1"})
    await tr.commit()

    tr = db.create_transaction()
    tr.add_read_conflict_range(P, prefix_end(P))
    tr.set(b"summary", b"2")
    await put(db, {row(ROWS - 1): b"changed"})
    await expect_conflict(tr.commit())


# -- what a user sees ----------------------------------------------------------------------------

ALICE = Credentials(1000, 1000)


async def test_recursive_rmdir_of_a_large_directory_while_others_write(tmp_path: Path) -> None:
    """A non-root ``rm -r`` reads every entry of the directory with conflict tracking; with more
    than EXACT_RANGE_ROWS entries it must still succeed while another client keeps writing
    elsewhere, as it does with fewer."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"), map_size=1 << 28)
    table = ChainTable(1, 1, tuple(range(101, 109)))
    s = MetaStore(db, layouts=ChainAllocator(static_tables([table]), default_stripe=2))
    await s.start(background=False)
    try:
        home = await s.mkdir(ROOT, ROOT_ID, b"home", 0o777)
        big = await s.mkdir(ALICE, home.id, b"big", 0o755)
        other = await s.mkdir(ALICE, home.id, b"other", 0o755)
        names = iter(range(EXACT_RANGE_ROWS + 1))

        async def creator() -> None:
            for i in names:
                await s.create(ALICE, big.id, b"f%06d" % i, 0o644)

        await asyncio.gather(*(creator() for _ in range(64)))  # commits batch: well under a second

        busy, stop = asyncio.Event(), asyncio.Event()

        async def writer() -> None:
            made = 0
            while not stop.is_set():
                await s.mkdir(ALICE, other.id, b"d%d" % made, 0o755)
                made += 1
                busy.set()
                await asyncio.sleep(0.002)

        task = asyncio.create_task(writer())
        try:
            await busy.wait()
            await s.rmdir(ALICE, home.id, b"big", recursive=True)
        finally:
            stop.set()
            await task
        with pytest.raises(FS3Error) as info:
            await s.lookup(ALICE, home.id, b"big")
        assert info.value.code == StatusCode.NOT_FOUND
    finally:
        await s.stop()
        await db.close()
