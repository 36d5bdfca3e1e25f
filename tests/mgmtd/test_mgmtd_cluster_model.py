"""The primary's Cluster driven by random heartbeats, silences, clock jumps and admin operations
(hypothesis), checking the chain invariants on what is published and that memory and the store agree."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fs3.errors import FS3Error
from fs3.kv import open_database
from fs3.mgmtd.admin import Admin
from fs3.mgmtd.cluster import Cluster, Timing, load_records
from fs3.mgmtd.election import Election
from fs3.proto import common_pb2, mgmtd_pb2

pytestmark = pytest.mark.timeout(120)

NODES = (10, 11, 12, 13)
TIMEOUT_S = 5.0
LOCAL = st.sampled_from([common_pb2.UPTODATE, common_pb2.ONLINE, common_pb2.LOCAL_OFFLINE])


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class ClusterModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.mono = Clock()
        self.run(self._setup())

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    async def _setup(self) -> None:
        self.db = await open_database("mem")
        election = Election(self.db, 1, "127.0.0.1:1", 3600.0)
        assert (await election.tick())[0]
        self.cluster = Cluster(self.db, election, Timing(heartbeat_timeout_s=TIMEOUT_S), monotonic=self.mono)
        await self.cluster.load()
        self.admin = Admin(self.cluster)
        await self.admin.init_cluster(mgmtd_pb2.InitClusterRequest(cluster_id="model"))
        for nid in NODES:
            await self.cluster.register_node(
                mgmtd_pb2.RegisterNodeRequest(node_id=nid, type=common_pb2.NODE_STORAGE)
            )
        # two chains of three over four nodes, one target per (node, chain)
        await self.admin.create_targets(
            [mgmtd_pb2.TargetSpec(target_id=nid * 10 + c, node_id=nid) for nid in NODES for c in (1, 2)]
        )
        await self.admin.upload_chains(
            [
                mgmtd_pb2.ChainSpec(chain_id=1, target_ids=[101, 111, 121]),
                mgmtd_pb2.ChainSpec(chain_id=2, target_ids=[112, 122, 132]),
            ],
            False,
        )
        self.members = {1: {101, 111, 121}, 2: {112, 122, 132}}
        self.seq = dict.fromkeys(NODES, 0)
        self.local = {
            nid: {nid * 10 + 1: common_pb2.UPTODATE, nid * 10 + 2: common_pb2.UPTODATE} for nid in NODES
        }
        self.versions = {cid: c.version for cid, c in self.cluster.rec.chains.items()}
        self.published = self.cluster.rec.routing_version

    def teardown(self) -> None:
        self.run(self.db.close())
        self.loop.close()

    # ---- events --------------------------------------------------------------------------------

    @rule(node=st.sampled_from(NODES), state=LOCAL)
    def heartbeat(self, node: int, state: int) -> None:
        """A node reports every target of it in ``state``."""
        for tid in self.local[node]:
            self.local[node][tid] = state
        self._beat(node)

    @rule(node=st.sampled_from(NODES))
    def heartbeat_unchanged(self, node: int) -> None:
        self._beat(node)

    def _beat(self, node: int) -> None:
        self.seq[node] += 1
        targets = [
            mgmtd_pb2.TargetHeartbeat(target_id=tid, local_state=s, chain_version=1 << 40)
            for tid, s in self.local[node].items()
        ]
        req = mgmtd_pb2.HeartbeatRequest(
            node_id=node,
            type=common_pb2.NODE_STORAGE,
            incarnation=1,
            sequence=self.seq[node],
            targets=targets,
        )
        self.run(self.cluster.heartbeat(req))

    @rule()
    def storage_reacts_to_routing(self) -> None:
        # what storage does: an UPTODATE target that routing shows out of the data path drops its
        # view and comes back ONLINE, to be synced
        for chain in self.cluster.rec.chains.values():
            for t in chain.targets:
                node = t.target_id // 10
                if (
                    t.public_state in (common_pb2.WAITING, common_pb2.OFFLINE)
                    and self.local[node][t.target_id] == common_pb2.UPTODATE
                ):
                    self.local[node][t.target_id] = common_pb2.ONLINE

    @rule()
    def sync_completes(self) -> None:
        # what storage does: a SYNCING target that got everything reports UPTODATE
        for chain in self.cluster.rec.chains.values():
            for t in chain.targets:
                if t.public_state == common_pb2.SYNCING:
                    node = t.target_id // 10
                    if self.local[node][t.target_id] == common_pb2.ONLINE:
                        self.local[node][t.target_id] = common_pb2.UPTODATE

    @rule(dt=st.floats(0.1, 2 * TIMEOUT_S))
    def time_passes(self, dt: float) -> None:
        self.mono.t += dt

    @rule()
    def tick(self) -> None:
        before = {cid: (c.version, list(c.targets)) for cid, c in self.cluster.rec.chains.items()}
        changed = self.run(self.cluster.tick())
        for cid, c in self.cluster.rec.chains.items():
            old_version, old_targets = before[cid]
            if cid in changed:
                assert c.version == old_version + 1 and list(c.targets) != old_targets
            else:
                assert c.version == old_version and list(c.targets) == old_targets

    @rule(which=st.sampled_from([101, 111, 121, 112, 122, 132]), force=st.booleans())
    def admin_offline(self, which: int, force: bool) -> None:
        try:
            self.run(self.admin.offline_target(which, force))
        except FS3Error:
            pass

    @precondition(
        lambda self: any(
            c.targets[0].public_state == common_pb2.LASTSRV for c in self.cluster.rec.chains.values()
        )
    )
    @rule()
    def admin_rotate_lastsrv(self) -> None:
        for cid, c in self.cluster.rec.chains.items():
            if c.targets[0].public_state == common_pb2.LASTSRV:
                self.run(self.admin.rotate_lastsrv(cid))
                return

    # ---- invariants ----------------------------------------------------------------------------

    @invariant()
    def chains_are_well_formed(self) -> None:
        for cid, c in self.cluster.rec.chains.items():
            states = [t.public_state for t in c.targets]
            assert states.count(common_pb2.SYNCING) <= 1, states
            assert {t.target_id for t in c.targets} == self.members[cid]
            assert c.version >= self.versions[cid]
            self.versions[cid] = c.version

    @invariant()
    def every_chain_keeps_a_last_server(self) -> None:
        # a SERVING target, or the LASTSRV one that serves once back: no chain waits forever
        for c in self.cluster.rec.chains.values():
            states = [t.public_state for t in c.targets]
            assert common_pb2.SERVING in states or common_pb2.LASTSRV in states, states

    @invariant()
    def after_a_round_serving_means_serving_head(self) -> None:
        # admin offline with force may leave a non-SERVING head until the next round; a round fixes it
        for c in self.cluster.rec.chains.values():
            states = [t.public_state for t in c.targets]
            if common_pb2.SERVING in states and states[0] != common_pb2.SERVING:
                assert any(s == common_pb2.OFFLINE for s in states)

    @invariant()
    def routing_version_only_grows_and_store_matches_memory(self) -> None:
        rec = self.run(self.db.run(load_records, read_only=True))
        assert rec.chains == self.cluster.rec.chains
        assert rec.routing_version == self.cluster.rec.routing_version >= self.published
        self.published = rec.routing_version
        info = self.cluster.routing_info()
        assert info.version == self.cluster.rec.routing_version
        assert {c.chain_id: c for c in info.chains} == self.cluster.rec.chains


TestClusterModel = ClusterModel.TestCase
TestClusterModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
