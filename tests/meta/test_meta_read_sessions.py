"""Read sessions written after their open is answered (fs3.meta.read_sessions): what is queued,
what waits for the queue, and what a clean stop keeps."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_meta_gc import FakeChunks

from fs3.errors import FS3Error, StatusCode
from fs3.kv import Database, Transaction, open_database, prefix_end
from fs3.meta import schema
from fs3.meta.permissions import ROOT
from fs3.meta.read_sessions import MIN_GRACE_S, ReadSessions
from fs3.meta.schema import ROOT_ID
from fs3.meta.store import MetaStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fake() -> FakeChunks:
    return FakeChunks()


@pytest.fixture
def queued(store: MetaStore, fake: FakeChunks) -> MetaStore:
    """The store with read sessions queued while its collector takes unlinked files at once (its
    grace 0): the case where only the collector's wait for the queue keeps a reader's file."""
    store.chunks = fake
    fake.store = store
    store.grace_s = lambda: MIN_GRACE_S
    return store


async def _stored_sessions(s: MetaStore, inode_id: int) -> list[bytes]:
    """The session keys of ``inode_id`` in the store, without waiting for any queue."""
    prefix = schema.session_prefix(inode_id)
    rows = await s.db.run(lambda tr: tr.snapshot.get_range(prefix, prefix_end(prefix)), read_only=True)
    return [k for k, _ in rows]


async def _unlinked_file(s: MetaStore, fake: FakeChunks) -> int:
    r = await s.create(ROOT, ROOT_ID, b"f", 0o644, session=True)
    fake.write(r.inode.id, 0, 100)
    await s.close(r.inode.id, r.session_id, 100, True)
    await s.unlink(ROOT, ROOT_ID, b"f")
    return r.inode.id


async def test_the_collector_waits_for_a_queued_read_session(queued: MetaStore, fake: FakeChunks) -> None:
    """A reader opens a file, then another client unlinks it and the collector runs at once (its
    grace 0 here): the open was answered before its session was in the store, and the collector
    must find the session (it waits for the queue), so the file's chunks stay until the close."""
    s = queued
    r = await s.create(ROOT, ROOT_ID, b"f", 0o644, session=True)
    f = r.inode.id
    fake.write(f, 0, 100)
    await s.close(f, r.session_id, 100, True)
    ino, sid = await s.open(ROOT, f, 0)
    assert ino.id == f and sid
    assert await _stored_sessions(s, f) == []  # answered first, written after
    await s.unlink(ROOT, ROOT_ID, b"f")
    await s.collector.collect_once()
    assert fake.removals == [] and fake.chunks[f] == {0: 100}
    assert (await s.stat(f)).nlink == 0
    assert [x.session_id for x in await s.sessions_of(f)] == [sid]
    assert await s.close(f, sid) is not None
    await s.collector.collect_once()
    assert fake.removals == [f]
    assert s.read_sessions is not None and s.read_sessions.dropped == 0


async def test_an_unlinked_file_opens_with_its_session_written(queued: MetaStore, fake: FakeChunks) -> None:
    """A reader that looked a file up before its unlink opens it after: the collector may claim
    it any moment, so that session is in the store before the open is answered (a queued one
    could come after the claim, leaving an answered open without its chunks)."""
    s = queued
    f = await _unlinked_file(s, fake)
    _, sid = await s.open(ROOT, f, 0)
    assert len(await _stored_sessions(s, f)) == 1
    await s.collector.collect_once()
    assert fake.removals == []
    await s.close(f, sid)
    await s.collector.collect_once()
    assert fake.removals == [f]


async def test_queued_opens_and_closes(queued: MetaStore, fake: FakeChunks) -> None:
    s = queued
    rs = s.read_sessions
    assert rs is not None
    r = await s.create(ROOT, ROOT_ID, b"f", 0o644, session=True)
    f = r.inode.id
    # a write session is in the store when the open is answered; the creator's here
    assert len(await _stored_sessions(s, f)) == 1
    await s.close(f, r.session_id, 0, False)
    assert await _stored_sessions(s, f) == []

    # a retried open (same request id) gets the same session, and the store one session
    _, first = await s.open(ROOT, f, 0, client_id=7, idem=(7, 55))
    _, again = await s.open(ROOT, f, 0, client_id=7, idem=(7, 55))
    _, other = await s.open(ROOT, f, 0, client_id=7, idem=(7, 56))
    assert first == again != other
    assert sorted(x.session_id for x in await s.sessions_of(f)) == sorted([first, other])
    assert len(await _stored_sessions(s, f)) == 2

    # a retry of an open whose session is written already, then its close: nothing stays
    await rs.settled()
    _, again = await s.open(ROOT, f, 0, client_id=7, idem=(7, 55))
    assert again == first
    await s.close(f, first)
    await rs.settled()
    assert sorted(x.session_id for x in await s.sessions_of(f)) == [other]
    _, first = await s.open(ROOT, f, 0, client_id=7, idem=(7, 57))

    # a close of a written session (its end queued), then a second close of it refused
    await rs.settled()
    assert (await s.close(f, first)).id == f
    with pytest.raises(FS3Error) as e:
        await s.close(f, first)
    assert e.value.code == StatusCode.META_BAD_HANDLE
    await rs.settled()
    assert len(await _stored_sessions(s, f)) == 1

    # opened and closed before the queue was written: nothing is written at all
    put = rs.put
    _, sid = await s.open(ROOT, f, 0)
    await s.close(f, sid)
    await s.close(f, other)
    await rs.settled()
    assert rs.put == put and await _stored_sessions(s, f) == []

    # a touch (a client checking its session) of a session still queued finds it
    _, sid = await s.open(ROOT, f, 0)
    assert (await s.touch(f, sid)).id == f
    await s.close(f, sid)
    await rs.settled()
    assert await _stored_sessions(s, f) == [] and rs.queued == 0

    # an O_RDWR open is written at once, and closing it with nothing written goes through meta's
    # transaction, as before
    _, wsid = await s.open(ROOT, f, 2)
    assert len(await _stored_sessions(s, f)) == 1
    await s.close(f, wsid)
    assert await _stored_sessions(s, f) == []


async def test_a_short_grace_writes_read_sessions_at_once(queued: MetaStore, fake: FakeChunks) -> None:
    s = queued
    s.grace_s = lambda: MIN_GRACE_S / 2
    r = await s.create(ROOT, ROOT_ID, b"f", 0o644)
    _, sid = await s.open(ROOT, r.inode.id, 0)
    assert len(await _stored_sessions(s, r.inode.id)) == 1
    await s.close(r.inode.id, sid)
    assert await _stored_sessions(s, r.inode.id) == []


async def test_an_open_that_finds_the_queue_closed_when_done_writes_its_session(
    queued: MetaStore, fake: FakeChunks
) -> None:
    """The grace shortened by a pushed config (or the queue stopped, or failing) while a read-only
    open was being answered: its session goes in its own transaction before the answer, and a
    close meanwhile in one too."""
    s = queued
    r = await s.create(ROOT, ROOT_ID, b"f", 0o644)
    graces = iter([MIN_GRACE_S, MIN_GRACE_S / 2])
    s.grace_s = lambda: next(graces, MIN_GRACE_S / 2)
    _, sid = await s.open(ROOT, r.inode.id, 0, client_id=7, idem=(7, 99))
    assert len(await _stored_sessions(s, r.inode.id)) == 1
    graces = iter([MIN_GRACE_S, MIN_GRACE_S / 2])
    await s.close(r.inode.id, sid)
    assert await _stored_sessions(s, r.inode.id) == []
    assert s.read_sessions is not None and s.read_sessions.queued == 0


async def test_a_clean_stop_writes_the_queue(tmp_path: Path) -> None:
    path = str(tmp_path / "kv")
    db = await open_database("lmdb", path=path, map_size=1 << 26)
    s = MetaStore(db, gc_grace_s=2.0)
    await s.start(background=False)
    f = (await s.create(ROOT, ROOT_ID, b"f", 0o644)).inode.id
    _, sid = await s.open(ROOT, f, 0)
    assert await _stored_sessions(s, f) == []
    await s.stop()
    await db.close()

    db = await open_database("lmdb", path=path, map_size=1 << 26)
    s = MetaStore(db)
    try:
        assert [x.session_id for x in await s.sessions_of(f)] == [sid]
    finally:
        await db.close()


async def test_read_session_ids_are_not_derivable_from_the_request(tmp_path: Path) -> None:
    """A retry that reaches the same meta process gets the same session; another process (or the
    same request id on another client) another one: a session id is what a close presents."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"), map_size=1 << 26)
    a, b = MetaStore(db, gc_grace_s=2.0), MetaStore(db, gc_grace_s=2.0)
    try:
        await a.start(background=False)
        f = (await a.create(ROOT, ROOT_ID, b"f", 0o644)).inode.id
        first = (await a.open(ROOT, f, 0, client_id=7, idem=(7, 55)))[1]
        assert (await a.open(ROOT, f, 0, client_id=7, idem=(7, 55)))[1] == first
        assert (await b.open(ROOT, f, 0, client_id=7, idem=(7, 55)))[1] != first
        assert (await a.open(ROOT, f, 0, client_id=8, idem=(8, 55)))[1] != first
    finally:
        await a.stop()
        await b.stop()
        await db.close()


@contextlib.asynccontextmanager
async def _store_with_file(
    tmp_path: Path, map_size: int
) -> AsyncIterator[tuple[Database, MetaStore, ReadSessions, int]]:
    """An lmdb store of ``map_size`` with meta over it (read sessions queued) and a file; its
    database, meta, the queue and the file's inode id."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"), map_size=map_size)
    s = MetaStore(db, gc_grace_s=2.0)
    rs = s.read_sessions
    assert rs is not None
    try:
        await s.start(background=False)
        yield db, s, rs, (await s.create(ROOT, ROOT_ID, b"f", 0o644)).inode.id
    finally:
        await s.stop()
        await db.close()


async def test_a_full_store_still_takes_readers_sessions(tmp_path: Path) -> None:
    """A store full to its reserve refuses what adds data, but readers' sessions may use the room
    kept (a reader's open failed with ENOSPC, while the README said reads go on): opens for
    reading are answered and their sessions go in; an open for writing is refused."""
    async with _store_with_file(tmp_path, map_size=16 << 20) as (db, s, rs, f):

        async def put(tr: Transaction, i: int) -> None:
            tr.set(b"zz-fill-%d" % i, os.urandom(50_000))

        with pytest.raises(FS3Error) as full:
            for i in range(100_000):
                await db.run(lambda tr, i=i: put(tr, i))
        assert full.value.code == StatusCode.KV_STORE_FULL
        sids = [(await s.open(ROOT, f, 0))[1] for _ in range(3)]
        await asyncio.wait_for(rs.settled(), 10)
        assert sorted(x.session_id for x in await s.sessions_of(f)) == sorted(sids) and rs.accepting(2.0)
        s.read_sessions = None  # sessions in the open's own transaction, as with a short grace
        _, sid = await s.open(ROOT, f, 0)
        assert sid in {x.session_id for x in await s.sessions_of(f)}
        with pytest.raises(FS3Error) as e:
            await s.open(ROOT, f, os.O_WRONLY)
        assert e.value.code == StatusCode.KV_STORE_FULL
        s.read_sessions = rs


async def test_a_store_that_refuses_the_queue_makes_opens_write_their_sessions(tmp_path: Path) -> None:
    """A store that fails the queue's batch (full here, to the last page: the reserve kept for
    removals and readers' sessions used up too): the batch is kept and tried again, and
    meanwhile opens write their sessions in their own transactions, so they fail visibly instead
    of being answered without a session."""
    async with _store_with_file(tmp_path, map_size=1 << 20) as (db, s, rs, f):

        async def put(tr: Transaction, i: int, size: int) -> None:
            tr.use_reserve()
            tr.set(b"zz-fill-%d-%d" % (size, i), b"x" * size)

        async def clear(tr: Transaction) -> None:
            tr.clear_range(b"zz-fill-", b"zz-fill-\xff")

        for size in (3000, 300, 30, 1):  # fill the store, to the last page
            with pytest.raises(FS3Error):
                for i in range(100_000):
                    await db.run(lambda tr, i=i, size=size: put(tr, i, size))
        _, sid = await s.open(ROOT, f, 0)  # answered from a snapshot; its session fails to go in
        for _ in range(100):
            if not rs.accepting(2.0):
                break
            await asyncio.sleep(0.01)
        assert not rs.accepting(2.0) and rs.queued == 1
        with pytest.raises(FS3Error) as e:
            await s.open(ROOT, f, 0)
        assert e.value.code == StatusCode.KV_STORE_FULL
        # room again: the kept batch goes in
        await db.run(clear)
        await asyncio.wait_for(rs.settled(), 10)
        assert [x.session_id for x in await s.sessions_of(f)] == [sid] and rs.accepting(2.0)
