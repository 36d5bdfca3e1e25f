"""Read sessions written after their open is answered (fs3.meta.read_sessions): what is queued,
what waits for the queue, and what a clean stop keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_meta_gc import FakeChunks

from fs3.errors import FS3Error, StatusCode
from fs3.kv import open_database, prefix_end
from fs3.meta import schema
from fs3.meta.permissions import ROOT
from fs3.meta.read_sessions import MIN_GRACE_S
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
    """A file unlinked and then opened for reading (a reader that looked it up before the unlink):
    the open is answered before its session is in the store, and a collector pass run at once
    must find the session (it waits for the queue), so the file's chunks stay until the close."""
    s = queued
    f = await _unlinked_file(s, fake)
    ino, sid = await s.open(ROOT, f, 0)
    assert ino.id == f and sid
    assert await _stored_sessions(s, f) == []  # answered first, written after
    await s.collector.collect_once()
    assert fake.removals == [] and fake.chunks[f] == {0: 100}
    assert (await s.stat(f)).nlink == 0
    assert [x.session_id for x in await s.sessions_of(f)] == [sid]
    assert await s.close(f, sid) is not None
    await s.collector.collect_once()
    assert fake.removals == [f]
    assert s.read_sessions is not None and s.read_sessions.dropped == 0


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

    # a close answered from the queue, then a second close of the same session refused
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
