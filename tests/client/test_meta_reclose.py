"""A read session's close that meta answered before writing its end (fs3.meta.read_sessions): if
the meta process dies before it writes it, the session would stay until the client goes, and keep
its file's chunks if the file is unlinked (found by the chaos test: a meta killed mid-batch). The
client ends such sessions again (EndReadSessions), through another server, when it loses that one."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
from cluster import wait_until

from fs3.client.meta_client import MetaClient, QueuedSessions
from fs3.config import KvConfig, MetaConfig
from fs3.errors import FS3Error, StatusCode
from fs3.kv import open_database, prefix_end
from fs3.kv.base import Database, Transaction
from fs3.meta import schema
from fs3.meta.daemon import MetaDaemon
from fs3.meta.namespace import CALL_DEADLINE
from fs3.meta.permissions import Credentials
from fs3.meta.schema import ROOT_ID
from fs3.proto import common_pb2
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)


async def _sessions(db: Database, inode_id: int) -> int:
    """The sessions of ``inode_id`` in the store, without waiting for any meta's queue."""
    prefix = schema.session_prefix(inode_id)

    async def fn(tr: Transaction) -> int:
        return len(await tr.snapshot.get_range(prefix, prefix_end(prefix)))

    return await db.run(fn, read_only=True)


@pytest.fixture
async def two_metas(tmp_path) -> AsyncIterator[tuple[Database, MetaDaemon, MetaDaemon]]:
    db = await open_database(KvConfig(engine="lmdb", path=str(tmp_path / "kv")))
    daemons = [
        MetaDaemon(
            MetaConfig(node_id=node_id, listen_port=0, mgmtd_addresses=[], kv=KvConfig(engine="lmdb")), db=db
        )
        for node_id in (100, 101)
    ]
    try:
        for d in daemons:
            await d.start()
        yield db, daemons[0], daemons[1]
    finally:
        for d in daemons:
            await d.stop()
        await db.close()


def _stall(meta: MetaDaemon) -> None:
    """From now on ``meta`` queues read sessions and never writes them."""

    async def never(tr: Transaction) -> tuple[int, int, int]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    assert meta.store is not None and meta.store.read_sessions is not None
    meta.store.read_sessions._write = never  # type: ignore[method-assign]  # noqa: SLF001


async def _die(meta: MetaDaemon) -> None:
    """``meta`` dies: its connections end, and its queue with it."""
    assert meta.store is not None and meta.store.read_sessions is not None
    task = meta.store.read_sessions._task  # noqa: SLF001
    assert task is not None
    task.cancel()
    assert meta.server is not None
    await meta.server.stop()


async def _unlink_and_die(client: MetaClient, meta: MetaDaemon, unlinked: bool) -> None:
    """Unlink /f through the second server if ``unlinked``; then ``meta`` dies (:func:`_die`)."""
    if unlinked:
        client._current = 1  # noqa: SLF001
        await client.unlink(ROOT_ID, b"f")
    await _die(meta)


async def _sessions_become(db: Database, inode_id: int, n: int, what: str) -> None:
    async def there() -> bool:
        return await _sessions(db, inode_id) == n

    await wait_until(there, 20, what)


@pytest.mark.parametrize("unlinked", [False, True])
async def test_a_read_session_whose_end_died_with_its_meta_is_closed_again(two_metas, unlinked: bool) -> None:
    db, a, b = two_metas
    assert a.store is not None and a.store.read_sessions is not None
    client = MetaClient([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    try:
        ino = (await client.create(ROOT_ID, b"f", 0o644)).inode
        client._current = 0  # noqa: SLF001  # the open and close go to meta a
        rsp = await client.open(ino.id, os.O_RDONLY)
        await a.store.read_sessions.settled()  # the session is written ...
        assert await _sessions(db, ino.id) == 1

        _stall(a)
        await client.close_file(ino.id, rsp.session_id)  # ... its end is queued and never written
        assert await _sessions(db, ino.id) == 1
        await _unlink_and_die(client, a, unlinked)
        await _sessions_become(db, ino.id, 0, "the read session to be closed again through meta b")
        await wait_until(lambda: client._queued_ends.ended == 1, 10, "the answer")  # noqa: SLF001
        if unlinked:  # and the collector may take the file
            assert b.store is not None
            await wait_until(lambda: _gone(db, ino.id), 30, "the unlinked file to be collected")
    finally:
        await client.close()


async def _gone(db: Database, inode_id: int) -> bool:
    async def fn(tr: Transaction) -> bool:
        return await tr.get(schema.inode_key(inode_id)) is None

    return await db.run(fn, read_only=True)


async def test_after_a_clean_stop_nothing_is_left_to_end(two_metas, caplog) -> None:  # type: ignore[no-untyped-def]
    """A clean stop writes the queue: the batch the client sends after it ends nothing (one
    snapshot read at meta, no write)."""
    caplog.set_level("DEBUG", logger="fs3.client.meta_client")
    db, a, b = two_metas
    client = MetaClient([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    try:
        ino = (await client.create(ROOT_ID, b"f", 0o644)).inode
        client._current = 0  # noqa: SLF001
        for _ in range(3):
            rsp = await client.open(ino.id, os.O_RDONLY)
            await client.close_file(ino.id, rsp.session_id)
        assert a.store is not None
        await a.store.read_sessions.settled()  # as a stop does before its connections end
        await a.stop()
        await wait_until(
            lambda: any("ended 0 read sessions" in r.getMessage() for r in caplog.records),
            20,
            "the client's batch after the stop",
        )
        assert client._queued_ends.ended == 0 and await _sessions(db, ino.id) == 0  # noqa: SLF001
        assert "(of 3 closed through it" in caplog.text
    finally:
        await client.close()


async def test_only_the_callers_read_sessions_end(two_metas) -> None:
    db, _, b = two_metas
    client = MetaClient([f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    other = MetaClient([f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    try:
        created = await client.create(ROOT_ID, b"f", 0o644, session=True)  # a write session
        ino = created.inode
        read = await client.open(ino.id, os.O_RDONLY)
        others = await other.open(ino.id, os.O_RDONLY)
        assert b.store is not None
        await b.store.read_sessions.settled()
        assert await _sessions(db, ino.id) == 3
        refs = [
            m.SessionRef(inode=ino.id, session_id=sid)
            for sid in (created.session_id, read.session_id, others.session_id)
        ]
        rsp = await client.call("EndReadSessions", m.EndReadSessionsReq(sessions=refs))
        assert rsp.ended == 1 and await _sessions(db, ino.id) == 2
        rsp = await client.call("EndReadSessions", m.EndReadSessionsReq(sessions=refs))
        assert rsp.ended == 0
    finally:
        await client.close()
        await other.close()


class _FakeRpc:
    def on_connection_lost(self, listener: object) -> None:
        pass

    def remove_connection_lost(self, listener: object) -> None:
        pass


class _FakeClient:
    """What QueuedSessions uses of a MetaClient, but its calls (which subclasses add)."""

    rpc = _FakeRpc()

    def avoid(self, address: object) -> None:
        pass


async def test_a_loss_reported_before_its_last_close_is_recorded_still_ends_that_session() -> None:
    """An RDMA connection delivers a close's answer and the connection's end in one callback: the
    loss reaches the tracker before the close's caller has recorded the close."""
    sent: list[m.EndReadSessionsReq] = []

    class Client(_FakeClient):
        async def call(self, method: str, req: m.EndReadSessionsReq) -> m.EndReadSessionsRsp:
            sent.append(req)
            return m.EndReadSessionsRsp(ended=len(req.sessions))

    ends = QueuedSessions(Client())  # type: ignore[arg-type]
    ends.lost(("10.0.0.1", 8100))
    ends.add(("10.0.0.1", 8100), 5, 6)
    await wait_until(lambda: bool(sent), 5, "the batch")
    assert [(s.inode, s.session_id) for s in sent[0].sessions] == [(5, 6)]
    await ends.close()


@pytest.mark.parametrize("unlinked", [False, True])
async def test_a_read_session_whose_open_died_with_its_meta_is_put_again(two_metas, unlinked: bool) -> None:
    """Meta answered the open and died before writing the session: the client puts it again
    through meta b, so a file unlinked while it reads keeps its chunks until the close."""
    db, a, b = two_metas
    assert a.store is not None and a.store.read_sessions is not None and b.store is not None
    client = MetaClient([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    try:
        ino = (await client.create(ROOT_ID, b"f", 0o644)).inode

        _stall(a)
        client._current = 0  # noqa: SLF001  # the open goes to meta a
        rsp = await client.open(ino.id, os.O_RDONLY)
        assert rsp.session_queued and rsp.session_id
        assert await _sessions(db, ino.id) == 0  # queued, never written
        await _unlink_and_die(client, a, unlinked)
        await _sessions_become(db, ino.id, 1, "the read session to be put again through meta b")
        # (the store has it before the client has meta b's answer)
        await wait_until(lambda: client._queued_ends.restored == 1, 10, "the answer")  # noqa: SLF001
        # past the collector's grace, the open file keeps its chunks (without the session it goes)
        await asyncio.sleep(b.store.collector.grace_s + 0.3)
        await b.store.collector.collect_once()
        assert not await _gone(db, ino.id)
        assert (await client.stat(ino.id)).nlink == (0 if unlinked else 1)
        # the close (through b) ends the restored session, and an unlinked file then goes
        await client.close_file(ino.id, rsp.session_id)
        await b.store.read_sessions.settled()
        assert await _sessions(db, ino.id) == 0
        if unlinked:
            await b.store.collector.collect_once()
            assert await _gone(db, ino.id)
    finally:
        await client.close()


async def test_restore_puts_only_missing_sessions_of_readable_files(two_metas) -> None:
    db, _, b = two_metas
    client = MetaClient([f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    bob = client.acting_as(common_pb2.UserInfo(uid=1000, gid=1000))
    try:
        assert b.store is not None
        readable = (await client.create(ROOT_ID, b"r", 0o644)).inode
        private = (await client.create(ROOT_ID, b"p", 0o600)).inode
        there = await client.open(readable.id, os.O_RDONLY)
        await b.store.read_sessions.settled()

        async def restore(c: MetaClient, pairs: list[tuple[int, int]]) -> m.RestoreReadSessionsRsp:
            req = m.RestoreReadSessionsReq(inode_ids=[i for i, _ in pairs], session_ids=[s for _, s in pairs])
            return await c.call("RestoreReadSessions", req)

        rsp = await restore(client, [(readable.id, there.session_id), (readable.id, 77), (999_999, 78)])
        assert (rsp.restored, rsp.present) == (1, 1)  # the gone inode is neither
        assert await _sessions(db, readable.id) == 2
        rsp = await restore(bob, [(private.id, 79), (readable.id, 80)])
        assert (rsp.restored, rsp.present) == (1, 0)  # not the file bob may not read
        assert await _sessions(db, private.id) == 0
        # a restored session is the caller's: it ends as any of its read sessions
        ended = await bob.call(
            "EndReadSessions", m.EndReadSessionsReq(sessions=[m.SessionRef(inode=readable.id, session_id=80)])
        )
        assert ended.ended == 1
        with pytest.raises(FS3Error) as e:
            await client.call(
                "RestoreReadSessions", m.RestoreReadSessionsReq(inode_ids=[1, 2], session_ids=[3])
            )
        assert e.value.code == StatusCode.INVALID_ARGUMENT
        with pytest.raises(FS3Error) as e:
            await client.call(
                "RestoreReadSessions",
                m.RestoreReadSessionsReq(inode_ids=[readable.id] * 4097, session_ids=list(range(1, 4098))),
            )
        assert e.value.code == StatusCode.INVALID_ARGUMENT
    finally:
        await client.close()


async def test_a_session_closed_or_given_up_is_not_put_again() -> None:
    """Only sessions still held open are put again, each through the client (user) that opened
    it; a close waits for a put of its session being sent, so the put cannot come after it."""
    sent: list[tuple[int, m.RestoreReadSessionsReq]] = []
    release = asyncio.Event()

    class Client(_FakeClient):
        def __init__(self, uid: int) -> None:
            self.user = common_pb2.UserInfo(uid=uid)

        async def call(self, method: str, req: m.RestoreReadSessionsReq) -> m.RestoreReadSessionsRsp:
            assert method == "RestoreReadSessions"
            sent.append((self.user.uid, req))
            await release.wait()
            return m.RestoreReadSessionsRsp(restored=len(req.inode_ids))

    base, alice = Client(0), Client(1000)
    queued = QueuedSessions(base)  # type: ignore[arg-type]
    here = ("10.0.0.1", 8100)
    queued.opened(here, base, 5, 6)  # type: ignore[arg-type]
    queued.opened(here, alice, 7, 8)  # type: ignore[arg-type]
    queued.opened(here, base, 9, 10)  # type: ignore[arg-type]
    queued.opened(("10.0.0.2", 8100), base, 11, 12)  # type: ignore[arg-type]  # another server's
    queued.forget(9, 10)  # given up (meta ended it)
    queued.lost(here)
    await wait_until(lambda: len(sent) == 2, 5, "the batches")
    assert sorted((uid, list(r.inode_ids), list(r.session_ids)) for uid, r in sent) == [
        (0, [5], [6]),
        (1000, [7], [8]),
    ]
    # a check that found no session waits for the put, and then knows the session may be there
    asking = asyncio.ensure_future(queued.restoring(7, 8))
    closing = asyncio.ensure_future(queued.closing(5, 6))
    await asyncio.sleep(0.05)
    assert not closing.done() and not asking.done()  # both wait for the put being sent
    release.set()
    await asyncio.wait_for(closing, 5)
    assert await asyncio.wait_for(asking, 5)
    assert queued.restored == 2
    assert not await queued.restoring(9, 10) and not await queued.restoring(11, 12)
    queued.forget(7, 8)
    assert not await queued.restoring(7, 8)
    queued.lost(here)  # nothing left of that server
    await asyncio.sleep(0.05)
    assert len(sent) == 2
    await queued.close()


async def test_a_put_again_whose_caller_gave_up_writes_nothing(two_metas) -> None:
    """A put that comes after its caller gave up (and may have put and closed the session through
    another server since) would bring the session back for good: it is refused instead."""
    db, _, b = two_metas
    client = MetaClient([f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    try:
        assert b.store is not None
        ino = (await client.create(ROOT_ID, b"f", 0o644)).inode
        token = CALL_DEADLINE.set(asyncio.get_running_loop().time() - 1)
        try:
            with pytest.raises(FS3Error) as e:
                await b.store.restore_read_sessions(Credentials(0, 0), client.client_id, [(ino.id, 5)])
        finally:
            CALL_DEADLINE.reset(token)
        assert e.value.code == StatusCode.DEADLINE_EXCEEDED
        assert await _sessions(db, ino.id) == 0
    finally:
        await client.close()


def _hold_queued_writes(meta: MetaDaemon, release: asyncio.Event) -> None:
    """``meta`` writes the read sessions it queued only once ``release`` is set (a slow commit)."""
    assert meta.store is not None and meta.store.read_sessions is not None
    write = meta.store.read_sessions._write  # noqa: SLF001

    async def late(tr: Transaction) -> tuple[int, int, int]:
        await release.wait()
        return await write(tr)

    meta.store.read_sessions._write = late  # type: ignore[method-assign]  # noqa: SLF001


async def test_a_check_of_a_queued_session_asks_the_server_that_queued_it(two_metas) -> None:
    """Meta a answered the open and has not written the session yet; the client's next call would
    go to meta b, which would not find it (META_BAD_HANDLE: the handle would open its file again
    and the first session stay for good). The check goes to a, which waits for its write."""
    db, a, b = two_metas
    client = MetaClient([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    release = asyncio.Event()
    try:
        ino = (await client.create(ROOT_ID, b"f", 0o644)).inode
        _hold_queued_writes(a, release)
        client._current = 0  # noqa: SLF001
        rsp = await client.open(ino.id, os.O_RDONLY)
        assert rsp.session_queued
        client._current = 1  # noqa: SLF001  # b, but for the check
        check = asyncio.ensure_future(client.touch_session(ino.id, rsp.session_id, confirm=True))
        await asyncio.sleep(0.2)
        assert not check.done()  # a waits for its write
        release.set()
        assert await asyncio.wait_for(check, 10) > 0
        assert await _sessions(db, ino.id) == 1
        # and b, asked directly, finds it now (it was written)
        await client.touch_session(ino.id, rsp.session_id)
        client.forget_session(ino.id, rsp.session_id)
        with pytest.raises(FS3Error) as e:
            await client.touch_session(ino.id, 12345, confirm=True)
        assert e.value.code == StatusCode.META_BAD_HANDLE
    finally:
        release.set()  # (a's stop waits for its queue)
        await client.close()


async def test_a_close_of_a_queued_session_goes_to_the_server_that_queued_it(two_metas) -> None:
    """As a mount does: the open through its caller's client answered by meta a (the session not
    written yet), the close through the mount's own client, whose next server is b. Sent to b, the
    close found no session (META_BAD_HANDLE, taken for an end by meta), and a wrote it after: it
    stayed for good, and kept an unlinked file's chunks. It goes to a, which ends it after its put."""
    db, a, b = two_metas
    client = MetaClient([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], timeout_s=20, rpc_timeout_s=5)
    release = asyncio.Event()
    try:
        ino = (await client.create(ROOT_ID, b"f", 0o644)).inode
        _hold_queued_writes(a, release)
        user = client.acting_as(common_pb2.UserInfo())
        user._current = 0  # noqa: SLF001
        client._current = 1  # noqa: SLF001
        rsp = await user.open(ino.id, os.O_RDONLY)
        assert rsp.session_queued
        close = asyncio.ensure_future(client.close_file(ino.id, rsp.session_id))
        await asyncio.sleep(0.2)
        release.set()
        await asyncio.wait_for(close, 10)
        await a.store.read_sessions.settled()
        await _sessions_become(db, ino.id, 0, "the session ended")
    finally:
        release.set()
        await client.close()
