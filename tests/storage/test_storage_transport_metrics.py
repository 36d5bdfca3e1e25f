"""A storage daemon with ``transport = "tcp"`` counts the connections it opens in
``fs3_net_transport_connections_total{transport, reason}``, as one with ``auto`` does."""

from __future__ import annotations

import os
import re

import pytest
from cluster import Cluster

pytestmark = pytest.mark.timeout(120)

CHUNK = 1 << 16


def _connections(metrics: str, transport: str, reason: str) -> float:
    m = re.search(
        rf'^fs3_net_transport_connections_total\{{reason="{reason}",transport="{transport}"\}} (\S+)$',
        metrics,
        re.MULTILINE,
    )
    assert m is not None, f"no {transport}/{reason} sample in:\n" + "\n".join(
        line for line in metrics.splitlines() if "transport_connections" in line
    )
    return float(m.group(1))


async def test_tcp_connections_are_counted(tmp_path) -> None:
    async with Cluster(
        tmp_path / "c", storage_nodes=2, replication=2, metrics=True, storage_extra={"transport": "tcp"}
    ) as c:
        routing = await c.routing()
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        await client.write(chain_id, 1, 0, 0, os.urandom(CHUNK), CHUNK)
        head = c.node_of_target(routing.chain(chain_id).targets[0].target_id)
        # the head forwarded the write to its successor over a connection it opened
        assert _connections(await c.scrape(head.index), "tcp", "configured") >= 1
