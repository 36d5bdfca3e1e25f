"""The storage service end to end: mgmtd and three storage daemons as real processes on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import sys

import pytest
from cluster import Cluster

from fs3.client.storage_client import STORAGE_SERVICE, ReadRequest, crc32c, node_address
from fs3.errors import FS3Error, StatusCode
from fs3.proto import storage_pb2

pytestmark = pytest.mark.timeout(120)

KiB = 1024
MiB = 1024 * KiB


async def replica_metas(c: Cluster, client, chain_id: int, inode: int) -> dict[int, list[tuple]]:
    """(chunk index, committed version, length, crc, pending) of the inode's chunks on each replica."""
    out = {}
    for tid in c.chain_targets[chain_id]:
        metas = await client.dump_chunk_meta(tid, inode)
        out[tid] = [
            (m.key.chunk_index, m.committed_version, m.length, m.crc32c, m.pending_version) for m in metas
        ]
    return out


async def assert_replicas_identical(c: Cluster, client, chain_id: int, inode: int) -> list[tuple]:
    metas = await replica_metas(c, client, chain_id, inode)
    first = next(iter(metas.values()))
    assert all(m == first for m in metas.values()), metas
    assert all(p == 0 for *_, p in first), first
    return first


async def test_round_trip_across_chunk_boundaries(tmp_path):
    async with Cluster(tmp_path / "c", chains=2) as c:
        client = await c.storage_client()
        chunk = 64 * KiB
        data = os.urandom(5 * chunk + 1234)

        def chain_of(i: int) -> int:
            return c.chain_ids[i % 2]

        results = await client.write_range(chain_of, 7, 3000, data, chunk)
        assert len(results) == 6
        assert await client.read_range(chain_of, 7, 3000, len(data), chunk) == data
        # a range straddling chunk boundaries, and one inside a chunk
        assert (
            await client.read_range(chain_of, 7, chunk - 10, 20, chunk) == data[chunk - 3010 : chunk - 2990]
        )
        assert (
            await client.read(chain_of(2), 7, 2, 100, 50)
            == data[2 * chunk + 100 - 3000 : 2 * chunk + 150 - 3000]
        )
        # short read at a chunk's end, empty read of a missing chunk
        last = (3000 + len(data)) // chunk
        tail_len = (3000 + len(data)) % chunk
        assert len(await client.read(chain_of(last), 7, last, 0, chunk)) == tail_len
        assert await client.read(chain_of(9), 7, 9, 0, 100) == b""
        # batch read over both chains
        got = await client.batch_read([ReadRequest(chain_of(i), 7, i, 0, chunk) for i in range(last + 1)])
        assert b"".join(got)[3000:] == data
        # the same, straight into caller buffers (one node: copied out of one reply; alone: no copy)
        bufs = [bytearray(chunk) for _ in range(last + 2)]
        reqs = [ReadRequest(chain_of(i), 7, i, 0, chunk) for i in range(last + 2)]
        lengths = await client.batch_read_into(reqs, bufs)
        assert lengths == [len(g) for g in got] + [0]
        assert b"".join(bytes(b[:n]) for b, n in zip(bufs, lengths, strict=True))[3000:] == data
        one = bytearray(chunk)
        assert await client.batch_read_into([reqs[1]], [one]) == [chunk]
        assert one == got[1]
        # more than one call may ask of a node (64 MiB, 4096 reads) goes to it in several calls
        many = [ReadRequest(chain_of(i % 6), 7, i % 6, 0, chunk) for i in range(4100)]
        assert b"".join((await client.batch_read(many))[:6])[3000:] == data
        huge = [ReadRequest(chain_of(i), 7, i, 0, 48 << 20) for i in range(4)]  # 192 MiB asked
        assert b"".join(await client.batch_read(huge))[3000:] == data[: 4 * chunk - 3000]
        # file length per chain
        q0 = await client.query_last_chunk(c.chain_ids[0], 7)
        q1 = await client.query_last_chunk(c.chain_ids[1], 7)
        assert (q0.found, q1.found) == (True, True)
        assert q0.chunk_count + q1.chunk_count == 6
        assert max(q0.last_chunk_index, q1.last_chunk_index) == last
        assert q0.total_length + q1.total_length == 3000 + len(data)
        for cid in c.chain_ids:
            await assert_replicas_identical(c, client, cid, 7)

        # truncate into chunk 2, then remove everything
        await asyncio.gather(*(client.truncate_chunks(cid, 7, chunk, 2 * chunk + 10) for cid in c.chain_ids))
        got = await client.read_range(chain_of, 7, 0, 3 * chunk, chunk)
        assert got[3000 : 2 * chunk + 10] == data[: 2 * chunk + 10 - 3000]
        assert got[2 * chunk + 10 :] == bytes(chunk - 10)
        q = [await client.query_last_chunk(cid, 7) for cid in c.chain_ids]
        assert max(x.last_chunk_index for x in q) == 2 and sum(x.total_length for x in q) == 2 * chunk + 10
        removed = sum([await client.remove_chunks(cid, 7, 0, 0) for cid in c.chain_ids])
        assert removed == 3
        assert not (await client.query_last_chunk(c.chain_ids[0], 7)).found
        for cid in c.chain_ids:
            assert await assert_replicas_identical(c, client, cid, 7) == []


def serial_order_exists(writes: list[tuple[int, bytes]], final: bytes, sessions: list[list[int]]) -> bool:
    """Whether applying ``writes`` (write ``w`` fills its range with byte ``w + 1``) one after
    another in some order leaves exactly ``final``. Each byte names the write that came last there,
    so every other write covering it came before: an order exists iff those constraints are acyclic
    and applying the writes in a topological order reproduces ``final``. ``sessions`` lists the
    writes each client issued one after another: their order is fixed too."""
    n = len(writes)
    before: list[set[int]] = [set() for _ in range(n)]  # before[v]: writes that precede v
    for session in sessions:
        for a, b in zip(session, session[1:], strict=False):
            before[b].add(a)
    for i, b in enumerate(final):
        if b == 0:
            continue
        v = b - 1
        for w, (off, data) in enumerate(writes):
            if w != v and off <= i < off + len(data):
                before[v].add(w)
    order: list[int] = []
    done: set[int] = set()
    while len(order) < n:
        ready = [v for v in range(n) if v not in done and before[v] <= done]
        if not ready:
            return False  # a cycle: no serial order explains the bytes
        order += ready
        done.update(ready)
    replay = bytearray()
    for w in order:
        off, data = writes[w]
        if len(replay) < off + len(data):
            replay.extend(bytes(off + len(data) - len(replay)))
        replay[off : off + len(data)] = data
    return bytes(replay) == final


async def test_concurrent_writers_on_one_chunk(tmp_path):
    async with Cluster(tmp_path / "c") as c:
        clients = [await c.storage_client() for _ in range(3)]
        chunk = 64 * KiB
        chain = c.chain_ids[0]
        writes = []
        for w in range(30):
            off = random.randrange(0, 12 * KiB)  # overlapping a lot
            writes.append((off, bytes([w + 1]) * random.randrange(1, 4096)))

        async def writer(k: int) -> None:
            for i in range(k, len(writes), 3):
                off, data = writes[i]
                await clients[k].write(chain, 11, 0, off, data, chunk)

        await asyncio.gather(*(writer(k) for k in range(3)))
        metas = await assert_replicas_identical(c, clients[0], chain, 11)
        assert metas[0][1] == len(writes)  # one committed version per write
        final = await clients[0].read(chain, 11, 0, 0, chunk)
        assert serial_order_exists(writes, final, [list(range(k, len(writes), 3)) for k in range(3)])
        # every replica serves identical bytes
        for tid in c.chain_targets[chain]:
            assert crc32c(final) == next(m.crc32c for m in await clients[0].dump_chunk_meta(tid, 11))


async def test_write_of_several_ranges_reaches_every_replica_as_one_version(tmp_path):
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chunk = 256 * KiB
        chain = c.chain_ids[0]
        model = bytearray(os.urandom(100 * KiB))
        await client.write(chain, 12, 0, 0, bytes(model), chunk)
        for version in (2, 3, 4):
            starts = sorted(random.sample(range(0, 150 * KiB, 8 * KiB), 12))
            ranges = [
                (s + random.randrange(4 * KiB), os.urandom(random.randrange(1, 4 * KiB))) for s in starts
            ]
            data = b"".join(d for _, d in ranges)
            r = await client.write(
                chain, 12, 0, ranges[0][0], data, chunk, extents=[(off, len(d)) for off, d in ranges]
            )
            for off, d in ranges:
                model.extend(bytes(max(0, off + len(d) - len(model))))  # past the end: a hole first
                model[off : off + len(d)] = d
            assert (r.committed_version, r.length, r.crc32c) == (version, len(model), crc32c(bytes(model)))
            metas = await assert_replicas_identical(c, client, chain, 12)
            assert metas == [(0, version, len(model), crc32c(bytes(model)), 0)]
            assert await client.read(chain, 12, 0, 0, chunk) == bytes(model)


async def test_coalesced_reads_each_get_their_own_bytes_or_error(tmp_path):
    async with Cluster(tmp_path / "c", chains=2) as c:
        client = await c.storage_client(coalesce_turns=4)
        chunk = 64 * KiB
        data = os.urandom(4 * chunk)
        await client.write_range(lambda i: c.chain_ids[i % 2], 5, 0, data, chunk)

        async def one(index: int, offset: int, length: int, chain: int | None = None) -> bytes:
            sink = memoryview(bytearray(length))
            io = ReadRequest(c.chain_ids[index % 2] if chain is None else chain, 5, index, offset, length)
            n = await client.read_into(io, sink)
            return bytes(sink[:n])

        # a read alone waits for no other: it goes at once, not in a batch
        assert await one(1, 3, 5) == data[chunk + 3 : chunk + 8] and client.batches == 0
        reads = [(i % 4, (i * 997) % chunk, 1 + i % 3000) for i in range(60)]
        got = await asyncio.gather(*(one(*r) for r in reads))
        assert got == [data[i * chunk + o : i * chunk + min(o + n, chunk)] for i, o, n in reads]
        assert client.batches < len(reads) // 4  # they went out together
        # a read that fails (an unknown chain) fails alone; the others in its batch succeed
        got = await asyncio.gather(
            one(0, 0, 10), one(1, 5, 10, chain=999), one(2, 7, 10), return_exceptions=True
        )
        assert got[0] == data[:10] and got[2] == data[2 * chunk + 7 : 2 * chunk + 17]
        assert isinstance(got[1], FS3Error) and got[1].code == StatusCode.MGMTD_UNKNOWN_CHAIN
        del got

        # and the failed read's error, once dropped, keeps no reference to its buffer (no cycle
        # through the future it waited on)
        async def failing(buf: bytearray) -> None:
            with contextlib.suppress(FS3Error):
                await client.read_into(ReadRequest(999, 5, 1, 5, 10), memoryview(buf))

        buf = bytearray(10)
        base = sys.getrefcount(buf)
        gc.collect()
        gc.disable()
        try:
            # failing among good reads (the batch is retried read by read), and alone in its batch
            await asyncio.gather(one(0, 0, 10), failing(buf), one(2, 7, 10))
            assert sys.getrefcount(buf) == base
            await asyncio.gather(one(0, 0, 10), one(2, 7, 10))
            await asyncio.gather(
                client.read_into(ReadRequest(c.chain_ids[0], 5, 0, 0, 10), memoryview(bytearray(10))),
                failing(buf),
            )
            assert sys.getrefcount(buf) == base
        finally:
            gc.enable()


async def test_bad_input_gets_clear_errors(tmp_path):
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain = c.chain_ids[0]
        with pytest.raises(FS3Error) as e:
            await client.write(chain, 1, 0, 0, b"x", 100_000)  # not a power of two
        assert e.value.code == StatusCode.INVALID_ARGUMENT and "power of two" in e.value.message
        with pytest.raises(FS3Error) as e:
            await client.write(chain, 1, 0, 64 * KiB - 1, b"xy", 64 * KiB)
        assert e.value.code == StatusCode.INVALID_ARGUMENT
        with pytest.raises(FS3Error) as e:
            await client.read(chain, 1, 0, 0, 65 * MiB)
        assert e.value.code == StatusCode.INVALID_ARGUMENT
        with pytest.raises(FS3Error) as e:
            await client.read(999, 1, 0, 0, 10)
        assert e.value.code == StatusCode.MGMTD_UNKNOWN_CHAIN
        with pytest.raises(FS3Error) as e:
            await client.truncate_chunks(chain, 1, 3 * KiB, 10)
        assert e.value.code == StatusCode.INVALID_ARGUMENT


async def test_chain_replication_on_a_backend_network(tmp_path):
    async with Cluster(tmp_path / "c", backend_network=True) as c:
        routing = await c.routing()
        for node in c.nodes:
            ports = [ep.port for ep in routing.node(node.node_id).endpoints]
            assert ports == [node.port, node.backend_port]
        client = await c.storage_client()
        chain = c.chain_ids[0]
        data = os.urandom(100 * KiB)
        await client.write_range(lambda i: chain, 1, 0, data, 64 * KiB)
        assert await client.read_range(lambda i: chain, 1, 0, len(data), 64 * KiB) == data
        metas = await assert_replicas_identical(c, client, chain, 1)
        assert len(metas) == 2


async def test_a_retry_reaching_the_next_head_after_the_first_died_is_applied_once(tmp_path):
    """Every replica remembers the tags of the client updates it committed, so the retry of a write
    whose head died before answering is recognised by the new head: answered, not applied again
    over what another client wrote since."""
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        routing = await c.routing()
        chain = routing.chain(chain_id)
        old_head = chain.targets[0].target_id
        mine, theirs = b"A" * 4096, b"B" * 4096
        req = storage_pb2.WriteReq()
        req.tag.client_id, req.tag.request_id, req.tag.channel, req.tag.seqnum = 99, 7, 3, 5
        req.io.key.chain_id, req.io.key.chain_version, req.io.key.inode_id = chain_id, chain.version, 4
        req.io.type = storage_pb2.UPDATE_WRITE
        req.io.length, req.io.chunk_size, req.io.crc32c = len(mine), 64 * KiB, crc32c(mine)
        write = STORAGE_SERVICE["Write"]
        first, _ = await client.rpc.call(node_address(routing, old_head), write, req, payload=mine)
        assert first.committed_version == 1
        c.kill_storage(c.node_of_target(old_head).index)  # its answer is lost with it, say
        routing = await c.wait_chains(
            lambda ch: ch.head is not None and ch.head.target_id != old_head, what="a new head"
        )
        await client.write(chain_id, 4, 0, 0, theirs, 64 * KiB)  # another writer, after
        assert await client.read(chain_id, 4, 0, 0, 4096) == theirs
        chain = routing.chain(chain_id)
        req.io.key.chain_version = chain.version
        again, _ = await client.rpc.call(
            node_address(routing, chain.head.target_id), write, req, payload=mine
        )
        assert again.committed_version == 1 and again.crc32c == first.crc32c
        assert await client.read(chain_id, 4, 0, 0, 4096) == theirs


async def test_retried_update_is_applied_once_and_space_is_reported(tmp_path):
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        routing = await c.routing()
        chain = routing.chain(chain_id)
        head = node_address(routing, chain.targets[0].target_id)
        data = b"once" * 1000
        req = storage_pb2.WriteReq()
        req.tag.client_id, req.tag.request_id, req.tag.channel, req.tag.seqnum = 99, 7, 3, 5
        req.io.key.chain_id, req.io.key.chain_version, req.io.key.inode_id = chain_id, chain.version, 4
        req.io.type = storage_pb2.UPDATE_WRITE
        req.io.length, req.io.chunk_size, req.io.crc32c = len(data), 64 * KiB, crc32c(data)
        write = STORAGE_SERVICE["Write"]
        first, _ = await client.rpc.call(head, write, req, payload=data)
        again, _ = await client.rpc.call(head, write, req, payload=data)  # a retry: same tag
        assert again == first and first.committed_version == 1
        req.tag.seqnum, req.tag.request_id = 4, 6  # older than what the channel has seen
        with pytest.raises(FS3Error) as e:
            await client.rpc.call(head, write, req, payload=data)
        assert e.value.code == StatusCode.FAILED_PRECONDITION
        req.tag.seqnum, req.tag.request_id = 6, 8  # the next update on the channel
        third, _ = await client.rpc.call(head, write, req, payload=data)
        assert third.committed_version == 2
        metas = await assert_replicas_identical(c, client, chain_id, 4)
        assert metas[0][1] == 2
        for node in c.nodes:
            (space,) = await client.space_info(node.node_id)
            assert space.target_id in node.targets
            assert space.chunks == 1 and space.used >= len(data) and space.capacity >= space.free > 0
