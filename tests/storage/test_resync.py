"""Resync: a sync vouches for one chain version only (a successor that left the chain and came back
meanwhile is not declared up to date), and a chunk the predecessor cannot read does not stall it.

The first tests drive a ResyncWorker and the SyncStart/SyncDone handlers in-process, against a
real chunk engine, with the successor's daemon faked (the RPCs it would get are recorded); the
last ones run real daemons (tests/cluster.py).
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from chain_workload import CHUNK, PinnedClient, verify
from cluster import Cluster, Proc, wait_until
from prometheus_client import CollectorRegistry

from fs3.client.routing import Routing
from fs3.client.storage_client import RetryPolicy, StorageClient, crc32c
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2, mgmtd_pb2, storage_pb2
from fs3.storage import craq, resync
from fs3.storage.async_engine import AsyncChunkEngine
from fs3.storage.chain_ops import chunk_id, split_chunk_id
from fs3.storage.chunk_engine import ChunkEngine
from fs3.storage.craq import Replicator
from fs3.storage.resync import ResyncWorker
from fs3.storage.service import StorageService
from fs3.storage.target_map import ONLINE, UPTODATE, LocalTarget, TargetMap

pytestmark = pytest.mark.timeout(180)

SERVING, SYNCING, OFFLINE = common_pb2.SERVING, common_pb2.SYNCING, common_pb2.OFFLINE
INODE = 61


def routing(version: int, succ_state: int, succ_local: int = ONLINE) -> Routing:
    """Chain 1 at ``version``: target 1 SERVING (node 1), then target 2 (node 2) in ``succ_state``,
    last heard reporting ``succ_local``."""
    info = mgmtd_pb2.RoutingInfo(version=version)
    chain = info.chains.add(chain_id=1, version=version)
    for tid, state, local in ((1, SERVING, UPTODATE), (2, succ_state, succ_local)):
        chain.targets.add(target_id=tid, public_state=state)
        info.targets.add(target_id=tid, node_id=tid, chain_id=1, public_state=state, local_state=local)
        node = info.nodes.add(node_id=tid, type=common_pb2.NODE_STORAGE)
        node.endpoints.add(host="127.0.0.1", port=9000 + tid, transport="tcp")
    return Routing(info)


class FakeSuccessor:
    """The RPC client of the predecessor's daemon, answering as a successor holding no chunks."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, bytes | None]] = []

    async def call(self, address, method, req, *, payload=None, **_):  # type: ignore[no-untyped-def]
        name = method.name
        self.calls.append((name, req, None if payload is None else bytes(payload)))
        if name == "DumpChunkMeta":
            return storage_pb2.DumpChunkMetaRsp(), None
        if name == "Update":
            return storage_pb2.IOResult(), None
        return None, None

    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]


@pytest.fixture
async def predecessor(tmp_path: Path):
    """(worker, its target 1 holding one chunk, the fake successor), chain 1 at version 1 with
    target 2 SYNCING."""
    executor = ThreadPoolExecutor(4)
    engine = AsyncChunkEngine(ChunkEngine(tmp_path / "t1"), executor)
    t = LocalTarget(1, tmp_path / "t1", engine)
    targets = TargetMap(1, [t])
    targets.apply_routing(routing(1, SYNCING))
    t.local_state = UPTODATE  # (a serving target past the startup protocol)
    rpc = FakeSuccessor()
    rep = Replicator(targets, None, rpc)  # type: ignore[arg-type]
    worker = ResyncWorker(rep, registry=CollectorRegistry())
    cid = chunk_id(INODE, 0)
    meta = await engine.update(cid, 0, b"old content", chunk_size=CHUNK, chain_ver=1)
    await engine.commit(cid, meta.pending_ver)
    try:
        yield worker, t, rpc
    finally:
        await engine.close()
        executor.shutdown()


async def test_a_syncing_successor_is_left_behind_only_where_mgmtd_cannot_make_it_serving(
    predecessor,
) -> None:
    """An update a SYNCING successor kept failing commits without it (craq.SYNCING_FORWARD_GRACE_S)
    only while that cannot reach a SERVING replica: not once its resync sent SyncDone at this
    chain version, nor while mgmtd has it reporting UPTODATE (mgmtd makes it SERVING on that)."""
    worker, t, _ = predecessor
    rep = worker.replicator
    why = FS3Error(StatusCode.RPC_CONNECTION_CLOSED, "connection closed")

    def left_behind(version: int, succ_local: int) -> bool:
        worker.targets.apply_routing(routing(version, SYNCING, succ_local))
        return rep._skip_syncing(t, worker.targets.chain(1), 2, chunk_id(INODE, 0), 2, why)

    assert left_behind(1, ONLINE)
    assert rep.forward_skips(1, 2) == 1
    assert not left_behind(1, UPTODATE)  # a SyncDone at an older chain version, say
    rep.sync_done(1, 2, 1)
    assert not left_behind(1, ONLINE)
    assert left_behind(2, ONLINE)  # out and back since: resynced anew
    assert rep.forward_skips(1, 2) == 2
    worker.targets.apply_routing(routing(3, SYNCING, ONLINE))
    t.local_state = ONLINE  # not up to date itself: not the one resyncing the successor
    assert not rep._skip_syncing(t, worker.targets.chain(1), 2, chunk_id(INODE, 0), 2, why)


async def test_a_sync_during_which_an_update_was_left_behind_ends_without_sync_done(predecessor) -> None:
    worker, t, rpc = predecessor
    rep = worker.replicator
    dump = rpc.call

    async def call(address, method, req, **kw):  # type: ignore[no-untyped-def]
        if method.name == "DumpChunkMeta":  # an update left behind while the sync runs
            assert rep._skip_syncing(t, worker.targets.chain(1), 2, chunk_id(INODE, 5), 1, FS3Error(0, ""))
        return await dump(address, method, req, **kw)

    rpc.call = call  # type: ignore[method-assign]
    with pytest.raises(FS3Error) as e:
        await worker._sync_once(t, 2, 1, "2")
    assert e.value.code == StatusCode.STORAGE_ROUTING_STALE and "starting over" in e.value.message
    assert "SyncDone" not in rpc.names()
    rpc.call = dump  # type: ignore[method-assign]
    await worker._sync_once(t, 2, 1, "2")  # nothing left behind during this one
    assert rpc.names()[-1] == "SyncDone"


async def test_a_sync_sends_what_the_successor_lacks_then_sync_done(predecessor) -> None:
    worker, t, rpc = predecessor
    stats = await worker._sync_once(t, 2, worker.targets.chain(t.chain_id).version, "2")
    assert stats == (1, 1, 0, 0)
    assert rpc.names() == ["SyncStart", "DumpChunkMeta", "Update", "SyncDone"]
    _, update, payload = rpc.calls[2]
    assert payload == b"old content" and update.io.crc32c == crc32c(b"old content")
    _, done, _ = rpc.calls[3]
    assert (done.target_id, done.chain_id, done.chain_version) == (2, 1, 1)


@pytest.mark.parametrize("differs", [False, True], ids=["same-bytes", "other-bytes"])
async def test_a_successor_copy_with_other_bytes_is_sent_again(predecessor, differs: bool) -> None:
    """A successor's copy with the committed version and length of ours but other bytes (its
    CRC32C differs) is not ours: it is sent again; one that matches in every way is not."""
    worker, t, rpc = predecessor
    cid = chunk_id(INODE, 0)
    theirs = storage_pb2.ChunkMeta(
        committed_version=1,
        length=len(b"old content"),
        crc32c=crc32c(b"OLD CONTENT" if differs else b"old content"),
        chunk_size=CHUNK,
        chunk_id=cid,
    )
    theirs.key.inode_id, theirs.key.chunk_index = split_chunk_id(cid)
    real_call = rpc.call

    async def call(address, method, req, *, payload=None, **kw):  # type: ignore[no-untyped-def]
        if method.name == "DumpChunkMeta":
            rpc.calls.append((method.name, req, None))
            return storage_pb2.DumpChunkMetaRsp(chunks=[theirs]), None
        return await real_call(address, method, req, payload=payload, **kw)

    rpc.call = call
    await worker._sync_once(t, 2, worker.targets.chain(t.chain_id).version, "2")
    sent = [payload for name, _, payload in rpc.calls if name == "Update"]
    assert sent == ([b"old content"] if differs else [])
    assert rpc.names()[-1] == "SyncDone"


async def test_a_successor_that_left_the_chain_during_the_comparison_is_not_declared_synced(
    predecessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The successor restarts while the predecessor compares metadata: OFFLINE at version 2 (the
    predecessor commits a write without it), SYNCING again at 3. The list of chunks to copy,
    made from the metadata of before, misses that write: the sync must stop, not send SyncDone."""
    worker, t, rpc = predecessor
    entered, release = threading.Event(), threading.Event()
    real = resync._differing

    def slow_differing(*args):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(30)
        return real(*args)

    monkeypatch.setattr(resync, "_differing", slow_differing)
    sync = asyncio.create_task(worker._sync_once(t, 2, worker.targets.chain(t.chain_id).version, "2"))
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        worker.targets.apply_routing(routing(2, OFFLINE))
        missed = chunk_id(INODE, 1)  # committed while the successor was out of the chain
        meta = await t.engine.update(missed, 0, b"missed", chunk_size=CHUNK, chain_ver=2)
        await t.engine.commit(missed, meta.pending_ver)
        worker.targets.apply_routing(routing(3, SYNCING))
    finally:
        release.set()
    with pytest.raises(FS3Error) as err:
        await sync
    assert err.value.code is StatusCode.STORAGE_ROUTING_STALE
    assert "SyncDone" not in rpc.names() and "Update" not in rpc.names()
    # the next sync starts afresh at version 3 and finds the missed chunk
    rpc.calls.clear()
    assert await worker._sync_once(t, 2, worker.targets.chain(t.chain_id).version, "2") == (2, 2, 0, 0)
    assert sorted(p for name, _, p in rpc.calls if name == "Update") == [b"missed", b"old content"]
    assert rpc.calls[-1][0] == "SyncDone" and rpc.calls[-1][1].chain_version == 3


class _HoldingSuccessor(FakeSuccessor):
    """A successor holding ``meta``'s committed version of its chunk."""

    def __init__(self, meta) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.meta = meta

    async def call(self, address, method, req, *, payload=None, **kw):  # type: ignore[no-untyped-def]
        if method.name != "DumpChunkMeta":
            return await super().call(address, method, req, payload=payload, **kw)
        self.calls.append(("DumpChunkMeta", req, None))
        m = self.meta
        rsp = storage_pb2.DumpChunkMetaRsp()
        rsp.chunks.add(
            chunk_id=m.chunk_id,
            committed_version=m.committed_ver,
            length=m.committed.length,
            crc32c=m.committed.crc,
            chunk_size=m.chunk_size,
        )
        return rsp, None


async def test_a_write_the_tail_commits_across_a_successors_return_reaches_it(
    predecessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tail (its successor OFFLINE) writes and commits a client's write in one trip to its
    I/O threads; meanwhile the successor comes back SYNCING and the resync compares metadata
    before that commit lands: the chunk looks the same on both, nothing is copied, SyncDone. The
    write must reach the successor before the client is answered (it served the old version, and
    was all that was left of the write should the predecessor fail)."""
    worker, t, _ = predecessor
    rep = worker.replicator
    cid = chunk_id(INODE, 0)
    before = await t.engine.get_meta(cid)
    rpc = _HoldingSuccessor(before)
    rep.rpc = rpc
    worker.targets.apply_routing(routing(2, OFFLINE))  # this target is the tail
    entered, release = threading.Event(), threading.Event()
    real = craq.apply_op

    def slow_apply_op(*args):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(30)  # a slow disk: the write-and-commit takes a while
        return real(*args)

    monkeypatch.setattr(craq, "apply_op", slow_apply_op)
    req = storage_pb2.WriteReq()
    req.io.key.chain_id, req.io.key.chain_version = 1, 2
    req.io.key.inode_id, req.io.key.chunk_index = INODE, 0
    req.io.type, req.io.chunk_size, req.io.offset, req.io.length = storage_pb2.UPDATE_WRITE, CHUNK, 4, 3
    req.io.crc32c = crc32c(b"NEW")
    write = asyncio.create_task(rep.client_update(req, memoryview(b"NEW")))
    try:
        assert await asyncio.to_thread(entered.wait, 30)
        monkeypatch.setattr(craq, "apply_op", real)
        worker.targets.apply_routing(routing(3, SYNCING))  # the successor is back
        await worker._sync_once(t, 2, worker.targets.chain(t.chain_id).version, "2")
        assert rpc.names() == ["SyncStart", "DumpChunkMeta", "SyncDone"]  # nothing looked missing
    finally:
        release.set()
    result = await write
    assert result.committed_version == before.committed_ver + 1
    sent = [(r.io.update_version, p) for name, r, p in rpc.calls if name == "Update"]
    assert sent == [(before.committed_ver + 1, b"old NEWtent")]


@pytest.fixture
async def successor(tmp_path: Path):
    """(service, target 2): the successor's side, chain 1 at version 1 with target 2 SYNCING."""
    t = LocalTarget(2, tmp_path / "t2", engine=None)  # type: ignore[arg-type]
    targets = TargetMap(2, [t])
    targets.apply_routing(routing(1, SYNCING))
    t.local_state = ONLINE
    rep = Replicator(targets, None, None)  # type: ignore[arg-type]
    yield StorageService(rep, registry=CollectorRegistry()), t


def sync_req(cls, version: int):  # type: ignore[no-untyped-def]
    return cls(target_id=2, chain_id=1, chain_version=version)


async def test_sync_done_needs_the_sync_start_of_its_chain_version(successor) -> None:
    service, t = successor
    ctx = SimpleNamespace(peer="predecessor", user=None)  # a cluster member
    # no SyncStart since this daemon started: a sync begun before a restart vouches for nothing
    with pytest.raises(FS3Error) as err:
        await service.sync_done(sync_req(storage_pb2.SyncDoneReq, 1), None, ctx)
    assert err.value.code is StatusCode.STORAGE_ROUTING_STALE
    assert t.local_state == ONLINE
    await service.sync_start(sync_req(storage_pb2.SyncStartReq, 1), None, ctx)
    # the target leaves the chain and comes back SYNCING: the sync started at version 1 missed
    # whatever the chain committed at version 2
    service.targets.apply_routing(routing(2, OFFLINE))
    service.targets.apply_routing(routing(3, SYNCING))
    with pytest.raises(FS3Error) as err:
        await service.sync_done(sync_req(storage_pb2.SyncDoneReq, 3), None, ctx)
    assert err.value.code is StatusCode.STORAGE_ROUTING_STALE
    assert "version 1" in err.value.message
    assert t.local_state == ONLINE
    await service.sync_start(sync_req(storage_pb2.SyncStartReq, 3), None, ctx)
    await service.sync_done(sync_req(storage_pb2.SyncDoneReq, 3), None, ctx)
    assert t.local_state == UPTODATE


# -- real daemons: a chunk the predecessor cannot read ---------------------------------------------


async def write_chunks(client, chain_id: int, count: int, size: int) -> dict[int, bytearray]:  # type: ignore[no-untyped-def]
    """Chunks 0 .. count-1 of INODE, ``size`` random bytes each, written: the model of them."""
    model = {i: bytearray(os.urandom(size)) for i in range(count)}
    for i, data in model.items():
        await client.write(chain_id, INODE, i, 0, bytes(data), CHUNK)
    return model


def lose_chunk_file(c: Cluster, target_id: int, index: int) -> None:
    """Delete a target's data files of chunk ``index`` of INODE (a lost file, not a failed disk)."""
    path = c.node_of_target(target_id).targets[target_id]
    files = list((path / "chunks").glob(f"*/{chunk_id(INODE, index).hex()}.*"))
    assert files, f"target {target_id} has no file of chunk {index}"
    for f in files:
        f.unlink()


def metric(text: str, name: str, target: int) -> float:
    """The value of ``name{target="<target>"}`` in a /metrics text (0 when absent)."""
    prefix = f'{name}{{target="{target}"}} '
    return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


async def stop_and_read_chunks(c: Cluster, target_id: int) -> dict[int, bytes]:
    """Kill the daemon of ``target_id`` and read every committed chunk of INODE off its disk."""
    node = c.node_of_target(target_id)
    c.kill_storage(node.index)
    with ChunkEngine(node.targets[target_id]) as eng:
        return {
            split_chunk_id(m.chunk_id)[1]: bytes(eng.read(m.chunk_id).data)
            for m in eng.dump_metadata(chunk_id(INODE, 0), chunk_id(INODE + 1, 0))
            if m.committed is not None
        }


async def test_a_chunk_the_predecessor_cannot_read_is_resynced_from_another_replica(tmp_path) -> None:
    async with Cluster(tmp_path / "c", metrics=True) as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        model = await write_chunks(client, chain_id, 4, CHUNK // 4)
        head, middle, tail = (t.target_id for t in (await c.routing()).chain(chain_id).targets)
        c.kill_storage(c.node_of_target(tail).index)
        await c.wait_chains(lambda ch: len(ch.serving) == 2, what="the tail to go")
        for i in (2, 4):  # chunk 2 changes and chunk 4 is new while the tail is away
            model[i] = bytearray(os.urandom(CHUNK // 2))
            await client.write(chain_id, INODE, i, 0, bytes(model[i]), CHUNK)
        lose_chunk_file(c, middle, 4)  # the middle resyncs the tail; the head still has chunk 4
        await c.restart_storage(c.node_of_target(tail).index)
        await c.wait_all_serving(90)
        await verify(c, client, chain_id, INODE, model)  # the middle's copy was repaired too
        text = await c.scrape(c.node_of_target(middle).index)
        assert metric(text, "fs3_storage_sync_repaired_chunks_total", tail) == 1, text
        assert metric(text, "fs3_storage_sync_lost_chunks_total", tail) == 0, text
        assert await stop_and_read_chunks(c, tail) == {i: bytes(d) for i, d in model.items()}


async def test_a_chunk_no_replica_can_read_is_recorded_lost_and_the_resync_finishes(tmp_path) -> None:
    """Where no replica can read a chunk's committed version, the resync finishes and records that
    version on the successor as lost: its reads there fail as on the others, instead of serving
    the older version it held (chunk 2) or a hole (chunk 4, which it did not have)."""
    async with Cluster(tmp_path / "c", storage_nodes=2, replication=2, metrics=True) as c:
        client = await c.storage_client()
        pinned = await c.storage_client()
        pinned.__class__ = PinnedClient
        chain_id = c.chain_ids[0]
        model = await write_chunks(client, chain_id, 4, CHUNK // 4)
        head, tail = (t.target_id for t in (await c.routing()).chain(chain_id).targets)
        pinned.pin = tail
        c.kill_storage(c.node_of_target(tail).index)
        await c.wait_chains(lambda ch: len(ch.serving) == 1, what="the tail to go")
        lost = {i: os.urandom(CHUNK // 2) for i in (2, 4)}
        for i, data in lost.items():
            await client.write(chain_id, INODE, i, 0, data, CHUNK)
            lose_chunk_file(c, head, i)  # the only copy of this version
        del model[2]
        await c.restart_storage(c.node_of_target(tail).index)
        await c.wait_all_serving(90)
        text = await c.scrape(c.node_of_target(head).index)
        assert metric(text, "fs3_storage_sync_lost_chunks_total", tail) == 2, text
        for i in lost:  # the tail (pinned) served its older chunk 2 and a hole for chunk 4
            for reader in (pinned, client):
                with pytest.raises(FS3Error) as err:
                    got = await reader.read(chain_id, INODE, i, 0, CHUNK)
                    pytest.fail(f"chunk {i} read {len(got)} bytes, {'older' if got else 'a hole'}")
                assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH, (i, err.value)
        tail_metas = {m.key.chunk_index: m for m in await client.dump_chunk_meta(tail, INODE)}
        assert sorted(tail_metas) == [0, 1, 2, 3, 4]
        for i, data in model.items():
            assert (tail_metas[i].length, tail_metas[i].crc32c, tail_metas[i].lost) == (
                len(data),
                crc32c(data),
                False,
            )
        for i, data in lost.items():
            m = tail_metas[i]
            assert (m.length, m.crc32c, m.lost, m.pending_version) == (len(data), crc32c(data), True, 0), i
            with pytest.raises(FS3Error) as err:  # a write that keeps some of the lost bytes
                await client.write(chain_id, INODE, i, 10, b"patch", CHUNK)
            assert err.value.code is StatusCode.STORAGE_CHECKSUM_MISMATCH
        for i, data in model.items():
            assert await pinned.read(chain_id, INODE, i, 0, CHUNK) == bytes(data)
        assert any(
            "resync records a chunk no replica can read" in p.log() and chunk_id(INODE, 4).hex() in p.log()
            for p in c.procs
        ), c.logs()
        # the next whole write of a lost chunk makes it whole again on both
        for i in lost:
            model[i] = bytearray(os.urandom(CHUNK // 2))
            await client.write(chain_id, INODE, i, 0, bytes(model[i]), CHUNK)
        await verify(c, client, chain_id, INODE, model)
        assert await stop_and_read_chunks(c, tail) == {i: bytes(d) for i, d in model.items()}


def damage_chunk_file(c: Cluster, target_id: int, index: int) -> None:
    """Flip bytes in the middle of a target's data file of chunk ``index`` of INODE (bit rot)."""
    path = c.node_of_target(target_id).targets[target_id]
    (f,) = (path / "chunks").glob(f"*/{chunk_id(INODE, index).hex()}.*")
    with open(f, "r+b") as fh:
        fh.seek(f.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


async def test_an_update_at_a_head_whose_copy_is_damaged_repairs_it_from_the_chain(tmp_path) -> None:
    """A small write builds on the chunk's committed bytes: at a head whose copy fails its
    checksums (or whose file is gone), it failed, again and again, although the other replicas
    held good copies. The head repairs its copy from theirs and the write goes on."""
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        model = await write_chunks(client, chain_id, 2, CHUNK // 2)
        head = (await c.routing()).chain(chain_id).targets[0].target_id
        lose_chunk_file(c, head, 0)
        damage_chunk_file(c, head, 1)
        # two writes to each chunk at once: the one that waits while the other repairs goes on
        writes = [(i, off) for i in model for off in (100, 300)]
        await asyncio.gather(
            *(client.write(chain_id, INODE, i, off, b"HELLOWORLD", CHUNK) for i, off in writes)
        )
        for i, off in writes:
            model[i][off : off + 10] = b"HELLOWORLD"
        await verify(c, client, chain_id, INODE, model)
        assert await stop_and_read_chunks(c, head) == {i: bytes(d) for i, d in model.items()}


async def test_a_read_that_finds_a_damaged_copy_repairs_it_and_counts_it(tmp_path) -> None:
    """A read of a replica whose copy fails its checksums (or whose file is gone) is answered
    from another replica; the damaged copy was left so until a whole-chunk write, unseen on the
    storage side. The daemon counts it, logs it and repairs it from another replica."""
    async with Cluster(tmp_path / "c", metrics=True) as c:
        client = await c.storage_client()
        pinned = await c.storage_client()
        pinned.__class__ = PinnedClient
        chain_id = c.chain_ids[0]
        model = await write_chunks(client, chain_id, 2, CHUNK // 2)
        tail = (await c.routing()).chain(chain_id).targets[-1].target_id
        damage_chunk_file(c, tail, 0)
        lose_chunk_file(c, tail, 1)
        pinned.pin = tail
        for i, data in model.items():
            assert await pinned.read(chain_id, INODE, i, 0, CHUNK) == bytes(data)
        index = c.node_of_target(tail).index

        async def repaired() -> bool:
            return c.nodes[index].proc.log().count("repaired a damaged chunk from another replica") == 2

        await wait_until(repaired, 30, "the tail's copies to be repaired")
        assert c.nodes[index].proc.log().count("read found a damaged copy, repairing it") == 2
        scraped = await c.scrape(index)
        assert metric(scraped, "fs3_storage_damaged_reads_total", tail) == 2
        # the two reads failed inside OK batch reads: counted by code (the data-error alert's)
        failed = 'fs3_storage_read_failures_total{code="STORAGE_CHECKSUM_MISMATCH"} '
        counted = [float(line[len(failed) :]) for line in scraped.splitlines() if line.startswith(failed)]
        assert counted == [2.0], counted
        assert await stop_and_read_chunks(c, tail) == {i: bytes(d) for i, d in model.items()}


async def test_a_copy_whose_file_went_missing_while_its_daemon_was_down_is_resynced(tmp_path) -> None:
    """A daemon restarting with a data file missing (an operator, fsck) logged it and then passed
    the resync, which compares metadata only: the damaged copy stayed until a whole-chunk write.
    DumpChunkMeta says the copy is damaged and the resync sends the chain's."""
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        model = await write_chunks(client, chain_id, 3, CHUNK // 2)
        tail = (await c.routing()).chain(chain_id).targets[-1].target_id
        c.kill_storage(c.node_of_target(tail).index)
        await c.wait_chains(lambda ch: len(ch.serving) == 2, what="the tail to go")
        lose_chunk_file(c, tail, 1)
        await c.restart_storage(c.node_of_target(tail).index)
        await c.wait_all_serving(60)
        await verify(c, client, chain_id, INODE, model)
        assert await stop_and_read_chunks(c, tail) == {i: bytes(d) for i, d in model.items()}


async def test_replicas_that_are_all_damaged_do_not_set_each_others_repairs_off(tmp_path) -> None:
    """A repair reads the other replicas' copies; one whose copy is damaged too took that read
    for a failed read of its own and started a repair, which read the first, and so on: dozens of
    repairs within a second from one client read. A read made for a repair starts none."""
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        await client.write(chain_id, INODE, 0, 0, os.urandom(CHUNK // 2), CHUNK)
        for target in c.chain_targets[chain_id]:
            lose_chunk_file(c, target, 0)
        with pytest.raises(FS3Error) as e:
            await client.read(chain_id, INODE, 0, 0, CHUNK)
        assert e.value.code == StatusCode.STORAGE_CHECKSUM_MISMATCH
        await asyncio.sleep(1.0)
        started = sum(n.proc.log().count("read found a damaged copy") for n in c.nodes)
        assert started == 3, started  # one per replica the client read


async def test_a_truncate_at_a_head_whose_copy_is_damaged_repairs_it_from_the_chain(tmp_path) -> None:
    """A truncate that cuts inside a chunk reads the bytes it keeps: at a head whose copy is
    damaged it failed (EIO on the file's truncate) while the other replicas held good copies."""
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        data = os.urandom(CHUNK // 2)
        await client.write(chain_id, INODE, 0, 0, data, CHUNK)
        head = (await c.routing()).chain(chain_id).targets[0].target_id
        damage_chunk_file(c, head, 0)
        rsp = await client.truncate_chunks(chain_id, INODE, CHUNK, CHUNK // 4 + 5)
        assert rsp.truncated
        model = {0: bytearray(data[: CHUNK // 4 + 5])}
        await verify(c, client, chain_id, INODE, model)
        assert await stop_and_read_chunks(c, head) == {0: bytes(model[0])}


async def test_scrub_finds_and_repairs_damaged_copies_nobody_reads(tmp_path) -> None:
    """Reads repair the damaged copies they meet; a copy nobody reads rotted unseen. The scrubber
    reads every committed copy back and repairs the damaged ones from another replica."""
    scrub = {"scrub_mib_per_s": 1000.0, "scrub_start_delay_s": 0.2, "scrub_interval_s": 0.5}
    async with Cluster(tmp_path / "c", metrics=True, storage_extra=scrub) as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        model = await write_chunks(client, chain_id, 3, CHUNK // 2)
        # a chunk of 9 MiB, read back in windows: damaged in its middle one
        model[3] = bytearray(os.urandom(9 << 20))
        await client.write(chain_id, INODE, 3, 0, bytes(model[3]), 16 << 20)
        _, middle, tail = (t.target_id for t in (await c.routing()).chain(chain_id).targets)
        damage_chunk_file(c, tail, 0)
        damage_chunk_file(c, tail, 3)
        lose_chunk_file(c, middle, 1)

        async def repaired() -> bool:
            texts = {t: await c.scrape(c.node_of_target(t).index) for t in (middle, tail)}
            want = {middle: 1, tail: 2}
            return all(
                metric(texts[t], "fs3_storage_scrub_repaired_chunks_total", t) == want[t] for t in texts
            )

        await wait_until(repaired, 30, "scrub to repair both copies")
        for target in (middle, tail):
            assert await stop_and_read_chunks(c, target) == {i: bytes(d) for i, d in model.items()}


class DescriptorLimit:
    """The open-files limit of a daemon's process: ``clamp`` leaves it no descriptor for a new
    file or connection, ``restore`` gives it its own back."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.soft, self.hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)

    def clamp(self) -> None:
        used = len(os.listdir(f"/proc/{self.pid}/fd"))
        resource.prlimit(self.pid, resource.RLIMIT_NOFILE, (used, self.hard))

    def restore(self) -> None:
        resource.prlimit(self.pid, resource.RLIMIT_NOFILE, (self.soft, self.hard))


async def head_short_of_descriptors(
    c: Cluster, client: StorageClient, chain_id: int
) -> tuple[dict[int, bytearray], int, Proc, DescriptorLimit]:
    """Two chunks written, then the head's daemon left with no descriptor for a new chunk file or
    connection (its connections along the chain are open already): the model, the head, its
    daemon, and its limit (clamped)."""
    model = await write_chunks(client, chain_id, 2, CHUNK // 2)
    # writes at once: every pooled connection along the chain is open before the limit
    await asyncio.gather(*(client.write(chain_id, INODE, i, 0, bytes(model[i]), CHUNK) for i in (0, 1) * 4))
    head = (await c.routing()).chain(chain_id).targets[0].target_id
    proc = c.node_of_target(head).proc
    assert proc is not None and proc.popen is not None
    limit = DescriptorLimit(proc.popen.pid)
    limit.clamp()
    return model, head, proc, limit


async def test_a_head_short_of_file_descriptors_is_resynced_instead_of_failed_for_good(
    tmp_path: Path,
) -> None:
    """A parallel whole-chunk write that failed at the head for a passing reason (EMFILE: the
    storage daemon at its open-files limit) took the head's target offline until its daemon was
    restarted, though the engine was sound. The target now leaves its chain, is resynced from its
    predecessor, and serves again with nothing restarted; no replica serves a stale chunk."""
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        model, head, proc, limit = await head_short_of_descriptors(c, client, chain_id)
        again = []

        async def write_more() -> None:
            for i in range(2, 6):  # whole chunks from offset 0: stored and forwarded at once
                model[i] = bytearray(os.urandom(CHUNK))
                try:
                    await client.write(chain_id, INODE, i, 0, bytes(model[i]), CHUNK)
                except FS3Error:  # anything else the head needed a descriptor for: written again
                    again.append(i)

        writes = asyncio.create_task(write_more())
        try:
            await c.wait_chains(lambda ch: head not in ch.serving, what="the head to leave its chain")
        finally:
            # At once, not after the writes: once out, the target is SYNCING at the chain's tail,
            # and a write forwarded to it waits (retried for the write's whole budget) while it
            # cannot accept its predecessor's connection.
            limit.restore()
            await writes
        for i in again:
            await client.write(chain_id, INODE, i, 0, bytes(model[i]), CHUNK)
        routing = await c.wait_all_serving(90)
        assert head in routing.chain(chain_id).serving
        assert proc.popen.poll() is None  # the same process: nothing was restarted
        await verify(c, client, chain_id, INODE, model)


async def test_a_syncing_target_that_cannot_take_writes_does_not_hold_up_its_chain(tmp_path: Path) -> None:
    """A target out of its chain to be resynced (SYNCING, at the tail) whose daemon could not
    accept its predecessor's connection (out of descriptors) held up every write of its chain: the
    predecessor retried each for forward_timeout_s (20 s here, 30 s by default), and the client's
    deadline ran out. The predecessor now leaves it behind after SYNCING_FORWARD_GRACE_S, and the
    resync of it starts over; once it has descriptors again it is resynced, writes included."""
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client(retry=RetryPolicy(total_s=15.0, rpc_timeout_s=10.0))
        chain_id = c.chain_ids[0]
        model, head, proc, limit = await head_short_of_descriptors(c, client, chain_id)
        again = []
        try:
            model[2] = bytearray(os.urandom(CHUNK))  # fails at the head: it leaves its chain
            try:
                await client.write(chain_id, INODE, 2, 0, bytes(model[2]), CHUNK)
            except FS3Error:
                again.append(2)
            await c.wait_chains(
                lambda ch: ch.state_of(head) == SYNCING, what="the old head to be SYNCING at the tail"
            )
            # its predecessor knows it (and tries to resync it): it forwards the writes below to it
            await wait_until(
                lambda: f"to={head} chain_version" in c.logs(tail=1 << 30), what="a resync of the old head"
            )
            limit.clamp()  # again: descriptors it closed since are not for its predecessor either
            for i in range(3, 5):
                model[i] = bytearray(os.urandom(CHUNK))
                await client.write(chain_id, INODE, i, 0, bytes(model[i]), CHUNK)
                model[i][:4096] = os.urandom(4096)  # and a partial write, which the tail applies
                await client.write(chain_id, INODE, i, 0, bytes(model[i][:4096]), CHUNK)
            assert (await c.routing()).chain(chain_id).state_of(head) == SYNCING  # not resynced yet
        finally:
            limit.restore()
        assert "update not forwarded to a SYNCING target" in c.logs(tail=1 << 30)
        for i in again:
            await client.write(chain_id, INODE, i, 0, bytes(model[i]), CHUNK)
        routing = await c.wait_all_serving(90)
        assert head in routing.chain(chain_id).serving
        assert proc.popen is not None and proc.popen.poll() is None
        await verify(c, client, chain_id, INODE, model)


async def test_a_replica_short_of_descriptors_for_an_update_leaves_its_chain(tmp_path: Path) -> None:
    """A middle replica that could not open a chunk's file (its daemon out of descriptors) failed
    the update, target staying online: its predecessor retried the forward for forward_timeout_s
    and every write of the chain failed for as long as the shortage lasted. It now leaves its chain
    (OFFLINE, as for a parallel write's local failure: TargetMap.rejoin), writes go on without it
    (then SYNCING, it is left behind), and it is resynced once it has descriptors again."""
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client(retry=RetryPolicy(total_s=15.0, rpc_timeout_s=10.0))
        chain_id = c.chain_ids[0]
        model = await write_chunks(client, chain_id, 3, CHUNK // 2)
        await asyncio.gather(
            *(client.write(chain_id, INODE, i, 0, bytes(model[i]), CHUNK) for i in (0, 1, 2) * 3)
        )
        middle = (await c.routing()).chain(chain_id).targets[1].target_id
        proc = c.node_of_target(middle).proc
        assert proc is not None and proc.popen is not None
        limit = DescriptorLimit(proc.popen.pid)
        limit.clamp()
        try:
            for i in (0, 1, 2):  # in the middle of each chunk: applied in turn along the chain
                model[i][1000:5000] = os.urandom(4000)
                await client.write(chain_id, INODE, i, 1000, bytes(model[i][1000:5000]), CHUNK)
            assert middle not in (await c.routing()).chain(chain_id).serving
        finally:
            limit.restore()
        assert f"target leaves its chain to be resynced target_id={middle}" in c.logs(tail=1 << 30)
        routing = await c.wait_all_serving(90)
        assert middle in routing.chain(chain_id).serving
        assert proc.popen.poll() is None
        await verify(c, client, chain_id, INODE, model)
