"""mgmtd over gRPC, in process over the mem engine: admin API, users and tokens, heartbeats, failure
detection driving the chain state machine, routing info, sessions, configs, health, election."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from mgmtd_harness import FAST, Admin, InProcess, StorageNode, endpoint, wait_until

from fs3.client.mgmtd_client import MgmtdClient
from fs3.client.routing import RoutingCache
from fs3.config import MetaConfig, MgmtdConfig
from fs3.errors import FS3Error, StatusCode
from fs3.meta.daemon import MetaDaemon
from fs3.mgmtd import cluster as cluster_module
from fs3.mgmtd import schema
from fs3.mgmtd import service as service_module
from fs3.proto import common_pb2, health_pb2, health_pb2_grpc, mgmtd_pb2

pytestmark = pytest.mark.timeout(60)

SERVING, SYNCING, OFFLINE, LASTSRV = (
    common_pb2.SERVING,
    common_pb2.SYNCING,
    common_pb2.OFFLINE,
    common_pb2.LASTSRV,
)


async def expect(code: StatusCode, aw) -> FS3Error:
    with pytest.raises(FS3Error) as e:
        await aw
    assert e.value.code == code, e.value
    return e.value


async def storage_cluster(a: Admin, n_nodes: int = 3) -> list[StorageNode]:
    """n storage nodes with one target each (target id = node id + 100), chain 1 over all of them."""
    nodes = [StorageNode(a.client, 10 + i, [110 + i]) for i in range(n_nodes)]
    for n in nodes:
        await n.register()
    await a.client.create_targets(
        [mgmtd_pb2.TargetSpec(target_id=110 + i, node_id=10 + i, disk_index=0) for i in range(n_nodes)]
    )
    await a.client.upload_chains({1: [110 + i for i in range(n_nodes)]})
    await a.client.upload_chain_table(1, [1])
    return nodes


class Heartbeats:
    """Background heartbeats of fake storage nodes; a paused node goes silent."""

    def __init__(self, nodes: list[StorageNode], interval_s: float = 0.05) -> None:
        self.nodes = nodes
        self.paused: set[int] = set()
        self.interval_s = interval_s
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            for n in self.nodes:
                if n.node_id not in self.paused:
                    with contextlib.suppress(FS3Error):
                        await n.heartbeat()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def heartbeating(
    a: Admin, n_nodes: int = 3
) -> AsyncIterator[tuple[list[StorageNode], Heartbeats, RoutingCache]]:
    """:func:`storage_cluster` with its nodes heartbeating, and a routing cache refreshed often."""
    nodes = await storage_cluster(a, n_nodes)
    hb = Heartbeats(nodes)
    cache = RoutingCache(a.client, refresh_interval_s=0.05)
    await cache.start()
    try:
        yield nodes, hb, cache
    finally:
        await cache.stop()
        await hb.stop()


def chain_states(cache: RoutingCache, chain_id: int = 1) -> list[tuple[int, int]]:
    return [(t.target_id, t.public_state) for t in cache.routing.chain(chain_id).targets]


# ---- cluster init, users and tokens --------------------------------------------------------------


async def test_init_cluster_once(inproc: InProcess) -> None:
    await inproc.start(1)
    await inproc.primary()
    c = inproc.client()
    # before init no admin exists, so without the cluster secret nobody may administer
    await expect(StatusCode.UNAUTHENTICATED, c.list_chains())
    token = await c.init_cluster("t")
    assert token.startswith("fs3u.0.")
    await expect(StatusCode.ALREADY_EXISTS, c.init_cluster("t"))
    root = await inproc.client(token=token).verify_token(token)
    assert root.uid == 0 and root.admin and root.root


async def test_admin_rpcs_need_an_admin_token(admin: Admin) -> None:
    env = admin.env
    user_token = await admin.client.add_user(1000, "alice", gid=100, groups=[100, 200])
    anonymous = env.client()
    alice = env.client(token=user_token)
    forged = env.client(token=user_token[:-4] + "AAAA")
    garbage = env.client(token="not-a-token")
    for client, code in [
        (anonymous, StatusCode.UNAUTHENTICATED),
        (alice, StatusCode.PERMISSION_DENIED),
        (forged, StatusCode.UNAUTHENTICATED),
        (garbage, StatusCode.UNAUTHENTICATED),
    ]:
        await expect(code, client.list_nodes())
        await expect(code, client.add_user(1001, "mallory", admin=True))
        await expect(code, client.upload_chains({5: [1]}))
        await expect(code, client.set_config(common_pb2.NODE_META, ""))
    # a valid user token is good for what any user may do
    assert (await alice.verify_token(user_token)).name == "alice"
    assert (await alice.get_routing_info()).version > 0
    users = {u.uid: u for u in await admin.client.list_users()}
    assert users[1000].groups == [100, 200] and not users[1000].admin
    # promoting alice makes her token an admin token
    await admin.client.set_user(mgmtd_pb2.SetUserRequest(uid=1000, admin=True))
    assert len(await alice.list_nodes()) == 0


async def test_tokens_expire_and_can_be_revoked(admin: Admin) -> None:
    first = await admin.client.add_user(1000, "alice")
    short = await admin.client.issue_token(1000, ttl_s=0.3)
    c = admin.client
    verified = await c.verify_token(short)
    assert verified.uid == 1000 and 0 < verified.token_expires_in_s <= 0.3  # left, not a time
    assert (await c.verify_token(first)).token_expires_in_s == 0  # never: said so
    assert (await c.get_user(1000)).token_count == 2
    await wait_until(lambda: time.time() > 0, 1)  # clock sanity
    deadline = time.monotonic() + 5
    while True:
        try:
            await c.verify_token(short)
        except FS3Error as e:
            assert e.code == StatusCode.UNAUTHENTICATED
            break
        assert time.monotonic() < deadline, "short-lived token never expired"
        await asyncio.sleep(0.05)
    assert (await c.verify_token(first)).uid == 1000
    fresh = await c.issue_token(1000, invalidate_existing=True)
    await expect(StatusCode.UNAUTHENTICATED, c.verify_token(first))
    assert (await c.verify_token(fresh)).uid == 1000
    await c.remove_user(1000)
    await expect(StatusCode.UNAUTHENTICATED, c.verify_token(fresh))
    await expect(StatusCode.NOT_FOUND, c.get_user(1000))
    # the last admin stays
    await expect(StatusCode.FAILED_PRECONDITION, c.remove_user(0))
    await expect(StatusCode.FAILED_PRECONDITION, c.set_user(mgmtd_pb2.SetUserRequest(uid=0, admin=False)))
    await expect(StatusCode.ALREADY_EXISTS, c.add_user(0, "root2"))
    await expect(StatusCode.INVALID_ARGUMENT, c.add_user(7, "a/b"))


async def test_cluster_secret(inproc: InProcess) -> None:
    secret = b"0123456789abcdef-secret"
    await inproc.start(1, secret=secret)
    await inproc.primary()
    anonymous = inproc.client()
    wrong = inproc.client(cluster_secret=b"x" * 20)
    service = inproc.client(cluster_secret=secret)
    await expect(StatusCode.UNAUTHENTICATED, anonymous.init_cluster())
    await expect(StatusCode.UNAUTHENTICATED, wrong.init_cluster())
    await expect(
        StatusCode.MGMTD_NOT_INITIALIZED,
        service.create_targets([mgmtd_pb2.TargetSpec(target_id=1, node_id=1)]),
    )
    token = await service.init_cluster()
    await expect(StatusCode.UNAUTHENTICATED, anonymous.register_node(10, common_pb2.NODE_STORAGE))
    await expect(StatusCode.UNAUTHENTICATED, anonymous.get_routing_info())
    await service.register_node(10, common_pb2.NODE_STORAGE)
    # the secret is an admin credential; a user token is not a service credential
    assert [n.node_id for n in await service.list_nodes()] == [10]
    await expect(StatusCode.UNAUTHENTICATED, anonymous.register_node(11, common_pb2.NODE_META))
    # an admin may pre-register a node, a plain user may not, and only services heartbeat
    await inproc.client(token=token).register_node(11, common_pb2.NODE_META)
    user_token = await service.add_user(1000, "u")
    await expect(
        StatusCode.PERMISSION_DENIED, inproc.client(token=user_token).register_node(12, common_pb2.NODE_META)
    )
    hb = mgmtd_pb2.HeartbeatRequest(node_id=11, type=common_pb2.NODE_META, incarnation=1, sequence=1)
    await expect(StatusCode.UNAUTHENTICATED, inproc.client(token=token).heartbeat(hb))
    await service.heartbeat(hb)
    assert (await inproc.client(token=token).get_routing_info()).version > 0


# ---- membership and heartbeats -------------------------------------------------------------------


async def test_bad_heartbeats_are_refused(admin: Admin) -> None:
    c = admin.client
    node = StorageNode(c, 10, [110])
    other = StorageNode(c, 11, [111])
    e = await expect(StatusCode.MGMTD_UNKNOWN_NODE, node.heartbeat())
    assert "node 10" in e.message
    await node.register()
    await other.register()
    # a target nobody created (or removed while the daemon ran): passed over, not the node's
    # heartbeat refused (see test_mgmtd_draining)
    await node.heartbeat()
    await c.create_targets(
        [
            mgmtd_pb2.TargetSpec(target_id=110, node_id=10),
            mgmtd_pb2.TargetSpec(target_id=111, node_id=11),
        ]
    )
    await node.heartbeat()
    # stale: the same (incarnation, sequence) again, or an older one
    req = node.request()
    await c.heartbeat(req)
    await expect(StatusCode.MGMTD_STALE_HEARTBEAT, c.heartbeat(req))
    old = mgmtd_pb2.HeartbeatRequest()
    old.CopyFrom(req)
    old.incarnation -= 1
    old.sequence += 100
    await expect(StatusCode.MGMTD_STALE_HEARTBEAT, c.heartbeat(old))
    # an older process still beating as this node (a second daemon with a copied node_id, the
    # newer one accepted): said so, naming both (it was 'not newer than the last one accepted')
    twin = mgmtd_pb2.HeartbeatRequest()
    twin.CopyFrom(old)
    twin.hostname, twin.pid = "other-host", req.pid + 1
    e = await expect(StatusCode.MGMTD_STALE_HEARTBEAT, c.heartbeat(twin))
    assert "also run by another process" in e.message and "other-host pid" in e.message, e.message
    # a target that belongs to another node: passed over too
    node.local[111] = common_pb2.UPTODATE
    await node.heartbeat()
    del node.local[111]
    # the same target twice
    dup = node.request()
    dup.targets.append(dup.targets[0])
    await expect(StatusCode.INVALID_ARGUMENT, c.heartbeat(dup))
    # the wrong node type
    wrong = node.request()
    wrong.type = common_pb2.NODE_META
    await expect(StatusCode.INVALID_ARGUMENT, c.heartbeat(wrong))
    # a bad local state
    bad = node.request()
    bad.targets[0].local_state = 42
    await expect(StatusCode.INVALID_ARGUMENT, c.heartbeat(bad))
    # a disabled node
    await c.set_node_enabled(10, False)
    await expect(StatusCode.MGMTD_NODE_DISABLED, node.heartbeat())
    await c.set_node_enabled(10, True)
    await node.heartbeat()
    # registering under another type, a node id 0
    await expect(StatusCode.ALREADY_EXISTS, c.register_node(10, common_pb2.NODE_META))
    await expect(StatusCode.INVALID_ARGUMENT, c.register_node(0, common_pb2.NODE_META))
    await expect(StatusCode.INVALID_ARGUMENT, c.register_node(12, common_pb2.NODE_CLIENT))
    # unregistering a node with targets
    await expect(StatusCode.FAILED_PRECONDITION, c.unregister_node(10))
    nodes = {n.node_id: n for n in await c.list_nodes()}
    assert nodes[10].status == mgmtd_pb2.NODE_STATUS_ACTIVE
    assert nodes[10].endpoints[0].port == 9010


async def test_bad_chains_and_tables_are_refused(admin: Admin) -> None:
    c = admin.client
    for nid in (10, 11):
        await c.register_node(nid, common_pb2.NODE_STORAGE, [endpoint()])
    await expect(
        StatusCode.MGMTD_UNKNOWN_NODE, c.create_targets([mgmtd_pb2.TargetSpec(target_id=1, node_id=99)])
    )
    await c.register_node(20, common_pb2.NODE_META)
    await expect(
        StatusCode.INVALID_ARGUMENT, c.create_targets([mgmtd_pb2.TargetSpec(target_id=1, node_id=20)])
    )
    await c.create_targets([mgmtd_pb2.TargetSpec(target_id=t, node_id=10 + t % 2) for t in (1, 2, 3, 4)])
    await expect(StatusCode.ALREADY_EXISTS, c.create_targets([mgmtd_pb2.TargetSpec(target_id=1, node_id=10)]))
    e = await expect(StatusCode.MGMTD_UNKNOWN_TARGET, c.upload_chains({1: [1, 99]}))
    assert "target 99" in e.message
    await expect(StatusCode.MGMTD_INVALID_CHAIN, c.upload_chains({1: []}))
    await expect(StatusCode.MGMTD_INVALID_CHAIN, c.upload_chains({1: [1, 1]}))
    e = await expect(StatusCode.MGMTD_INVALID_CHAIN, c.upload_chains({1: [1, 2], 2: [2, 3]}))
    assert "target 2 is already in chain 1" in e.message
    assert await c.list_chains() == []  # a refused upload changes nothing
    await c.upload_chains({1: [1, 2]})
    await c.upload_chains({1: [1, 2]})  # the same again is a no-op
    e = await expect(StatusCode.MGMTD_INVALID_CHAIN, c.upload_chains({2: [3, 1]}))
    assert "already in chain 1" in e.message
    await expect(StatusCode.MGMTD_INVALID_CHAIN, c.upload_chains({1: [1, 3]}))
    e = await expect(StatusCode.MGMTD_UNKNOWN_CHAIN, c.upload_chain_table(1, [1, 7]))
    assert "chain 7" in e.message
    await expect(StatusCode.INVALID_ARGUMENT, c.upload_chain_table(1, []))
    await expect(StatusCode.INVALID_ARGUMENT, c.upload_chain_table(1, [1, 1]))
    # one stored value (at most 100,000 bytes): 20,000 ids as 3FS numbers them take 100,008
    e = await expect(StatusCode.INVALID_ARGUMENT, c.upload_chain_table(1, list(range(900100001, 900120001))))
    assert "takes 100012 bytes, more than a stored value may (100000)" in e.message
    assert await c.upload_chain_table(1, [1]) == 1
    assert await c.upload_chain_table(1, [1]) == 1
    await c.upload_chains({2: [3, 4]})
    assert await c.upload_chain_table(1, [1, 2]) == 2
    assert [(t.table_id, t.version) for t in await c.list_chain_tables()] == [(1, 1), (1, 2)]
    assert [ch.chain_id for ch in await c.list_chains(table_id=1)] == [1, 2]
    assert [ch.chain_id for ch in await c.list_chains(table_id=1, table_version=1)] == [1]
    await expect(StatusCode.MGMTD_UNKNOWN_CHAIN_TABLE, c.list_chains(table_id=9))
    await expect(StatusCode.FAILED_PRECONDITION, c.remove_target(1))
    await expect(StatusCode.MGMTD_UNKNOWN_TARGET, c.remove_target(77))
    await expect(StatusCode.MGMTD_UNKNOWN_CHAIN, c.rotate_lastsrv(9))
    await expect(
        StatusCode.MGMTD_INVALID_CHAIN, c.update_chain(1, 3, mgmtd_pb2.CHAIN_UPDATE_ADD)
    )  # 3 is in chain 2


async def test_concurrent_uploads_cannot_put_a_target_in_two_chains(admin: Admin) -> None:
    c = admin.client
    for node in range(10, 18):
        await c.register_node(node, common_pb2.NODE_STORAGE)
    await c.create_targets([mgmtd_pb2.TargetSpec(target_id=t, node_id=9 + t) for t in range(1, 9)])
    # eight uploads race, each claiming target 1 for a different chain
    results = await asyncio.gather(
        *(c.upload_chains({cid: [1, cid + 1]}) for cid in range(1, 8)), return_exceptions=True
    )
    assert sum(r is None for r in results) == 1
    assert all(
        r is None or (isinstance(r, FS3Error) and r.code == StatusCode.MGMTD_INVALID_CHAIN) for r in results
    )
    assert len(await c.list_chains()) == 1


async def test_a_chain_with_two_targets_on_one_node_is_refused(admin: Admin) -> None:
    """A storage daemon serves one target per chain (requests name the chain): a second target of
    the chain on the same node was never written, and the node's failure took every copy on it.
    Uploaded or added by update-chain, such a chain was accepted without a word."""
    c = admin.client
    for node in (10, 11):
        await c.register_node(node, common_pb2.NODE_STORAGE)
    await c.create_targets(
        [mgmtd_pb2.TargetSpec(target_id=t, node_id=10 if t < 3 else 11, disk_index=t) for t in (1, 2, 3, 4)]
    )
    e = await expect(StatusCode.MGMTD_INVALID_CHAIN, c.upload_chains({1: [1, 3, 2]}))
    assert "targets 1 and 2 are both on node 10" in e.message
    await c.upload_chains({1: [1, 3]})
    e = await expect(StatusCode.MGMTD_INVALID_CHAIN, c.update_chain(1, 4, mgmtd_pb2.CHAIN_UPDATE_ADD))
    assert "targets 3 and 4 are both on node 11" in e.message
    assert [t.target_id for t in (await c.list_chains())[0].targets] == [1, 3]


# ---- routing and the chain state machine ---------------------------------------------------------


async def test_routing_info_is_versioned(admin: Admin) -> None:
    c = admin.client
    first = await c.get_routing_info(0)
    assert first.HasField("info") and first.info.version == first.version
    same = await c.get_routing_info(first.version)
    assert not same.HasField("info") and same.version == first.version
    await c.register_node(10, common_pb2.NODE_STORAGE, [endpoint()])
    newer = await c.get_routing_info(first.version)
    assert newer.version > first.version
    assert [n.node_id for n in newer.info.nodes] == [10]


async def test_a_node_restarted_with_its_clock_set_back_is_heard_once_the_old_process_failed(
    admin: Admin,
) -> None:
    async with heartbeating(admin) as (nodes, hb, cache):
        await cache.wait_for(lambda r: r.node(11).status == mgmtd_pb2.NODE_STATUS_ACTIVE, 5)
        # A new process whose clock went back numbers its incarnation below the live one's: that
        # could be a late heartbeat of an old process, so while the live one beats it is refused.
        restarted = StorageNode(admin.client, 11, list(nodes[1].local))
        restarted.incarnation = nodes[1].incarnation - 3600 * 10**9
        await expect(StatusCode.MGMTD_STALE_HEARTBEAT, restarted.heartbeat())
        hb.paused.add(11)  # the old process is gone
        await cache.wait_for(lambda r: r.node(11).status == mgmtd_pb2.NODE_STATUS_FAILED, 5)
        await restarted.heartbeat()  # now it is the node
        await cache.wait_for(lambda r: r.node(11).status == mgmtd_pb2.NODE_STATUS_ACTIVE, 5)
        await restarted.heartbeat()  # and its next ones are newer than its own


async def test_failure_detection_moves_a_silent_target_to_the_end_and_back(
    admin: Admin, tmp_path: Path
) -> None:
    async with heartbeating(admin) as (nodes, hb, cache):
        await cache.wait_for(
            lambda r: (
                [t.public_state for t in r.chain(1).targets] == [SERVING] * 3
                and all(n.status == mgmtd_pb2.NODE_STATUS_ACTIVE for n in r.nodes.values())
            ),
            5,
        )
        v0 = cache.routing.chain(1).version
        hb.paused.add(11)  # the middle goes silent
        await cache.wait_for(lambda r: r.chain(1).version > v0, 5)
        assert chain_states(cache) == [(110, SERVING), (112, SERVING), (111, OFFLINE)]
        assert cache.routing.node(11).status == mgmtd_pb2.NODE_STATUS_FAILED
        assert cache.routing.chain(1).head.target_id == 110
        # it comes back with an empty target: it syncs, then serves at the end of the chain
        nodes[1].local[111] = common_pb2.ONLINE
        hb.paused.discard(11)
        await cache.wait_for(lambda r: r.chain(1).targets[2].public_state == SYNCING, 5)
        nodes[1].local[111] = common_pb2.UPTODATE
        await cache.wait_for(lambda r: r.chain(1).targets[2].public_state == SERVING, 5)
        assert chain_states(cache) == [(110, SERVING), (112, SERVING), (111, SERVING)]
        assert cache.routing.chain(1).version == v0 + 3
        # every target down: the head is the last server
        hb.paused.update({10, 11, 12})
        await cache.wait_for(lambda r: r.chain(1).targets[0].public_state == LASTSRV, 5)
        assert [s for _, s in chain_states(cache)] == [LASTSRV, OFFLINE, OFFLINE]
        # an admin may give up on it: the next target becomes the last server. fs3 admin asks for
        # --force first: writes acknowledged while the last server served alone are lost (it said
        # "LASTSRV rotated" and nothing else; helper review)
        before = [t for t, _ in chain_states(cache)]
        token = tmp_path / "token"
        token.write_text(admin.token)
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "fs3.cli.main", "admin", "rotate-lastsrv", "1",
             "--mgmtd", admin.server.address, "--token-file", str(token)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 2, cli.stderr
        assert f"target {before[0]} is chain 1's last server" in cli.stderr and "--force" in cli.stderr
        assert [t for t, _ in chain_states(cache)] == before
        chain = await admin.client.rotate_lastsrv(1)
        assert [(t.target_id, t.public_state) for t in chain.targets] == [
            (before[1], LASTSRV),
            (before[2], OFFLINE),
            (before[0], OFFLINE),
        ]


async def test_giving_up_on_the_last_server_leaves_a_chain_that_serves_again(admin: Admin) -> None:
    c = admin.client
    async with heartbeating(admin) as (nodes, hb, cache):
        await cache.wait_for(
            lambda r: not r.bootstrapping and [t.public_state for t in r.chain(1).targets] == [SERVING] * 3, 5
        )
        hb.paused.update({10, 11, 12})  # every daemon down: the head is the last server
        await cache.wait_for(lambda r: r.chain(1).targets[0].public_state == LASTSRV, 5)
        head, nxt, last = (t for t, _ in chain_states(cache))
        await expect(StatusCode.FAILED_PRECONDITION, c.offline_target(head))
        await expect(StatusCode.FAILED_PRECONDITION, c.update_chain(1, head, mgmtd_pb2.CHAIN_UPDATE_REMOVE))
        chain = await c.offline_target(head, force=True)
        assert [(t.target_id, t.public_state) for t in chain.targets] == [
            (nxt, LASTSRV),
            (last, OFFLINE),
            (head, OFFLINE),
        ]
        # the daemons come back; the new last server serves, and the others resync from it in turn
        by_target = {t: n for n in nodes for t in n.local}
        for t in (last, head):
            by_target[t].local[t] = common_pb2.ONLINE
        hb.paused.clear()
        await cache.wait_for(lambda r: r.chain(1).targets[0].public_state == SERVING, 5)
        assert chain_states(cache)[0] == (nxt, SERVING)
        synced: set[int] = set()
        for _ in range(2):

            def another_syncing(r) -> bool:
                return any(
                    t.public_state == SYNCING and t.target_id not in synced for t in r.chain(1).targets
                )

            r = await cache.wait_for(another_syncing, 5)
            tid = next(t.target_id for t in r.chain(1).targets if t.public_state == SYNCING)
            by_target[tid].local[tid] = common_pb2.UPTODATE
            synced.add(tid)
        await cache.wait_for(lambda r: [t.public_state for t in r.chain(1).targets] == [SERVING] * 3, 5)
        assert chain_states(cache)[0] == (nxt, SERVING)


async def test_chain_updates_survive_a_late_lease_renewal(admin: Admin) -> None:
    """A renewal that comes after the trust margin (a busy host) makes the primary distrust its
    lease for a moment; renewed with the same epoch it is the same primary, and it must go on
    updating chains (it once stopped for good: CI saw targets stay OFFLINE for a minute)."""
    election = admin.server.election
    async with heartbeating(admin) as (_nodes, hb, cache):
        await cache.wait_for(
            lambda r: not r.bootstrapping and [t.public_state for t in r.chain(1).targets] == [SERVING] * 3, 5
        )
        epoch = election.epoch
        renewals = asyncio.Event()
        renew = election.tick

        async def late_tick():
            await renewals.wait()
            return await renew()

        election.tick = late_tick  # the election loop's next renewal waits
        try:
            election._trusted_until = 0.0  # past the trust margin
            assert not admin.server.is_primary()
            await asyncio.sleep(0.4)  # several chain-update intervals pass without a trusted lease
        finally:
            renewals.set()
            del election.tick
        await wait_until(admin.server.is_primary, 5, "the lease renewed")
        assert election.epoch == epoch  # the same primary, not a new term
        v0 = cache.routing.chain(1).version
        hb.paused.add(11)
        await cache.wait_for(lambda r: r.chain(1).version > v0, 5)
        assert chain_states(cache) == [(110, SERVING), (112, SERVING), (111, OFFLINE)]


async def test_a_stalled_primary_fails_no_node(admin: Admin) -> None:
    """The event loop blocked for longer than the heartbeat timeout (an fsync stall, a VM pause):
    nobody could reach the primary meanwhile, so nobody is failed for it; a node that stays silent
    a full timeout after the primary resumed still is."""
    server = admin.server
    async with heartbeating(admin) as (_nodes, hb, cache):
        await cache.wait_for(
            lambda r: (
                not r.bootstrapping
                and [t.public_state for t in r.chain(1).targets] == [SERVING] * 3
                and all(n.status == mgmtd_pb2.NODE_STATUS_ACTIVE for n in r.nodes.values())
            ),
            5,
        )
        cluster = server.cluster
        v0 = cache.routing.chain(1).version
        rounds = 0
        tick = cluster.tick

        async def counted_tick() -> list[int]:
            nonlocal rounds
            rounds += 1
            return await tick()

        cluster.tick = counted_tick
        hb.paused.update({10, 11, 12})
        time.sleep(1.5 * FAST["heartbeat_timeout_s"])  # noqa: ASYNC251 - the stall under test
        resumed, rounds_before = time.monotonic(), rounds
        # the nodes backed off while they were refused; the primary works a few rounds before they
        # are back (a round needs the lease renewed, so these are rounds of a trusted primary)
        await wait_until(lambda: rounds >= rounds_before + 2, 5, "chain updates after the stall")
        hb.paused.clear()
        await wait_until(
            lambda: (
                rounds >= rounds_before + 4
                and all(cluster.node_rt[n].last_heartbeat > resumed for n in (10, 11, 12))
            ),
            5,
            "heartbeats and chain updates after the stall",
        )
        assert server.cluster is cluster  # the same primary all along
        assert {n: cluster.node_rt[n].status for n in (10, 11, 12)} == dict.fromkeys(
            (10, 11, 12), mgmtd_pb2.NODE_STATUS_ACTIVE
        )
        assert cluster.rec.chains[1].version == v0
        hb.paused.add(11)
        await cache.wait_for(lambda r: r.chain(1).version > v0, 5)
        assert chain_states(cache) == [(110, SERVING), (112, SERVING), (111, OFFLINE)]
        assert cache.routing.node(11).status == mgmtd_pb2.NODE_STATUS_FAILED


async def test_stale_chain_version_cannot_claim_uptodate(admin: Admin) -> None:
    async with heartbeating(admin, 2) as (nodes, _hb, cache):
        await cache.wait_for(lambda r: [t.public_state for t in r.chain(1).targets] == [SERVING] * 2, 5)
        await admin.client.offline_target(111)
        nodes[1].local[111] = common_pb2.ONLINE
        await cache.wait_for(lambda r: r.chain(1).targets[1].public_state == SYNCING, 5)
        # a report made against an older chain version does not finish the sync
        nodes[1].chain_version[111] = 1
        nodes[1].local[111] = common_pb2.UPTODATE
        await asyncio.sleep(0.3)  # several update rounds; nothing may change
        await cache.refresh()
        assert cache.routing.chain(1).targets[1].public_state == SYNCING
        nodes[1].chain_version[111] = cache.routing.chain(1).version
        await cache.wait_for(lambda r: r.chain(1).targets[1].public_state == SERVING, 5)


async def test_low_space_reports_reach_routing_info(admin: Admin) -> None:
    """Meta places new files by it, so a target's low-space report publishes a routing version."""
    async with heartbeating(admin) as (nodes, _hb, cache):
        await cache.wait_for(
            lambda r: not r.bootstrapping and [t.public_state for t in r.chain(1).targets] == [SERVING] * 3, 5
        )
        await asyncio.sleep(0.2)  # heartbeats that change nothing publish nothing
        await cache.refresh()
        assert cache.routing.low_space_chains == frozenset()
        v0 = cache.routing.version
        nodes[2].low_space.add(112)
        await cache.wait_for(lambda r: r.target(112).low_space, 5)
        assert cache.routing.version > v0 and cache.routing.low_space_chains == frozenset({1})
        assert not cache.routing.target(111).low_space
        assert [t.public_state for t in cache.routing.chain(1).targets] == [SERVING] * 3
        assert {t.target_id: t.low_space for t in await admin.client.list_targets()}[112]
        nodes[2].low_space.clear()
        await cache.wait_for(lambda r: not r.target(112).low_space, 5)
        assert cache.routing.low_space_chains == frozenset()


async def test_admin_chain_operations(admin: Admin) -> None:
    c = admin.client
    nodes = await storage_cluster(admin, 3)
    for n in nodes:
        await n.heartbeat()
    await c.register_node(13, common_pb2.NODE_STORAGE)
    await c.create_targets([mgmtd_pb2.TargetSpec(target_id=113, node_id=13)])
    chain = await c.update_chain(1, 113, mgmtd_pb2.CHAIN_UPDATE_ADD)
    assert [(t.target_id, t.public_state) for t in chain.targets][-1] == (113, OFFLINE)
    chain = await c.update_chain(1, 113, mgmtd_pb2.CHAIN_UPDATE_REMOVE)
    assert [t.target_id for t in chain.targets] == [110, 111, 112]
    await c.remove_target(113)
    assert 113 not in [t.target_id for t in await c.list_targets()]
    chain = await c.offline_target(110)
    # a SERVING target of a live node drains first: still written to, no longer read from, until
    # its daemon says it acts on that chain version (this fake one reports any version)
    assert [(t.target_id, t.public_state) for t in chain.targets] == [
        (110, SERVING),
        (111, SERVING),
        (112, SERVING),
    ]
    assert [(d.target_id, d.remove, d.since_version) for d in chain.draining] == [(110, False, chain.version)]
    await wait_until(lambda: _chain_of(c, 1, lambda ch: not ch.draining), 5, "the drain")
    chain = next(ch for ch in await c.list_chains() if ch.chain_id == 1)
    assert [(t.target_id, t.public_state) for t in chain.targets] == [
        (111, SERVING),
        (112, SERVING),
        (110, OFFLINE),
    ]
    await expect(StatusCode.FAILED_PRECONDITION, c.rotate_lastsrv(1))
    await expect(StatusCode.INVALID_ARGUMENT, c.set_preferred_order(1, [110, 111]))
    chain = await c.set_preferred_order(1, [110, 111, 112])
    assert list(chain.preferred_order) == [110, 111, 112]
    listed = await c.list_targets(chain_id=1)
    assert [t.target_id for t in listed] == [111, 112, 110]
    assert all(t.chain_id == 1 and t.used_bytes == 123 for t in listed)


async def test_removals_and_disables_leaving_too_few_copies_are_refused_by_mgmtd(admin: Admin) -> None:
    """Only the CLI checked a listing before removing a target or disabling a node: two removals
    (or two disables) at once both passed and left a chain one copy (or UNAVAILABLE), any other
    API client was not checked at all, and an OFFLINE target counted as a copy (helper review).
    mgmtd checks now, one admin request at a time; force does it anyway."""
    c = admin.client
    nodes = await storage_cluster(admin, 3)
    for n in nodes:
        await n.heartbeat()
    remove = mgmtd_pb2.CHAIN_UPDATE_REMOVE
    both = await asyncio.gather(
        c.update_chain(1, 110, remove), c.update_chain(1, 111, remove), return_exceptions=True
    )
    refused = [r for r in both if isinstance(r, FS3Error)]
    assert len(refused) == 1 and refused[0].code == StatusCode.FAILED_PRECONDITION, both
    assert "one copy of its data left" in refused[0].message and "--force" in refused[0].message
    await wait_until(lambda: _chain_of(c, 1, lambda ch: not ch.draining), 5, "the drain")
    gone = 110 if isinstance(both[1], FS3Error) else 111
    kept = 111 if gone == 110 else 110
    chain = await c.update_chain(1, gone, mgmtd_pb2.CHAIN_UPDATE_ADD)  # back, OFFLINE until it syncs
    assert [(t.target_id, t.public_state) for t in chain.targets] == [
        (kept, SERVING),
        (112, SERVING),
        (gone, OFFLINE),
    ]
    # an OFFLINE target holds no current copy: one SERVING target left is one copy
    with pytest.raises(FS3Error, match=r"one copy of its data left \(on target 112\)"):
        await c.update_chain(1, kept, remove)
    # a node holding a chain's last SERVING target is not disabled
    await c.offline_target(kept)
    await wait_until(lambda: _chain_of(c, 1, lambda ch: not ch.draining), 5, "the drain")
    with pytest.raises(FS3Error, match="holds the last SERVING target of chains 1"):
        await c.set_node_enabled(12, False)
    assert not next(n for n in await c.list_nodes() if n.node_id == 12).disabled
    await c.set_node_enabled(12, False, force=True)
    assert next(n for n in await c.list_nodes() if n.node_id == 12).disabled


async def test_two_disables_at_once_cannot_strand_a_chain(admin: Admin) -> None:
    """The first disable's target drains, SERVING until it has: counted as serving, it let the
    second disable through, and the chain was left UNAVAILABLE (attack on 8dd94ad)."""
    c = admin.client
    nodes = await storage_cluster(admin, 3)
    for n in nodes:
        await n.heartbeat()
    await c.offline_target(110)
    await wait_until(lambda: _chain_of(c, 1, lambda ch: not ch.draining), 5, "the drain")
    version = next(ch for ch in await c.list_chains() if ch.chain_id == 1).version
    nodes[1].chain_version[111] = version  # acts on no later version: a drain of 111 lasts
    for n in nodes[1:]:
        await n.heartbeat()  # live: a disabled node's SERVING target drains
    both = await asyncio.gather(
        c.set_node_enabled(11, False), c.set_node_enabled(12, False), return_exceptions=True
    )
    refused = [r for r in both if isinstance(r, FS3Error)]
    assert len(refused) == 1 and "holds the last SERVING target of chains 1" in refused[0].message, both
    assert sum(n.disabled for n in await c.list_nodes() if n.node_id in (11, 12)) == 1


async def test_two_meta_disables_at_once_leave_one_meta_node_active(admin: Admin) -> None:
    """Only the CLI checked a listing before disabling the last active meta node: two disables at
    once both passed and left clients that find meta through routing none (a review, by reading).
    mgmtd checks now, one request at a time; force does it anyway."""
    c = admin.client
    for nid in (20, 21):
        await c.register_node(nid, common_pb2.NODE_META)
        await c.heartbeat(
            mgmtd_pb2.HeartbeatRequest(node_id=nid, type=common_pb2.NODE_META, incarnation=1, sequence=1)
        )
    both = await asyncio.gather(
        c.set_node_enabled(20, False), c.set_node_enabled(21, False), return_exceptions=True
    )
    refused = [r for r in both if isinstance(r, FS3Error)]
    assert len(refused) == 1 and "is the only active meta node" in refused[0].message, both
    assert refused[0].code == StatusCode.FAILED_PRECONDITION and "--force" in refused[0].message
    assert sum(n.disabled for n in await c.list_nodes() if n.node_id in (20, 21)) == 1
    left = 21 if isinstance(both[1], FS3Error) else 20
    await c.set_node_enabled(left, False, force=True)
    assert all(n.disabled for n in await c.list_nodes() if n.node_id in (20, 21))


def _chain_of(c: MgmtdClient, chain_id: int, pred):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return any(ch.chain_id == chain_id and pred(ch) for ch in await c.list_chains())

    return check


async def test_client_sessions(admin: Admin) -> None:
    c = admin.client
    s = mgmtd_pb2.ClientSession(
        client_id="fuse-1", hostname="h", description="mount /mnt", type=common_pb2.NODE_CLIENT
    )
    reply = await c.extend_session(s)
    assert reply.session_timeout_s > 0
    sessions = await c.list_client_sessions()
    assert [x.client_id for x in sessions] == ["fuse-1"] and sessions[0].started_at > 0
    await expect(StatusCode.INVALID_ARGUMENT, c.extend_session(mgmtd_pb2.ClientSession()))
    await wait_until(_no_sessions(c), 5, "session expiry")


async def test_a_user_extends_only_its_own_client_sessions(admin: Admin) -> None:
    alice = admin.env.client(token=await admin.client.add_user(1000, "alice"))
    bob = admin.env.client(token=await admin.client.add_user(1001, "bob"))
    await alice.extend_session(mgmtd_pb2.ClientSession(client_id="a-1", uid=0))  # uid: what the token says
    await alice.extend_session(mgmtd_pb2.ClientSession(client_id="a-1"))
    e = await expect(
        StatusCode.PERMISSION_DENIED, bob.extend_session(mgmtd_pb2.ClientSession(client_id="a-1"))
    )
    assert "belongs to uid 1000" in e.message
    sessions = {x.client_id: x for x in await admin.client.list_client_sessions()}
    assert sessions["a-1"].uid == 1000
    # a root token (as a mount's) or the cluster secret extends any, as before
    await admin.client.extend_session(mgmtd_pb2.ClientSession(client_id="a-1", uid=1000))


async def test_client_sessions_are_listed_in_pages_and_a_user_holds_a_bounded_number(
    admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user could start client sessions without end: 20,000 of them took mgmtd from 57 to 114
    MB, and listing them all in one reply (28 MB) passed gRPC's 4 MB limit, so `fs3 admin
    list-clients` failed and meta, unable to list them, expired no dead client's file sessions."""
    monkeypatch.setattr(cluster_module, "MAX_SESSIONS_PER_USER", 5)
    monkeypatch.setattr(service_module, "SESSIONS_PAGE", 3)
    alice = admin.env.client(token=await admin.client.add_user(1000, "alice"))
    for i in range(5):
        await alice.extend_session(mgmtd_pb2.ClientSession(client_id=f"a-{i}", description="x" * 1024))
    e = await expect(
        StatusCode.RESOURCE_EXHAUSTED, alice.extend_session(mgmtd_pb2.ClientSession(client_id="a-5"))
    )
    assert "uid 1000 holds 5 client sessions" in e.message
    await alice.extend_session(mgmtd_pb2.ClientSession(client_id="a-4"))  # one she holds: extended
    await alice.end_session("a-0")
    await alice.extend_session(mgmtd_pb2.ClientSession(client_id="a-5"))  # room again
    # members (and root tokens) are not counted as a user
    for i in range(4):
        await admin.client.extend_session(mgmtd_pb2.ClientSession(client_id=f"m-{i}", uid=1000))
    # ... nor is a session of hers once a member extends it (it takes the uid the member names)
    await admin.client.extend_session(mgmtd_pb2.ClientSession(client_id="a-5", uid=0))
    await alice.extend_session(mgmtd_pb2.ClientSession(client_id="a-6"))  # room for one more
    await expect(
        StatusCode.RESOURCE_EXHAUSTED, alice.extend_session(mgmtd_pb2.ClientSession(client_id="a-7"))
    )
    await admin.client.end_session("a-6")  # and one a member ends counts off
    await alice.extend_session(mgmtd_pb2.ClientSession(client_id="a-7"))
    page = await list_sessions(admin.client, limit=1000)
    assert [s.client_id for s in page.sessions] == ["a-1", "a-2", "a-3"] and page.more
    page = await list_sessions(admin.client, limit=1000, start_after="a-3")
    assert [s.client_id for s in page.sessions] == ["a-4", "a-5", "a-7"] and page.more
    page = await list_sessions(admin.client, limit=2, start_after="a-7")
    assert [s.client_id for s in page.sessions] == ["m-0", "m-1"] and page.more
    # the client reads every page, as the admin tool and meta do
    listed = [s.client_id for s in await admin.client.list_client_sessions()]
    assert listed == ["a-1", "a-2", "a-3", "a-4", "a-5", "a-7", "m-0", "m-1", "m-2", "m-3"]
    # 0 asks for all at once (a client from before pages)
    assert len((await list_sessions(admin.client)).sessions) == 10


async def list_sessions(c: MgmtdClient, **request: object) -> mgmtd_pb2.ListClientSessionsReply:
    return await c.call("ListClientSessions", mgmtd_pb2.ListClientSessionsRequest(**request))


async def test_a_new_primary_lists_client_sessions_as_partial(
    inproc: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Sessions live in the primary's memory: a new one knows only clients that extended since it
    took over, so meta must not take a client missing from its list for gone (and prune its file
    sessions) until every live client had a session timeout to extend."""
    await inproc.start(1, client_session_timeout_s=3600.0)
    await inproc.primary()
    c = inproc.client(token=await inproc.client().init_cluster("t"))
    await c.extend_session(mgmtd_pb2.ClientSession(client_id="5"))
    reply = await list_sessions(c)
    assert reply.partial and [s.client_id for s in reply.sessions] == ["5"]
    meta = MetaDaemon(MetaConfig())
    meta.mgmtd = c
    with caplog.at_level(logging.INFO, logger="fs3.meta.daemon"):
        assert await meta._live_clients() is None  # no file session expires this round
        assert await meta._live_clients() is None
    assert len([r for r in caplog.records if "partial" in r.getMessage()]) == 1  # once per stretch


async def test_the_session_list_is_complete_a_session_timeout_after_taking_over(admin: Admin) -> None:
    c = admin.client
    meta = MetaDaemon(MetaConfig())
    meta.mgmtd = c

    async def complete() -> bool:
        await c.extend_session(mgmtd_pb2.ClientSession(client_id="7"))
        return not (await list_sessions(c)).partial

    await wait_until(complete, 5, "a complete session list")
    await c.extend_session(mgmtd_pb2.ClientSession(client_id="fuse-1"))
    assert await meta._live_clients() == frozenset({7})


def _no_sessions(c: MgmtdClient):
    async def check() -> bool:
        return await c.list_client_sessions() == []

    return check


async def test_configs(admin: Admin) -> None:
    c = admin.client
    e = await expect(StatusCode.CONFIG_INVALID, c.set_config(common_pb2.NODE_STORAGE, "no_such_key = 1\n"))
    assert "no_such_key" in e.message
    await expect(StatusCode.CONFIG_INVALID, c.set_config(common_pb2.NODE_STORAGE, "= broken"))
    # a node's identity and disks are its own: pushed to every storage node, they were accepted
    # and then never applied anywhere
    e = await expect(StatusCode.CONFIG_INVALID, c.set_config(common_pb2.NODE_STORAGE, "node_id = 7\n"))
    assert "node_id: each node's own" in e.message
    e = await expect(
        StatusCode.CONFIG_INVALID,
        c.set_config(common_pb2.NODE_STORAGE, 'target_ids = [1]\ntarget_paths = ["/d"]\n'),
    )
    assert "target_ids, target_paths" in e.message
    assert await c.get_config(common_pb2.NODE_STORAGE) is None
    assert await c.set_config(common_pb2.NODE_STORAGE, "heartbeat_interval_s = 1.5\n", "faster") == 1
    assert await c.set_config(common_pb2.NODE_STORAGE, "heartbeat_interval_s = 2.5\n") == 2
    assert (await c.get_config(common_pb2.NODE_STORAGE)).version == 2
    assert "1.5" in (await c.get_config(common_pb2.NODE_STORAGE, 1)).content
    await expect(StatusCode.NOT_FOUND, c.get_config(common_pb2.NODE_STORAGE, 9))
    node = StorageNode(c, 10, [])
    await node.register()
    reply = await node.heartbeat()
    assert reply.config.version == 2
    req = node.request()
    req.config_version = 2
    assert not (await c.heartbeat(req)).HasField("config")
    # a user reads the client config only (any token read every daemon's)
    assert await c.set_config(common_pb2.NODE_CLIENT, "rpc_timeout_s = 20.0\n") == 1
    bob = admin.env.client(token=await c.add_user(1001, "bob"))
    e = await expect(StatusCode.PERMISSION_DENIED, bob.get_config(common_pb2.NODE_STORAGE))
    assert "client config only" in e.message
    assert "20.0" in (await bob.get_config(common_pb2.NODE_CLIENT)).content
    session = mgmtd_pb2.ClientSession(client_id="bob-1", type=common_pb2.NODE_STORAGE)
    assert not (await bob.extend_session(session)).HasField("config")
    session = mgmtd_pb2.ClientSession(client_id="bob-2", type=common_pb2.NODE_CLIENT)
    assert (await bob.extend_session(session)).config.version == 1


# ---- health and election -------------------------------------------------------------------------


async def test_health_service(inproc: InProcess) -> None:
    a = await inproc.start(1)
    b = await inproc.start(2)
    primary = await inproc.primary()
    standby = b if primary is a else a
    for server, mgmtd_status in [
        (primary, health_pb2.HealthCheckResponse.SERVING),
        (standby, health_pb2.HealthCheckResponse.NOT_SERVING),
    ]:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            r = await stub.Check(health_pb2.HealthCheckRequest(service=""))
            assert r.status == health_pb2.HealthCheckResponse.SERVING
            r = await stub.Check(health_pb2.HealthCheckRequest(service="fs3.Mgmtd"))
            assert r.status == mgmtd_status
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # Watch reports the standby becoming primary
    async with grpc.aio.insecure_channel(standby.address) as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service="fs3.Mgmtd"))
        first = await stream.read()
        assert first.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await primary.stop(grace_s=0)
        second = await asyncio.wait_for(stream.read(), 10)
        assert second.status == health_pb2.HealthCheckResponse.SERVING
        stream.cancel()


async def test_an_unparsable_request_body_is_invalid_argument_and_logs_no_traceback(
    inproc: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A body protobuf cannot parse, with no credential at all: grpcio logged a 7-line traceback at
    ERROR for each (a flood of them wrote ~1 MB of log a second). Now INVALID_ARGUMENT, quietly;
    the server serves on, the health service too."""
    server = await inproc.start(1)
    await inproc.primary()
    caplog.clear()
    async with grpc.aio.insecure_channel(server.address) as ch:
        for method in ("/fs3.Mgmtd/GetPrimary", "/fs3.Mgmtd/Heartbeat", "/grpc.health.v1.Health/Check"):
            call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
            for _ in range(5):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await call(b"\xff\xff\xff")
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]


async def test_standbys_redirect_and_take_over(inproc: InProcess) -> None:
    servers = [await inproc.start(i) for i in (1, 2, 3)]
    primary = await inproc.primary()
    await asyncio.sleep(0.3)  # several election rounds: still exactly one primary
    assert sum(s.is_primary() for s in servers) == 1
    standby = next(s for s in servers if s is not primary)
    # a client that only knows a standby is told where the primary is
    raw = MgmtdClient([standby.address], timeout_s=0.5)
    inproc.clients.append(raw)
    async with grpc.aio.insecure_channel(standby.address) as ch:
        from fs3.proto import mgmtd_pb2_grpc

        with pytest.raises(grpc.aio.AioRpcError) as e:
            await mgmtd_pb2_grpc.MgmtdStub(ch).GetRoutingInfo(mgmtd_pb2.GetRoutingInfoRequest())
        md = dict(e.value.trailing_metadata())
        assert md["fs3-status"] == str(int(StatusCode.MGMTD_NOT_PRIMARY))
        assert md["fs3-primary"] == primary.address
    await raw.init_cluster()  # followed the redirect
    assert raw.primary == primary.address
    assert (await raw.get_primary()).address == primary.address
    # the primary stops cleanly: it hands the lease over and a standby serves the same state
    clients = inproc.client()
    v_before = (await clients.get_routing_info()).version
    t0 = time.monotonic()
    await primary.stop(grace_s=0)
    inproc.servers.remove(primary)
    new = await inproc.primary()
    assert new is not primary and time.monotonic() - t0 < 2.0
    reply = await clients.get_routing_info(v_before)
    assert reply.version > v_before  # a new primary always publishes a newer version
    await expect(StatusCode.ALREADY_EXISTS, clients.init_cluster())  # state survived


async def test_deposed_primary_cannot_write(inproc: InProcess) -> None:
    server = await inproc.start(1, lease_interval_s=30.0)
    await inproc.primary()
    c = inproc.client(timeout_s=0.5)
    token = await c.init_cluster()
    admin = inproc.client(token=token, timeout_s=0.5)

    async def steal(tr):
        raw = await tr.get(schema.LEASE_KEY)
        lease = mgmtd_pb2.MgmtdLease.FromString(raw)
        tr.set(
            schema.LEASE_KEY,
            mgmtd_pb2.MgmtdLease(
                node_id=99, address="127.0.0.1:1", epoch=lease.epoch + 1, expires_at=time.time() + 30
            ).SerializeToString(),
        )

    await inproc.db.run(steal)
    # the old primary still trusts its lease in memory, but its write is fenced off
    assert server.is_primary()
    await expect(StatusCode.MGMTD_NOT_PRIMARY, admin.add_user(5, "bob"))
    assert not server.is_primary()

    async def users_in_store(tr):
        return [kv.key for kv in await tr.get_prefix(schema.USER)]

    assert await inproc.db.run(users_in_store, read_only=True) == [schema.user_key(0)]


async def test_the_cluster_secret_never_crosses_the_wire() -> None:
    """Services prove the cluster secret to mgmtd with a key derived from it: a listener on mgmtd's
    (clear-text gRPC) traffic learns nothing that opens fs3 RPC connections to storage or meta."""
    seen: list[dict[str, object]] = []

    class Recorder(grpc.GenericRpcHandler):
        def service(self, handler_call_details: grpc.HandlerCallDetails) -> None:
            seen.append(dict(handler_call_details.invocation_metadata))
            return None  # every method unimplemented

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Recorder(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    secret = b"the-cluster-secret-0123456789"
    client = MgmtdClient([f"127.0.0.1:{port}"], cluster_secret=secret, timeout_s=2.0)
    try:
        with pytest.raises(FS3Error):
            await client.get_routing_info()
        assert seen
        for md in seen:
            assert not any(secret.decode() in str(v) for v in md.values()), md
            assert "fs3-cluster-credential" in md
    finally:
        await client.close()
        await server.stop(None)


async def test_an_outage_of_mgmtd_is_logged_once_then_its_end(
    inproc: InProcess, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While no mgmtd answers, a client says so once (and again every UNREACHABLE_REMINDER_S), its
    callers' failures are DEBUG lines, and the first answer after is logged with the outage's
    length; heartbeats and routing refreshes failing meanwhile add no warning of their own."""
    from fs3.client import mgmtd_client

    server = await inproc.start(1)
    await inproc.primary()
    port = server.address.rsplit(":", 1)[1]
    client = inproc.client(timeout_s=0.3)
    client.rpc_timeout_s = 0.1
    routing = RoutingCache(client, refresh_interval_s=3600)
    await client.get_routing_info()
    await server.stop(grace_s=0)
    inproc.servers.remove(server)
    down_at = time.monotonic()

    caplog.set_level(logging.DEBUG, logger="fs3.client")
    for _ in range(3):
        with pytest.raises(mgmtd_client.MgmtdUnreachable) as e:
            await client.get_routing_info()
        assert e.value.code == StatusCode.UNAVAILABLE
    try:
        await routing.refresh()
    except FS3Error as err:
        routing._refresh_failed(err)  # what its refresh loop does with a failure
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("fs3.client")
    ]
    assert len(warnings) == 1 and warnings[0].startswith("mgmtd unreachable"), warnings

    monkeypatch.setattr(mgmtd_client, "UNREACHABLE_REMINDER_S", 0.0)
    with pytest.raises(mgmtd_client.MgmtdUnreachable):
        await client.get_routing_info()
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("fs3.client")
    ]
    assert len(warnings) == 2 and "still unreachable" in warnings[1] and "failed_calls=5" in warnings[1], (
        warnings
    )

    monkeypatch.setattr(mgmtd_client, "UNREACHABLE_REMINDER_S", 60.0)
    caplog.clear()
    back_at = time.monotonic()
    await inproc.start(1, port=int(port))
    await inproc.primary()
    await wait_until_answered(client)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    again = [m for m in infos if m.startswith("mgmtd answers again after")]
    assert again, infos
    # the outage dates from the first call that failed, not from the end of its retries (0.3 s on)
    assert float(again[0].split()[4]) >= back_at - down_at - 0.05, (again, back_at - down_at)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("fs3.client")]
    # once over, a new outage is a new first line
    assert client._unreachable_since is None


async def wait_until_answered(client: MgmtdClient) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            await client.get_routing_info()
            return
        except FS3Error:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


# ---- the stop fence (see also test_mgmtd_resume.py and test_stop_fence.py) -----------------------


async def _stored_fence(a: Admin) -> tuple[float, float]:
    async def fn(tr) -> tuple[float, float]:  # type: ignore[no-untyped-def]
        return schema.decode_fence(await tr.get(schema.FENCE_KEY))

    return await a.env.db.run(fn, read_only=True)


async def test_a_clean_stop_of_the_only_mgmtd_sets_a_stop_fence(admin: Admin) -> None:
    admin.server.cfg.stop_fence_s = 30.0
    async with heartbeating(admin) as (nodes, _, cache):
        await cache.wait_for(
            lambda r: all(r.node(n.node_id).status == mgmtd_pb2.NODE_STATUS_ACTIVE for n in nodes), 5
        )
        await admin.server.stop(grace_s=0)
    ends_at, seconds = await _stored_fence(admin)
    assert seconds == 30.0 and 25.0 < ends_at - time.time() <= 30.0


async def test_a_clean_stop_with_a_standby_sets_no_stop_fence(admin: Admin, caplog) -> None:  # type: ignore[no-untyped-def]
    """A standby takes over within a second of the lease's release and renews the storage nodes'
    leases itself: a fence would only hold off failure handling for nothing."""
    caplog.set_level(logging.INFO, logger="fs3.mgmtd.server")
    admin.server.cfg.stop_fence_s = 30.0
    standby = await admin.env.start(2)
    assert admin.server.election is not None
    election = admin.server.election

    async def standby_seen() -> bool:
        return await election.standbys(10.0) == [2]

    await wait_until(standby_seen, 5, "the standby's record")
    async with heartbeating(admin) as (nodes, _, cache):
        await cache.wait_for(
            lambda r: all(r.node(n.node_id).status == mgmtd_pb2.NODE_STATUS_ACTIVE for n in nodes), 5
        )
        await admin.server.stop(grace_s=0)
    assert await _stored_fence(admin) == (0.0, 0.0)
    assert "stop fence: none needed, standby mgmtd 2 takes over" in caplog.text
    await wait_until(standby.is_primary, 5, "the standby to take over")
    assert standby.election is not None
    primary = standby.election
    assert await primary.standbys(10.0) == []  # a standby that takes over drops its record
    third = await admin.env.start(3)

    async def third_seen() -> bool:
        return await primary.standbys(10.0) == [3]

    await wait_until(third_seen, 5, "the third mgmtd's record")
    await third.stop(grace_s=0)
    assert await primary.standbys(10.0) == []  # a standby's clean stop clears its record


async def test_a_lease_longer_than_storage_leases_outlast_is_warned_of(
    inproc: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A storage node's lease (0.8 x heartbeat_timeout_s) must outlast a failover (up to the
    primary's lease_interval_s): with the old defaults (10 s, 10 s) every node refused reads
    for seconds when a standby took over."""
    caplog.set_level(logging.WARNING, logger="fs3.mgmtd.server")
    await inproc.start(1, lease_interval_s=8.0, heartbeat_timeout_s=10.0)
    assert any("over half of heartbeat_timeout_s" in r.getMessage() for r in caplog.records)
    assert MgmtdConfig().lease_interval_s <= MgmtdConfig().heartbeat_timeout_s / 2


async def test_a_redirect_to_an_address_that_does_not_work_from_here_is_not_followed_again(
    inproc: InProcess,
) -> None:
    """A standby names the primary by the address the primary advertises; where that does not
    work from the client (a host name that does not resolve here, an IPv6 address on an IPv4-only
    host), the client went back to the standby, was redirected again, and never tried the next
    address of its list, the primary's own: every call failed until its deadline."""
    primary = await inproc.start(1, advertise_host="primary.invalid")
    await inproc.primary()
    standby = await inproc.start(2)
    assert primary.address == f"primary.invalid:{primary.port}"
    client = MgmtdClient([standby.address, f"127.0.0.1:{primary.port}"], timeout_s=10)
    inproc.clients.append(client)
    await client.init_cluster()
    assert client.primary == f"127.0.0.1:{primary.port}"


@pytest.mark.skipif(not socket.has_ipv6, reason="this host has no IPv6")
async def test_mgmtd_listens_and_is_reached_over_ipv6(inproc: InProcess) -> None:
    """gRPC takes an IPv6 address only in brackets: mgmtd on ::1 failed to start ("Misformatted
    domain name"), and on :: advertised an address no client could dial."""
    server = await inproc.start(1, listen_host="::1")
    await inproc.primary()
    assert server.address == f"[::1]:{server.port}"
    client = MgmtdClient([server.address], timeout_s=10)
    inproc.clients.append(client)
    await client.init_cluster()
    assert (await client.get_primary()).address == server.address
    # the IPv6 wildcard takes IPv4 as well
    both = await inproc.start(2, listen_host="::")
    for address in (f"127.0.0.1:{both.port}", f"[::1]:{both.port}"):
        c = MgmtdClient([address], timeout_s=10)
        inproc.clients.append(c)
        assert (await c.get_primary()).address == server.address
