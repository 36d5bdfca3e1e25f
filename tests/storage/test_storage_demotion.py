"""A storage daemon cut off from mgmtd comes back through a resync, and serves no stale reads.

One storage daemon of a real cluster runs in this process, so that the test can hold back its
heartbeats and its routing polls separately (a partition, then a routing poll that lands late):
mgmtd takes its target OFFLINE and the chain acknowledges writes without it; when its heartbeats
get through again, mgmtd makes the target SYNCING, and only then does the daemon see routing
again. It never saw itself OFFLINE; it must still not serve what it holds, nor count as up to date.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cluster import Cluster, wait_until
from prometheus_client import CollectorRegistry

from fs3.client.storage_client import STORAGE_SERVICE, node_address
from fs3.config import StorageConfig, load_config
from fs3.errors import StatusCode
from fs3.proto import common_pb2, storage_pb2
from fs3.storage.daemon import StorageDaemon
from fs3.storage.target_map import UPTODATE

pytestmark = pytest.mark.timeout(120)

CHUNK = 64 * 1024
INODE = 5
OLD = b"old!" * 1024
NEW = b"NEW." * 1024


class Gates:
    """Holds back one daemon's heartbeats and routing polls to mgmtd, each on its own."""

    def __init__(self, daemon: StorageDaemon) -> None:
        assert daemon.mgmtd is not None
        self.heartbeats = asyncio.Event()
        self.polls = asyncio.Event()
        self.heartbeats.set()
        self.polls.set()
        self.accepted = 0  # heartbeats mgmtd answered
        call = daemon.mgmtd.call

        async def gated(method: str, request: Any, **kw: Any) -> Any:
            if method == "Heartbeat":
                await self.heartbeats.wait()
            elif method == "GetRoutingInfo":
                await self.polls.wait()
            reply = await call(method, request, **kw)
            if method == "Heartbeat":
                self.accepted += 1  # the daemon takes in the reply without yielding
            return reply

        daemon.mgmtd.call = gated  # type: ignore[method-assign]


async def read_from(client, routing, target_id: int, chain_id: int) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    """Read the chunk from the one replica ``target_id``: (status code, data)."""
    req = storage_pb2.BatchReadReq()
    io = req.ios.add(offset=0, length=CHUNK)
    io.key.chain_id, io.key.inode_id, io.key.chunk_index = chain_id, INODE, 0
    rsp, payload = await client.rpc.call(
        node_address(routing, target_id), STORAGE_SERVICE["BatchRead"], req, timeout=10
    )
    res = rsp.results[0]
    if res.status.code:
        return res.status.code, b""
    return 0, bytes(payload[res.payload_offset : res.payload_offset + res.length])


async def test_target_cut_off_from_mgmtd_is_resynced_and_serves_nothing_stale(tmp_path):
    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        await client.write(chain_id, INODE, 0, 0, OLD, CHUNK)

        # the middle target's daemon, restarted in this process
        node = c.nodes[1]
        (victim,) = node.targets
        c.kill_storage(1)
        await c.wait_chains(lambda ch: victim not in ch.serving, what="the killed target out of service")
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        await daemon.start()
        try:
            assert daemon.targets is not None
            t = daemon.targets.target(victim)
            await c.wait_all_serving()
            await wait_until(
                lambda: (
                    t.public_state == common_pb2.SERVING and t.local_state == UPTODATE and daemon.lease.ok()
                ),
                20,
                "the in-process daemon to serve its target",
            )
            assert await read_from(client, await c.routing(), victim, chain_id) == (0, OLD)
            done = f"resync done chain_id={chain_id} target_id={victim}"
            resyncs = sum(p.log().count(done) for p in c.procs)
            gates = Gates(daemon)

            # cut off: mgmtd takes the target OFFLINE, the chain acknowledges a write without it
            gates.heartbeats.clear()
            gates.polls.clear()
            await c.wait_chains(
                lambda ch: ch.state_of(victim) == common_pb2.OFFLINE, what="mgmtd to take the target OFFLINE"
            )
            # written at the chain version without it (the daemon, still at the old one, would
            # refuse any part of it)
            await client.routing.wait_for(
                lambda r: r.chains[chain_id].state_of(victim) == common_pb2.OFFLINE, 10
            )
            await client.write(chain_id, INODE, 0, 0, NEW, CHUNK)
            assert (t.public_state, t.local_state) == (common_pb2.SERVING, UPTODATE)  # as far as it knows

            # heartbeats get through again, routing polls not yet: mgmtd makes it SYNCING
            gates.heartbeats.set()
            await c.wait_chains(
                lambda ch: ch.state_of(victim) == common_pb2.SYNCING, what="mgmtd to make the target SYNCING"
            )
            accepted = gates.accepted
            await wait_until(lambda: gates.accepted >= accepted + 2, 20, "two more heartbeats answered")
            routing = await c.routing()
            code, data = await read_from(client, routing, victim, chain_id)
            assert data != OLD, "a target taken out of its chain served a stale read"
            assert code == StatusCode.STORAGE_TARGET_NOT_SERVING

            # the daemon sees routing again, its target SYNCING without having seen itself OFFLINE
            gates.polls.set()
            await c.wait_all_serving()
            await wait_until(
                lambda: (
                    t.public_state == common_pb2.SERVING and t.local_state == UPTODATE and daemon.lease.ok()
                ),
                20,
                "the in-process daemon to serve its target again",
            )
            assert await read_from(client, await c.routing(), victim, chain_id) == (0, NEW)
            assert sum(p.log().count(done) for p in c.procs) == resyncs + 1, c.logs()
        finally:
            await daemon.stop()
