"""User connections end to end: a native client not trusted with the cluster secret
(``ClientConfig.user_auth``) authenticates with its user token, meta acts for it only as that
token's user, and storage serves it only the files meta issued it a capability for. Real daemons on
127.0.0.1; meta verifies tokens (``authenticate = true``)."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster import expect_errno, wait_until
from fs_cluster import FsCluster

from fs3 import capability
from fs3.capability import CapabilityIssuer
from fs3.client import filesystem
from fs3.client.file import chain_of
from fs3.client.filesystem import FileSystem
from fs3.client.kvcache import KVCache
from fs3.client.meta_client import InodeHandles
from fs3.client.storage_client import StorageClient
from fs3.config import ClientConfig, MetaConfig, load_config
from fs3.errors import FS3Error, StatusCode
from fs3.net.auth import user_scoped_id
from fs3.proto import common_pb2, mgmtd_pb2
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(180)

ALICE, BOB = 1000, 1001


@dataclass
class Users:
    c: FsCluster
    admin: FileSystem  # a cluster member (the secret) with the admin's root token
    tokens: dict[str, Path]

    async def connect(self, name: str) -> FileSystem:
        """A FileSystem on user connections with ``name``'s token, without the cluster secret."""
        return await self.c.connect(
            name=f"client-{name}", user_auth=True, token_file=str(self.tokens[name]), cluster_secret_file=""
        )


async def _users(c: FsCluster) -> Users:
    """alice and bob, each with a home directory of their own (0755)."""
    assert c.cluster.admin is not None
    tokens = {"admin": c.tmp / "admin.token"}
    tokens["admin"].write_text(c.cluster.admin_token + "\n")
    for uid, name in ((ALICE, "alice"), (BOB, "bob")):
        tokens[name] = c.tmp / f"{name}.token"
        tokens[name].write_text(await c.cluster.admin.add_user(uid, name, gid=uid) + "\n")
    admin = await c.connect(name="client-admin", token_file=str(tokens["admin"]))
    for uid, name in ((ALICE, "alice"), (BOB, "bob")):
        await admin.mkdir(f"/{name}", 0o755)
        await admin.chown(f"/{name}", uid, uid)
    return Users(c, admin, tokens)


@pytest.fixture
async def users(tmp_path: Path) -> AsyncIterator[Users]:
    async with FsCluster(tmp_path, meta_extra={"authenticate": True}) as c:
        yield await _users(c)


def assert_names_layout(cap: bytes, ino: m.Inode) -> None:
    """``cap`` is for the file ``ino`` and holds for its chains and chunk size, as meta has them."""
    grant = capability.parse(cap)
    assert grant.inode_id == ino.id and ino.layout.chains
    assert (grant.chains, grant.chunk_size) == (set(ino.layout.chains), ino.layout.chunk_size)


async def test_a_user_works_on_its_own_files_as_itself(users: Users) -> None:
    alice = await users.connect("alice")
    assert (alice.meta.user.uid, alice.meta.user.gid) == (
        ALICE,
        ALICE,
    )  # the token's user, not this process's
    data = os.urandom(2_500_000)  # three chunks
    await alice.write_file("/alice/a.bin", data, perm=0o600)
    # the create brought a capability for the file's layout
    ino = (await alice.stat("/alice/a.bin")).inode
    created = alice.meta.capabilities.now(ino.id, capability.WRITE)
    assert created is not None and capability.parse(created).rights & capability.WRITE
    assert_names_layout(created, ino)
    assert await alice.read_file("/alice/a.bin") == data
    async with await alice.open("/alice/a.bin", "a") as f:
        await f.write(b"tail")
    async with await alice.open("/alice/a.bin", "r+") as f:
        # the open brought its capability: no call to meta before the first read
        cap = alice.meta.capabilities.now(f.inode_id, capability.RIGHTS)
        assert cap is not None
        assert_names_layout(cap, (await alice.stat("/alice/a.bin")).inode)
        assert await f.pread(4, len(data)) == b"tail"
        await f.pwrite(b"HEAD", 0)
    await alice.truncate("/alice/a.bin", 1_200_000)
    await alice.rename("/alice/a.bin", "/alice/b.bin")
    assert await alice.listdir("/alice") == ["b.bin"]
    st = await alice.stat("/alice/b.bin")
    assert (st.st_uid, st.st_gid, st.st_size) == (ALICE, ALICE, 1_200_000)
    assert await alice.read_file("/alice/b.bin") == b"HEAD" + data[4:1_200_000]
    # a read by path, without an open: the capability comes from meta
    assert await alice.read_batch([("/alice/b.bin", 1_000_000, 10)]) == [data[1_000_000:1_000_010]]
    # her capabilities hold for her files' layouts only: storage refuses a new chunk of another
    # size (the capability at hand, and the one meta renews it with), which meta's truncates and
    # removals, going by the file's chunk size, would never find
    layout = ino.layout
    far = 1000  # a chunk index past the file's end
    chain = chain_of(layout, far)
    e = await expect_errno(
        errno.EACCES, alice.storage.write(chain, ino.id, far, 0, b"x" * 10, layout.chunk_size * 2)
    )
    assert e.code == StatusCode.STORAGE_CAPABILITY
    assert await users.admin.storage.read(chain, ino.id, far, 0, 10) == b""
    assert await alice.read_file("/alice/b.bin") == b"HEAD" + data[4:1_200_000]
    # alice is alice whatever her headers say: the root directory is root's
    alice.meta.user = common_pb2.UserInfo(uid=0, gid=0)
    await expect_errno(errno.EACCES, alice.mkdir("/mine"))
    await alice.write_file("/alice/c.bin", b"c")
    assert (await users.admin.stat("/alice/c.bin")).st_uid == ALICE
    # nor is she an admin at mgmtd
    await expect_errno(errno.EACCES, alice.mgmtd.list_nodes())
    await expect_errno(errno.EACCES, alice.mgmtd.add_user(2000, "mallory"))


async def test_a_kv_cache_in_a_group_directory_is_shared_by_the_group(users: Users) -> None:
    """Shards and entries take the cache root's bits: the first user to fill a shard made it 0755
    and every other user's put, delete and evict of a key in it failed with EACCES."""
    assert users.c.cluster.admin is not None
    await users.c.cluster.admin.set_user(mgmtd_pb2.SetUserRequest(uid=BOB, set_groups=True, groups=[ALICE]))
    await users.admin.mkdir("/team", 0o775)
    await users.admin.chown("/team", 0, ALICE)
    await users.admin.chmod("/team", 0o2775)
    alice, bob = await users.connect("alice"), await users.connect("bob")
    mine, theirs = KVCache(alice, "/team"), KVCache(bob, "/team")
    keys = [f"key-{i}".encode() for i in range(12)]  # as many shards, nearly all first made by alice
    await mine.put_many((k, b"alice's " + k) for k in keys)
    await theirs.put_many((k, b"bob's " + k) for k in keys)  # replaces each of her entries
    assert await mine.get_many(keys) == [b"bob's " + k for k in keys]
    shard, entry = (
        await users.admin.stat(mine.path_of(keys[0]).rsplit("/", 1)[0]),
        await users.admin.stat(mine.path_of(keys[0])),
    )
    assert (shard.st_mode & 0o7777, shard.st_uid, shard.st_gid) == (0o2775, ALICE, ALICE)
    assert (entry.st_mode & 0o7777, entry.st_uid, entry.st_gid) == (0o664, BOB, ALICE)
    await mine.put(keys[1], b"alice again")  # and back: she replaces bob's entry in her shard
    assert await theirs.delete(keys[1]) is True
    assert (await theirs.evict(0)).removed == len(keys) - 1
    assert await mine.get_many(keys) == [None] * len(keys)
    # a root made by its first put is its maker's alone, as before; modes may also be given
    await KVCache(alice, "/alice/kv").put(b"k", b"v")
    await expect_errno(errno.EACCES, KVCache(bob, "/alice/kv").put(b"k", b"bob's"))
    assert await KVCache(bob, "/alice/kv").get(b"k") == b"v"
    # a touch of an entry bob may read but not write is skipped, not his get's error (it raised
    # PermissionError and lost the batch's values; helper review)
    assert await KVCache(bob, "/alice/kv", touch_on_get=True).get_many([b"k", b"k", b"nope"]) == [
        b"v",
        b"v",
        None,
    ]
    private = KVCache(alice, "/team/private", dir_mode=0o700, file_mode=0o600)
    await private.put(b"k", b"v")
    assert (await alice.stat(private.path_of(b"k"))).st_mode & 0o7777 == 0o600
    await expect_errno(errno.EACCES, KVCache(bob, "/team/private").get(b"k"))
    with pytest.raises(FS3Error) as e:
        KVCache(alice, "/team", file_mode=0o10000)
    assert e.value.code == StatusCode.INVALID_ARGUMENT


async def test_a_user_connections_change_whose_answer_was_lost_fails_as_it_did(users: Users) -> None:
    """A member client asks meta what became of a change whose answer was lost and returns its
    recorded result; on a user connection that result lacks the handle (and capability) meta adds
    to every answer it sends, so the user got EACCES on the directory it had just made. There the
    change fails as before (the caller looks it up again), and no handle-less inode is returned."""
    alice = await users.connect("alice")
    mc = alice.meta
    home = (await alice.stat("/alice")).inode.id
    real = mc.rpc.call

    async def answer_lost(address: Any, meth: Any, req: Any, **kw: Any) -> Any:
        rsp = await real(address, meth, req, **kw)
        if meth.name in ("Mkdir", "Create"):
            raise FS3Error(StatusCode.DEADLINE_EXCEEDED, "answer lost")
        return rsp

    mc.rpc.call = answer_lost  # type: ignore[method-assign]
    mc.timeout_s = 0.5
    try:
        await expect_errno(errno.ETIMEDOUT, mc.mkdir(home, b"made", 0o755))
        await expect_errno(errno.ETIMEDOUT, alice.write_file("/alice/f.bin", b"hello"))
    finally:
        mc.rpc.call = real  # type: ignore[method-assign]
    made = (await alice.stat("/alice/made")).inode  # looked up again: with its handle
    assert made.handle and (await mc.stat(made.id)).id == made.id
    await alice.write_file("/alice/f.bin", b"hello")
    assert await alice.read_file("/alice/f.bin") == b"hello"


async def test_another_user_can_neither_open_nor_read_nor_write_a_private_file(users: Users) -> None:
    alice, bob = await users.connect("alice"), await users.connect("bob")
    data = os.urandom(300_000)
    await alice.write_file("/alice/secret", data, perm=0o600)
    ino = (await alice.stat("/alice/secret")).inode
    chain = chain_of(ino.layout, 0)
    chunk_size = ino.layout.chunk_size
    await expect_errno(errno.EACCES, bob.open("/alice/secret"))
    await expect_errno(errno.EACCES, bob.open("/alice/secret", "r+"))
    # by inode id, straight to storage: meta gives his client no capability for it
    await expect_errno(errno.EACCES, bob.storage.read(chain, ino.id, 0, 0, 100))
    await expect_errno(errno.EACCES, bob.storage.write(chain, ino.id, 0, 0, b"x" * 100, chunk_size))
    # nor does it help to say he is alice
    bob.meta.user = common_pb2.UserInfo(uid=ALICE, gid=ALICE)
    bob.storage.user = common_pb2.UserInfo(uid=ALICE, gid=ALICE)
    await expect_errno(errno.EACCES, bob.open("/alice/secret"))
    await expect_errno(errno.EACCES, bob.meta.capability(ino.id, capability.READ))
    await expect_errno(errno.EACCES, bob.storage.read(chain, ino.id, 0, 0, 100))
    # and without a capability at all, storage refuses his connection's reads and writes
    bare = StorageClient(bob.routing, bob.rpc, user=bob.storage.user)
    e = await expect_errno(errno.EACCES, bare.read(chain, ino.id, 0, 0, 100))
    assert e.code == StatusCode.STORAGE_CAPABILITY
    e = await expect_errno(errno.EACCES, bare.write(chain, ino.id, 0, 0, b"x" * 100, chunk_size))
    assert e.code == StatusCode.STORAGE_CAPABILITY
    assert await alice.read_file("/alice/secret") == data
    # what alice lets others read, bob reads, and only that
    await alice.chmod("/alice/secret", 0o644)
    assert await bob.read_file("/alice/secret") == data
    await expect_errno(errno.EACCES, bob.open("/alice/secret", "r+"))


async def test_a_user_settles_its_own_requests_and_not_another_users(users: Users) -> None:
    """SettleRequest (what became of a request a client gave up on) finds a user's own request,
    whose record meta keeps under the user's scoped request id; another user naming that client
    and scoped id (anyone can compute it) neither reads its recorded reply nor settles it."""
    alice, bob = await users.connect("alice"), await users.connect("bob")
    drawn: list[int] = []
    draw = alice.meta._next_request_id

    def record() -> int:
        drawn.append(draw())
        return drawn[-1]

    alice.meta._next_request_id = record  # type: ignore[method-assign]
    await alice.mkdir("/alice/plans")
    made = drawn[-1]
    later = draw() + 1000  # an id alice's client has not used yet
    alice.meta._next_request_id = draw  # type: ignore[method-assign]
    plans = (await alice.stat("/alice/plans")).st_ino

    # bob, posing as alice's client, asks about her records by their scoped ids
    bob.meta.client_id = alice.meta.client_id
    for rid in (made, later):
        rsp = await bob.meta.call("SettleRequest", m.SettleRequestReq(request_id=user_scoped_id(ALICE, rid)))
        assert not rsp.done and not rsp.response
    # alice's own: done, with the reply she missed; and her next request is not settled away
    rsp = await alice.meta.call("SettleRequest", m.SettleRequestReq(request_id=made))
    assert rsp.done and m.InodeRsp.FromString(rsp.response).inode.id == plans
    alice.meta._next_request_id = lambda: later  # type: ignore[method-assign]
    await alice.mkdir("/alice/more")
    assert (await alice.stat("/alice/more")).st_ino


async def test_another_user_cannot_reach_a_file_by_id_past_a_private_directory(users: Users) -> None:
    """A 0644 file inside alice's 0700 directory: bob cannot reach it by path, nor by its inode id
    (meta asks his requests for the handle it gives only with inodes he may reach), so meta gives
    him no capability and storage no bytes."""
    alice, bob = await users.connect("alice"), await users.connect("bob")
    data = os.urandom(100_000)
    await alice.write_file("/alice/inner", data, perm=0o644)
    await alice.chmod("/alice", 0o700)
    ino = (await alice.stat("/alice/inner")).inode
    await expect_errno(errno.EACCES, bob.read_file("/alice/inner"))
    for call in (bob.meta.stat(ino.id), bob.meta.open(ino.id, os.O_RDONLY), bob.meta.capability(ino.id, 1)):
        await expect_errno(errno.EACCES, call)
    await expect_errno(errno.EACCES, bob.storage.read(chain_of(ino.layout, 0), ino.id, 0, 0, 100))
    # once alice opens the directory, bob gets there by name (and so gets the handle)
    await alice.chmod("/alice", 0o755)
    assert await bob.read_file("/alice/inner") == data
    assert (await bob.meta.stat(ino.id)).size == len(data)


def test_inode_handles_keep_the_most_recently_used() -> None:
    handles = InodeHandles(limit=2)
    handles.learn([m.Inode(id=i, handle=bytes([i]) * 16) for i in (5, 6)])
    assert handles.get(5) == bytes([5]) * 16  # 5 is now the more recently used
    handles.learn([m.Inode(id=7, handle=b"7" * 16), m.Inode(id=8)])  # 8 brought none
    assert (handles.get(6), handles.get(5), handles.get(8), len(handles)) == (None, bytes([5]) * 16, None, 2)
    req = m.RenameReq(old_parent=5, new_parent=1, old_name=b"a", new_name=b"b")
    handles.attach("Rename", req)
    assert dict(req.hdr.handles) == {5: bytes([5]) * 16}  # none for the root, nor for what it lacks
    req = m.BatchStatReq(inode_ids=[7, 6])
    handles.attach("BatchStat", req)
    assert dict(req.hdr.handles) == {7: b"7" * 16}
    # pinned handles stay whatever else comes, until unpinned as often
    handles.pin(7, 2)
    handles.pin(99)  # no handle known: nothing to keep
    handles.learn([m.Inode(id=i, handle=bytes([i]) * 16) for i in range(10, 20)])
    assert handles.get(7) == b"7" * 16 and handles.get(99) is None and len(handles) == 3
    handles.unpin(7)
    handles.learn([m.Inode(id=30, handle=b"x" * 16)])
    assert handles.get(7) == b"7" * 16
    handles.unpin(7)  # now an ordinary one, the most recently used
    handles.learn([m.Inode(id=i, handle=bytes([i]) * 16) for i in (31, 32)])
    assert handles.get(7) is None and len(handles) == 2
    handles.unpin(7)  # not pinned any more: nothing happens


async def test_a_users_open_files_keep_their_handles_however_many_others_it_meets(tmp_path: Path) -> None:
    """A client keeps ``inode_handles`` handles beyond those of its open files: stats of many
    other files must not make the close (or the writes) of an open one fail."""
    async with FsCluster(
        tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1, meta_extra={"authenticate": True}
    ) as c:
        users = await _users(c)
        alice = await c.connect(
            name="client-alice",
            user_auth=True,
            token_file=str(users.tokens["alice"]),
            cluster_secret_file="",
            inode_handles=4,
        )
        f = await alice.open("/alice/open", "w")
        await f.write(b"a" * 5000)
        for n in range(20):
            await alice.write_file(f"/alice/other{n}", b"o")
            await alice.stat(f"/alice/other{n}")
        assert len(alice.meta.handles) <= 4 + 1
        await f.write(b"b" * 5000)
        await f.close()
        assert (await users.admin.stat("/alice/open")).st_size == 10_000
        assert await alice.read_file("/alice/open") == b"a" * 5000 + b"b" * 5000


async def test_meta_without_authentication_refuses_user_connections(tmp_path: Path) -> None:
    async with FsCluster(tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1) as c:
        assert c.cluster.admin is not None
        token = c.tmp / "alice.token"
        token.write_text(await c.cluster.admin.add_user(ALICE, "alice", gid=ALICE))
        alice = await c.connect(user_auth=True, token_file=str(token), cluster_secret_file="")
        e = await expect_errno(errno.EACCES, alice.stat("/"))
        assert e.code == StatusCode.RPC_AUTH_FAILED
        # what trusts the header takes cluster members only
        member = await c.connect()
        assert (await member.stat("/")).st_uid == 0


async def test_an_expired_or_refused_capability_is_renewed_until_access_is_lost(tmp_path: Path) -> None:
    # capabilities for 1 s (meta's daemon), which this client renews after half of it, by its own
    # clock (storage still accepts them CLOCK_SKEW_S past their expiry)
    meta_extra = {"authenticate": True, "capability_ttl_s": 1.0}
    async with FsCluster(
        tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1, meta_extra=meta_extra
    ) as c:
        users = await _users(c)
        alice = await users.connect("alice")
        caps = alice.meta.capabilities
        data = os.urandom(100_000)
        await alice.write_file("/alice/f", data, perm=0o600)
        f = await alice.open("/alice/f", "r+")
        first = caps.now(f.inode_id, capability.RIGHTS)
        assert first is not None
        ino = (await alice.stat("/alice/f")).inode
        assert capability.parse(first).ttl_s == 1

        async def expired() -> bool:
            return caps.now(f.inode_id, capability.READ) is None

        await wait_until(expired, 5, "the capability to expire")
        assert await f.pread(10, 0) == data[:10]
        renewed = caps.now(f.inode_id, capability.READ)
        assert renewed is not None and renewed != first
        assert_names_layout(renewed, ino)
        # one that storage refuses (sealed with another secret, good for an hour) is replaced
        forged = CapabilityIssuer(b"not-the-cluster-secret-at-all!!!", ttl_s=3600).issue(
            f.inode_id, capability.RIGHTS, ino.layout
        )
        caps.put(f.inode_id, forged)
        assert await f.pread(10, 10) == data[10:20]
        await f.pwrite(b"new", 0)
        await f.fsync()
        assert caps.now(f.inode_id, capability.RIGHTS) != forged
        # once alice may not read it any more (root gave it to bob; its mode is 0600), meta issues
        # her none, and storage serves her no more
        await users.admin.chown("/alice/f", BOB, BOB)
        await wait_until(expired, 5, "the capability to expire")
        await expect_errno(errno.EACCES, f.pread(10, 20))
        await expect_errno(errno.EACCES, alice.open("/alice/f"))
        await users.admin.chown("/alice/f", ALICE, ALICE)
        assert await f.pread(10, 0) == b"new" + data[3:10]
        await f.close()

        # a file she creates 0444 and opens for writing (as git writes its objects): POSIX lets
        # that open write whatever the mode, and so do its capabilities after the first one
        ro = await alice.open_flags("/alice/ro", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o444)
        await ro.pwrite(b"first", 0)
        await ro.fsync()
        await wait_until(lambda: caps.now(ro.inode_id, capability.WRITE) is None, 5, "it to expire")
        await ro.pwrite(b"-second", 5)
        await ro.close()
        assert await alice.read_file("/alice/ro") == b"first-second"
        await expect_errno(errno.EACCES, alice.open("/alice/ro", "r+"))  # a new open checks the mode


async def test_user_auth_needs_a_token(tmp_path: Path) -> None:
    for config in (
        ClientConfig(user_auth=True),
        ClientConfig(user_auth=True, token_file=str(tmp_path / "none")),
    ):
        e = await expect_errno(errno.EINVAL, FileSystem.connect(config, timeout_s=1))
        assert e.code == StatusCode.CONFIG_INVALID and "token" in e.message
    (tmp_path / "empty").write_text("\n")
    e = await expect_errno(
        errno.EINVAL, FileSystem.connect(ClientConfig(user_auth=True, token_file=str(tmp_path / "empty")))
    )
    assert e.code == StatusCode.CONFIG_INVALID and "empty" in e.message
    (tmp_path / "token").write_text("fs3u.0.x\n")
    rdma = ClientConfig(user_auth=True, token_file=str(tmp_path / "token"), transport="rdma")
    e = await expect_errno(errno.EINVAL, FileSystem.connect(rdma, timeout_s=1))
    assert e.code == StatusCode.CONFIG_INVALID and "TCP only" in e.message
    cfg = tmp_path / "meta.toml"
    cfg.write_text("capability_ttl_s = 0\n")
    with pytest.raises(FS3Error) as err:
        load_config(MetaConfig, cfg)
    assert err.value.code == StatusCode.CONFIG_INVALID and "capability_ttl_s" in err.value.message
    assert load_config(MetaConfig, None, environ={}).capability_ttl_s == 600.0


async def test_refused_credentials_name_the_file_and_what_to_do(tmp_path: Path) -> None:
    """'malformed token' or 'wrong cluster secret' alone left a user guessing which file, and that a
    client not trusted with the cluster secret needs user_auth = true and a token."""
    async with FsCluster(tmp_path, storage_nodes=1, chains=1, replication=1, stripe=1) as c:
        garbage = tmp_path / "garbage.token"
        garbage.write_text("not-a-token\n")
        user = c.client_config("user", user_auth=True, token_file=str(garbage), cluster_secret_file="")
        with pytest.raises(FS3Error) as e:
            await FileSystem.connect(load_config(ClientConfig, user, environ={}), timeout_s=10)
        assert e.value.code == StatusCode.UNAUTHENTICATED
        assert f"the user token in token_file {garbage}" in e.value.message, e.value.message
        no_secret = c.client_config("nosecret", cluster_secret_file="")
        with pytest.raises(FS3Error) as e:
            await FileSystem.connect(load_config(ClientConfig, no_secret, environ={}), timeout_s=10)
        assert e.value.code == StatusCode.UNAUTHENTICATED
        assert "no cluster_secret_file is set" in e.value.message and "user_auth = true" in e.value.message


def _replace(path: Path, text: str) -> None:
    """Write ``path`` the way a careful operator does: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


async def test_a_new_token_in_token_file_is_taken_up_without_a_restart(
    users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client read its token once: when it expired or was revoked, the client (a mount serving a
    training job) failed every call until restarted. It now takes up a token written to its
    token_file, once mgmtd says it is the same user's."""
    monkeypatch.setattr(filesystem, "TOKEN_CHECK_S", 0.1, raising=False)
    alice = await users.connect("alice")
    await alice.write_file("/alice/before.bin", b"before", perm=0o600)
    # Another user's token, and garbage, are not taken up: she stays herself (bob may not create
    # in her home), and her token works on.
    assert users.c.cluster.admin is not None
    bob_token = users.tokens["bob"].read_text()
    for wrong in (bob_token, "fs3u.1000.not-a-token\n", bob_token):
        _replace(users.tokens["alice"], wrong)
        await asyncio.sleep(0.5)
        await alice.write_file("/alice/still-alice.bin", b"x")
        assert (await alice.stat("/alice/still-alice.bin")).st_uid == ALICE
    # The admin issues her a new token and revokes the old one; her meta server restarts, so
    # her connections to it open again and prove a token afresh (a server that keeps one open
    # asks mgmtd again within a minute, and closes it once its token is refused).
    new = await users.c.cluster.admin.issue_token(ALICE, invalidate_existing=True)
    _replace(users.tokens["alice"], new + "\n")
    users.c.kill_meta(0)
    users.c.start_meta(0)
    assert await alice.read_file("/alice/before.bin") == b"before"
    data = os.urandom(1_500_000)
    await alice.write_file("/alice/after.bin", data, perm=0o600)
    assert await alice.read_file("/alice/after.bin") == data
    assert alice.rpc.token == new and alice.meta.user.uid == ALICE
    # her old connections close once idle (after a grace without calls): then every connection
    # open proved the new token
    await wait_until(lambda: not alice.rpc._retiring, 30, "the old connections to close")
