"""The meta service's side of user connections (clients that authenticate with a user token rather
than the cluster secret): every call acts as the token's user whatever its header says, opens and
creates of regular files bring a capability with the rights the open checked, and ``Capability``
issues a new one only to a caller who may access the file now. Against an in-process server (mem
engine), with and without request metrics (two ways into the handlers)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from cluster import expect_errno
from prometheus_client import CollectorRegistry

from fs3 import capability
from fs3.capability import CapabilityIssuer, CapabilityVerifier
from fs3.client.meta_client import DEV_SECRET, ROOT_ID, InodeHandles, MetaClient
from fs3.errors import FS3Error, StatusCode
from fs3.kv import open_database, prefix_end
from fs3.meta import schema
from fs3.meta.auth import TokenAuthenticator
from fs3.meta.handles import HandleSealer
from fs3.meta.inode import now_ns as inode_now
from fs3.meta.layout import ChainAllocator, ChainTable, static_tables
from fs3.meta.service import MetaService
from fs3.meta.storage_io import NoStorage
from fs3.meta.store import MetaStore
from fs3.net import RpcClient, RpcServer
from fs3.proto import common_pb2, mgmtd_pb2
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)

CHAINS = (101, 102, 103, 104, 105)  # the chain table new files take their chains from
CHUNK = 256 << 10  # meta's default chunk size here

USERS = {
    "tok-root": mgmtd_pb2.User(uid=0, name="root", gid=0, admin=True, root=True),
    "tok-alice": mgmtd_pb2.User(uid=1001, name="alice", gid=100, groups=[7]),
    "tok-bob": mgmtd_pb2.User(uid=1002, name="bob", gid=100),
}


async def verify(token: str) -> mgmtd_pb2.User:
    user = USERS.get(token)
    if user is None:
        raise FS3Error(StatusCode.UNAUTHENTICATED, "unknown token")
    return user


@dataclass
class Meta:
    address: str
    member: MetaClient  # a cluster member (the secret) acting as root with the root token
    rpcs: list[RpcClient]
    clients: list[MetaClient]
    store: MetaStore
    registry: CollectorRegistry | None = None  # the "measured" service's

    def user(
        self,
        token: str,
        uid: int = 0,
        gid: int = 0,
        client_id: int | None = None,
        header_token: str | None = None,
    ) -> MetaClient:
        """A client on a user connection of ``token`` whose headers say ``uid``/``gid`` and
        ``header_token`` (``token`` by default)."""
        rpc = RpcClient(None, token=token, identity="user-job")
        self.rpcs.append(rpc)
        c = MetaClient(
            [self.address],
            rpc=rpc,
            user=common_pb2.UserInfo(uid=uid, gid=gid, token=token if header_token is None else header_token),
            client_id=client_id,
            timeout_s=5,
            handles=InodeHandles(),
        )
        self.clients.append(c)
        return c


@pytest.fixture(params=["plain", "measured"])
async def meta(request: pytest.FixtureRequest) -> AsyncIterator[Meta]:
    db = await open_database("mem")
    layouts = ChainAllocator(
        static_tables([ChainTable(1, 1, CHAINS)]), default_chunk_size=CHUNK, default_stripe=2
    )
    store = MetaStore(db, layouts=layouts)
    await store.start(background=False)
    auth = TokenAuthenticator(verify)
    server = RpcServer(DEV_SECRET, verify_user=auth.user_of)
    registry = CollectorRegistry() if request.param == "measured" else None
    MetaService(
        store, auth, capabilities=CapabilityIssuer(DEV_SECRET), handles=HandleSealer(DEV_SECRET)
    ).register(server, registry)
    host, port = await server.start(("127.0.0.1", 0))
    address = f"{host}:{port}"
    member = MetaClient([address], user=common_pb2.UserInfo(uid=0, gid=0, token="tok-root"), timeout_s=5)
    env = Meta(address, member, [], [], store, registry)
    try:
        yield env
    finally:
        for c in [member, *env.clients]:
            await c.close()
        for rpc in env.rpcs:
            await rpc.close()
        await server.stop()
        await store.stop()
        await db.close()


async def reach(client: MetaClient, *paths: bytes) -> None:
    """Look ``paths`` up as ``client``'s user, which brings it their handles."""
    for path in paths:
        await client.lookup_path(path)


def rights_of(cap: bytes, ino: m.Inode) -> int:
    """The rights of ``cap``, which must name the file ``ino`` and its layout (its chains and chunk
    size), after checking it as storage does on each of the file's chains."""
    grant = capability.parse(cap)
    layout = ino.layout
    assert grant.inode_id == ino.id
    assert layout.chains and set(layout.chains) <= set(CHAINS)
    assert (grant.chains, grant.chunk_size) == (set(layout.chains), layout.chunk_size)
    verifier = CapabilityVerifier(DEV_SECRET)
    for chain_id in layout.chains:
        if grant.rights & capability.READ:
            verifier.check(cap, ino.id, capability.READ, chain_id)
        if grant.rights & capability.WRITE:
            verifier.check(cap, ino.id, capability.WRITE, chain_id, layout.chunk_size)
    return grant.rights


def granted(rsp: m.OpenRsp | m.CreateRsp) -> int:
    """The rights of an open's or create's capability, which names the file in the reply."""
    return rights_of(rsp.capability, rsp.inode)


async def test_a_user_connection_acts_as_its_tokens_user_whatever_its_header_says(meta: Meta) -> None:
    # the header says root, with no token; the connection's token is alice's
    alice = meta.user("tok-alice", uid=0, gid=0, header_token="")
    await expect_errno(errno.EACCES, alice.mkdir(ROOT_ID, b"by-alice"))  # the root is root's, 0755
    private = await meta.member.mkdir(ROOT_ID, b"private", 0o700)
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    await reach(alice, b"/private", b"/home")
    await expect_errno(errno.EACCES, alice.lookup(private.id, b"x"))  # an inline handler
    f = (await alice.create(home.id, b"f", 0o600, flags=os.O_RDWR, session=True)).inode
    d = await alice.mkdir(home.id, b"d", 0o755)
    assert (f.uid, f.gid) == (d.uid, d.gid) == (1001, 100)
    # a header that names alice with bob's token acts as bob
    bob = meta.user("tok-bob", uid=1001, gid=100)
    await reach(bob, b"/home/f")
    await expect_errno(errno.EACCES, bob.open(f.id, os.O_RDONLY))
    await expect_errno(errno.EPERM, bob.setattr(f.id, mode=0o666))
    # sessions are the token user's: with alice's client id and uid in his headers, bob prunes
    # none of hers
    posing = meta.user("tok-bob", uid=1001, gid=100, client_id=alice.client_id)
    assert await posing.prune_sessions(alice.client_id) == 0
    assert await alice.prune_sessions(alice.client_id) == 1


async def test_a_root_tokens_user_connection_acts_as_the_user_its_header_names(meta: Meta) -> None:
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    as_carol = meta.user("tok-root", uid=1500, gid=1500)
    f = (await as_carol.create(home.id, b"f", 0o600, session=True)).inode
    assert (f.uid, f.gid) == (1500, 1500)
    await expect_errno(errno.EACCES, as_carol.mkdir(ROOT_ID, b"x"))
    assert (await meta.user("tok-root").mkdir(ROOT_ID, b"x")).uid == 0


async def test_a_user_names_inodes_by_id_only_with_the_handles_meta_gave_it(meta: Meta) -> None:
    """Ids are dense: without handles, bob could reach files inside alice's 0700 directory by id
    (a stat, an open, which would bring a capability to read them from storage), bypassing the
    search permission of the directories above them. A handle comes only with an inode meta
    returned to that user, and is that user's alone."""
    top = await meta.member.mkdir(ROOT_ID, b"alice", 0o700)
    await meta.member.setattr(top.id, uid=1001, gid=100)
    alice, bob = meta.user("tok-alice"), meta.user("tok-bob")
    await reach(alice, b"/alice")
    pub = (await alice.create(top.id, b"pub", 0o644)).inode
    sub = await alice.mkdir(top.id, b"sub", 0o755)
    link = await alice.symlink(top.id, b"ln", b"pub")
    await alice.setxattr(pub.id, b"user.k", b"v")
    assert pub.handle == HandleSealer(DEV_SECRET).seal(1001, pub.id)  # any meta of the cluster's
    # alice, who may reach them by name, may use their ids
    assert (await alice.stat(pub.id)).id == pub.id
    assert (await alice.open(pub.id, os.O_RDONLY)).capability
    assert await alice.getxattr(pub.id, b"user.k") == b"v"
    assert await alice.readlink(link.id) == b"pub"

    # bob may not reach them by name, nor by id (each kind of request that names inodes by id)
    await expect_errno(errno.EACCES, bob.lookup_path(b"/alice/pub"))
    for call in (
        bob.stat(pub.id),
        bob.batch_stat([ROOT_ID, pub.id]),
        bob.open(pub.id, os.O_RDONLY),
        bob.capability(pub.id, capability.READ),
        bob.getxattr(pub.id, b"user.k"),
        bob.listxattr(pub.id),
        bob.readlink(link.id),
        bob.lookup(sub.id, b"x"),
        bob.readdir(sub.id),
        bob.create(sub.id, b"x", 0o644),
        bob.link(pub.id, ROOT_ID, b"stolen"),
        bob.rename(sub.id, b"a", ROOT_ID, b"b"),
        bob.setattr(pub.id, atime_ns=None),
    ):
        await expect_errno(errno.EACCES, call)
    # ... not with a handle of alice's, nor a made-up one
    for handle in (pub.handle, bytes(16), b""):
        req = m.StatReq(inode_id=pub.id)
        req.hdr.handles[pub.id] = handle
        await expect_errno(errno.EACCES, bob.call("Stat", req))
    assert (await bob.batch_stat([ROOT_ID]))[0].id == ROOT_ID  # the root needs none
    # what bob may reach by name he may use by id: /alice itself, found in a listing of the root
    rsp = await bob.readdir(ROOT_ID, with_inodes=True)
    assert [i.id for i in rsp.inodes if i.handle] == [top.id]
    assert (await bob.stat(top.id)).id == top.id
    await expect_errno(errno.EACCES, bob.readdir(top.id))  # 0700: its own mode still applies
    # a listing bob may read but not search (r without x) brings no handles: he could not stat
    # the entries by name either
    await alice.setattr(top.id, mode=0o744)
    rsp = await bob.readdir(top.id, with_inodes=True)
    assert sorted(e.name for e in rsp.entries) == [b"ln", b"pub", b"sub"]
    # ... nor attributes: the ids and types a local directory's listing gives
    assert [(i.id, i.type, i.handle, i.mode, i.uid, i.size) for i in rsp.inodes] == [
        (e.inode_id, e.type, b"", 0, 0, 0) for e in rsp.entries
    ]
    await expect_errno(errno.EACCES, bob.stat(pub.id))
    # once he may search it, a lookup brings the handle, which keeps working (as an NFS handle
    # does) after the directory is closed again; the file's own mode still applies
    await alice.setattr(top.id, mode=0o755)
    await reach(bob, b"/alice/pub")
    await alice.setattr(top.id, mode=0o700)
    assert (await bob.stat(pub.id)).id == pub.id
    await alice.setattr(pub.id, mode=0o600)
    await expect_errno(errno.EACCES, bob.open(pub.id, os.O_RDONLY))

    # a directory's ".." brings no handle: bob may search /alice/sub (he got its handle while he
    # could reach it) but not, now, its parent
    await alice.setattr(top.id, mode=0o755)
    await reach(bob, b"/alice/sub")
    await alice.setattr(top.id, mode=0o700)
    up = await bob.lookup(sub.id, b"..")
    assert (up.id, up.handle) == (top.id, b"")
    # more ids than a BatchStat may name are refused before any handle is checked (the client's
    # batch_stat asks at most that many at a time: the request is made here by hand)
    await expect_errno(
        errno.EINVAL, bob.call("BatchStat", m.BatchStatReq(inode_ids=list(range(10_000, 14_097))))
    )

    # a root token's connection and cluster members name any inode by id
    for client in (meta.user("tok-root", uid=1002, gid=100), meta.member):
        assert (await client.stat(pub.id)).handle == b""

    if meta.registry is not None:
        # requests refused for want of a handle are counted, by their status, as every other
        # request is: in the requests and in the latency histogram alike
        def value(name: str, **labels: str) -> float:
            return meta.registry.get_sample_value(name, labels) or 0.0  # type: ignore[union-attr]

        assert value("fs3_meta_requests_total", method="Stat", code="PERMISSION_DENIED") >= 5
        for method in ("Stat", "BatchStat", "Open", "Getxattr", "Readdir", "Lookup"):
            counted = sum(
                s.value
                for metric in meta.registry.collect()
                if metric.name == "fs3_meta_requests"
                for s in metric.samples
                if s.name == "fs3_meta_requests_total" and s.labels["method"] == method
            )
            assert counted == value("fs3_meta_request_seconds_count", method=method) > 0, method


async def test_a_close_sets_a_time_of_the_callers_choosing_only_for_the_owner(meta: Meta) -> None:
    """CloseReq may carry the write's mtime. A writer who is not the owner may set only "now" (as
    utimensat has it, and meta's Setattr): the time it sends is not taken (it was, so any writer
    could date a file as it liked); the owner's is, kept between the session's open and meta's
    now (a time before the open, from a client clock behind, is the open's)."""
    d = await meta.member.mkdir(ROOT_ID, b"shared-times", 0o777)
    f = (await meta.member.create(d.id, b"f", 0o666)).inode  # root's, others may write
    bob = meta.user("tok-bob", 1002, 100)
    await reach(bob, b"/shared-times/f")
    with pytest.raises(FS3Error) as e:
        await bob.setattr(f.id, atime_ns=5, mtime_ns=5)
    assert e.value.errno == errno.EPERM

    async def close_with_mtime(client: MetaClient, inode_id: int, ahead_ns: int = 0) -> int:
        """Open, then close saying the write was made ``ahead_ns`` after the open (by meta's
        clock, this process's); returns that time."""
        opened = await client.open(inode_id, os.O_RDWR)
        wrote = inode_now() + ahead_ns
        await asyncio.sleep(0.3)
        req = m.CloseReq(inode_id=inode_id, session_id=opened.session_id, written_length=1, wrote=True)
        req.mtime.sec, req.mtime.nsec = divmod(wrote, 10**9)
        await client.call("Close", req, request_id=True)
        return wrote

    given = await close_with_mtime(bob, f.id, 100_000_000)
    assert (await meta.member.stat(f.id)).mtime_ns > given  # meta's now at the close
    await reach(bob, b"/shared-times")
    mine = (await bob.create(d.id, b"bobs", 0o644)).inode
    given = await close_with_mtime(bob, mine.id, 100_000_000)
    assert (await meta.member.stat(mine.id)).mtime_ns == given
    before_open = await close_with_mtime(bob, mine.id, -86_400 * 10**9)
    assert (await meta.member.stat(mine.id)).mtime_ns > before_open + 86_000 * 10**9


async def test_opens_bring_capabilities_for_the_rights_they_checked(meta: Meta) -> None:
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    alice = meta.user("tok-alice")
    await reach(alice, b"/home")
    created = await alice.create(home.id, b"f", 0o644, flags=os.O_WRONLY, session=True)
    f = created.inode
    assert granted(created) == capability.WRITE
    for flags, rights in (
        (os.O_RDONLY, capability.READ),
        (os.O_WRONLY, capability.WRITE),
        (os.O_RDWR, capability.RIGHTS),
        (os.O_RDONLY | os.O_TRUNC, capability.RIGHTS),
    ):
        assert granted(await alice.open(f.id, flags)) == rights
        again = await alice.create(home.id, b"f", 0o644, flags=flags, session=True)
        assert not again.created and granted(again) == rights
    # bob may read what is 0644, and only that
    bob = meta.user("tok-bob")
    await reach(bob, b"/home/f")
    assert granted(await bob.open(f.id, os.O_RDONLY)) == capability.READ
    await expect_errno(errno.EACCES, bob.open(f.id, os.O_RDWR))
    # no capability for what has no chunks, nor for a cluster member
    d = await alice.mkdir(home.id, b"d")
    assert (await alice.open(d.id, os.O_RDONLY)).capability == b""
    assert (await meta.member.open(f.id, os.O_RDWR)).capability == b""
    assert (await meta.member.create(home.id, b"g", 0o644, flags=os.O_RDWR, session=True)).capability == b""


async def test_a_created_file_brings_what_its_creator_asked_whatever_its_mode(meta: Meta) -> None:
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    alice = meta.user("tok-alice")
    await reach(alice, b"/home")
    r = await alice.create(home.id, b"ro", 0o444, flags=os.O_RDWR, session=True)
    assert r.created and granted(r) == capability.RIGHTS


async def test_capability_checks_the_callers_access_now(meta: Meta) -> None:
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    alice, bob = meta.user("tok-alice"), meta.user("tok-bob", uid=1001, gid=100)  # bob says he is alice
    await reach(alice, b"/home")
    f = (await alice.create(home.id, b"f", 0o600, session=True)).inode
    await reach(bob, b"/home/f")
    assert rights_of(await alice.capability(f.id, capability.READ), f) == capability.READ
    assert rights_of(await alice.capability(f.id, capability.RIGHTS), f) == capability.RIGHTS
    await expect_errno(errno.EACCES, bob.capability(f.id, capability.READ))
    await alice.setattr(f.id, mode=0o640)  # bob's group may read
    assert rights_of(await bob.capability(f.id, capability.READ), f) == capability.READ
    await expect_errno(errno.EACCES, bob.capability(f.id, capability.WRITE))
    # the owner gets one whatever the mode (she could chmod it anyway; an open POSIX let her make
    # whatever the mode, a creator's of a 0444 file for writing, must outlive its first one)
    await alice.setattr(f.id, mode=0)
    assert rights_of(await alice.capability(f.id, capability.RIGHTS), f) == capability.RIGHTS
    await expect_errno(errno.EACCES, alice.open(f.id, os.O_RDONLY))  # an open checks the mode
    await meta.member.setattr(f.id, uid=1002)  # root gives it to bob: no longer hers
    await expect_errno(errno.EACCES, alice.capability(f.id, capability.READ))
    assert rights_of(await bob.capability(f.id, capability.RIGHTS), f) == capability.RIGHTS
    await meta.member.setattr(f.id, uid=1001)
    await expect_errno(errno.EISDIR, alice.capability(home.id, capability.READ))
    await expect_errno(errno.EINVAL, alice.capability(f.id, 0))
    await expect_errno(errno.EINVAL, alice.capability(f.id, 4))
    await expect_errno(errno.EACCES, alice.capability(f.id + 1000, capability.READ))  # no handle
    g = (await alice.create(home.id, b"g", 0o600)).inode
    await alice.unlink(home.id, b"g")
    await meta.store.collector.collect_once()  # gone (not held open), though she has its handle
    await expect_errno(errno.ENOENT, alice.capability(g.id, capability.READ))


async def test_capabilities_name_the_files_layout(meta: Meta) -> None:
    """What storage holds a capability's chunks to: the chains and chunk size of the file's layout
    as meta has it (a directory's own layout included), whichever call issued it."""
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    alice = meta.user("tok-alice")
    await reach(alice, b"/home")
    d = await alice.mkdir(home.id, b"big", 0o755)
    await alice.set_layout(d.id, chunk_size=4 << 20, stripe_count=4)
    for parent, chunk_size, stripe in ((home.id, CHUNK, 2), (d.id, 4 << 20, 4)):
        created = await alice.create(parent, b"f", 0o644, flags=os.O_RDWR, session=True)
        f = created.inode
        assert (f.layout.chunk_size, len(f.layout.chains)) == (chunk_size, stripe)
        assert f.layout == (await meta.member.stat(f.id)).layout
        assert granted(created) == capability.RIGHTS
        assert granted(await alice.open(f.id, os.O_RDONLY)) == capability.READ
        assert rights_of(await alice.capability(f.id, capability.WRITE), f) == capability.WRITE
        grant = capability.parse(created.capability)
        verifier = CapabilityVerifier(DEV_SECRET)
        for chain_id in set(CHAINS) - set(f.layout.chains):
            with pytest.raises(FS3Error) as e:
                verifier.check(created.capability, f.id, capability.READ, chain_id)
            assert e.value.code == StatusCode.STORAGE_CAPABILITY
        other_size = chunk_size * 2
        with pytest.raises(FS3Error) as e:
            verifier.check(created.capability, f.id, capability.WRITE, f.layout.chains[0], other_size)
        assert e.value.code == StatusCode.STORAGE_CAPABILITY and grant.chunk_size == chunk_size


async def test_a_users_retry_gets_its_first_reply_and_another_users_replay_a_reply_of_its_own(
    meta: Meta,
) -> None:
    """Idempotency records are kept by (client id, request id), and a user connection's request id
    is its user's: alice's retries get her first reply, and bob naming her client and request ids
    makes a request of his own, answered as such, never with what was recorded for her."""
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    alice = meta.user("tok-alice")
    bob = meta.user("tok-bob", client_id=alice.client_id)
    await reach(alice, b"/home")
    await reach(bob, b"/home")
    req = m.CreateReq(parent=home.id, name=b"f", mode=0o666, flags=os.O_RDWR, open_session=True)
    first = await alice.call("Create", req, request_id=True)
    assert first.created and first.session_id and granted(first) == capability.RIGHTS
    # alice's retry (the same request id): the first reply (its session, no second one), with a
    # capability again
    again = await alice.call("Create", req)
    assert again.created and (again.inode.id, again.session_id) == (first.inode.id, first.session_id)
    assert granted(again) == capability.RIGHTS
    # bob with her client and request ids: his own create of what exists now, his own session
    theirs = await bob.call("Create", req)
    assert not theirs.created and theirs.inode.id == first.inode.id
    assert theirs.session_id not in (0, first.session_id)
    assert granted(theirs) == capability.RIGHTS  # 0666: his own open may write
    # ... which his retry gets again
    assert (await bob.call("Create", req)).session_id == theirs.session_id
    assert (await alice.call("Create", req)).session_id == first.session_id

    # the same for opens
    f = first.inode
    open_req = m.OpenReq(inode_id=f.id, flags=os.O_RDONLY)
    opened = await alice.call("Open", open_req, request_id=True)
    assert opened.session_id not in (0, first.session_id)
    assert (await alice.call("Open", open_req)).session_id == opened.session_id
    replayed = await bob.call("Open", open_req)
    assert replayed.session_id not in (0, opened.session_id, theirs.session_id)
    assert granted(replayed) == capability.READ
    assert (await bob.call("Open", open_req)).session_id == replayed.session_id

    # and what bob may not open himself, a replay of alice's create does not open for him
    private = m.CreateReq(parent=home.id, name=b"p", mode=0o600, flags=os.O_RDWR, open_session=True)
    mine = await alice.call("Create", private, request_id=True)
    assert mine.created and granted(mine) == capability.RIGHTS
    await expect_errno(errno.EACCES, bob.call("Create", private))
    assert (await alice.call("Create", private)).session_id == mine.session_id


async def test_a_retried_open_or_create_brings_only_what_the_file_allows_now(meta: Meta) -> None:
    """A retry is answered with the recorded reply (up to idem_ttl_s old), but its capability is
    checked on the file as it is now: access lost since (a chmod, a chown away from the creator)
    is not regained by sending an old request again, nor is a file collected since."""
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    alice, bob = meta.user("tok-alice"), meta.user("tok-bob")
    await reach(alice, b"/home")
    await reach(bob, b"/home")
    shared = (await bob.create(home.id, b"shared", 0o666, flags=os.O_RDWR)).inode
    await reach(alice, b"/home/shared")
    open_req = m.OpenReq(inode_id=shared.id, flags=os.O_RDWR)
    assert granted(await alice.call("Open", open_req, request_id=True)) == capability.RIGHTS
    await bob.setattr(shared.id, mode=0o600)
    await expect_errno(errno.EACCES, alice.call("Open", open_req))  # the same request id
    await expect_errno(errno.EACCES, alice.capability(shared.id, capability.WRITE))

    create_req = m.CreateReq(parent=home.id, name=b"mine", mode=0o644, flags=os.O_RDWR)
    made = await alice.call("Create", create_req, request_id=True)
    assert made.created and granted(made) == capability.RIGHTS
    await meta.member.setattr(made.inode.id, mode=0o600, uid=1002, gid=100)  # root gives it to bob
    await expect_errno(errno.EACCES, alice.call("Create", create_req))

    gone_req = m.CreateReq(parent=home.id, name=b"gone", mode=0o644)
    gone = await alice.call("Create", gone_req, request_id=True)
    assert gone.created and granted(gone) == capability.READ
    await alice.unlink(home.id, b"gone")
    await meta.store.collector.collect_once()  # not held open: collected
    await expect_errno(errno.ENOENT, alice.call("Create", gone_req))


class RecordingStorage(NoStorage):
    """Storage that notes which files' chunks meta removes."""

    def __init__(self) -> None:
        self.removed: list[tuple[int, tuple[int, ...]]] = []

    async def remove(self, layout: m.Layout, inode_id: int) -> None:
        self.removed.append((inode_id, tuple(layout.chains)))


async def gc_entries(meta: Meta) -> dict[int, m.GcEntry]:
    rows = await meta.store.db.run(
        lambda tr: tr.snapshot.get_range(schema.GCQU, prefix_end(schema.GCQU), 100), read_only=True
    )
    return {e.inode_id: e for e in (m.GcEntry.FromString(v) for _k, v in rows)}


async def test_a_file_written_through_a_capability_is_swept_again_once_none_can_be_used(
    meta: Meta, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storage takes a write capability until it expires without knowing whether its file still
    exists: chunks written with one after the file was collected would stay for good. A file a
    write capability was issued for is collected as any other, then its chunks are removed once
    more after the last such capability lapsed; files without one (a cluster member's, or only
    read) get no second pass."""
    storage = RecordingStorage()
    meta.store.chunks = storage
    home = await meta.member.mkdir(ROOT_ID, b"home", 0o777)
    alice = meta.user("tok-alice")
    await reach(alice, b"/home")
    written = await alice.create(home.id, b"w", 0o644, flags=os.O_RDWR)
    assert granted(written) == capability.RIGHTS
    assert (await alice.stat(written.inode.id)).write_caps_until_ns == 0  # meta's own, not in replies
    members = (await meta.member.create(home.id, b"m", 0o644, flags=os.O_RDWR)).inode
    read = (await meta.member.create(home.id, b"r", 0o644)).inode
    await reach(alice, b"/home/r")
    opened = await alice.open(read.id, os.O_RDONLY)
    assert granted(opened) == capability.READ
    await alice.close_file(read.id, opened.session_id)
    for name in (b"w", b"m", b"r"):
        await meta.member.unlink(home.id, name)
    await meta.store.collector.collect_once()
    chains = {written.inode.id: tuple(written.inode.layout.chains), members.id: tuple(members.layout.chains)}
    chains[read.id] = tuple(read.layout.chains)
    assert sorted(storage.removed) == sorted(chains.items())
    for inode_id in chains:
        await expect_errno(errno.ENOENT, meta.member.stat(inode_id))
    pending = await gc_entries(meta)
    assert list(pending) == [written.inode.id]  # the others are done
    sweep_after = pending[written.inode.id].sweep_after_ns
    assert sweep_after > inode_now() + int(CapabilityIssuer(DEV_SECRET).ttl_s * 1e9)

    storage.removed.clear()
    await meta.store.collector.collect_once()  # not due yet
    assert storage.removed == [] and list(await gc_entries(meta)) == [written.inode.id]
    later = sweep_after + 1
    monkeypatch.setattr("fs3.meta.inode.now_ns", lambda: later)
    await meta.store.collector.collect_once()
    assert storage.removed == [(written.inode.id, chains[written.inode.id])]
    assert await gc_entries(meta) == {}
