"""Admin operations that take a SERVING target out of its chain (offline-target, update-chain
remove, rotate to the preferred order) drain it first: the chain version that says so keeps it in
the data path (written to) but out of reads, and the chain updater makes the change once the
target's daemon acts on that version, its node has failed, or a heartbeat timeout has passed.
Taken out at once, a daemon still on the older routing served reads of data its chain no longer
wrote to it. The primary's Cluster on a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from mgmtd_harness import storage_heartbeat

from fs3.errors import FS3Error, StatusCode
from fs3.kv import open_database
from fs3.mgmtd.admin import Admin
from fs3.mgmtd.cluster import Cluster, Timing
from fs3.mgmtd.election import Election
from fs3.proto import common_pb2, mgmtd_pb2

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 10.0
NODES = (10, 11, 12)
SERVING, OFFLINE = common_pb2.SERVING, common_pb2.OFFLINE


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Env:
    def __init__(self, db, election: Election) -> None:  # type: ignore[no-untyped-def]
        self.db = db
        self.election = election
        self.mono = Clock()
        self.seq = dict.fromkeys(NODES, 0)
        # the chain version each node's daemon acts on (what its heartbeats report)
        self.acting = dict.fromkeys(NODES, 0)

    async def open(self) -> None:
        self.cluster = Cluster(
            self.db, self.election, Timing(heartbeat_timeout_s=TIMEOUT_S), monotonic=self.mono
        )
        await self.cluster.load()
        self.admin = Admin(self.cluster)

    async def beat(self, *nodes: int) -> None:
        for nid in nodes:
            self.seq[nid] += 1
            await self.cluster.heartbeat(storage_heartbeat(nid, self.seq[nid], self.acting[nid]))

    async def run(self, seconds: float, beating: tuple[int, ...] = NODES) -> None:
        end = self.mono.t + seconds
        while self.mono.t < end:
            self.mono.t += 1.0
            await self.beat(*beating)
            await self.cluster.tick()

    def catch_up(self, *nodes: int) -> None:
        """The daemons of ``nodes`` act on the current chain version."""
        for nid in nodes:
            self.acting[nid] = self.chain().version

    def chain(self) -> mgmtd_pb2.ChainInfo:
        return self.cluster.rec.chains[1]

    def states(self) -> list[tuple[int, int]]:
        return [(t.target_id, t.public_state) for t in self.chain().targets]

    def draining(self) -> list[int]:
        return [d.target_id for d in self.chain().draining]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    db = await open_database("mem")
    election = Election(db, 1, "127.0.0.1:1", 3600.0)
    assert (await election.tick())[0]
    e = Env(db, election)
    await e.open()
    await e.admin.init_cluster(mgmtd_pb2.InitClusterRequest(cluster_id="drain"))
    for nid in NODES:
        await e.cluster.register_node(
            mgmtd_pb2.RegisterNodeRequest(node_id=nid, type=common_pb2.NODE_STORAGE)
        )
    await e.admin.create_targets([mgmtd_pb2.TargetSpec(target_id=nid + 100, node_id=nid) for nid in NODES])
    await e.admin.upload_chains(
        [mgmtd_pb2.ChainSpec(chain_id=1, target_ids=[nid + 100 for nid in NODES])], False
    )
    e.catch_up(*NODES)
    await e.run(2 * TIMEOUT_S)
    assert e.states() == [(110, SERVING), (111, SERVING), (112, SERVING)]
    e.catch_up(*NODES)
    try:
        yield e
    finally:
        await db.close()


async def test_an_offlined_target_drains_until_its_daemon_acts_on_that(env: Env) -> None:
    chain = await env.admin.offline_target(112, False)
    assert chain.version == env.chain().version and env.draining() == [112]
    assert env.states() == [(110, SERVING), (111, SERVING), (112, SERVING)]  # still written to
    assert (await env.admin.offline_target(112, False)).version == chain.version  # already under way
    await env.run(TIMEOUT_S / 2)  # its daemon still acts on the version before
    assert env.draining() == [112] and env.chain().version == chain.version
    env.catch_up(12)
    await env.run(1)
    assert env.states() == [(110, SERVING), (111, SERVING), (112, OFFLINE)]
    assert env.draining() == [] and env.chain().version == chain.version + 1


async def test_a_drain_ends_after_a_heartbeat_timeout_whatever_the_daemon_says(env: Env) -> None:
    """A daemon that goes on heartbeating without acting on the new routing has its lease held
    back (the replies name a newer routing): after a heartbeat timeout it serves no reads."""
    await env.admin.offline_target(111, False)
    await env.run(TIMEOUT_S - 2)
    assert env.draining() == [111]
    await env.run(3)
    assert [t for t, _ in env.states()] == [110, 112, 111] and env.draining() == []
    assert env.states()[2][1] != SERVING  # out of the data path (its live daemon is resynced next)


async def test_a_draining_target_whose_node_fails_just_goes(env: Env) -> None:
    await env.admin.offline_target(110, False)
    await env.run(TIMEOUT_S + 2, beating=(11, 12))
    assert env.states() == [(111, SERVING), (112, SERVING), (110, OFFLINE)] and env.draining() == []


async def test_a_removed_target_drains_then_leaves_the_chain(env: Env) -> None:
    await env.admin.set_preferred_order(1, [110, 111, 112])
    chain = await env.admin.update_chain(1, 111, mgmtd_pb2.CHAIN_UPDATE_REMOVE)
    assert [d.remove for d in chain.draining] == [True] and len(chain.targets) == 3
    env.catch_up(11)
    await env.run(1)
    assert env.states() == [(110, SERVING), (112, SERVING)] and env.draining() == []
    assert list(env.chain().preferred_order) == [110, 112]
    assert 111 not in env.cluster.target_chain
    await env.admin.remove_target(111)  # in no chain now


async def test_targets_out_of_the_read_path_or_of_failed_nodes_change_at_once(env: Env) -> None:
    await env.run(TIMEOUT_S + 2, beating=(10, 11))  # node 12 fails: 112 OFFLINE
    env.catch_up(10, 11)
    assert env.states()[-1] == (112, OFFLINE)
    chain = await env.admin.update_chain(1, 112, mgmtd_pb2.CHAIN_UPDATE_REMOVE)
    assert [t.target_id for t in chain.targets] == [110, 111] and not chain.draining
    # a forced offline of the last SERVING target: nothing else serves reads
    await env.admin.offline_target(110, False)
    env.catch_up(10)
    await env.run(1, beating=(10, 11))
    assert env.states() == [(111, SERVING), (110, OFFLINE)]
    with pytest.raises(FS3Error) as e:
        await env.admin.offline_target(111, False)
    assert e.value.code == StatusCode.FAILED_PRECONDITION
    chain = await env.admin.offline_target(111, True)
    assert not chain.draining and chain.targets[-1].target_id == 111


async def test_a_drain_that_would_take_the_last_server_is_given_up(env: Env) -> None:
    await env.run(4, beating=(12,))  # 110 and 111 fall silent, and fail while 112 drains
    await env.admin.offline_target(112, False)
    assert env.draining() == [112]
    await env.run(TIMEOUT_S, beating=(12,))
    assert env.states()[0] == (112, SERVING) and env.draining() == []  # it stays, and serves


async def test_a_new_primary_goes_on_draining(env: Env) -> None:
    chain = await env.admin.offline_target(110, False)
    await env.open()  # another primary takes over (same store)
    assert env.draining() == [110] and env.chain().version == chain.version
    await env.run(TIMEOUT_S - 1)  # the drain waits from when it took over
    assert env.draining() == [110]
    await env.run(2)
    assert [t for t, _ in env.states()] == [111, 112, 110] and env.draining() == []


async def test_a_disabled_nodes_serving_targets_drain_too(env: Env) -> None:
    """Disabling a node takes its targets out; a SERVING one drains first. The node's heartbeats
    are refused, but what its daemon says it acts on still ends the drain; then the target stays
    OFFLINE (nothing of a disabled node is heard)."""
    await env.cluster.set_node_enabled(11, False)
    assert env.draining() == [111] and env.states()[1] == (111, SERVING)
    with pytest.raises(FS3Error) as e:
        await env.beat(11)
    assert e.value.code == StatusCode.MGMTD_NODE_DISABLED
    await env.run(2, beating=(10, 12))
    assert env.draining() == [111]
    env.catch_up(11)
    with pytest.raises(FS3Error):
        await env.beat(11)  # refused, and heard as the daemon acting on the draining version
    await env.run(1, beating=(10, 12))
    assert env.states() == [(110, SERVING), (112, SERVING), (111, OFFLINE)] and env.draining() == []
    await env.run(2 * TIMEOUT_S, beating=(10, 12))
    assert env.states()[-1] == (111, OFFLINE)
    await env.cluster.set_node_enabled(11, True)
    await env.run(3)
    assert env.states()[-1][0] == 111 and env.states()[-1][1] != OFFLINE  # back: it resyncs


async def test_a_disabled_nodes_drain_ends_after_a_heartbeat_timeout(env: Env) -> None:
    await env.cluster.set_node_enabled(10, False)
    assert env.draining() == [110]
    await env.run(TIMEOUT_S + 1, beating=(11, 12))
    assert env.states() == [(111, SERVING), (112, SERVING), (110, OFFLINE)] and env.draining() == []


async def test_only_a_node_that_may_hold_a_lease_drains(env: Env) -> None:
    """Right after a primary starts, nodes it has not heard from are only registered. On the
    first primary ever none of them can hold a read lease: their targets go at once. After a
    takeover (a lease epoch past the first), one may hold an earlier primary's lease until this
    primary's grace ends: its targets drain."""
    await env.open()  # a primary starts over the same store (same lease epoch: the first)
    assert env.cluster.bootstrapping and not any(env.cluster.may_serve(n) for n in NODES)
    chain = await env.admin.offline_target(110, False)
    assert not chain.draining and chain.targets[-1].target_id == 110
    await env.election.release()  # another mgmtd takes over
    env.election = Election(env.db, 2, "127.0.0.1:2", 3600.0)
    assert (await env.election.tick())[0] and env.election.epoch == 2
    await env.open()
    assert all(env.cluster.may_serve(n) for n in NODES)
    chain = await env.admin.offline_target(111, False)
    assert [d.target_id for d in chain.draining] == [111]


async def test_a_disabled_nodes_drain_goes_on_after_a_takeover(env: Env) -> None:
    """A primary that takes over while a disabled node's target drains keeps it draining (SERVING
    in the data path, out of reads) until its daemon acts on that version or a heartbeat timeout
    passes, as the previous primary would have: taken out at once, a daemon still on the older
    routing and an earlier primary's lease could serve reads its chain no longer writes to it."""
    await env.cluster.set_node_enabled(11, False)
    assert env.draining() == [111]
    await env.election.release()  # another mgmtd takes over
    env.election = Election(env.db, 2, "127.0.0.1:2", 3600.0)
    assert (await env.election.tick())[0]
    await env.open()
    await env.run(2, beating=(10, 12))
    assert env.draining() == [111] and env.states()[1] == (111, SERVING)
    await env.run(TIMEOUT_S, beating=(10, 12))
    assert env.states() == [(110, SERVING), (112, SERVING), (111, OFFLINE)] and env.draining() == []


async def test_a_chain_with_a_disabled_nodes_draining_target_changes_while_the_new_primary_starts(
    env: Env,
) -> None:
    """Right after a takeover the new primary changes no chain with a target it knows nothing of
    (until a heartbeat timeout has passed); a disabled node's draining target must not count as
    such (nothing of that node is heard): another target's failure, and the end of the drain once
    the daemon acts on that version, are acted on at once."""
    await env.cluster.set_node_enabled(11, False)
    await env.election.release()  # another mgmtd takes over
    env.election = Election(env.db, 2, "127.0.0.1:2", 3600.0)
    assert (await env.election.tick())[0]
    await env.open()
    assert env.cluster.bootstrapping
    await env.run(2, beating=(10, 12))
    failed = storage_heartbeat(12, env.seq[12] + 1)
    env.seq[12] += 1
    failed.targets[0].local_state = common_pb2.LOCAL_OFFLINE
    await env.cluster.heartbeat(failed)  # 112's disk failed
    await env.cluster.tick()
    assert env.cluster.bootstrapping and dict(env.states())[112] == OFFLINE
    env.catch_up(11)  # 11's daemon acts on the draining version (its heartbeats are refused)
    with pytest.raises(FS3Error):
        await env.beat(11)
    await env.cluster.tick()
    assert env.cluster.bootstrapping and env.draining() == [] and dict(env.states())[111] == OFFLINE


LASTSRV = common_pb2.LASTSRV


async def test_a_disabled_nodes_drain_given_up_leaves_its_target_lastsrv_not_serving_unheard(
    env: Env,
) -> None:
    """A disabled node's target drains; the others fail meanwhile, so the drain is given up (it
    is the last server). Its node's reports are refused, so it may not stay SERVING unheard (a
    node powered off for the maintenance it was disabled for would stay the chain's head, never
    failed): it becomes the chain's LASTSRV, as a disabled last server does at once."""
    await env.run(4, beating=(10,))  # 11 and 12 fall silent, and fail during the drain
    await env.cluster.set_node_enabled(10, False)
    assert env.draining() == [110]
    await env.run(TIMEOUT_S + 3, beating=())
    await env.run(2, beating=())
    assert env.draining() == [] and env.states()[0] == (110, LASTSRV)
    await env.cluster.set_node_enabled(10, True)  # back from maintenance: it serves again
    await env.run(3, beating=(10,))
    assert env.states()[0] == (110, SERVING)


async def test_a_second_take_out_is_checked_against_the_chain_the_drains_leave(env: Env) -> None:
    """With 112 failed and 110 draining, 111 is the chain's last server once 110 leaves: offlining
    or removing it is refused (both draining, nothing was left to read from, and the second drain
    was given up at its end though the admin had been told it went ahead); disabling its node
    does not drain it either (a disabled last server goes OFFLINE at once)."""
    await env.run(TIMEOUT_S + 2, beating=(10, 11))  # node 12 fails
    env.catch_up(10, 11)
    await env.admin.offline_target(110, False)
    assert env.draining() == [110]
    for take_out in (
        env.admin.offline_target(111, False),
        env.admin.update_chain(1, 111, mgmtd_pb2.CHAIN_UPDATE_REMOVE),
    ):
        with pytest.raises(FS3Error) as e:
            await take_out
        assert e.value.code == StatusCode.FAILED_PRECONDITION and "110" in e.value.message
    assert env.draining() == [110]
    await env.cluster.set_node_enabled(11, False)
    assert env.draining() == [110]


async def test_a_force_not_needed_when_asked_is_not_applied_at_the_end_of_the_drain(env: Env) -> None:
    """offline-target --force while the others serve needs no force; if they fail during the
    drain, the target alone holds what was written since: the drain is given up (it stays
    SERVING) rather than forced, which made a stale target the chain's LASTSRV."""
    await env.run(4, beating=(10,))  # 11 and 12 fall silent
    await env.admin.offline_target(110, True)
    assert [d.force for d in env.chain().draining] == [False]
    await env.run(TIMEOUT_S + 3, beating=(10,))
    assert env.states()[0] == (110, SERVING) and env.draining() == []


async def test_a_target_removed_while_its_daemon_reports_it_fails_not_the_node(env: Env) -> None:
    """A spare target in no chain is removed while its node's daemon still has it configured (the
    order of a disk replacement): the node's heartbeats, which report it, are taken all the same
    (refused, they failed the node and its other targets with it)."""
    await env.admin.create_targets([mgmtd_pb2.TargetSpec(target_id=210, node_id=10)])
    await env.admin.remove_target(210)
    for _ in range(int(TIMEOUT_S) + 3):
        env.mono.t += 1.0
        for nid in NODES:
            env.seq[nid] += 1
            req = storage_heartbeat(nid, env.seq[nid], env.acting[nid])
            if nid == 10:
                req.targets.add(target_id=210, local_state=common_pb2.ONLINE)
                req.targets.add(target_id=111, local_state=common_pb2.ONLINE)  # another node's
            await env.cluster.heartbeat(req)
        await env.cluster.tick()
    assert env.cluster.node_rt[10].status == mgmtd_pb2.NODE_STATUS_ACTIVE
    assert env.states() == [(110, SERVING), (111, SERVING), (112, SERVING)]


async def test_a_node_whose_draining_target_is_its_chains_last_server_is_not_disabled(env: Env) -> None:
    """A draining target counts for none when another SERVING target stays (two disables at once
    both passed); but the drain of a chain's last server never ends (it stays, see
    Cluster._take_out_drained): disabling its node sent it OFFLINE as LASTSRV, the chain
    UNAVAILABLE, without --force (a review: offline-target, then the other server's daemon
    stopped, then disable-node)."""
    await env.admin.offline_target(111, False)
    env.catch_up(11)
    await env.run(1)
    assert env.states() == [(110, SERVING), (112, SERVING), (111, OFFLINE)]
    await env.admin.offline_target(110, False)  # drains: 112 serves on
    assert env.draining() == [110]
    env.seq[12] += 1  # 112's daemon stops (its disk gone): 110, draining, is the last server
    beat = storage_heartbeat(12, env.seq[12], env.acting[12])
    beat.targets[0].local_state = common_pb2.LOCAL_OFFLINE
    await env.cluster.heartbeat(beat)
    await env.cluster.tick()
    assert dict(env.states())[112] == OFFLINE and dict(env.states())[110] == SERVING
    assert env.draining() == [110]
    with pytest.raises(FS3Error, match="holds the last SERVING target of chains 1"):
        await env.cluster.set_node_enabled(10, False, force=False)
    assert dict(env.states())[110] == SERVING
