"""Opening stores, and lmdb behaviour beyond the shared contract."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lmdb
import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.kv import Transaction, open_database, open_database_sync

pytestmark = pytest.mark.timeout(60)


async def test_open_from_config_object(tmp_path: Path) -> None:
    config = SimpleNamespace(
        engine="lmdb",
        path=str(tmp_path / "kv"),
        cluster_file="",
        group_commit_interval_ms=1.0,
        map_size=1 << 30,
    )
    db = await open_database(config)
    await db.run(lambda tr: _set(tr, b"k", b"v"))
    await db.close()
    mem = await open_database(SimpleNamespace(engine="mem", path="/ignored", cluster_file=None))
    await mem.close()


async def _set(tr: Transaction, key: bytes, value: bytes) -> None:
    tr.set(key, value)


def test_open_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown kv engine"):
        open_database_sync("redis")
    with pytest.raises(TypeError, match="path"):
        open_database_sync("mem", path=str(tmp_path))
    with pytest.raises(TypeError, match="needs a path"):
        open_database_sync("lmdb")
    with pytest.raises(TypeError, match="cluster_file"):
        open_database_sync("lmdb", path=str(tmp_path), cluster_file="x")


async def test_lmdb_persists_and_handles_share_one_environment(tmp_path: Path) -> None:
    first = await open_database("lmdb", path=str(tmp_path))
    second = await open_database("lmdb", path=str(tmp_path))
    await first.run(lambda tr: _set(tr, b"a", b"1"))
    assert await second.run(lambda tr: tr.get(b"a"), read_only=True) == b"1"
    await first.close()
    await second.run(lambda tr: _set(tr, b"b", b"2"))  # still open after the other handle closed
    await second.close()
    with pytest.raises(FS3Error) as info:
        await second.create_transaction().get(b"a")
    assert info.value.code == StatusCode.KV_STORE_FAILED

    reopened = await open_database("lmdb", path=str(tmp_path))
    pairs = await reopened.run(lambda tr: tr.get_range(b"", b"\xff"), read_only=True)
    assert [(kv.key, kv.value) for kv in pairs] == [(b"a", b"1"), (b"b", b"2")]
    await reopened.close()


async def test_lmdb_full_store_fails_cleanly_and_stays_usable(tmp_path: Path) -> None:
    db = await open_database("lmdb", path=str(tmp_path), map_size=1 << 20)

    async def fill(tr: Transaction) -> None:
        for i in range(20):
            tr.set(b"big%d" % i, bytes(100_000))

    # Small commits queued alongside the one that cannot fit must not fail with it.
    outcomes = await asyncio.gather(
        db.run(fill),
        *(db.run(lambda tr, i=i: _set(tr, b"k%d" % i, b"v")) for i in range(10)),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], FS3Error)
    assert outcomes[0].code == StatusCode.KV_STORE_FULL
    assert "full" in outcomes[0].message
    assert outcomes[1:] == [None] * 10
    await db.run(lambda tr: _set(tr, b"small", b"ok"))
    assert await db.run(lambda tr: tr.get(b"small"), read_only=True) == b"ok"
    await db.close()


async def test_long_scan_does_not_starve_the_loop(tmp_path: Path) -> None:
    db = await open_database("lmdb", path=str(tmp_path))

    async def load(tr: Transaction) -> None:
        for i in range(30_000):
            tr.set(b"s%08d" % i, b"x")

    await db.run(load)
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    rows = await db.run(lambda tr: tr.get_range(b"s", b"t"), read_only=True)
    during = ticks - before
    stop.set()
    await task
    assert len(rows) == 30_000
    assert during >= 5  # the scan handed the loop back along the way
    await db.close()


async def test_lmdb_from_several_event_loops(tmp_path: Path) -> None:
    db = await open_database("lmdb", path=str(tmp_path))
    errors: list[BaseException] = []

    def thread_main(n: int) -> None:
        async def work() -> None:
            for i in range(50):
                await db.run(lambda tr, i=i: _set(tr, b"t%d-%d" % (n, i), b"v"))

        try:
            asyncio.run(work())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=thread_main, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    await asyncio.to_thread(lambda: [t.join(timeout=30) for t in threads])
    assert not errors
    pairs = await db.run(lambda tr: tr.get_range(b"t", b"u"), read_only=True)
    assert len(pairs) == 150
    await db.close()


async def test_lmdb_many_large_transactions_at_once(tmp_path: Path) -> None:
    db = await open_database("lmdb", path=str(tmp_path))
    value = bytes(range(256)) * 390  # ~100 KB

    async def big(tr: Transaction, n: int) -> None:
        for i in range(90):  # ~9 MB, close to the transaction limit
            tr.set(b"big/%d/%02d" % (n, i), value)

    await asyncio.gather(*(db.run(lambda tr, n=n: big(tr, n)) for n in range(8)))
    pairs = await db.run(lambda tr: tr.get_range(b"big/", b"big0"), read_only=True)
    assert len(pairs) == 8 * 90 and all(kv.value == value for kv in pairs)
    await db.close()


@pytest.mark.parametrize("interval_ms", [0.0, 2.0, 50.0])
async def test_lmdb_group_commit_settings(tmp_path: Path, interval_ms: float) -> None:
    db = await open_database("lmdb", path=str(tmp_path), group_commit_interval_ms=interval_ms)

    async def incr(tr: Transaction) -> None:
        tr.set(b"n", b"%d" % (int(await tr.get(b"n") or b"0") + 1))

    async def caller() -> None:
        for _ in range(20):
            await db.run(incr, max_attempts=1000)

    await asyncio.gather(*(caller() for _ in range(16)))
    assert await db.run(lambda tr: tr.get(b"n"), read_only=True) == b"320"
    await db.close()


async def test_lmdb_cancelled_commit_leaves_store_usable(tmp_path: Path) -> None:
    db = await open_database("lmdb", path=str(tmp_path))
    tr = db.create_transaction()
    tr.set(b"maybe", b"1")
    task = asyncio.create_task(tr.commit())
    await asyncio.sleep(0)  # let it queue
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The outcome of a cancelled commit is unknown to its caller, but the store carries on.
    await db.run(lambda tr: _set(tr, b"after", b"2"))
    assert await db.run(lambda tr: tr.get(b"after"), read_only=True) == b"2"
    assert await db.run(lambda tr: tr.get(b"maybe"), read_only=True) in (None, b"1")
    await db.close()


async def test_lmdb_data_file_is_extended_ahead_of_use(tmp_path: Path) -> None:
    from fs3.kv.lmdb_engine import FileExtender

    fs = os.statvfs(tmp_path)
    if fs.f_bavail * fs.f_frsize < FileExtender.MIN_FREE + (64 << 20):
        pytest.skip(f"{tmp_path} has under {FileExtender.MIN_FREE >> 20} MiB free: nothing is extended there")
    db = await open_database("lmdb", path=str(tmp_path))

    async def grow(tr: Transaction, n: int) -> None:
        for i in range(200):
            tr.set(b"g/%d/%d" % (n, i), bytes(4000))

    for n in range(12):  # ~10 MB: a few extensions
        await db.run(lambda tr, n=n: grow(tr, n))
    await db.close()

    env = lmdb.open(str(tmp_path), readonly=True, lock=False)
    used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    env.close()
    size = (tmp_path / "data.mdb").stat().st_size
    # Ahead of LMDB by at most one step, and never behind by more than the low-water mark.
    assert size - used >= FileExtender.LOW - (2 << 20)  # less what the last commit took
    assert size - used <= FileExtender.LOW + FileExtender.STEP

    reopened = await open_database("lmdb", path=str(tmp_path))
    pairs = await reopened.run(lambda tr: tr.get_range(b"g/", b"g0"), read_only=True)
    assert len(pairs) == 12 * 200 and all(kv.value == bytes(4000) for kv in pairs)
    await reopened.close()


async def test_lmdb_commit_stats_count_batches_conflicts_and_flushes(tmp_path: Path) -> None:
    db = await open_database("lmdb", path=str(tmp_path))
    before = db.commit_stats()
    assert before is not None

    # 24 callers at once: each commit is counted once, in however many batches the group made
    await asyncio.gather(*(db.run(lambda tr, n=n: _set(tr, b"s/%d" % n, b"x")) for n in range(24)))
    mid = db.commit_stats()
    assert mid.transactions - before.transactions == 24
    assert 1 <= mid.batches - before.batches <= 24
    assert mid.conflicts == before.conflicts
    assert mid.commit_seconds > before.commit_seconds
    # every caller heard only after a flush made its batch durable
    assert mid.fsyncs - before.fsyncs >= 1 and mid.fsync_seconds > before.fsync_seconds

    # a transaction whose read went stale is refused, and counted as a conflict
    stale = db.create_transaction()
    assert await stale.get(b"s/0") == b"x"
    await db.run(lambda tr: _set(tr, b"s/0", b"y"))
    stale.set(b"s/0", b"z")
    with pytest.raises(FS3Error) as err:
        await stale.commit()
    assert err.value.code == StatusCode.KV_CONFLICT
    after = db.commit_stats()
    assert after.conflicts - mid.conflicts == 1
    assert after.transactions - mid.transactions == 2
    assert await db.run(lambda tr: tr.get(b"s/0"), read_only=True) == b"y"
    await db.close()
    assert db.commit_stats() is None  # closed: nothing to report


async def test_engines_without_group_commit_report_no_stats() -> None:
    db = await open_database("mem")
    assert db.commit_stats() is None
    await db.close()


async def _put_as(db: Any, caller: str, key: bytes, *, turns: int = 0, within_s: float | None = None) -> None:
    """Commit ``key`` = ``caller`` as COMMIT_CALLER ``caller`` (run it as a task: the context
    variables are set in its context only), after ``turns`` turns of the loop, with ``within_s``
    seconds left before a COMMIT_DEADLINE."""
    from fs3.kv.txn import COMMIT_CALLER, COMMIT_DEADLINE

    COMMIT_CALLER.set(caller)
    if within_s is not None:
        COMMIT_DEADLINE.set(asyncio.get_running_loop().time() + within_s)
    for _ in range(turns):
        await asyncio.sleep(0)
    await db.run(lambda tr: _set(tr, key, caller.encode()))


async def _after_a_batch_of_a_and_b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """An lmdb store whose event loop committed callers A and B in one batch last, waiting for
    either of them for up to a second: (database, its committer)."""
    from fs3.kv import lmdb_engine

    monkeypatch.setattr(lmdb_engine, "GATHER_WAIT_MAX_S", 5.0)
    monkeypatch.setattr(lmdb_engine, "LOOP_COMMIT_MAX_S", 10.0)  # the loop commits (not the thread)
    db = await open_database("lmdb", path=str(tmp_path))
    committer = db._shared.committer  # noqa: SLF001
    # (the first commit grows the new store's file, on the thread)
    await asyncio.create_task(_put_as(db, "warm", b"w"))
    await asyncio.gather(_put_as(db, "A", b"a1"), _put_as(db, "B", b"b1"))  # one batch: A's and B's
    # (waits are bounded by how long a commit and a flush take on average; this disk's may be
    # faster than a few turns of the loop)
    committer._sync_avg = 1.0  # noqa: SLF001
    return db, committer


async def test_lmdb_batch_waits_for_the_callers_of_the_loop_s_previous_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Callers answered together come back at slightly different times; a batch committed as soon
    as the first are back would split them into groups alternating between half-full batches. The
    event loop holds its batch open (briefly) for callers of its previous batch still to come."""
    db, committer = await _after_a_batch_of_a_and_b(tmp_path, monkeypatch)
    before = db.commit_stats()
    # B is back at once, A three turns of the loop later: they still make one batch
    await asyncio.gather(_put_as(db, "B", b"b2"), _put_as(db, "A", b"a2", turns=3))
    after = db.commit_stats()
    assert (after.batches - before.batches, after.transactions - before.transactions) == (1, 2)

    # A caller that does not come back is waited for once: the batch after it is B's alone
    committer._sync_avg = 0.0  # noqa: SLF001 (no wait: B's commit does not stand for A)
    await asyncio.create_task(_put_as(db, "B", b"b3"))
    assert committer._last_callers == {"B"}  # noqa: SLF001
    # transactions of nobody in particular (no COMMIT_CALLER) wait for nobody
    await db.run(lambda tr: _set(tr, b"n", b"x"))
    assert committer._last_callers == set()  # noqa: SLF001
    values = [await db.run(lambda tr, k=k: tr.get(k), read_only=True) for k in (b"a1", b"a2", b"b2", b"b3")]
    assert values == [b"A", b"A", b"B", b"B"]
    await db.close()


async def test_lmdb_batch_does_not_wait_past_its_callers_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for callers of the previous batch ends before a queued caller's deadline would
    pass: its commit is made, not refused as too late."""
    db, _ = await _after_a_batch_of_a_and_b(tmp_path, monkeypatch)
    # B alone, with half a second left, while A does not come back: made in time
    await asyncio.wait_for(asyncio.create_task(_put_as(db, "B", b"b2", within_s=0.5)), 30)
    assert await db.run(lambda tr: tr.get(b"b2"), read_only=True) == b"B"
    await db.close()
