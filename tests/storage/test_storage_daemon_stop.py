"""A storage daemon's clean stop, run in this process: the engine calls already in its I/O threads
finish before the engines close (no target is taken for failed on a clean stop), and its chunk
metadata stores are opened with the configured size."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal

import pytest
from cluster import Cluster, wait_until
from prometheus_client import CollectorRegistry

from fs3.config import StorageConfig, load_config
from fs3.errors import FS3Error
from fs3.proto import common_pb2
from fs3.storage.daemon import StorageDaemon
from fs3.storage.target_map import UPTODATE

pytestmark = pytest.mark.timeout(120)

CHUNK = 1 << 20


async def test_a_clean_stop_under_writes_lets_the_disk_calls_finish_and_fails_no_target(tmp_path) -> None:
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1) as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        node = c.nodes[0]
        (tid,) = node.targets
        c.kill_storage(0)
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        cfg = dataclasses.replace(cfg, chunk_meta_map_size=3 << 30)
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        await daemon.start()
        writers: list[asyncio.Future[None]] = []
        try:
            assert daemon.targets is not None
            t = daemon.targets.target(tid)
            await wait_until(
                lambda: t.public_state == common_pb2.SERVING and t.local_state == UPTODATE,
                30,
                "the in-process daemon to serve its target",
            )
            engine = t.engine.engine
            assert engine._store._env.info()["map_size"] == 3 << 30  # noqa: SLF001
            data = os.urandom(CHUNK)
            await client.write(chain_id, 1, 0, 0, data, CHUNK)

            async def write(n: int) -> None:
                for i in range(1000):
                    with contextlib.suppress(FS3Error):
                        await client.write(chain_id, 2 + n, i % 8, 0, data, CHUNK)

            writers = [asyncio.ensure_future(write(n)) for n in range(16)]
            await asyncio.sleep(1.0)  # writes at every stage of their way through the engine
        finally:
            await daemon.stop()
            for w in writers:
                w.cancel()
            await asyncio.gather(*writers, return_exceptions=True)
        assert engine.failure is None


async def test_a_clean_stop_takes_the_nodes_targets_out_of_their_chains_at_once(tmp_path) -> None:
    """A daemon stopped with SIGTERM says so to mgmtd in a last heartbeat: its chains go on with the
    other replicas at once, not after a heartbeat timeout (60 s here, so only its word can do it)
    during which writes to its chains failed; started again, it resyncs and serves."""
    timing = {"heartbeat_timeout_s": 60.0}
    async with Cluster(tmp_path / "c", storage_nodes=2, replication=2, mgmtd_extra=timing) as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        first, second = os.urandom(CHUNK), os.urandom(CHUNK)
        await client.write(chain_id, 1, 0, 0, first, CHUNK)
        leaving = c.nodes[0]
        c.kill_storage(0, signal.SIGTERM)
        assert leaving.proc is not None and leaving.proc.popen is not None
        assert await asyncio.to_thread(leaving.proc.popen.wait, 30) == 0
        gone = set(leaving.targets)
        await c.wait_chains(lambda ch: not gone & set(ch.serving), 15, "the stopped node's targets to leave")
        await asyncio.wait_for(client.write(chain_id, 1, 0, 0, second, CHUNK), 15)
        c.start_storage(0)
        await c.wait_all_serving(60)
        assert await client.read(chain_id, 1, 0, 0, CHUNK) == second


async def test_a_disabled_nodes_daemon_restarts_and_rejoins_when_enabled(tmp_path) -> None:
    """disable-node, stop the daemon (to replace a disk, say), start it again: it starts, serving
    nothing while mgmtd refuses its heartbeats (it exited, 'node is disabled'), and its targets
    rejoin their chains once the node is enabled."""
    async with Cluster(tmp_path / "c", storage_nodes=2, replication=2) as c:
        assert c.admin is not None
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        data = os.urandom(CHUNK)
        await client.write(chain_id, 1, 0, 0, data, CHUNK)
        node = c.nodes[1]
        await c.admin.set_node_enabled(node.node_id, False)
        await c.wait_chains(lambda ch: not set(node.targets) & set(ch.serving), 30, "the node's targets out")
        c.kill_storage(1, signal.SIGTERM)
        assert node.proc is not None and node.proc.popen is not None
        assert await asyncio.to_thread(node.proc.popen.wait, 30) == 0
        c.start_storage(1)
        await c._wait_port(node)  # noqa: SLF001 - listening: it started
        await wait_until(
            lambda: "is disabled: it serves nothing" in node.proc.log(), 30, "the daemon to say so"
        )
        assert node.proc.alive()
        await client.write(chain_id, 1, 0, 0, data[::-1], CHUNK)  # the chain goes on without it
        await c.admin.set_node_enabled(node.node_id, True)
        await c.wait_all_serving(60)
        assert await client.read(chain_id, 1, 0, 0, CHUNK) == data[::-1]


async def test_a_stop_does_not_wait_for_a_disk_call_that_hangs(tmp_path, monkeypatch) -> None:
    """An I/O thread stuck in a disk call (a dying disk answering after minutes): the stop waited
    the drain limit, said "stopped", and the process then sat in Python's join of the executor's
    threads until the disk answered, holding the target locks a restart needs. The stop now says
    it leaves them (``io_abandoned``), and ``fs3 storage`` exits at once."""
    import threading

    from fs3.storage import daemon as storage_daemon

    monkeypatch.setattr(storage_daemon, "_IO_DRAIN_S", 0.5)
    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1) as c:
        node = c.nodes[0]
        c.kill_storage(0)
        cfg = load_config(StorageConfig, c.storage_config(node), environ={})
        daemon = StorageDaemon(cfg, secret=c.secret, registry=CollectorRegistry())
        await daemon.start()
        disk = threading.Event()
        stuck = asyncio.get_running_loop().run_in_executor(
            daemon.pools[next(iter(node.targets))], disk.wait, 60
        )
        try:
            assert not daemon.io_abandoned
            await daemon.stop()
            assert daemon.io_abandoned
        finally:
            disk.set()
            await stuck
