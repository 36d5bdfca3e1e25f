"""Group commit of chunk metadata: changes that arrive while a transaction is in progress share the
next one, each caller returns once its own change is recorded, a change built on a stale base
fails alone, and a transaction that fails fails every change in it and records none."""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.kv.lmdb_engine import FileExtender
from fs3.storage.chunk_engine import ChunkEngine
from fs3.storage.chunk_meta import ChunkMeta, ChunkVersion, block_count
from fs3.storage.chunk_meta_store import ChunkMetaStore

pytestmark = pytest.mark.timeout(60)

CS = 1 << 20


def cid(n: int) -> bytes:
    return struct.pack(">BBQHI", 0, 0, 7, 0, n)


def meta(n: int, *, version: int = 1, length: int = 1000, chunk_size: int = CS) -> ChunkMeta:
    crcs = bytes(4 * block_count(length))
    return ChunkMeta(cid(n), chunk_size, ChunkVersion(version, 1, length, 0, 100 + n, crcs), None)


def poll(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


@contextmanager
def writer_held(env: lmdb.Environment) -> Iterator[None]:
    """Hold LMDB's one write transaction, so that the next group's leader blocks in it and every
    change made meanwhile queues behind it."""
    txn = env.begin(write=True)
    try:
        yield
    finally:
        txn.abort()


def run_all(calls: list[Callable[[], object]]) -> tuple[list[threading.Thread], list[object]]:
    results: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    return threads, results


def test_changes_queued_during_a_transaction_share_the_next(tmp_path: Path) -> None:
    eng = ChunkEngine(tmp_path / "target")
    try:
        before = eng.commit_stats()
        n = 12
        env = eng._store._env  # noqa: SLF001 - the test needs LMDB's writer to stall a leader
        # chunks whose striped locks differ (str hashes vary by run): one waiting for another's
        # stripe would not reach the queue while the leader stalls
        ids: list[int] = []
        stripes: set[int] = set()
        for i in range(256):
            if len(ids) < n and id(eng._chunk_lock(cid(i))) not in stripes:  # noqa: SLF001
                stripes.add(id(eng._chunk_lock(cid(i))))  # noqa: SLF001
                ids.append(i)
        threads, results = run_all(
            [lambda i=i: eng.update(cid(i), 0, bytes([i]) * 5000, chunk_size=CS, chain_ver=1) for i in ids]
        )
        with writer_held(env):
            for t in threads:
                t.start()
            # one leader blocks on LMDB's writer lock with its group (itself, and any change that
            # queued before it took the queue); every other change queues behind it
            poll(
                lambda: (s := eng.commit_stats()).committing and s.queued + s.committing == n,
                "every other change queued",
            )
        for t in threads:
            t.join()
        assert all(isinstance(r, ChunkMeta) and r.pending_ver == 1 for r in results), results
        after = eng.commit_stats()
        assert (after.changes - before.changes, after.transactions - before.transactions) == (n, 2)
        assert after.queued == 0
    finally:
        eng.close()
    with ChunkEngine(tmp_path / "target") as eng:
        assert [m.chunk_id for m in eng.pending_chunks()] == sorted(cid(i) for i in ids)
        for i in ids:
            eng.commit(cid(i), 1)
            assert eng.read(cid(i)).data == bytes([i]) * 5000


def test_a_change_on_a_stale_base_fails_alone(tmp_path: Path) -> None:
    store = ChunkMetaStore(tmp_path / "meta", sync=True, map_size=1 << 26, max_readers=16)
    try:
        store.swap(cid(9), None, meta(9))
        calls: list[Callable[[], object]] = [
            lambda: store.swap(cid(1), None, meta(1)),  # the leader, stalled
            lambda: store.swap(cid(2), None, meta(2)),
            lambda: store.swap(cid(9), meta(9, version=5), meta(9, version=6)),  # stale base
            lambda: store.swap(cid(9), meta(9), None),  # right base: removes it
            lambda: store.swap(cid(4), None, meta(4)),
        ]
        threads, results = run_all(calls)
        with writer_held(store._env):  # noqa: SLF001
            threads[0].start()
            poll(lambda: store.commit_stats().transactions == 1 and _leading(store), "the leader stalled")
            for t in threads[1:]:
                t.start()
            poll(lambda: store.commit_stats().queued == len(calls) - 1, "the rest queued")
        for t in threads:
            t.join()
        stale = results[2]
        assert isinstance(stale, FS3Error) and stale.code is StatusCode.ABORTED
        assert [r for i, r in enumerate(results) if i != 2] == [None] * 4
        assert store.commit_stats().transactions == 3
        assert [m.chunk_id for m in store.scan(b"", None, 100)] == [cid(1), cid(2), cid(4)]
        stats = store.stats()
        assert (stats.chunk_count, stats.used, stats.max_file_id) == (
            3,
            3000,
            109,
        )  # the highest file id ever recorded
    finally:
        store.close()


def test_a_failed_transaction_fails_every_change_in_it(tmp_path: Path) -> None:
    # a map too small for the group: LMDB refuses the whole transaction (MapFullError)
    store = ChunkMetaStore(tmp_path / "meta", sync=True, map_size=128 << 10, max_readers=16)
    big = 64 << 20  # 1024 block CRCs: 4 KiB of metadata a chunk
    try:
        calls: list[Callable[[], object]] = [
            lambda i=i: store.swap(cid(i), None, meta(i, length=big, chunk_size=big)) for i in range(20)
        ]
        threads, results = run_all(calls)
        with writer_held(store._env):  # noqa: SLF001
            threads[0].start()
            poll(lambda: _leading(store), "the leader stalled")
            for t in threads[1:]:
                t.start()
            poll(lambda: store.commit_stats().queued == len(calls) - 1, "the rest queued")
        for t in threads:
            t.join()
        assert results[0] is None  # the leader's change had a transaction of its own
        assert all(isinstance(r, lmdb.MapFullError) for r in results[1:]), results
        # each caller raised its own copy: one shared error, raised in every caller's thread,
        # took all their frames into its traceback (and a frame holding it was a cycle)
        assert len({id(r) for r in results[1:]}) == len(results) - 1
        assert [m.chunk_id for m in store.scan(b"", None, 100)] == [cid(0)]
        assert store.stats().chunk_count == 1
        store.swap(cid(50), None, meta(50))  # the store still works for what fits
        assert store.stats().chunk_count == 2
    finally:
        store.close()


def _leading(store: ChunkMetaStore) -> bool:
    return store._leading  # noqa: SLF001 - no public view of a leader blocked inside LMDB


def test_a_leader_whose_change_is_past_the_group_limit_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # More changes queued than one group takes: whoever leads next may find its own change left
    # for a later group; it must not return before that change is recorded.
    monkeypatch.setattr("fs3.storage.chunk_meta_store._MAX_GROUP", 1)
    store = ChunkMetaStore(tmp_path / "meta", sync=False, map_size=1 << 26, max_readers=16)
    seen: dict[int, ChunkMeta | None] = {}

    def swap_then_look(i: int) -> None:
        store.swap(cid(i), None, meta(i))
        seen[i] = store.get(cid(i))  # what the caller sees the moment swap returns

    try:
        n = 16
        threads, results = run_all([lambda i=i: swap_then_look(i) for i in range(n)])
        with writer_held(store._env):  # noqa: SLF001
            threads[0].start()
            poll(lambda: _leading(store), "the leader stalled")
            for t in threads[1:]:
                t.start()
            poll(lambda: store.commit_stats().queued == n - 1, "the rest queued")
        for t in threads:
            t.join()
        assert results == [None] * n
        assert all(seen[i] == meta(i) for i in range(n)), [i for i in range(n) if seen[i] is None]
        assert store.commit_stats().transactions == n
    finally:
        store.close()


@pytest.mark.parametrize("max_group", [512, 3])
def test_many_threads_swapping_at_once_all_return_with_their_change_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_group: int
) -> None:
    # Leadership passes from group to group without a shared wake-up: no caller may be left
    # waiting (a lost hand-off would hang here) or return before its change is recorded.
    monkeypatch.setattr("fs3.storage.chunk_meta_store._MAX_GROUP", max_group)
    store = ChunkMetaStore(tmp_path / "meta", sync=False, map_size=1 << 26, max_readers=64)
    threads_n, rounds = 24, 40
    wrong: list[tuple[int, int]] = []

    def worker(w: int) -> None:
        prev = None
        for r in range(rounds):
            n = w * 1000 + r
            new = meta(w, version=r + 1, length=1000 + n)
            store.swap(cid(w), prev, new)
            if store.get(cid(w)) != new:
                wrong.append((w, r))
            prev = new

    try:
        threads, results = run_all([lambda w=w: worker(w) for w in range(threads_n)])
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "a caller was never woken"
        assert results == [None] * threads_n and not wrong
        stats = store.commit_stats()
        assert stats.changes == threads_n * rounds and stats.queued == 0 and stats.committing == 0
        assert stats.transactions <= stats.changes
        assert all(store.get(cid(w)).committed.version == rounds for w in range(threads_n))
    finally:
        store.close()


def test_the_metadata_file_is_extended_ahead_of_use(tmp_path: Path) -> None:
    # Zeros ahead of LMDB's pages (FileExtender), so that a group's flush seldom has a new file
    # size to commit; the metadata stays exact across a reopen.
    fs = os.statvfs(tmp_path)
    if fs.f_bavail * fs.f_frsize < FileExtender.MIN_FREE + (64 << 20):
        pytest.skip(f"{tmp_path} has under {FileExtender.MIN_FREE >> 20} MiB free: nothing is extended there")
    store = ChunkMetaStore(tmp_path / "meta", sync=False, map_size=1 << 30, max_readers=16)
    n = 3000  # ~4 KiB of checksums each: ~12 MB of metadata, a few extensions
    try:
        for i in range(n):
            store.swap(cid(i), None, meta(i, length=64 << 20, chunk_size=64 << 20))
    finally:
        store.close()
    env = lmdb.open(str(tmp_path / "meta"), readonly=True, lock=False, max_dbs=2)
    used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    env.close()
    size = (tmp_path / "meta" / "data.mdb").stat().st_size
    assert used > 2 * FileExtender.STEP  # it did grow past the first extensions
    assert FileExtender.LOW - (1 << 20) <= size - used <= FileExtender.LOW + FileExtender.STEP
    store = ChunkMetaStore(tmp_path / "meta", sync=False, map_size=1 << 30, max_readers=16)
    try:
        assert store.stats().chunk_count == n
        assert all(
            store.get(cid(i)) == meta(i, length=64 << 20, chunk_size=64 << 20) for i in (0, n // 2, n - 1)
        )
    finally:
        store.close()
