"""Linearizable reads across an admin operation that takes a SERVING target out of its chain: the
target drains first (still written to, serving no reads once its daemon knows), and mgmtd makes
the change only after that, so a reader still on the older routing never reads, from the target
taken out, data older than a write acknowledged before its read began. Real daemons, deployed-like
intervals (storage polls routing every second, heartbeats every two)."""

from __future__ import annotations

import time

import pytest
from cluster import Cluster

from fs3.client.storage_client import STORAGE_SERVICE, node_address
from fs3.proto import common_pb2, storage_pb2

pytestmark = pytest.mark.timeout(120)

CHUNK = 1 << 20
INODE = 7


async def test_a_reader_on_older_routing_never_reads_a_target_taken_out_stale(tmp_path) -> None:
    async with Cluster(
        tmp_path,
        storage_nodes=3,
        chains=1,
        mgmtd_extra={"heartbeat_timeout_s": 10.0},
        storage_extra={"heartbeat_interval_s": 2.0, "routing_refresh_interval_s": 1.0},
    ) as c:
        cid = c.chain_ids[0]
        tail = c.chain_targets[cid][-1]
        writer = await c.storage_client()
        await writer.write(cid, INODE, 0, 0, b"%08d" % 0, CHUNK)
        reader = await c.storage_client()
        await reader.routing.stop()  # a reader between two polls: routing as of before
        old = reader.routing.routing
        address = node_address(old, tail)

        async def read_tail() -> bytes | None:
            req = storage_pb2.BatchReadReq()
            io = req.ios.add(offset=0, length=8)
            io.key.chain_id, io.key.chain_version = cid, old.chain(cid).version
            io.key.inode_id, io.key.chunk_index = INODE, 0
            rsp, payload = await reader.rpc.call(address, STORAGE_SERVICE["BatchRead"], req, timeout=5)
            res = rsp.results[0]
            if res.status.code != 0:
                return None  # refused: it serves no reads any more
            return bytes(payload[res.payload_offset : res.payload_offset + res.length])

        chain = await c.admin.offline_target(tail)
        assert [d.target_id for d in chain.draining] == [tail]
        acked, served, refused = 0, 0, 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            await writer.routing.refresh()
            acked += 1
            await writer.write(cid, INODE, 0, 0, b"%08d" % acked, CHUNK)
            got = await read_tail()  # begun after the write was acknowledged
            if got is None:
                refused += 1
            else:
                served += 1
                assert int(got) >= acked, (
                    f"read {got!r} from the target taken out after write {acked} was acked"
                )
            routing = await c.routing()
            if routing.chain(cid).state_of(tail) != common_pb2.SERVING and refused >= 5:
                break
        assert refused >= 5, (acked, served, refused)
        assert routing.chain(cid).state_of(tail) != common_pb2.SERVING
        assert not routing.chain(cid).draining
