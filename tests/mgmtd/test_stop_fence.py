"""The stop fence with real processes: the only mgmtd stopped cleanly (SIGTERM) for longer than the
storage nodes' leases last, as for an upgrade or a reboot of its host. Before the fence, reads
stopped 0.8 heartbeat timeouts after mgmtd went (each replica refused them: its lease had run out)
until mgmtd was back; with it the cluster serves on, and the restarted mgmtd fails no node.

The fence's rules on a fake clock (what the stopping primary and the next one may conclude) are in
test_mgmtd_resume.py; the storage lease's in tests/storage/test_target_map.py."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from cluster import MGMTD_TIMING, Cluster, wait_until

from fs3.client.storage_client import RetryPolicy

pytestmark = pytest.mark.timeout(180)

CHUNK = 64 << 10


async def test_the_cluster_serves_through_a_clean_stop_of_the_only_mgmtd_and_none_is_failed(tmp_path) -> None:
    async with Cluster(
        tmp_path / "c", storage_nodes=3, replication=3, mgmtd_extra={"stop_fence_s": 30.0}
    ) as c:
        # a short retry budget: a read refused for a lapsed lease must fail here, not wait for mgmtd
        client = await c.storage_client(retry=RetryPolicy(total_s=2.0, rpc_timeout_s=2.0))
        chain_id = c.chain_ids[0]
        first = os.urandom(CHUNK)
        await client.write(chain_id, 1, 0, 0, first, CHUNK)
        version = (await c.routing()).chain(chain_id).version

        mgmtd = c.mgmtd_proc
        assert mgmtd is not None and mgmtd.popen is not None
        mgmtd.popen.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(mgmtd.popen.wait, 30) == 0, mgmtd.log()
        assert "stop fence: no node is failed before" in mgmtd.log(), mgmtd.log()
        assert "storage nodes told 3, not told none" in mgmtd.log(), mgmtd.log()

        # three heartbeat timeouts without mgmtd: a lease without the fence lasts 0.8 of one
        await asyncio.sleep(3 * float(MGMTD_TIMING["heartbeat_timeout_s"]))
        assert await client.read(chain_id, 1, 0, 0, CHUNK) == first
        second = os.urandom(CHUNK)
        await client.write(chain_id, 2, 0, 0, second, CHUNK)
        assert await client.read(chain_id, 2, 0, 0, CHUNK) == second
        for node in c.nodes:
            assert node.proc is not None
            assert "serve on without it" in node.proc.log(), node.proc.log()
            assert "lease from mgmtd ran out" not in node.proc.log(), node.proc.log()

        await c.restart_mgmtd()
        # logged once the new primary has loaded the cluster state, a moment after it serves
        await wait_until(
            lambda: "honouring the stop fence of the previous primary" in mgmtd.log(),
            10,
            "the fence to be honoured",
        )
        routing = await c.wait_all_serving(30)
        assert routing.chain(chain_id).version == version, c.logs()  # no node was failed
        assert await client.read(chain_id, 1, 0, 0, CHUNK) == first
        assert await client.read(chain_id, 2, 0, 0, CHUNK) == second
