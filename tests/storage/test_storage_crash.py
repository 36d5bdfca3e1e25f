"""Daemon-level crash test: SIGKILL a storage daemon at random moments during a write workload, 20
times; after each restart every committed chunk verifies on every replica and no pending version
is left once the chain has settled."""

from __future__ import annotations

import random

import pytest
from chain_workload import BLOCK, CHUNK, PinnedClient, Workload
from cluster import Cluster

from fs3.client.storage_client import crc32c

KILLS = 20


@pytest.mark.timeout(300)
async def test_sigkill_at_random_moments_20_times(tmp_path):
    rng = random.Random(20)
    async with Cluster(tmp_path / "c") as c:
        chain_id = c.chain_ids[0]
        client = await c.storage_client()
        pinned = {}
        for tid in c.chain_targets[chain_id]:
            p = await c.storage_client()
            p.__class__ = PinnedClient
            p.pin = tid
            pinned[tid] = p
        model: dict[int, bytearray] = {}
        for k in range(KILLS):
            work = Workload(client, chain_id, 100, writers=4)
            work.model = {**{w: bytearray() for w in range(4)}, **model}
            try:
                await work.wait_acked(rng.randrange(5, 30))
                victim = rng.randrange(len(c.nodes))
                c.kill_storage(victim)
                await c.restart_storage(victim)
                await c.wait_all_serving(60)
                await work.wait_acked(5)
            finally:
                await work.finish()
            model = work.model
            # every replica: same committed chunks, nothing pending, content as acknowledged
            for tid, p in pinned.items():
                metas = {m.key.chunk_index: m for m in await client.dump_chunk_meta(tid, 100)}
                assert sorted(metas) == sorted(model), (k, tid)
                for w, content in model.items():
                    m = metas[w]
                    assert m.pending_version == 0, (k, tid, m)
                    assert (m.length, m.crc32c) == (len(content), crc32c(content)), (k, tid, w)
                    assert await p.read(chain_id, 100, w, 0, CHUNK) == bytes(content), (k, tid, w)
        assert len(model) == 4 and all(len(v) >= BLOCK for v in model.values())
