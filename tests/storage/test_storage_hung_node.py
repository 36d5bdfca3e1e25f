"""Calls in flight to a storage daemon that hangs (SIGSTOP: its connections stay open, nothing
answers) end once mgmtd declares its node failed, and are retried on the new routing, instead of
each waiting out its deadline: a client's write to the chain's head and its reads from that
daemon, and the head's forward of a write to a hung successor.

Every call's deadline here is far beyond the time mgmtd takes to declare a silent node failed (a
2 s heartbeat timeout in test clusters): a write that took half its deadline waited for it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from cluster import Cluster

from fs3.client.storage_client import RetryPolicy

pytestmark = pytest.mark.timeout(300)

CHUNK = 64 * 1024
INODE = 7
OLD = b"old!" * (CHUNK // 4)
NEW = b"NEW." * (CHUNK // 4)
DEADLINE_S = 90.0


@pytest.mark.parametrize("stopped", ["head", "middle"])
async def test_calls_to_a_hung_daemon_end_when_mgmtd_declares_it_failed(tmp_path, stopped: str) -> None:
    extra = {"rpc_timeout_s": DEADLINE_S, "forward_timeout_s": 2 * DEADLINE_S}
    async with Cluster(tmp_path / "c", storage_extra=extra) as c:
        client = await c.storage_client(retry=RetryPolicy(total_s=3 * DEADLINE_S, rpc_timeout_s=DEADLINE_S))
        chain_id = c.chain_ids[0]
        await client.write(chain_id, INODE, 0, 0, OLD, CHUNK)
        chain = (await c.routing()).chain(chain_id)
        assert chain.head is not None
        head = chain.head.target_id
        successor = chain.successor(head)
        assert successor is not None
        target = head if stopped == "head" else successor.target_id
        proc = c.node_of_target(target).proc
        assert proc is not None and proc.pid is not None
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            # reads spread over the replicas by load: some go to the hung one
            results = await asyncio.gather(
                client.write(chain_id, INODE, 0, 0, NEW, CHUNK),
                *(client.read(chain_id, INODE, 0, 0, CHUNK) for _ in range(12)),
            )
            took = time.monotonic() - start
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert took < DEADLINE_S / 2, (
            f"the calls took {took:.1f} s: they waited for their {DEADLINE_S} s deadline"
        )
        assert all(r in (OLD, NEW) for r in results[1:])
        assert await client.read(chain_id, INODE, 0, 0, CHUNK) == NEW
