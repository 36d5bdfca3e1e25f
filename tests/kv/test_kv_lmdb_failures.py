"""The lmdb engine when the machine misbehaves: a failed fsync fails the store instead of being
retried into a false acknowledgement, and a process killed mid-transaction does not keep the
survivors from reusing freed pages."""

from __future__ import annotations

import asyncio
import contextvars
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from fs3.daemon import wait_for_shutdown
from fs3.errors import FS3Error, StatusCode, to_errno
from fs3.kv import Database, Transaction, lmdb_engine, open_database, open_database_sync
from fs3.kv.txn import COMMIT_DEADLINE

pytestmark = pytest.mark.timeout(120)

WORKER = str(Path(__file__).with_name("kv_worker.py"))


async def put(db: Database, key: bytes, value: bytes) -> None:
    async def body(tr: Transaction) -> None:
        tr.set(key, value)

    await db.run(body)


async def get(db: Database, key: bytes) -> bytes | None:
    async def body(tr: Transaction) -> bytes | None:
        return await tr.get(key)

    return await db.run(body, read_only=True)


def _end_child(proc: subprocess.Popen) -> None:
    """Kill ``proc`` (started by the test) if it still runs, reap it, close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for stream in (proc.stdin, proc.stdout):
        if stream:
            stream.close()


class _CommitFailsOnce:
    """The committer's LMDB environment, whose next write transaction's commit raises ``error``
    (what py-lmdb raises for it) instead of committing."""

    def __init__(self, env: lmdb.Environment, error: lmdb.Error) -> None:
        self._env = env
        self.error: lmdb.Error | None = error

    def __getattr__(self, name: str) -> object:
        return getattr(self._env, name)

    def begin(self, **kw: object) -> object:
        txn = self._env.begin(**kw)
        outer = self

        class Txn:
            def __enter__(self) -> lmdb.Transaction:
                return txn

            def __exit__(self, kind: object, *rest: object) -> bool:
                if kind is not None or outer.error is None:
                    return txn.__exit__(kind, *rest)  # type: ignore[no-any-return]
                txn.abort()
                error, outer.error = outer.error, None
                raise error

        return Txn()


@pytest.mark.parametrize(
    "error,fatal",
    [
        # LMDB's fdatasync of the batch's pages, or a page write, failed: a system error py-lmdb
        # has no class for, raised as the plain lmdb.Error
        (lmdb.Error("mdb_txn_commit: Input/output error"), True),
        # a failed meta-page write: LMDB refuses the environment from then on
        (lmdb.PanicError("mdb_txn_commit: MDB_PANIC: Update of meta page failed"), True),
        # a refusal of the batch itself, not of the disk
        (lmdb.BadValsizeError("mdb_put: MDB_BAD_VALSIZE: Unsupported size of key/DB name/data"), False),
    ],
    ids=["eio", "panic", "bad-valsize"],
)
@pytest.mark.parametrize("nearly_full", [False, True], ids=["room", "nearly-full-disk"])
async def test_a_disk_error_of_lmdb_s_own_commit_fails_the_store(
    tmp_path: Path, error: lmdb.Error, fatal: bool, nearly_full: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An EIO of LMDB's own fsync or page writes may have lost earlier batches' pages too (see
    the fsync test below): it fails the store as an fsync error does, not only its batch. Also on a
    nearly full disk, when the batch fitted in the zeros kept ahead of LMDB's data (only a write
    past them can have met a full disk)."""
    if nearly_full:
        monkeypatch.setattr(lmdb_engine, "file_system_full", lambda path: True)
    db = await open_database("lmdb", path=str(tmp_path / "kv"))
    try:
        committer = db._shared.committer  # noqa: SLF001
        await put(db, b"a", b"1")
        committer._env = _CommitFailsOnce(committer._env, error)  # noqa: SLF001
        with pytest.raises(FS3Error) as e:
            await put(db, b"b", b"2")
        assert e.value.code == StatusCode.KV_STORE_FAILED
        if fatal:
            with pytest.raises(FS3Error) as e:
                await put(db, b"c", b"3")
            assert e.value.code == StatusCode.KV_STORE_FAILED and "restart" in e.value.message
            assert db.failure() is not None
        else:
            await put(db, b"c", b"3")
            assert db.failure() is None and await get(db, b"c") == b"3"
        assert await get(db, b"a") == b"1" and await get(db, b"b") is None
    finally:
        await db.close()


async def test_the_empty_key_is_refused_alike_by_every_engine(tmp_path: Path) -> None:
    """LMDB cannot store the empty key; the engines refuse it alike, as the caller's error (it
    used to fail the lmdb commit of a whole batch as a store failure)."""
    for db in (await open_database("mem"), await open_database("lmdb", path=str(tmp_path / "kv"))):
        try:
            for op in (lambda tr: tr.set(b"", b"x"), lambda tr: tr.clear(b""), lambda tr: tr.add(b"", b"\1")):
                with pytest.raises(FS3Error) as e:
                    await db.run(lambda tr, op=op: _sync_body(op, tr))
                assert e.value.code == StatusCode.INVALID_ARGUMENT
            with pytest.raises(FS3Error) as e:
                await get(db, b"")
            assert e.value.code == StatusCode.INVALID_ARGUMENT

            async def ranges(tr: Transaction) -> None:
                tr.set(b"k", b"v")
                assert [kv.key for kv in await tr.get_range(b"", b"\xff")] == [b"k"]
                tr.clear_range(b"", b"\xff")

            await db.run(ranges)  # a range may begin there
            assert await get(db, b"k") is None and db.failure() is None
        finally:
            await db.close()


async def _sync_body(op: object, tr: Transaction) -> None:
    op(tr)  # type: ignore[operator]


async def test_a_failed_fsync_fails_the_commit_waiting_for_it_and_every_later_one(tmp_path: Path) -> None:
    """After an fsync error the kernel may report the next fsync as a success without the pages
    it lost: the commit that waited for the failed one must not be acknowledged by a retry."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"))
    try:
        committer = db._shared.committer  # noqa: SLF001
        real = committer._sync  # noqa: SLF001
        calls = 0

        def failing_once() -> None:  # the disk's write-back error, reported once (as Linux does)
            nonlocal calls
            calls += 1
            if calls == 2:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real()

        committer._sync = failing_once  # noqa: SLF001
        await put(db, b"a", b"1")
        with pytest.raises(FS3Error) as e:
            await put(db, b"b", b"2")
        assert e.value.code == StatusCode.KV_STORE_FAILED and "fsync" in e.value.message
        with pytest.raises(FS3Error) as e:
            await put(db, b"c", b"3")
        assert e.value.code == StatusCode.KV_STORE_FAILED and "restart" in e.value.message
        assert await get(db, b"a") == b"1"  # reads go on
        # a daemon over it stops (exit status 1), for its supervisor to restart it
        assert db.failure() is not None
        assert await asyncio.wait_for(wait_for_shutdown(db, check_s=0.05), 5) == 1
    finally:
        await db.close()


def test_a_reader_killed_mid_transaction_does_not_keep_freed_pages_from_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lmdb_engine, "READER_CHECK_S", 0.05)
    path = tmp_path / "kv"
    db = open_database_sync("lmdb", path=str(path))  # open before the other process dies
    holder = subprocess.Popen(
        [sys.executable, WORKER, "hold", str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )

    async def overwrite() -> None:
        value = os.urandom(60_000)
        for _ in range(1500):  # 90 MB written to one key: freed pages must be reused
            await put(db, b"k", value)

    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"read\n"  # snapshot taken
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        asyncio.run(overwrite())
        assert os.path.getsize(path / "data.mdb") < 40 << 20
    finally:
        _end_child(holder)
        asyncio.run(db.close())


async def test_a_full_store_refuses_what_adds_with_enospc_and_still_takes_removals(tmp_path: Path) -> None:
    """A store that cannot grow (here its map; a full disk alike) refuses transactions that only
    add with KV_STORE_FULL, which is ENOSPC, and keeps the last of its room for those that remove
    something: an unlink, a garbage collection. The store stays up, and once removals have freed
    pages, adding works again."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"), map_size=16 << 20)
    try:
        value = os.urandom(50_000)
        stored, full = await _fill_store(db, value)
        assert full.code == StatusCode.KV_STORE_FULL and "full" in full.message
        assert to_errno(full.code) == errno.ENOSPC
        assert 100 < stored < 320
        assert db.failure() is None
        stats, room = db.commit_stats(), db.space()
        assert stats is not None and stats.refused >= 1  # fs3_kv_commit_refused_total
        assert room is not None and room.limit_bytes == 16 << 20
        assert stored * 50_000 < room.used_bytes < room.limit_bytes and room.disk_free_bytes > 0
        assert await get(db, b"k0000") == value

        async def remove(tr: Transaction, key: bytes) -> None:
            tr.clear(key)

        # what must go on however full the store is (mgmtd's lease, a reader's session) may use
        # the room kept: a full store refused mgmtd's lease, and it lost its role over and over
        async def renew(tr: Transaction, reserve: bool) -> None:
            if reserve:
                tr.use_reserve()
            tr.set(b"lease", os.urandom(100))

        with pytest.raises(FS3Error) as refused:
            await db.run(lambda tr: renew(tr, False))
        assert refused.value.code == StatusCode.KV_STORE_FULL
        for _ in range(50):
            await db.run(lambda tr: renew(tr, True))

        # one batch: the refusal of the one that adds is its own, the removal commits
        outcomes = await asyncio.gather(
            put(db, b"refused", value), db.run(lambda tr: remove(tr, b"k0001")), return_exceptions=True
        )
        assert isinstance(outcomes[0], FS3Error) and outcomes[0].code == StatusCode.KV_STORE_FULL
        assert outcomes[1] is None and await get(db, b"k0001") is None

        async def remove_and_add(tr: Transaction) -> None:
            tr.clear(b"k0000")
            tr.set(b"moved", b"x")  # a rename: removes a name, adds another

        await db.run(remove_and_add)
        for n in range(2, stored // 2):
            await db.run(lambda tr, key=b"k%04d" % n: remove(tr, key))
        for n in range(stored, stored + 20):
            await put(db, b"k%04d" % n, value)  # the freed pages are used again
        assert await get(db, b"k%04d" % (stored + 19)) == value and await get(db, b"moved") == b"x"
    finally:
        await db.close()


async def test_a_reader_holding_old_pages_keeps_a_full_store_refusing_additions(tmp_path: Path) -> None:
    """Pages that removals freed while a reader holds an older snapshot are not free for LMDB to
    use yet: a full store does not count them as room, so additions stay refused (and the room
    kept for removals stays theirs) until the reader is done."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"), map_size=16 << 20)
    try:
        value = os.urandom(50_000)
        stored, _ = await _fill_store(db, value)
        reader = db.create_transaction()
        assert await reader.get(b"k0000") == value  # holds its snapshot
        for n in range(30):
            await db.run(lambda tr, key=b"k%04d" % n: _clear(tr, key))
        with pytest.raises(FS3Error) as refused:
            await put(db, b"new", value)
        assert refused.value.code == StatusCode.KV_STORE_FULL
        for n in range(30, 40):  # the room kept for removals is still there
            await db.run(lambda tr, key=b"k%04d" % n: _clear(tr, key))
        reader.cancel()
        await put(db, b"new", value)  # the freed pages count once nobody holds them
        assert await get(db, b"new") == value
    finally:
        await db.close()


async def _fill_store(db: Database, value: bytes) -> tuple[int, FS3Error]:
    """Put ``value`` under k0000, k0001, ... until the store refuses one: how many went in, and
    the refusal."""
    for n in range(1000):
        try:
            await put(db, b"k%04d" % n, value)
        except FS3Error as e:
            return n, e
    raise AssertionError("the store took 1,000 values without filling up")


async def _clear(tr: Transaction, key: bytes) -> None:
    tr.clear(key)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB ext4 file system of its own (a loop device), unmounted after the test; skips where
    it cannot be made (needs root, mkfs.ext4 and loop devices)."""
    image, mnt = tmp_path / "disk.img", tmp_path / "disk"
    mnt.mkdir()
    image.touch()
    os.truncate(image, 48 << 20)
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make an ext4 file system here: {exc}")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a loop device here: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


async def test_a_store_whose_disk_fills_up_refuses_with_enospc_and_stays_up(small_disk: Path) -> None:
    """The disk under the store fills up (other files took it): commits that would add fail with
    KV_STORE_FULL (ENOSPC), not as a failed disk (LMDB says EIO when a full disk cuts a write of
    its pages short, which stopped meta and mgmtd for good), removals still commit, and once space
    is freed adding works again, without a restart."""
    db = await open_database("lmdb", path=str(small_disk / "kv"))
    try:
        await put(db, b"first", b"x")
        st = os.statvfs(small_disk)
        _fill(small_disk / "filler", st.f_bfree * st.f_frsize - (6 << 20))  # all but 6 MiB
        value = os.urandom(50_000)
        stored, full = await _fill_store(db, value)
        assert full.code == StatusCode.KV_STORE_FULL, full
        assert to_errno(full.code) == errno.ENOSPC
        assert stored > 10
        assert db.failure() is None
        for n in range(stored // 2):

            async def remove(tr: Transaction, key: bytes = b"k%04d" % n) -> None:
                tr.clear(key)

            await db.run(remove)
        os.unlink(small_disk / "filler")
        for n in range(stored, stored + 100):
            await put(db, b"k%04d" % n, value)
        assert await get(db, b"first") == b"x" and await get(db, b"k%04d" % (stored + 99)) == value
        assert db.failure() is None
    finally:
        await db.close()


def _fill(path: Path, nbytes: int) -> None:
    piece = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(nbytes >> 20):
            f.write(piece)
        os.fsync(f.fileno())


# Another process's committer stopped mid-commit (a meta server frozen by SIGSTOP): it holds the
# store's write baton (see lmdb_engine._Committer._baton), then LMDB's write lock.
_HOLD_WRITE_LOCK = """
import fcntl, os, sys, lmdb
env = lmdb.open(sys.argv[1], map_size=1 << 30, max_dbs=0)
fcntl.flock(os.open(os.path.join(sys.argv[1], "data.mdb"), os.O_RDONLY), fcntl.LOCK_EX)
with env.begin(write=True):
    print("locked", flush=True)
    sys.stdin.readline()
"""


async def test_a_commit_whose_caller_gave_up_while_another_process_held_the_lock_is_not_made(
    tmp_path: Path,
) -> None:
    """A commit queued behind the write lock another process held (a meta server frozen while
    committing) was made once the lock came free, long after its caller's deadline: a change the
    caller had been told failed (ETIMEDOUT) was there after all (helper: mkdir, unlink on the
    other meta server). One not begun by the deadline of the call it serves fails instead."""
    path = tmp_path / "kv"
    db = await open_database("lmdb", path=str(path))
    await put(db, b"before", b"x")
    holder = subprocess.Popen(  # noqa: ASYNC220 - started once, before anything waits
        [sys.executable, "-c", _HOLD_WRITE_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        loop = asyncio.get_running_loop()
        token = COMMIT_DEADLINE.set(loop.time() + 0.5)
        try:
            late = loop.create_task(put(db, b"late", b"x"))  # in a copy of this context
            unbounded = loop.create_task(put(db, b"no-deadline", b"x"), context=contextvars.Context())
        finally:
            COMMIT_DEADLINE.reset(token)
        await asyncio.sleep(1.5)
        assert not late.done() and not unbounded.done()  # both wait for the lock
        # ... on the commit thread: this event loop goes on serving (it never waits for another
        # process's lock, though it commits its own transactions while the disk is fast)
        assert await asyncio.wait_for(get(db, b"before"), 5) == b"x"
        assert holder.stdin is not None
        holder.stdin.write(b"go\n")
        holder.stdin.flush()
        with pytest.raises(FS3Error) as e:
            await asyncio.wait_for(late, 10)
        assert e.value.code == StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(unbounded, 10)
        assert await get(db, b"late") is None
        assert await get(db, b"no-deadline") == b"x"
        token = COMMIT_DEADLINE.set(loop.time() + 5)
        try:
            await put(db, b"in-time", b"x")  # a deadline not reached is no obstacle
        finally:
            COMMIT_DEADLINE.reset(token)
        assert await get(db, b"in-time") == b"x"
    finally:
        _end_child(holder)
        await db.close()


async def test_commits_go_to_the_commit_thread_while_flushes_are_slow_and_come_back_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the disk is fast the event loop commits its callers' transactions itself (no thread
    switches: a quarter of a meta server's CPU per create); once flushes are slow, the commit
    thread does, so that the loop serves reads while a flush waits; once fast again, the loop."""
    monkeypatch.setattr(lmdb_engine, "LOOP_COMMIT_MAX_S", 0.02)  # a slow CI disk is faster than this
    db = await open_database("lmdb", path=str(tmp_path / "kv"))
    await put(db, b"warm", b"x")  # (the first commit grows the new store's file, on the thread)
    disk = _SlowFlushes(db._shared.committer)  # noqa: SLF001
    loop_thread = threading.get_ident()
    try:
        await put(db, b"a", b"1")
        assert disk.flushed_on == [loop_thread]  # the loop flushed its own commit
        disk.slow_s = 0.05
        for i in range(10):  # the average flush grows past LOOP_COMMIT_MAX_S
            await put(db, b"slow%d" % i, b"x")
        disk.flushed_on.clear()
        disk.release.clear()
        writer = asyncio.create_task(put(db, b"b", b"2"))
        # the flush waits for this read, which the loop serves meanwhile
        assert await asyncio.wait_for(get(db, b"a"), 5) == b"1"
        assert not writer.done()
        disk.release.set()
        await asyncio.wait_for(writer, 10)
        assert disk.flushed_on and loop_thread not in disk.flushed_on
        disk.slow_s = 0.0
        for i in range(40):  # fast again: the average falls
            await put(db, b"fast%d" % i, b"x")
        disk.flushed_on.clear()
        await put(db, b"c", b"3")
        assert disk.flushed_on == [loop_thread]
        assert [await get(db, k) for k in (b"a", b"b", b"c")] == [b"1", b"2", b"3"]
    finally:
        disk.release.set()
        await db.close()


class _SlowFlushes:
    """The committer's LMDB environment with flushes (``sync``) that take ``slow_s`` longer and
    wait for ``release``; ``flushed_on``: the threads that flushed."""

    def __init__(self, committer: lmdb_engine._Committer) -> None:
        self._env = committer._env  # noqa: SLF001
        self.slow_s = 0.0
        self.release = threading.Event()
        self.release.set()
        self.flushed_on: list[int] = []
        committer._env = self  # type: ignore[assignment]  # noqa: SLF001

    def sync(self, force: bool) -> None:
        self.flushed_on.append(threading.get_ident())
        time.sleep(self.slow_s)
        self.release.wait(10)  # the test sets it once it has read during the flush
        self._env.sync(force)

    def __getattr__(self, name: str) -> object:
        return getattr(self._env, name)


async def test_event_loops_of_two_threads_and_the_commit_thread_lose_no_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Increments from two event loops (each committing its own while it can, else handing its
    batch to the commit thread) and from the commit thread (forced by a zero threshold part of the
    time): every one counted once."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"))
    rounds = 300

    async def incr(tr: Transaction) -> None:
        raw = await tr.get(b"n")
        tr.set(b"n", b"%d" % (int(raw or b"0") + 1))

    async def worker() -> None:
        for i in range(rounds):
            if i % 100 == 50:
                monkeypatch.setattr(lmdb_engine, "LOOP_COMMIT_MAX_S", 0.0)  # thread path for a while
            elif i % 100 == 75:
                monkeypatch.setattr(lmdb_engine, "LOOP_COMMIT_MAX_S", 1.0)
            await asyncio.gather(*(db.run(incr) for _ in range(4)))

    try:
        other = threading.Thread(target=lambda: asyncio.run(worker()))
        other.start()
        await worker()
        await asyncio.to_thread(other.join, 60)
        assert not other.is_alive()
        assert await get(db, b"n") == b"%d" % (2 * rounds * 4)
    finally:
        await db.close()


async def test_a_store_closed_while_the_event_loop_flushes_its_commit_waits_for_that_flush(
    tmp_path: Path,
) -> None:
    """The loop commits, lets go of the write baton, then flushes: a close that came in between
    closed the environment under that flush, whose failure failed the store and told callers
    whose transactions were in it KV_STORE_FAILED (helper review, with the loop descheduled
    there). The close now waits for the loop's flush."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"))
    await put(db, b"warm", b"x")
    committer = db._shared.committer  # noqa: SLF001
    real = committer._sync  # noqa: SLF001
    stopper: threading.Thread | None = None
    stopped = threading.Event()
    stopped_during_flush: list[bool] = []

    def stop() -> None:
        committer.stop()
        stopped.set()

    def sync() -> None:
        nonlocal stopper
        if stopper is None:  # the close comes while this loop is about to flush
            stopper = threading.Thread(target=stop)
            stopper.start()
            stopped.wait(0.5)
            stopped_during_flush.append(stopped.is_set())
        real()

    committer._sync = sync  # noqa: SLF001
    try:
        await put(db, b"k", b"v")
        assert stopped_during_flush == [False]
        assert stopper is not None
        await asyncio.to_thread(stopper.join, 10)
        assert stopped.is_set()
    finally:
        await db.close()
    db = await open_database("lmdb", path=str(tmp_path / "kv"))
    try:
        assert await get(db, b"k") == b"v"
    finally:
        await db.close()


async def test_a_commit_that_grows_the_store_s_file_is_left_to_the_commit_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Growing the file writes and flushes 8 MiB of zeros ahead of LMDB (FileExtender), 7-9 ms
    here: on the event loop every request waited that long. The commit thread does it."""
    monkeypatch.setattr(lmdb_engine, "LOOP_COMMIT_MAX_S", 0.02)  # a slow CI disk is faster than this
    db = await open_database("lmdb", path=str(tmp_path / "kv"))
    await put(db, b"warm", b"x")  # a new store's file grows at the first commit
    disk = _SlowFlushes(db._shared.committer)  # noqa: SLF001
    extender = db._shared.committer._extender  # noqa: SLF001
    loop_thread = threading.get_ident()
    try:
        await put(db, b"a", b"1")
        assert disk.flushed_on == [loop_thread]
        disk.flushed_on.clear()
        extender.low = lambda: True  # type: ignore[method-assign]
        await put(db, b"b", b"2")
        assert disk.flushed_on and loop_thread not in disk.flushed_on
        del extender.low
        disk.flushed_on.clear()
        await put(db, b"c", b"3")
        assert disk.flushed_on == [loop_thread]
    finally:
        await db.close()
