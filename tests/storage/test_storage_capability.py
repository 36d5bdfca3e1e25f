"""User connections to storage (real daemons): a client that holds a user token instead of the
cluster secret reads and writes only chunks of files it holds a capability of, and nothing else."""

from __future__ import annotations

import contextlib
import time

import pytest
from cluster import Cluster

from fs3.capability import READ, RIGHTS, WRITE, CapabilityCache, CapabilityIssuer
from fs3.client.mgmtd_client import MgmtdClient
from fs3.client.routing import RoutingCache
from fs3.client.storage_client import (
    STORAGE_SERVICE,
    ReadRequest,
    RetryPolicy,
    StorageClient,
    crc32c,
    node_address,
)
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient
from fs3.net.auth import user_scoped_id
from fs3.proto import meta_pb2, storage_pb2
from fs3.storage.chain_ops import ResultCache

pytestmark = pytest.mark.timeout(180)

CHUNK = 64 * 1024
FILE = 0x5000  # the user's file
OTHER = 0x6000  # a file the user holds no capability of


def layout(*chains: int, chunk_size: int = CHUNK) -> meta_pb2.Layout:
    """The layout a capability binds: what meta would have given the file."""
    return meta_pb2.Layout(chunk_size=chunk_size, chains=chains)


class Tags:
    """Fresh update tags of one client id."""

    def __init__(self, client_id: int) -> None:
        self.client_id = client_id
        self.seq = 0

    def next(self, req: storage_pb2.WriteReq) -> storage_pb2.WriteReq:
        self.seq += 1
        req.tag.client_id, req.tag.request_id, req.tag.channel, req.tag.seqnum = (
            self.client_id,
            self.seq,
            1,
            self.seq,
        )
        return req


def write_req(
    chain_id: int, version: int, inode_id: int, data: bytes, cap: bytes = b""
) -> storage_pb2.WriteReq:
    req = storage_pb2.WriteReq(capability=cap)
    req.io.key.chain_id, req.io.key.chain_version = chain_id, version
    req.io.key.inode_id = inode_id
    req.io.type = storage_pb2.UPDATE_WRITE
    req.io.length = len(data)
    req.io.chunk_size = CHUNK
    req.io.crc32c = crc32c(data)
    return req


def read_req(chain_id: int, version: int, *reads: tuple[int, bytes]) -> storage_pb2.BatchReadReq:
    req = storage_pb2.BatchReadReq()
    for inode_id, cap in reads:
        io = req.ios.add(offset=0, length=CHUNK, capability=cap)
        io.key.chain_id, io.key.chain_version, io.key.inode_id = chain_id, version, inode_id
    return req


async def refused(rpc: RpcClient, address, method: str, req, payload: bytes | None = None) -> FS3Error:  # type: ignore[no-untyped-def]
    with pytest.raises(FS3Error) as e:
        await rpc.call(address, STORAGE_SERVICE[method], req, payload=payload, timeout=10)
    return e.value


@contextlib.asynccontextmanager
async def user_rpc(token: str):  # type: ignore[no-untyped-def]
    rpc = RpcClient(None, token=token, identity="alice-job")
    try:
        yield rpc
    finally:
        await rpc.close()


async def test_a_user_connection_reads_and_writes_only_what_its_capabilities_grant(tmp_path):
    async with Cluster(tmp_path / "c", backend_network=True) as c:
        assert c.admin is not None
        member = await c.storage_client()
        token = await c.admin.add_user(1000, "alice", gid=1000)
        issuer = CapabilityIssuer(c.secret)
        chain_id = c.chain_ids[0]
        lay = layout(chain_id)  # the file's, as meta would have made it
        routing = await c.routing()
        chain = routing.chain(chain_id)
        v = chain.version
        head = node_address(routing, chain.targets[0].target_id)
        tail = node_address(routing, chain.targets[-1].target_id)
        data = b"alice's bytes " * 100
        other = b"somebody else's" * 100
        await member.write(chain_id, OTHER, 0, 0, other, CHUNK)

        async with user_rpc(token) as rpc:
            tags = Tags(0x77)
            # with a capability of the file: written along the whole chain, read back
            req = tags.next(write_req(chain_id, v, FILE, data, issuer.issue(FILE, WRITE, lay)))
            rsp, _ = await rpc.call(head, STORAGE_SERVICE["Write"], req, payload=data, timeout=10)
            assert rsp.length == len(data)
            assert await member.read(chain_id, FILE, 0, 0, CHUNK) == data
            rsp, payload = await rpc.call(
                tail,
                STORAGE_SERVICE["BatchRead"],
                read_req(chain_id, v, (FILE, issuer.issue(FILE, READ, lay))),
                timeout=10,
            )
            assert rsp.results[0].status.code == 0 and bytes(payload) == data

            # writes without a valid capability of the chunk's file change nothing
            past = CapabilityIssuer(c.secret, ttl_s=10, clock=lambda: time.time() - 3600)
            forged = bytearray(issuer.issue(FILE, WRITE, lay))
            forged[-1] ^= 1
            bad_caps = {
                "none": b"",
                "another file's": issuer.issue(OTHER + 1, WRITE, lay),
                "read-only": issuer.issue(FILE, READ, lay),
                "forged": bytes(forged),
                "expired": past.issue(FILE, WRITE, lay),
                "another cluster's": CapabilityIssuer(b"not this cluster's secret!!").issue(FILE, WRITE, lay),
            }
            evil = b"X" * len(data)
            for what, cap in bad_caps.items():
                e = await refused(
                    rpc, head, "Write", tags.next(write_req(chain_id, v, FILE, evil, cap)), evil
                )
                assert e.code == StatusCode.STORAGE_CAPABILITY, (what, e)
            # a capability of its own file does not open another's
            e = await refused(
                rpc,
                head,
                "Write",
                tags.next(write_req(chain_id, v, OTHER, evil, issuer.issue(FILE, RIGHTS, lay))),
                evil,
            )
            assert e.code == StatusCode.STORAGE_CAPABILITY and "inode" in e.message
            # truncating and removing chunks is meta's, capability or not
            for kind in (storage_pb2.UPDATE_TRUNCATE, storage_pb2.UPDATE_REMOVE):
                req = tags.next(write_req(chain_id, v, FILE, b"", issuer.issue(FILE, RIGHTS, lay)))
                req.io.type, req.io.length, req.io.crc32c = kind, 0, 0
                e = await refused(rpc, head, "Write", req)
                assert e.code == StatusCode.PERMISSION_DENIED, (kind, e)
            assert await member.read(chain_id, FILE, 0, 0, CHUNK) == data
            assert await member.read(chain_id, OTHER, 0, 0, CHUNK) == other

            # reads: each one stands or falls with its own capability
            reads = [
                (FILE, issuer.issue(FILE, READ, lay)),
                (OTHER, b""),
                (OTHER, issuer.issue(FILE, READ, lay)),
                (FILE, issuer.issue(FILE, WRITE, lay)),
                (FILE, past.issue(FILE, READ, lay)),
                (FILE, bytes(forged)),
                (OTHER, issuer.issue(OTHER, RIGHTS, lay)),
            ]
            rsp, payload = await rpc.call(
                tail, STORAGE_SERVICE["BatchRead"], read_req(chain_id, v, *reads), timeout=10
            )
            codes = [r.status.code for r in rsp.results]
            assert codes == [0] + [StatusCode.STORAGE_CAPABILITY] * 5 + [0], codes
            first, last = rsp.results[0], rsp.results[-1]
            assert bytes(payload[first.payload_offset : first.payload_offset + first.length]) == data
            assert bytes(payload[last.payload_offset : last.payload_offset + last.length]) == other

            # every other method is for cluster members, whatever the request
            target = chain.targets[0].target_id
            real = {
                "RemoveChunks": storage_pb2.RemoveChunksReq(
                    chain_id=chain_id, chain_version=v, inode_id=FILE
                ),
                "TruncateChunks": storage_pb2.TruncateChunksReq(
                    chain_id=chain_id, chain_version=v, inode_id=FILE, chunk_size=CHUNK, length=1
                ),
                "DumpChunkMeta": storage_pb2.DumpChunkMetaReq(target_id=target, inode_id=OTHER),
                "QueryLastChunk": storage_pb2.QueryLastChunkReq(
                    chain_id=chain_id, chain_version=v, inode_id=OTHER
                ),
                "SpaceInfo": storage_pb2.SpaceInfoReq(),
            }
            update = storage_pb2.UpdateReq(
                target_id=chain.targets[1].target_id, io=write_req(chain_id, v, FILE, evil).io
            )
            update.io.update_version = 99
            real["Update"] = update
            checked = set()
            for method in STORAGE_SERVICE:
                if method.name in ("Write", "BatchRead"):
                    continue
                for address in (head, node_address(routing, chain.targets[1].target_id), tail):
                    req = real.get(method.name) or method.request()
                    e = await refused(
                        rpc, address, method.name, req, evil if method.name == "Update" else None
                    )
                    assert e.code == StatusCode.PERMISSION_DENIED and "cluster members" in e.message, (
                        method.name,
                        e,
                    )
                checked.add(method.name)
            assert {"Update", "RemoveChunks", "TruncateChunks", "DumpChunkMeta", "QueryCommitted"} <= checked
            assert await member.read(chain_id, FILE, 0, 0, CHUNK) == data

        # a token mgmtd does not know opens no connection
        async with user_rpc("not-a-token") as rpc:
            e = await refused(
                rpc, head, "BatchRead", read_req(chain_id, v, (FILE, issuer.issue(FILE, READ, lay)))
            )
            assert e.code == StatusCode.RPC_AUTH_FAILED
        # the chain's own listener takes cluster members only
        node = c.node_of_target(chain.targets[0].target_id)
        backend = ("127.0.0.1", node.backend_port)
        async with user_rpc(token) as rpc:
            e = await refused(
                rpc, backend, "BatchRead", read_req(chain_id, v, (FILE, issuer.issue(FILE, READ, lay)))
            )
            assert e.code == StatusCode.RPC_AUTH_FAILED
        rsp, _ = await member.rpc.call(
            backend, STORAGE_SERVICE["BatchRead"], read_req(chain_id, v, (FILE, b"")), timeout=10
        )
        assert rsp.results[0].length == len(data)


async def test_a_capability_holds_only_on_its_files_chains_and_with_its_chunk_size(tmp_path):
    """A capability binds its file's layout: with one, a client may not put chunks of the file on
    another chain, nor of another size, where meta's truncates and removals never look (space
    nobody could reclaim), nor read the file's inode id on another chain."""
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1, chains=2) as c:
        assert c.admin is not None
        member = await c.storage_client()
        token = await c.admin.add_user(1000, "alice")
        issuer = CapabilityIssuer(c.secret)
        mine, elsewhere = c.chain_ids
        routing = await c.routing()
        v = {cid: routing.chain(cid).version for cid in c.chain_ids}
        address = node_address(routing, routing.chain(mine).targets[0].target_id)
        assert address == node_address(routing, routing.chain(elsewhere).targets[0].target_id)
        cap = issuer.issue(FILE, RIGHTS, layout(mine))
        # chunks with FILE's inode id on a chain that is not the file's (a member's doing)
        theirs = b"not on alice's chains" * 10
        await member.write(elsewhere, FILE, 0, 0, theirs, CHUNK)
        data = b"alice's" * 100
        evil = b"X" * len(data)
        tags = Tags(0x99)
        async with user_rpc(token) as rpc:
            # another chain than the file's: refused, nothing written there
            req = tags.next(write_req(elsewhere, v[elsewhere], FILE, evil, cap))
            e = await refused(rpc, address, "Write", req, evil)
            assert e.code == StatusCode.STORAGE_CAPABILITY and f"chain {elsewhere}" in e.message, e
            assert await member.read(elsewhere, FILE, 0, 0, CHUNK) == theirs
            # the file's chain with another chunk size (one storage takes for a new chunk): refused,
            # nothing written
            for chunk_size in (CHUNK * 2, CHUNK * 16):
                req = tags.next(write_req(mine, v[mine], FILE, evil, cap))
                req.io.chunk_size = chunk_size
                e = await refused(rpc, address, "Write", req, evil)
                assert e.code == StatusCode.STORAGE_CAPABILITY and f"not {chunk_size}" in e.message, e
            # none at all (what a read names: not checked by the capability, refused by the write)
            req = tags.next(write_req(mine, v[mine], FILE, evil, cap))
            req.io.chunk_size = 0
            e = await refused(rpc, address, "Write", req, evil)
            assert e.code in (StatusCode.STORAGE_CAPABILITY, StatusCode.INVALID_ARGUMENT), e
            assert await member.read(mine, FILE, 0, 0, CHUNK) == b""
            # as the layout says: written
            req = tags.next(write_req(mine, v[mine], FILE, data, cap))
            rsp, _ = await rpc.call(address, STORAGE_SERVICE["Write"], req, payload=data, timeout=10)
            assert rsp.length == len(data)
            assert await member.read(mine, FILE, 0, 0, CHUNK) == data

            # reads: on the file's chains only
            both = issuer.issue(FILE, READ, layout(mine, elsewhere))
            req = storage_pb2.BatchReadReq()
            for chain_id, with_cap in ((mine, cap), (elsewhere, cap), (elsewhere, both), (mine, both)):
                io = req.ios.add(offset=0, length=CHUNK, capability=with_cap)
                io.key.chain_id, io.key.chain_version, io.key.inode_id = chain_id, v[chain_id], FILE
            rsp, payload = await rpc.call(address, STORAGE_SERVICE["BatchRead"], req, timeout=10)
            codes = [r.status.code for r in rsp.results]
            assert codes == [0, StatusCode.STORAGE_CAPABILITY, 0, 0], codes
            assert f"chain {elsewhere}" in rsp.results[1].status.message
            got = [bytes(payload[r.payload_offset : r.payload_offset + r.length]) for r in rsp.results]
            assert got[0] == got[3] == data and got[2] == theirs


async def test_a_users_update_tags_cannot_answer_another_clients_writes(tmp_path):
    """The head answers a retried write from its cache of results by the write's tag: a user who
    learnt another client's id must not get that client's next write answered unapplied."""
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1) as c:
        assert c.admin is not None
        member = await c.storage_client()
        token = await c.admin.add_user(1000, "mallory")
        issuer = CapabilityIssuer(c.secret)
        chain_id = c.chain_ids[0]
        lay = layout(chain_id)
        routing = await c.routing()
        v = routing.chain(chain_id).version
        head = node_address(routing, routing.chain(chain_id).targets[0].target_id)
        victim = 0x1234_5678_9ABC
        async with user_rpc(token) as rpc:
            req = Tags(victim).next(write_req(chain_id, v, FILE, b"mine", issuer.issue(FILE, WRITE, lay)))
            await rpc.call(head, STORAGE_SERVICE["Write"], req, payload=b"mine", timeout=10)
        theirs = b"the victim's write"
        req = Tags(victim).next(write_req(chain_id, v, OTHER, theirs))
        rsp, _ = await member.rpc.call(head, STORAGE_SERVICE["Write"], req, payload=theirs, timeout=10)
        assert rsp.length == len(theirs)
        assert await member.read(chain_id, OTHER, 0, 0, CHUNK) == theirs
        assert await member.read(chain_id, FILE, 0, 0, CHUNK) == b"mine"


async def test_the_storage_client_renews_a_refused_capability_once(tmp_path):
    async with Cluster(tmp_path / "c", storage_nodes=2, replication=2) as c:
        assert c.admin is not None
        token = await c.admin.add_user(1000, "alice")
        issuer = CapabilityIssuer(c.secret)
        chain_id = c.chain_ids[0]
        lay = layout(chain_id)
        renewals: list[tuple[int, int]] = []
        renew_with = issuer

        async def renew(inode_id: int, rights: int) -> bytes:
            renewals.append((inode_id, rights))
            return renew_with.issue(inode_id, rights, lay)

        # what meta issued an hour ago (or with its clock an hour behind): fresh for this client,
        # which times a capability from when it got it, and expired for storage
        caps = CapabilityCache(renew)
        stale = CapabilityIssuer(c.secret, clock=lambda: time.time() - 3600)
        caps.put(FILE, stale.issue(FILE, RIGHTS, lay))
        mgmtd = MgmtdClient([c.mgmtd_address], token=token, timeout_s=10.0)
        routing = RoutingCache(mgmtd, refresh_interval_s=0.25)
        rpc = RpcClient(None, token=token, identity="alice-job")
        try:
            await routing.start()
            client = StorageClient(routing, rpc, retry=RetryPolicy(total_s=30.0), capabilities=caps)
            data = bytes(range(256)) * 300  # two chunks and a bit
            await client.write_range(lambda _: chain_id, FILE, 0, data, CHUNK)
            assert renewals == [(FILE, WRITE)]  # one renewal for the chunks written in parallel
            caps.put(FILE, stale.issue(FILE, READ, lay))
            assert await client.read_range(lambda _: chain_id, FILE, 0, len(data), CHUNK) == data
            assert renewals == [(FILE, WRITE), (FILE, READ)]
            # the renewed ones are kept: no more renewals
            await client.write(chain_id, FILE, 0, 10, b"again", CHUNK)
            buf = bytearray(CHUNK)
            n = (await client.batch_read_into([ReadRequest(chain_id, FILE, 0, 0, CHUNK)], [buf]))[0]
            assert n == CHUNK and bytes(buf[10:15]) == b"again"
            assert len(renewals) == 2

            # meta keeps answering with what storage refuses: the second refusal is the caller's
            caps.put(OTHER, stale.issue(OTHER, RIGHTS, lay))
            renew_with = stale
            with pytest.raises(FS3Error) as e:
                await client.write(chain_id, OTHER, 0, 0, b"nope", CHUNK)
            assert e.value.code == StatusCode.STORAGE_CAPABILITY
            with pytest.raises(FS3Error) as e:
                await client.read(chain_id, OTHER, 0, 0, 4)
            assert e.value.code == StatusCode.STORAGE_CAPABILITY
            assert renewals[2:] == [(OTHER, WRITE), (OTHER, READ), (OTHER, READ)]
            member = await c.storage_client()
            assert await member.read(chain_id, OTHER, 0, 0, 4) == b""
        finally:
            await routing.stop()
            await rpc.close()
            await mgmtd.close()


def test_users_update_tags_never_push_out_cluster_members_retry_records() -> None:
    # A head answers a retried update from its records of recent results, by tag. A user may send
    # updates under ever new tags of its own (user_scoped_id): they push out users' records only.
    cache = ResultCache(capacity=4)
    member = storage_pb2.UpdateTag(client_id=12345, request_id=1, channel=1, seqnum=1)
    cache.store(member, storage_pb2.IOResult(length=7))
    user_tags = [
        storage_pb2.UpdateTag(client_id=user_scoped_id(1000, i), request_id=1, channel=1, seqnum=1)
        for i in range(100)
    ]
    for tag in user_tags:
        cache.store(tag, storage_pb2.IOResult(length=1))
    assert cache.lookup(member) == storage_pb2.IOResult(length=7)
    assert cache.lookup(user_tags[-1]) is not None and cache.lookup(user_tags[0]) is None
