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

from fs3.client.meta_client import MetaClient, QueuedEnds
from fs3.config import KvConfig, MetaConfig
from fs3.kv import open_database, prefix_end
from fs3.kv.base import Database, Transaction
from fs3.meta import schema
from fs3.meta.daemon import MetaDaemon
from fs3.meta.schema import ROOT_ID
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

        async def never(tr: Transaction) -> tuple[int, int, int]:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        a.store.read_sessions._write = never  # type: ignore[method-assign]  # noqa: SLF001
        await client.close_file(ino.id, rsp.session_id)  # ... its end is queued and never written
        assert await _sessions(db, ino.id) == 1
        if unlinked:
            client._current = 1  # noqa: SLF001
            await client.unlink(ROOT_ID, b"f")
        # meta a dies: its connections end, and its queue with it
        task = a.store.read_sessions._task  # noqa: SLF001
        assert task is not None
        task.cancel()
        assert a.server is not None
        await a.server.stop()

        async def closed_again() -> bool:
            return await _sessions(db, ino.id) == 0

        await wait_until(closed_again, 20, "the read session to be closed again through meta b")
        assert client._queued_ends.ended == 1  # noqa: SLF001
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


async def test_a_loss_reported_before_its_last_close_is_recorded_still_ends_that_session() -> None:
    """An RDMA connection delivers a close's answer and the connection's end in one callback: the
    loss reaches the tracker before the close's caller has recorded the close."""
    sent: list[m.EndReadSessionsReq] = []

    class Rpc:
        def on_connection_lost(self, listener: object) -> None:
            pass

        def remove_connection_lost(self, listener: object) -> None:
            pass

    class Client:
        rpc = Rpc()

        async def call(self, method: str, req: m.EndReadSessionsReq) -> m.EndReadSessionsRsp:
            sent.append(req)
            return m.EndReadSessionsRsp(ended=len(req.sessions))

    ends = QueuedEnds(Client())  # type: ignore[arg-type]
    ends.lost(("10.0.0.1", 8100))
    ends.add(("10.0.0.1", 8100), 5, 6)
    await wait_until(lambda: bool(sent), 5, "the batch")
    assert [(s.inode, s.session_id) for s in sent[0].sessions] == [(5, 6)]
    await ends.close()
