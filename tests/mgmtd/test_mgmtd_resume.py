"""The primary's Cluster on a fake monotonic clock: what it may conclude about nodes and client
sessions right after it took over, and after it resumes from a stall (event loop blocked, process
paused, lease not trusted for a while) during which nobody could reach it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from mgmtd_harness import storage_heartbeat

from fs3.kv import open_database
from fs3.mgmtd.admin import Admin
from fs3.mgmtd.cluster import Cluster, Timing
from fs3.mgmtd.election import Election
from fs3.proto import common_pb2, mgmtd_pb2
from fs3.storage.target_map import Lease

pytestmark = pytest.mark.timeout(60)

HEARTBEAT_TIMEOUT_S = 10.0
SESSION_TIMEOUT_S = 300.0
NODES = (10, 11, 12)
ACTIVE, FAILED = mgmtd_pb2.NODE_STATUS_ACTIVE, mgmtd_pb2.NODE_STATUS_FAILED


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Env:
    def __init__(self, cluster: Cluster, mono: Clock, wall: Clock) -> None:
        self.cluster = cluster
        self.mono = mono
        self.wall = wall
        self.seq = dict.fromkeys(NODES, 0)

    async def beat(self, *nodes: int) -> mgmtd_pb2.HeartbeatReply | None:
        """Heartbeats of ``nodes``; the last one's reply."""
        reply = None
        for nid in nodes:
            self.seq[nid] += 1
            reply = await self.cluster.heartbeat(storage_heartbeat(nid, self.seq[nid]))
        return reply

    async def run(self, seconds: float, *, beating: tuple[int, ...] = NODES, step: float = 1.0) -> None:
        """``seconds`` of normal operation: the listed nodes heartbeat and the primary does its
        periodic work every ``step``."""
        end = self.mono.t + seconds
        while self.mono.t < end:
            self.mono.t += step
            self.wall.t += step
            await self.beat(*beating)
            await self.cluster.tick()

    def advance(self, seconds: float) -> None:
        """``seconds`` pass in which the primary hears nothing and does nothing (a stall, if long)."""
        self.mono.t += seconds
        self.wall.t += seconds

    def status(self) -> dict[int, int]:
        return {nid: self.cluster.node_rt[nid].status for nid in NODES}

    def chain(self) -> mgmtd_pb2.ChainInfo:
        return self.cluster.rec.chains[1]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    db = await open_database("mem")
    election = Election(db, 1, "127.0.0.1:1", 3600.0)
    assert (await election.tick())[0]
    mono, wall = Clock(), Clock(1.7e9)
    cluster = Cluster(
        db,
        election,
        Timing(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, client_session_timeout_s=SESSION_TIMEOUT_S),
        monotonic=mono,
        wall=wall,
    )
    await cluster.load()
    admin = Admin(cluster)
    await admin.init_cluster(mgmtd_pb2.InitClusterRequest(cluster_id="resume"))
    for nid in NODES:
        await cluster.register_node(mgmtd_pb2.RegisterNodeRequest(node_id=nid, type=common_pb2.NODE_STORAGE))
    await admin.create_targets([mgmtd_pb2.TargetSpec(target_id=nid + 100, node_id=nid) for nid in NODES])
    await admin.upload_chains(
        [mgmtd_pb2.ChainSpec(chain_id=1, target_ids=[nid + 100 for nid in NODES])], False
    )
    e = Env(cluster, mono, wall)
    await e.run(2 * HEARTBEAT_TIMEOUT_S)  # past the bootstrapping grace, everyone heard of
    assert e.status() == dict.fromkeys(NODES, ACTIVE)
    try:
        yield e
    finally:
        await db.close()


async def test_a_stall_of_the_primary_fails_no_node(env: Env) -> None:
    chain_before = env.chain()
    env.advance(1.5 * HEARTBEAT_TIMEOUT_S)
    # the first round after the stall comes before the nodes' backed-off heartbeats
    assert await env.cluster.tick() == []
    assert env.status() == dict.fromkeys(NODES, ACTIVE)
    await env.run(3 * HEARTBEAT_TIMEOUT_S)
    assert env.status() == dict.fromkeys(NODES, ACTIVE)
    assert env.chain() == chain_before


async def test_a_node_that_stopped_cleanly_is_logged_as_stopped_not_failed(env: Env, caplog) -> None:  # type: ignore[no-untyped-def]
    """A storage daemon's clean stop takes its targets offline in a last heartbeat; its silence
    after that is no failure to warn about (operators restarting daemons saw a WARNING each time).
    A node that goes silent with its targets up is warned of as before."""
    caplog.set_level("INFO", logger="fs3.mgmtd.cluster")
    leaving = storage_heartbeat(10, env.seq[10] + 1)
    env.seq[10] += 1
    leaving.targets[0].local_state = common_pb2.LOCAL_OFFLINE
    await env.cluster.heartbeat(leaving)
    await env.run(HEARTBEAT_TIMEOUT_S + 2, beating=(12,))  # 10 left, 11 went silent
    records = {
        r.getMessage().split(" node_id=")[0]: r.levelname
        for r in caplog.records
        if "node_id=1" in r.getMessage()
    }
    assert records.get("node stopped (its targets were offline)") == "INFO", records
    assert records.get("node failed") == "WARNING", records


async def test_a_node_dead_during_the_stall_fails_one_timeout_after_it(env: Env) -> None:
    env.advance(1.5 * HEARTBEAT_TIMEOUT_S)  # node 12 died during the stall
    await env.cluster.tick()  # the primary resumes
    await env.run(HEARTBEAT_TIMEOUT_S - 1, beating=(10, 11))
    assert env.status()[12] == ACTIVE  # not judged before a full timeout of listening
    await env.run(2, beating=(10, 11))
    assert env.status() == {10: ACTIVE, 11: ACTIVE, 12: FAILED}
    assert [(t.target_id, t.public_state) for t in env.chain().targets] == [
        (110, common_pb2.SERVING),
        (111, common_pb2.SERVING),
        (112, common_pb2.OFFLINE),
    ]


async def _next_primary(env: Env, mono: Clock) -> Env:
    """The lease handed over to another mgmtd (another process: its own monotonic clock)."""
    await env.cluster.election.release()
    election = Election(env.cluster.db, 2, "127.0.0.1:2", 3600.0)
    assert (await election.tick())[0]
    timing = Timing(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, client_session_timeout_s=SESSION_TIMEOUT_S)
    nxt = Cluster(env.cluster.db, election, timing, monotonic=mono, wall=env.wall)
    await nxt.load()
    return Env(nxt, mono, env.wall)


async def test_a_stop_fence_holds_off_failures_here_and_at_the_next_primary(env: Env) -> None:
    """A primary stopping cleanly promises that no node is failed before the fence ends (the
    storage nodes serve on their extended leases meanwhile): a node silent from then on is failed
    neither by it nor by the next primary until the fence and a heartbeat timeout have passed."""
    c = env.cluster
    chain_before = env.chain()
    assert await c.begin_fence(60.0) == env.wall.t + 60.0
    assert c.fence_waiting() == [10, 11, 12]
    reply = await env.beat(10, 11)
    assert reply is not None and reply.fence_s == 60.0
    assert c.fence_waiting() == [12]  # node 12 is not told: it died, or heartbeats slowly
    await env.run(4 * HEARTBEAT_TIMEOUT_S, beating=(10, 11))
    assert env.status()[12] == ACTIVE and env.chain() == chain_before
    nxt = await _next_primary(env, Clock(5.0))
    assert nxt.cluster.fence_until == 5.0 + 20.0 and nxt.cluster.fence_left() == 20.0
    await nxt.run(20 + HEARTBEAT_TIMEOUT_S - 1, beating=(10, 11))
    assert nxt.status()[12] != FAILED and nxt.chain() == chain_before
    reply = await nxt.beat(10)
    assert reply is not None and reply.fence_s == 0.0  # only a stopping primary sets one
    await nxt.run(2, beating=(10, 11))
    assert nxt.status() == {10: ACTIVE, 11: ACTIVE, 12: FAILED}
    assert [(t.target_id, t.public_state) for t in nxt.chain().targets] == [
        (110, common_pb2.SERVING),
        (111, common_pb2.SERVING),
        (112, common_pb2.OFFLINE),
    ]


async def test_a_stop_fence_that_has_ended_changes_nothing_at_the_next_primary(env: Env) -> None:
    await env.cluster.begin_fence(5.0)
    await env.beat(*NODES)
    await env.run(6)
    nxt = await _next_primary(env, Clock(5.0))
    assert nxt.cluster.fence_until == 0.0
    await nxt.run(HEARTBEAT_TIMEOUT_S + 1, beating=(10, 11))
    assert nxt.status() == {10: ACTIVE, 11: ACTIVE, 12: FAILED}


@pytest.mark.parametrize("take_out", ["offline-target", "disable-node"])
async def test_during_a_stop_fence_an_admin_take_out_waits_for_the_fence_to_end(
    env: Env, take_out: str
) -> None:
    """Node 12, told of the fence, is heard once by the next primary and then cut off from mgmtd
    (not from clients): it serves on its fence until the fence ends. Taking its target out (or
    disabling the node) drains it, and the target leaves its chain only a heartbeat timeout after
    the fence (before, a drain ended a heartbeat timeout after it began, and a disabled node's
    target went at once)."""
    await env.cluster.begin_fence(60.0)
    await env.beat(*NODES)
    nxt = await _next_primary(env, Clock(5.0))
    assert nxt.cluster.fence_until == 65.0
    await nxt.run(1, beating=(10, 11))
    # heard once, acting on the chain as it is (a drain begun later is news to it)
    await nxt.cluster.heartbeat(storage_heartbeat(12, 1, chain_version=nxt.chain().version))
    await nxt.run(1, beating=(10, 11))
    if take_out == "offline-target":
        await Admin(nxt.cluster).offline_target(112, False)
    else:
        await nxt.cluster.set_node_enabled(12, False)
    await nxt.run(65 + HEARTBEAT_TIMEOUT_S - 1 - nxt.mono.t, beating=(10, 11))
    chain = nxt.chain()
    assert (chain.targets[2].target_id, chain.targets[2].public_state) == (112, common_pb2.SERVING)
    assert [d.target_id for d in chain.draining] == [112]
    await nxt.run(2, beating=(10, 11))
    assert [(t.target_id, t.public_state) for t in nxt.chain().targets] == [
        (110, common_pb2.SERVING),
        (111, common_pb2.SERVING),
        (112, common_pb2.OFFLINE),
    ]


async def test_a_stop_fence_set_by_a_clock_far_ahead_lasts_no_longer_than_it_was_set_for(
    env: Env, caplog
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level("WARNING", logger="fs3.mgmtd.cluster")
    env.wall.t += 86400  # the stopping primary's clock is a day ahead
    await env.cluster.begin_fence(60.0)
    await env.beat(*NODES)
    env.wall.t -= 86400
    nxt = await _next_primary(env, Clock(5.0))
    assert nxt.cluster.fence_until == 65.0
    assert any("clocks of the mgmtd hosts disagree" in r.getMessage() for r in caplog.records)
    await nxt.run(60 + HEARTBEAT_TIMEOUT_S + 1, beating=(10, 11))
    assert nxt.status()[12] == FAILED
    # and its own clean stop sets a fence of its own, not the day the store said
    assert await nxt.cluster.begin_fence(30.0) == env.wall.t + 30.0


async def test_a_node_is_told_of_the_stop_fence_once_it_acts_on_the_routing_the_reply_names(env: Env) -> None:
    # a reply naming newer routing than the node acts on holds the fence at the node (its lease
    # counts it only once it has that routing): the stop waits for a heartbeat that shows it has
    c = env.cluster
    await c.begin_fence(60.0)
    version = c.rec.routing_version
    env.seq[12] += 1
    reply = await c.heartbeat(storage_heartbeat(12, env.seq[12], routing_version=version - 1))
    assert (reply.fence_s, reply.routing_version) == (60.0, version)
    assert 12 in c.fence_waiting()
    env.seq[12] += 1
    await c.heartbeat(storage_heartbeat(12, env.seq[12], routing_version=version))
    assert 12 not in c.fence_waiting()


async def test_short_gaps_do_not_delay_failure_detection(env: Env) -> None:
    # rounds a little late (under half a timeout apart) still count silence from the last heartbeat
    await env.run(HEARTBEAT_TIMEOUT_S + 1, beating=(10, 11), step=0.4 * HEARTBEAT_TIMEOUT_S)
    assert env.status() == {10: ACTIVE, 11: ACTIVE, 12: FAILED}


async def test_rare_rounds_still_fail_a_silent_node_while_others_heartbeat(env: Env) -> None:
    # periodic work further apart than half a timeout (a long chain_update_interval_s): the
    # heartbeats accepted in between show that the primary was listening all along
    for _ in range(3):
        for _ in range(6):
            env.advance(1.0)
            await env.beat(10, 11)
        await env.cluster.tick()
    assert env.status() == {10: ACTIVE, 11: ACTIVE, 12: FAILED}


def listen_for_sessions(env: Env, seconds: float, *, extending: tuple[str, ...] = ()) -> None:
    """``seconds`` of normal operation for sessions: the listed clients extend every minute, and
    the session list is looked at as often."""
    for _ in range(int(seconds // 60)):
        env.advance(60)
        for cid in extending:
            env.cluster.extend_session(mgmtd_pb2.ClientSession(client_id=cid))
        env.cluster.expire_sessions()


async def test_sessions_are_partial_until_a_session_timeout_after_taking_over(env: Env) -> None:
    c = env.cluster
    assert c.sessions_partial  # the fixture ran for 2 heartbeat timeouts, far less than that
    listen_for_sessions(env, SESSION_TIMEOUT_S, extending=("7",))
    assert not c.sessions_partial and list(c.sessions) == ["7"]


async def test_a_renewing_client_whose_session_expired_is_told_so_but_not_after_a_takeover(env: Env) -> None:
    c = env.cluster
    assert c.sessions_partial
    # just after taking over, an unknown session is no evidence: it is started again
    assert not c.extend_session(mgmtd_pb2.ClientSession(client_id="7"), renewing=True)
    listen_for_sessions(env, SESSION_TIMEOUT_S + 120, extending=("8",))
    assert not c.sessions_partial and list(c.sessions) == ["8"]  # 7 stopped extending: expired
    assert c.extend_session(mgmtd_pb2.ClientSession(client_id="7"), renewing=True)
    assert not c.extend_session(mgmtd_pb2.ClientSession(client_id="7"), renewing=True)  # live again
    assert not c.extend_session(mgmtd_pb2.ClientSession(client_id="9"))  # a new client


async def test_a_wall_clock_step_expires_no_session(env: Env) -> None:
    """Sessions expire a timeout after their last extension on the monotonic clock: the wall clock
    stepping forward (NTP, an operator) must not expire every client at once (meta would then end
    their open files' sessions)."""
    c = env.cluster
    listen_for_sessions(env, SESSION_TIMEOUT_S + 120, extending=("7",))
    assert not c.sessions_partial and list(c.sessions) == ["7"]
    env.wall.t += 10 * SESSION_TIMEOUT_S
    c.expire_sessions()
    assert list(c.sessions) == ["7"]
    listen_for_sessions(env, SESSION_TIMEOUT_S + 60)  # a real timeout without an extension
    assert list(c.sessions) == []


async def test_sessions_survive_a_stall_and_the_list_is_partial_after_it(env: Env) -> None:
    c = env.cluster
    listen_for_sessions(env, SESSION_TIMEOUT_S, extending=("7", "8"))
    assert not c.sessions_partial
    env.advance(SESSION_TIMEOUT_S)  # nobody could extend meanwhile
    c.expire_sessions()
    assert c.sessions_partial and sorted(c.sessions) == ["7", "8"]
    # client 8 died during the stall; 7 extends again. One timeout later the list is complete.
    listen_for_sessions(env, SESSION_TIMEOUT_S, extending=("7",))
    assert not c.sessions_partial and list(c.sessions) == ["7"]


async def test_a_heartbeat_answered_during_the_chain_write_that_takes_its_node_out_holds_its_lease(
    env: Env,
) -> None:
    """Node 12 is declared failed and the chain write that takes its target out is under way when
    a late heartbeat of it arrives. The reply must name the routing that write publishes: counted
    against the routing the node still acts on (its target SERVING there), it would let the node
    serve reads for most of another timeout after the chain without it was published."""
    lease = Lease()
    lease.routing_applied(env.cluster.rec.routing_version)
    await env.run(HEARTBEAT_TIMEOUT_S - 1, beating=(10, 11))  # node 12 silent, not failed yet
    assert env.status()[12] == ACTIVE
    db = env.cluster.db
    run, gate = db.run, asyncio.Event()

    async def slow_run(fn, **kw):  # type: ignore[no-untyped-def]
        if not kw.get("read_only"):
            await gate.wait()  # the chain write takes a while (a busy store)
        return await run(fn, **kw)

    db.run = slow_run
    try:
        env.mono.t += 1.5
        tick = asyncio.create_task(env.cluster.tick())
        await asyncio.sleep(0.01)
        assert env.status()[12] == FAILED  # and the write that takes target 112 out is under way
        lease.sending()
        reply = await env.beat(12)
        assert reply is not None
        lease.confirmed(reply.heartbeat_timeout_s, reply.routing_version)
        gate.set()
        assert await tick == [1]
    finally:
        db.run = run
    assert env.chain().targets[-1].target_id == 112
    assert env.chain().targets[-1].public_state == common_pb2.OFFLINE
    assert reply.routing_version == env.cluster.rec.routing_version
    assert not lease.ok()  # acting on the routing before, the node is not leased by that reply
    lease.routing_applied(reply.routing_version)
    assert lease.ok()  # once it acts on the new routing, it is
