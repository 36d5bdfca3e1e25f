"""Every method of the meta service through fs3.client.meta_client against an in-process server
(mem engine): the wiring of each RPC, its reply, and its errno at the client."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator

import pytest
from cluster import expect_errno

from fs3.client.meta_client import DEV_SECRET, ROOT_ID, MetaClient
from fs3.errors import FS3Error
from fs3.kv import open_database
from fs3.meta.auth import TrustingAuthenticator
from fs3.meta.layout import ChainAllocator, ChainTable, static_tables
from fs3.meta.service import MetaService
from fs3.meta.store import MetaStore
from fs3.net import RpcServer
from fs3.proto import common_pb2
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def client() -> AsyncIterator[MetaClient]:
    db = await open_database("mem")
    store = MetaStore(db, layouts=ChainAllocator(static_tables([ChainTable(1, 1, (11, 12, 13))])))
    await store.start(background=False)
    server = RpcServer(DEV_SECRET)
    MetaService(store, TrustingAuthenticator()).register(server)
    host, port = await server.start(("127.0.0.1", 0))
    c = MetaClient([f"{host}:{port}"], user=common_pb2.UserInfo(uid=0, gid=0), timeout_s=5)
    try:
        yield c
    finally:
        await c.close()
        await server.stop()
        await store.stop()
        await db.close()


async def test_every_method(client: MetaClient) -> None:
    c = client
    d = await c.mkdir(ROOT_ID, b"d", 0o755)
    assert (await c.lookup(ROOT_ID, b"d")).id == d.id
    await c.set_layout(d.id, chunk_size=128 << 10, stripe_count=2)
    r = await c.create(d.id, b"f", 0o600, flags=2, session=True)
    f = r.inode
    assert r.created and r.session_id and f.layout.chunk_size == 128 << 10 and len(f.layout.chains) == 2
    assert (await c.sync(f.id, r.session_id, 100, True)).size == 100
    assert (await c.close_file(f.id, r.session_id, 200, True)).size == 200
    o = await c.open(f.id, 0)
    assert o.session_id and o.inode.size == 200
    assert await c.prune_sessions(c.client_id) == 1
    await expect_errno(errno.EBADF, c.close_file(f.id, o.session_id))
    assert (await c.setattr(f.id, mode=0o644, mtime_ns=None)).mode == 0o644
    t = await c.setattr(f.id, atime_ns=5, mtime_ns=7, size=10)
    assert (t.atime_ns, t.mtime_ns, t.size) == (5, 7, 10)
    await expect_errno(errno.EPERM, _as(c, 1000).setattr(f.id, uid=5))
    await c.setxattr(f.id, b"user.k", b"v")
    assert await c.getxattr(f.id, b"user.k") == b"v"
    assert await c.listxattr(f.id) == [b"user.k"]
    await c.removexattr(f.id, b"user.k")
    await expect_errno(errno.ENODATA, c.getxattr(f.id, b"user.k"))
    s = await c.symlink(d.id, b"s", b"f")
    assert await c.readlink(s.id) == b"f"
    assert (await c.lookup_path(b"/d/s")).id == f.id
    n = await c.mknod(d.id, b"p", 0o010644)
    assert n.type == m.INODE_FIFO
    assert (await c.link(f.id, ROOT_ID, b"hard")).nlink == 2
    await c.rename(ROOT_ID, b"hard", d.id, b"hard2")
    await expect_errno(errno.EEXIST, c.rename(d.id, b"hard2", d.id, b"f", flags=1))
    names = [e.name async for e in c.listdir(d.id, page=2)]
    assert names == [b"f", b"hard2", b"p", b"s"]
    page = await c.readdir(d.id, limit=2, with_inodes=True)
    assert page.more and [i.id for i in page.inodes] == [e.inode_id for e in page.entries]
    stats = await c.batch_stat([f.id, 424242])
    assert stats[0].id == f.id and isinstance(stats[1], FS3Error) and stats[1].errno == errno.ENOENT
    await c.unlink(d.id, b"hard2")
    await expect_errno(errno.ENOTEMPTY, c.rmdir(ROOT_ID, b"d"))
    await c.rmdir(ROOT_ID, b"d", recursive=True)
    await expect_errno(errno.ENOENT, c.lookup(ROOT_ID, b"d"))
    st = await c.statfs()
    assert st.name_max == 255 and st.inodes >= 1
    await expect_errno(errno.ENOENT, c.stat(d.id * 1000 + 1))


async def test_a_client_other_than_root_prunes_only_sessions_its_uid_opened(client: MetaClient) -> None:
    """A client id is the caller's word: claiming a victim's, a user prunes nothing of the victim's."""
    c = client
    alice, bob = _as(c, 1000), _as(c, 1001)
    bob.client_id = alice.client_id  # bob names alice's client
    f = (await c.create(ROOT_ID, b"shared", 0o666)).inode
    mine = await alice.open(f.id, os.O_WRONLY)
    assert await bob.prune_sessions(alice.client_id) == 0
    assert (await alice.sync(f.id, mine.session_id, 5, True)).size == 5  # alice's session lives
    assert await alice.prune_sessions(alice.client_id) == 1
    await expect_errno(errno.EBADF, alice.close_file(f.id, mine.session_id))


def _as(c: MetaClient, uid: int) -> MetaClient:
    other = MetaClient(c.addresses, user=common_pb2.UserInfo(uid=uid, gid=uid), rpc=c.rpc, timeout_s=5)
    return other


async def test_commits_of_a_call_name_its_client_for_the_group_commit() -> None:
    """The lmdb engine's group commit waits for the callers of its previous batch: each call's
    transactions are its client's (COMMIT_CALLER), told apart from another client's, and the same
    over each of the connections one client spreads its calls over (a mount has two: were they
    two callers, each batch of a lone mount would wait for the connection it did not use)."""
    from fs3.kv.txn import COMMIT_CALLER
    from fs3.net import RpcClient

    db = await open_database("mem")
    store = MetaStore(db, layouts=ChainAllocator(static_tables([ChainTable(1, 1, (11, 12, 13))])))
    await store.start(background=False)
    seen: list[object] = []
    real_create, real_mkdir = store.create, store.mkdir

    async def create(*args: object, **kwargs: object) -> m.CreateRsp:
        seen.append(COMMIT_CALLER.get())
        return await real_create(*args, **kwargs)  # type: ignore[arg-type]

    async def mkdir(*args: object, **kwargs: object) -> m.Inode:
        seen.append(COMMIT_CALLER.get())
        return await real_mkdir(*args, **kwargs)  # type: ignore[arg-type]

    store.create, store.mkdir = create, mkdir  # type: ignore[method-assign]
    server = RpcServer(DEV_SECRET)
    MetaService(store, TrustingAuthenticator()).register(server)
    host, port = await server.start(("127.0.0.1", 0))
    root = common_pb2.UserInfo(uid=0, gid=0)
    rpc = RpcClient(DEV_SECRET, identity="two-connections", connections_per_peer=2)
    one = MetaClient([f"{host}:{port}"], user=root, rpc=rpc, timeout_s=5)
    two = MetaClient([f"{host}:{port}"], user=root, timeout_s=5)
    try:
        await one.mkdir(ROOT_ID, b"d1", 0o755)
        for i in range(4):  # over both of its connections
            await one.create(ROOT_ID, b"f%d" % i, 0o644, flags=2)
        await two.create(ROOT_ID, b"g", 0o644, flags=2)
    finally:
        await one.close()
        await two.close()
        await rpc.close()
        await server.stop()
        await store.stop()
        await db.close()
    assert seen == [one.client_id] * 5 + [two.client_id]
