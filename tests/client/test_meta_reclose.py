"""A read session's close that meta answered before writing its end (fs3.meta.read_sessions): if
the meta process dies before it writes it, the session would stay until the client goes, and keep
its file's chunks if the file is unlinked (found by the chaos test: a meta killed mid-batch). The
client closes such sessions again, through another server, when its connection to that one ends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
from cluster import wait_until

from fs3.client.meta_client import MetaClient
from fs3.config import KvConfig, MetaConfig
from fs3.kv import open_database, prefix_end
from fs3.kv.base import Database, Transaction
from fs3.meta import schema
from fs3.meta.daemon import MetaDaemon
from fs3.meta.schema import ROOT_ID

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
        assert client._queued_ends.reclosed == 1  # noqa: SLF001
        if unlinked:  # and the collector may take the file
            assert b.store is not None
            await wait_until(lambda: _gone(db, ino.id), 30, "the unlinked file to be collected")
    finally:
        await client.close()


async def _gone(db: Database, inode_id: int) -> bool:
    async def fn(tr: Transaction) -> bool:
        return await tr.get(schema.inode_key(inode_id)) is None

    return await db.run(fn, read_only=True)
