"""What the meta service exports about its requests (counts by method and status, latency
histograms), and that a token's credentials, once verified, keep being honoured and refused as
before when the service takes them from the authenticator's cache; a request id names one
request, whatever kind of request reuses it."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fs3.client.meta_client import DEV_SECRET, ROOT_ID, MetaClient
from fs3.errors import FS3Error, StatusCode
from fs3.kv import open_database
from fs3.meta.auth import TokenAuthenticator, TrustingAuthenticator
from fs3.meta.service import MetaService
from fs3.meta.store import MetaStore
from fs3.net import RpcServer
from fs3.proto import common_pb2, mgmtd_pb2
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)


async def _serve(auth, reg: CollectorRegistry | None) -> AsyncIterator[tuple[str, MetaStore]]:
    db = await open_database("mem")
    store = MetaStore(db)
    await store.start(background=False)
    server = RpcServer(DEV_SECRET)
    MetaService(store, auth).register(server, reg)
    host, port = await server.start(("127.0.0.1", 0))
    try:
        yield f"{host}:{port}", store
    finally:
        await server.stop()
        await store.stop()
        await db.close()


async def test_request_counts_and_latency_histograms() -> None:
    reg = CollectorRegistry()
    async for address, _ in _serve(TrustingAuthenticator(), reg):
        async with MetaClient([address], user=common_pb2.UserInfo(uid=0, gid=0), timeout_s=5) as c:
            d = await c.mkdir(ROOT_ID, b"d")
            for i in range(3):
                await c.create(d.id, f"f{i}".encode(), 0o644)
            await c.stat(d.id)
            with pytest.raises(FS3Error) as e:
                await c.stat(999_999)
            assert e.value.errno == errno.ENOENT
            with pytest.raises(FS3Error):
                await c.mkdir(ROOT_ID, b"d")  # exists

    def value(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(name, labels)

    assert value("fs3_meta_requests_total", method="Create", code="OK") == 3
    assert value("fs3_meta_requests_total", method="Stat", code="OK") == 1
    assert value("fs3_meta_requests_total", method="Stat", code="NOT_FOUND") == 1
    assert value("fs3_meta_requests_total", method="Mkdir", code="OK") == 1
    assert value("fs3_meta_requests_total", method="Mkdir", code="ALREADY_EXISTS") == 1
    # every method is listed from the start, at zero
    assert value("fs3_meta_requests_total", method="Rename", code="OK") == 0
    # latencies count failed requests too; buckets are cumulative and end with +Inf = count
    assert value("fs3_meta_request_seconds_count", method="Stat") == 2
    assert value("fs3_meta_request_seconds_count", method="Create") == 3
    assert value("fs3_meta_request_seconds_bucket", method="Create", le="+Inf") == 3
    assert value("fs3_meta_request_seconds_sum", method="Create") > 0
    buckets = [
        s
        for metric in reg.collect()
        if metric.name == "fs3_meta_request_seconds"
        for s in metric.samples
        if s.name.endswith("_bucket") and s.labels["method"] == "Create"
    ]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and counts[-1] == 3 and buckets[0].labels["le"] == "5e-05"
    # and the text exposition a scraper reads
    text = generate_latest(reg).decode()
    assert 'fs3_meta_requests_total{code="OK",method="Create"} 3.0' in text
    assert "# TYPE fs3_meta_request_seconds histogram" in text


async def test_cached_token_credentials() -> None:
    users = {
        "alice-token": mgmtd_pb2.User(name="alice", uid=1000, gid=1000, groups=[7]),
        "root-token": mgmtd_pb2.User(name="root", uid=0, gid=0, root=True),
    }
    verified: list[str] = []

    async def verify(token: str) -> mgmtd_pb2.User:
        verified.append(token)
        if token not in users:
            raise FS3Error(StatusCode.UNAUTHENTICATED, "unknown token")
        return users[token]

    auth = TokenAuthenticator(verify)
    async for address, _ in _serve(auth, CollectorRegistry()):
        root_user = common_pb2.UserInfo(uid=0, gid=0, token="root-token")
        async with MetaClient([address], user=root_user, timeout_s=5) as root:
            shared = await root.mkdir(ROOT_ID, b"shared", 0o777)
            private = await root.mkdir(ROOT_ID, b"private", 0o700)
        # the root token acts for whoever the header names, each identity with its own groups
        for uid in (1000, 2000, 1000):
            user = common_pb2.UserInfo(uid=uid, gid=uid, token="root-token")
            async with MetaClient([address], user=user, timeout_s=5) as c:
                f = (await c.create(shared.id, f"by-{uid}-{len(verified)}".encode(), 0o644)).inode
                assert (f.uid, f.gid) == (uid, uid)
        alice = common_pb2.UserInfo(uid=1000, gid=1000, token="alice-token")
        async with MetaClient([address], user=alice, timeout_s=5) as a:
            for i in range(3):  # the second and later calls take the cached credentials
                f = (await a.create(shared.id, f"alice-{i}".encode(), 0o644)).inode
                assert (f.uid, f.gid) == (1000, 1000)
                with pytest.raises(FS3Error) as e:
                    await a.create(private.id, f"no-{i}".encode(), 0o644)
                assert e.value.errno == errno.EACCES
        # a verified token names its owner: another uid in the header is refused every time
        mallory = common_pb2.UserInfo(uid=0, gid=0, token="alice-token")
        async with MetaClient([address], user=mallory, timeout_s=5) as m:
            for _ in range(2):
                with pytest.raises(FS3Error) as e:
                    await m.stat(ROOT_ID)
                assert e.value.code == StatusCode.UNAUTHENTICATED
        bad = common_pb2.UserInfo(uid=1000, gid=1000, token="forged")
        async with MetaClient([address], user=bad, timeout_s=5) as b:
            for _ in range(2):
                with pytest.raises(FS3Error) as e:
                    await b.stat(ROOT_ID)
                assert e.value.code == StatusCode.UNAUTHENTICATED
    # each token was asked about once (answers are cached, refusals included)
    assert sorted(verified) == ["alice-token", "forged", "root-token"]


async def test_header_identities_are_told_apart() -> None:
    async for address, _ in _serve(TrustingAuthenticator(), None):
        async with MetaClient([address], user=common_pb2.UserInfo(uid=0, gid=0), timeout_s=5) as root:
            d = await root.mkdir(ROOT_ID, b"team", 0o770)
            await root.setattr(d.id, gid=7)
        member = common_pb2.UserInfo(uid=1000, gid=1000, groups=[3, 7])
        outsider = common_pb2.UserInfo(uid=1000, gid=1000, groups=[3])
        crowd = common_pb2.UserInfo(uid=1000, gid=1000, groups=list(range(100, 165)))
        for i in range(2):  # alternating identities of one uid, each with its own groups
            async with MetaClient([address], user=member, timeout_s=5) as c:
                f = (await c.create(d.id, f"m{i}".encode(), 0o644)).inode
                assert (f.uid, f.gid) == (1000, 1000)
            async with MetaClient([address], user=outsider, timeout_s=5) as c:
                with pytest.raises(FS3Error) as e:
                    await c.create(d.id, f"o{i}".encode(), 0o644)
                assert e.value.errno == errno.EACCES
            async with MetaClient([address], user=crowd, timeout_s=5) as c:
                with pytest.raises(FS3Error) as e:
                    await c.stat(ROOT_ID)
                assert e.value.code == StatusCode.INVALID_ARGUMENT


async def test_a_request_id_used_again_by_another_kind_of_request_is_refused() -> None:
    """A retried request gets its first answer; but a client that reused a request id for another
    request (an Unlink, a Mkdir, after a Create) was answered OK with the Create's response, and
    nothing was done: the file stayed, the directory was never made."""
    async for address, _ in _serve(TrustingAuthenticator(), None):
        async with MetaClient([address], user=common_pb2.UserInfo(uid=0, gid=0), timeout_s=5) as c:

            def header(req):  # type: ignore[no-untyped-def]
                req.hdr.request_id = 4242  # the client would give each request its own
                return req

            made = await c.call("Create", header(m.CreateReq(parent=ROOT_ID, name=b"f", mode=0o644)))
            again = await c.call("Create", header(m.CreateReq(parent=ROOT_ID, name=b"f", mode=0o644)))
            assert again.inode.id == made.inode.id  # a retry: the first answer
            for req in (
                m.UnlinkReq(parent=ROOT_ID, name=b"f"),
                m.MkdirReq(parent=ROOT_ID, name=b"d", mode=0o755),
            ):
                with pytest.raises(FS3Error) as e:
                    await c.call(type(req).__name__[:-3], header(req))
                assert e.value.code == StatusCode.INVALID_ARGUMENT, e.value
                assert "used by a CreateReq already" in e.value.message
            assert (await c.lookup(ROOT_ID, b"f")).id == made.inode.id  # not unlinked
            with pytest.raises(FS3Error) as e:
                await c.lookup(ROOT_ID, b"d")
            assert e.value.errno == errno.ENOENT
