"""Whole-chunk writes, which a replica stores and forwards at the same time (craq
``Replicator._update_parallel``): a replica whose disk fails such a write goes offline, and every
acknowledged write stays readable, identical on the replicas that remain."""

from __future__ import annotations

import asyncio
import os

import pytest
from chain_workload import CHUNK, finish_workers, wait_progress
from cluster import Cluster, fail_disk

from fs3.client.storage_client import crc32c
from fs3.proto import common_pb2

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("position", ["head", "middle"])
async def test_disk_failure_during_whole_chunk_writes(tmp_path, position):
    async with Cluster(tmp_path / "c") as c:
        chain_id = c.chain_ids[0]
        client = await c.storage_client()
        model: dict[int, bytes] = {}
        acked = 0
        stop = asyncio.Event()

        async def writer(w: int) -> None:
            nonlocal acked
            while not stop.is_set():
                data = os.urandom(CHUNK)
                await client.write(chain_id, 5, w, 0, data, CHUNK)
                model[w] = data
                acked += 1

        tasks = [asyncio.create_task(writer(w)) for w in range(3)]

        async def progress(n: int) -> None:
            await wait_progress(lambda: acked, n, tasks, what="writes")

        try:
            await progress(20)
            victim = (await c.routing()).chain(chain_id).targets[0 if position == "head" else 1].target_id
            path = c.node_of_target(victim).targets[victim]
            fail_disk(path)
            await c.wait_chains(
                lambda ch: ch.state_of(victim) == common_pb2.OFFLINE, what="the failed target to go offline"
            )
            await progress(20)
        finally:
            await finish_workers(stop, tasks)
        serving = (await c.routing()).chain(chain_id).serving
        assert victim not in serving and len(serving) == 2
        for tid in serving:
            metas = {m.key.chunk_index: m for m in await client.dump_chunk_meta(tid, 5)}
            assert sorted(metas) == sorted(model), (tid, sorted(metas))
            for w, data in model.items():
                m = metas[w]
                assert m.pending_version == 0, (tid, w, m)
                assert (m.length, m.crc32c) == (len(data), crc32c(data)), (tid, w)
        for w, data in model.items():
            assert await client.read(chain_id, 5, w, 0, CHUNK) == data
