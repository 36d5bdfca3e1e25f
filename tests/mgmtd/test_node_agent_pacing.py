"""A daemon's heartbeat interval adapts to mgmtd's heartbeat timeout (at least three beats per
timeout), so a misconfigured interval does not make mgmtd fail a live node between beats."""

from __future__ import annotations

import asyncio

import pytest
from mgmtd_harness import Admin

from fs3.client.mgmtd_client import NodeAgent
from fs3.proto import common_pb2, mgmtd_pb2

pytestmark = pytest.mark.timeout(60)


async def test_an_interval_past_the_timeout_is_shortened_and_the_node_stays_active(admin: Admin) -> None:
    c = admin.client
    # mgmtd here fails a node after 1 s of silence; the daemon was configured to beat every 5 s
    agent = NodeAgent(c, 30, common_pb2.NODE_META, interval_s=5.0)
    await agent.start()
    try:
        assert agent._loop.interval_s == pytest.approx(1.0 / 3)
        statuses = []
        for _ in range(12):  # 3 s: three timeouts
            await asyncio.sleep(0.25)
            statuses.append({n.node_id: n.status for n in await c.list_nodes()}[30])
        assert statuses == [mgmtd_pb2.NODE_STATUS_ACTIVE] * 12
    finally:
        await agent.stop()


async def test_a_short_interval_is_kept(admin: Admin) -> None:
    agent = NodeAgent(admin.client, 31, common_pb2.NODE_META, interval_s=0.1)
    await agent.start()
    try:
        assert agent._loop.interval_s == 0.1
    finally:
        await agent.stop()
