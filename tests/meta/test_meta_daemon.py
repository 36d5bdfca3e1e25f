"""The meta daemon: in-process with a real mgmtd (token checks, registration, layouts from the chain
table), and as a process (bad config, busy port, bad requests over the wire, retries, failover)."""

from __future__ import annotations

import asyncio
import errno
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from meta_harness import REPO, MetaProcesses

from fs3.client.meta_client import DEV_SECRET, META_SERVICE, ROOT_ID, MetaClient
from fs3.client.mgmtd_client import MgmtdClient
from fs3.config import KvConfig, MetaConfig, MgmtdConfig
from fs3.errors import FS3Error, StatusCode
from fs3.kv import open_database
from fs3.meta import schema as meta_schema
from fs3.meta.daemon import MetaDaemon
from fs3.meta.permissions import Credentials
from fs3.meta.store import MetaStore
from fs3.mgmtd.server import MgmtdServer
from fs3.net import RpcClient
from fs3.net.service import Method
from fs3.proto import common_pb2, mgmtd_pb2
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)


async def wait_until(pred, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {pred}")
        await asyncio.sleep(0.02)


class Cluster:
    mgmtd: MgmtdServer
    admin: MgmtdClient
    meta: MetaDaemon
    alice_token: str
    root_token: str

    def client(self, uid: int, gid: int, token: str, **kw) -> MetaClient:
        user = common_pb2.UserInfo(uid=uid, gid=gid, token=token)
        return MetaClient([f"127.0.0.1:{self.meta.port}"], user=user, timeout_s=5, **kw)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    mdb = await open_database("mem")
    c.mgmtd = MgmtdServer(
        MgmtdConfig(node_id=1, listen_port=0, lease_interval_s=0.8, kv=KvConfig(engine="mem")), mdb
    )
    await c.mgmtd.start()
    c.meta = None  # type: ignore[assignment]
    bootstrap = MgmtdClient([c.mgmtd.address], timeout_s=5)
    try:
        await wait_until(c.mgmtd.is_primary)
        c.root_token = await bootstrap.init_cluster("test")
        c.admin = MgmtdClient([c.mgmtd.address], token=c.root_token, timeout_s=5)
        c.alice_token = await c.admin.add_user(1000, "alice", gid=1000, groups=[500])
        for i in range(4):
            ep = common_pb2.Endpoint(host="127.0.0.1", port=9000 + i, transport="tcp")
            await c.admin.register_node(10 + i, common_pb2.NODE_STORAGE, [ep])
        await c.admin.create_targets(
            [mgmtd_pb2.TargetSpec(target_id=110 + i, node_id=10 + i, disk_index=0) for i in range(4)]
        )
        await c.admin.upload_chains({1: [110], 2: [111], 3: [112], 4: [113]})
        await c.admin.upload_chain_table(1, [1, 2, 3, 4])
        cfg = MetaConfig(
            node_id=100,
            listen_port=0,
            mgmtd_addresses=[c.mgmtd.address],
            authenticate=True,
            default_stripe=2,
            kv=KvConfig(engine="mem"),
        )
        c.meta = MetaDaemon(cfg)
        await c.meta.start()
        yield c
    finally:
        if c.meta is not None:
            await c.meta.stop()
        await bootstrap.close()
        if hasattr(c, "admin"):
            await c.admin.close()
        await c.mgmtd.stop(grace_s=0)
        await mdb.close()


async def test_tokens_layouts_and_registration(cluster: Cluster) -> None:
    alice = cluster.client(1000, 1000, cluster.alice_token)
    as_root = cluster.client(0, 0, cluster.root_token)
    impostor = cluster.client(0, 0, cluster.alice_token)
    nobody = cluster.client(1000, 1000, "not-a-token")
    try:
        pub = await as_root.mkdir(ROOT_ID, b"pub", 0o777)
        f = await alice.create(pub.id, b"f", 0o644)
        assert f.inode.uid == 1000
        assert len(f.inode.layout.chains) == 2 and set(f.inode.layout.chains) <= {1, 2, 3, 4}
        # a root user's token acts for whichever local user the request names (the FUSE mount)
        as_bob = cluster.client(1001, 1001, cluster.root_token)
        assert (await as_bob.create(pub.id, b"g", 0o644)).inode.uid == 1001
        for bad in (impostor, nobody):
            with pytest.raises(FS3Error) as info:
                await bad.stat(pub.id)
            assert info.value.errno == errno.EACCES
        reg = cluster.meta.registry
        assert reg.get_sample_value("fs3_meta_requests_total", {"method": "Create", "code": "OK"}) == 2
        assert (
            reg.get_sample_value("fs3_meta_requests_total", {"method": "Stat", "code": "UNAUTHENTICATED"})
            == 2
        )
        nodes = await cluster.admin.list_nodes()
        assert any(n.node_id == 100 and n.type == common_pb2.NODE_META for n in nodes)
    finally:
        for c in (alice, as_root, impostor, nobody):
            await c.close()


async def test_a_meta_on_a_store_of_another_file_system_is_refused(tmp_path: Path) -> None:
    """A meta whose kv.path named an empty store (a disk that did not mount under an existing
    directory, a typo) made a new root there and served it: clients failing over to it saw an
    empty file system, and its new files' chunk ids were the real one's. Now the first store's
    file system id is recorded in mgmtd and a meta on another is refused before it serves."""
    mdb = await open_database("mem")
    mgmtd = MgmtdServer(
        MgmtdConfig(node_id=1, listen_port=0, lease_interval_s=0.8, kv=KvConfig(engine="mem")), mdb
    )
    await mgmtd.start()
    bootstrap = MgmtdClient([mgmtd.address], timeout_s=5)
    admin: MgmtdClient | None = None
    daemons: list[MetaDaemon] = []

    async def meta(node_id: int, path: Path) -> MetaDaemon:
        d = MetaDaemon(
            MetaConfig(
                node_id=node_id,
                listen_port=0,
                mgmtd_addresses=[mgmtd.address],
                authenticate=False,
                kv=KvConfig(engine="lmdb", path=str(path)),
            )
        )
        await d.start()
        daemons.append(d)
        return d

    async def names(d: MetaDaemon) -> list[bytes]:
        client = MetaClient([f"127.0.0.1:{d.port}"], timeout_s=5)
        try:
            return sorted([e.name async for e in client.listdir(ROOT_ID)])
        finally:
            await client.close()

    try:
        await wait_until(mgmtd.is_primary)
        admin = MgmtdClient([mgmtd.address], token=await bootstrap.init_cluster("test"), timeout_s=5)
        # a store made before stores had an id (or without mgmtd): it is given one, recorded
        real = tmp_path / "kv"
        old = MetaStore(await open_database("lmdb", path=str(real)))
        await old.start(background=False)
        await old.mkdir(Credentials(0, 0), ROOT_ID, b"precious", 0o755)
        await old.db.close()
        first = await meta(100, real)
        assert await names(first) == [b"precious"]
        empty = tmp_path / "bare-mount-point" / "kv"
        empty.parent.mkdir()
        with pytest.raises(FS3Error) as e:
            await meta(101, empty)
        assert e.value.code == StatusCode.CONFIG_INVALID
        assert str(empty) in e.value.message and str(real) in e.value.message and "mounted" in e.value.message
        assert 101 not in {n.node_id for n in await admin.list_nodes()}
        probe = MetaStore(await open_database("lmdb", path=str(empty)))
        try:  # no root directory was made there
            assert await probe.db.run(lambda tr: tr.get(meta_schema.inode_key(ROOT_ID))) is None
        finally:
            await probe.db.close()
        # another meta on the same store serves the same file system, as does the first restarted
        assert await names(await meta(102, real)) == [b"precious"]
        await first.stop()
        daemons.remove(first)
        assert await names(await meta(100, real)) == [b"precious"]
    finally:
        for d in daemons:
            await d.stop()
        await bootstrap.close()
        if admin is not None:
            await admin.close()
        await mgmtd.stop(grace_s=0)
        await mdb.close()


@pytest.fixture
def procs(tmp_path: Path):
    p = MetaProcesses(tmp_path)
    try:
        yield p
    finally:
        p.cleanup()


async def test_a_daemon_without_a_cluster_secret_says_so(
    caplog: pytest.LogCaptureFixture, cluster: Cluster
) -> None:
    """The fixture's daemon has no cluster_secret_file: it runs on the development secret, which
    anyone can read in the source, and its log says so."""
    assert any(
        r.levelname == "WARNING" and "no cluster_secret_file" in r.getMessage()
        for r in caplog.get_records("setup")
    ), caplog.text


def test_unknown_config_key_exits_with_one_line(procs: MetaProcesses, tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("listen_port = 0\nbogus_key = 1\n")
    r = subprocess.run(
        [sys.executable, "-m", "fs3.meta", "--config", str(cfg)], cwd=REPO, capture_output=True, timeout=30
    )
    assert r.returncode != 0
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "bogus_key" in lines[0] and str(cfg) in lines[0]


def test_busy_port_exits_with_one_line(procs: MetaProcesses, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = procs.write_config(7, 'listen_host = "127.0.0.1"')
        r = subprocess.run(
            [sys.executable, "-m", "fs3.meta", "--config", str(cfg), "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            timeout=30,
        )
    assert r.returncode != 0
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0], lines


async def test_wire_errors_retries_and_failover(procs: MetaProcesses) -> None:
    a, b = procs.start(1), procs.start(2)
    procs.wait_ready(a)
    procs.wait_ready(b)
    user = common_pb2.UserInfo(uid=0, gid=0)
    client = MetaClient([a.address, b.address], user=user, timeout_s=10)
    rpc = RpcClient(DEV_SECRET)
    try:
        d = await client.mkdir(ROOT_ID, b"d", 0o755)
        # bad input over the wire: names, sizes, unknown ids, a message that does not parse
        for op, code in (
            (client.create(d.id, b"a/b"), errno.EINVAL),
            (client.create(d.id, b"x" * 256), errno.ENAMETOOLONG),
            (client.mkdir(d.id, b".."), errno.EINVAL),
            (client.stat(1 << 60), errno.ENOENT),
            (client.readdir(12345), errno.ENOENT),
            (client.setxattr(d.id, b"user.big", b"v" * 70000), errno.E2BIG),
        ):
            with pytest.raises(FS3Error) as info:
                await op
            assert info.value.errno == code, info.value
        raw = Method(1, m.METHOD_META_STAT, "Stat", m.LookupReq, m.InodeRsp, "meta")
        bogus = m.LookupReq(name=b"\xff" * 10, parent=(1 << 64) - 1)
        with pytest.raises(FS3Error) as info:  # read as a StatReq of an unknown inode
            await rpc.call(a.address, raw, bogus, timeout=5)
        assert info.value.code == StatusCode.NOT_FOUND
        # the same request id twice: the second reply is the first result, not EEXIST
        req = m.CreateReq(parent=d.id, name=b"once", mode=0o644, flags=0o200)
        req.hdr.user.CopyFrom(user)
        req.hdr.client_id, req.hdr.request_id = 99, 12345
        first, _ = await rpc.call(a.address, META_SERVICE["Create"], req, timeout=5)
        second, _ = await rpc.call(b.address, META_SERVICE["Create"], req, timeout=5)
        assert first.inode.id == second.inode.id and second.created
        req.hdr.request_id = 12346
        with pytest.raises(FS3Error) as info:
            await rpc.call(b.address, META_SERVICE["Create"], req, timeout=5)
        assert info.value.code == StatusCode.ALREADY_EXISTS
        # one daemon dies: the client carries on with the other
        a.popen.kill()
        a.popen.wait(timeout=10)
        for i in range(5):
            await client.create(d.id, f"after{i}".encode(), 0o644)
        names = [e.name async for e in client.listdir(d.id)]
        assert names == [b"after0", b"after1", b"after2", b"after3", b"after4", b"once"]
    finally:
        await client.close()
        await rpc.close()
