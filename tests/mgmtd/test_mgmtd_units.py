"""Pieces of mgmtd and its clients on their own: tokens, key layout, the lease, the node agent, the
session keeper and the routing cache."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mgmtd_harness import Admin, InProcess, wait_until

from fs3.client import mgmtd_client
from fs3.client.mgmtd_client import ClientSessionKeeper, MgmtdClient, NodeAgent
from fs3.client.routing import Routing, RoutingCache
from fs3.errors import FS3Error, StatusCode
from fs3.kv import open_database
from fs3.mgmtd import schema, users
from fs3.mgmtd.admin import _refuse_losing_copies
from fs3.mgmtd.election import Election
from fs3.proto import common_pb2, mgmtd_pb2

pytestmark = pytest.mark.timeout(60)


# ---- tokens --------------------------------------------------------------------------------------


def test_token_round_trip_and_digest_only_storage() -> None:
    token, digest = users.new_token(1234)
    uid, d2 = users.parse_token(token)
    assert uid == 1234 and d2 == digest
    stored = mgmtd_pb2.StoredUser(user=mgmtd_pb2.User(uid=1234))
    t2 = users.add_token(stored, now=100.0)
    assert t2 not in stored.SerializeToString().decode("latin-1")  # only the digest is stored
    assert users.token_matches(stored, users.parse_token(t2)[1], now=200.0)
    assert not users.token_matches(stored, digest, now=200.0)


def test_token_expiry_and_limit() -> None:
    stored = mgmtd_pb2.StoredUser(user=mgmtd_pb2.User(uid=1))
    t = users.add_token(stored, now=100.0, ttl_s=10.0)
    d = users.parse_token(t)[1]
    assert users.token_matches(stored, d, now=105.0)
    assert not users.token_matches(stored, d, now=111.0)
    for _ in range(users.MAX_TOKENS_PER_USER + 5):
        users.add_token(stored, now=100.0)
    assert len(stored.tokens) == users.MAX_TOKENS_PER_USER


@pytest.mark.parametrize(
    "uid",
    ["\u00b2", "\uff10", "\u0663"],  # a digit to str.isdigit() but not int(); full-width 0; Arabic-Indic 3
)
def test_a_token_whose_uid_is_not_ascii_digits_is_malformed(uid: str) -> None:
    with pytest.raises(FS3Error) as e:
        users.parse_token(f"fs3u.{uid}." + "A" * 43)
    assert (e.value.code, e.value.message) == (StatusCode.UNAUTHENTICATED, "malformed token")


@given(st.text(max_size=80))
def test_garbage_tokens_are_refused_cleanly(text: str) -> None:
    try:
        users.parse_token(text)
    except FS3Error as e:
        assert e.code == StatusCode.UNAUTHENTICATED


# ---- key layout ----------------------------------------------------------------------------------


def test_keys_sort_by_id_and_newest_config_first() -> None:
    assert schema.target_key(2) < schema.target_key(256) < schema.target_key(1 << 40)
    assert schema.chain_table_key(1, 9) < schema.chain_table_key(1, 10) < schema.chain_table_key(2, 1)
    assert schema.config_key(common_pb2.NODE_META, 10) < schema.config_key(common_pb2.NODE_META, 9)
    assert schema.config_key(common_pb2.NODE_META, 1).startswith(schema.config_prefix(common_pb2.NODE_META))
    for k in (schema.node_key(1), schema.target_key(1), schema.chain_key(1), schema.user_key(1)):
        assert k[:4] in (b"NODE", b"TGIF", b"CHIF", b"USER")
    assert schema.LEASE_KEY.startswith(b"SING")


# ---- the lease -----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_lease_one_holder_expiry_takeover_and_fencing() -> None:
    db = await open_database("mem")
    clock = Clock()
    a = Election(db, 1, "a:1", 10.0, clock=clock, monotonic=clock)
    b = Election(db, 2, "b:1", 10.0, clock=clock, monotonic=clock)
    assert await a.tick() == (True, True)
    assert await b.tick() == (False, False)
    assert b.primary_address() == (1, "a:1")
    clock.t += 5
    assert await a.tick() == (True, False)  # extended
    clock.t += 9
    assert await b.tick() == (False, False)  # b sees the renewal of +5 only now, at +14
    clock.t += 9
    assert await b.tick() == (False, False)  # unchanged for 9 s of b's clock: a's still
    assert b.primary_address() == (1, "a:1")
    clock.t += 1
    assert b.primary_address() == (0, "")  # unchanged for a lease: nobody known to hold it
    assert await b.tick() == (True, True)  # unchanged for a lease: b takes over
    assert b.epoch == a.epoch + 1
    # a stopped believing in its lease a trust margin before; its writes are fenced
    assert not a.is_primary()
    with pytest.raises(FS3Error) as e:
        await db.run(a.check)
    assert e.value.code == StatusCode.MGMTD_LEASE_LOST
    await db.run(b.check)
    assert await a.tick() == (False, False)
    # a clean release hands over at once
    await b.release()
    assert await a.tick() == (True, True)
    await db.close()


async def test_lease_decisions_ignore_wall_clock_steps() -> None:
    """Each mgmtd's wall clock may step (NTP, an operator): the lease is timed on monotonic
    clocks. Before, (1) a holder whose clock stepped back trusted its lease for the step's length,
    while another had taken it (two primaries); (2) a standby whose clock stepped forward took a
    live holder's lease; (3) a holder that died with its clock ahead was replaced only when the
    other's clock reached its expiry (no primary for the clock's lead)."""
    db = await open_database("mem")
    mono = Clock()
    wall_a, wall_b = Clock(), Clock()
    a = Election(db, 1, "a:1", 10.0, clock=wall_a, monotonic=mono)
    b = Election(db, 2, "b:1", 10.0, clock=wall_b, monotonic=mono)
    assert await a.tick() == (True, True)
    assert await b.tick() == (False, False)
    # (1) a's clock steps back 300 s and a cannot reach the store: it stops acting as primary
    # by its trust margin (7.5 s after its renewal began), before b may take over (10 s)
    wall_a.t -= 300
    mono.t += 7.4
    assert a.is_primary()
    mono.t += 0.2
    assert not a.is_primary()
    mono.t += 2.5
    assert await b.tick() == (True, True)
    assert await a.tick() == (False, False)
    # (2) b holds it now; a's clock steps forward 300 s: a does not take a live lease
    wall_a.t += 600
    for _ in range(8):
        mono.t += 2.5
        assert await b.tick() == (True, False)
        assert await a.tick() == (False, False)
    # (3) b's clock runs 300 s ahead, and b dies: a takes over a lease interval after it last
    # saw b's record change, not when a's clock reaches the expiry b wrote
    wall_b.t += 300
    mono.t += 2.5
    assert await b.tick() == (True, False)
    assert await a.tick() == (False, False)
    mono.t += 9.9
    assert await a.tick() == (False, False)
    mono.t += 0.2
    assert await a.tick() == (True, True)
    await db.close()


async def test_a_standby_times_the_lease_record_from_when_it_read_it() -> None:
    """A standby's tick whose read of the lease came seconds after the tick began (a slow store,
    retries, a busy loop) timed the record it read from the tick's start: it took over while the
    holder, which had renewed in between, still trusted its lease (two primaries)."""
    db = await open_database("mem")
    mono, wall = Clock(), Clock()

    class SlowStore:
        def __init__(self) -> None:
            self.before: Any = None

        async def run(self, fn: Any, **kw: Any) -> Any:
            if self.before is not None:
                first, self.before = self.before, None
                await first()
            return await db.run(fn, **kw)

    slow = SlowStore()
    holder = Election(db, 1, "h:1", 10.0, clock=wall, monotonic=mono)
    standby = Election(slow, 2, "s:1", 10.0, clock=wall, monotonic=mono)  # type: ignore[arg-type]
    assert await holder.tick() == (True, True)
    assert await standby.tick() == (False, False)
    mono.t += 2  # the standby's tick begins

    async def renewal_before_the_read() -> None:
        mono.t += 3
        assert await holder.tick() == (True, False)  # trusted for 7.5 s more

    slow.before = renewal_before_the_read
    assert await standby.tick() == (False, False)
    mono.t += 7  # the holder renews no more; it still trusts its lease for 0.5 s
    assert holder.is_primary()
    assert await standby.tick() == (False, False)
    mono.t += 3.1  # a lease interval after the standby read the holder's last renewal
    assert not holder.is_primary()
    assert await standby.tick() == (True, True)
    await db.close()


async def test_a_standby_record_from_the_future_does_not_count() -> None:
    """A stopping primary skips its stop fence when a standby recorded itself recently; a record
    stamped ahead of this clock (it stepped back after the standby died) counted for ever."""
    db = await open_database("mem")
    mono, wall = Clock(), Clock()
    a = Election(db, 1, "a:1", 4.0, clock=wall, monotonic=mono)
    b = Election(db, 2, "b:1", 4.0, clock=wall, monotonic=mono)
    assert await a.tick() == (True, True)
    assert await b.tick() == (False, False)
    assert await a.standbys(4.0) == [2]
    wall.t -= 120  # b is gone (no more ticks) and the clock steps back
    mono.t += 5
    assert await a.standbys(4.0) == []
    await db.close()


async def test_concurrent_candidates_elect_exactly_one() -> None:
    db = await open_database("mem")
    elections = [Election(db, i, f"h:{i}", 5.0) for i in range(1, 6)]
    results = await asyncio.gather(*(e.tick() for e in elections))
    assert sum(primary for primary, _ in results) == 1
    await db.close()


# ---- client helpers ------------------------------------------------------------------------------


async def test_node_agent_heartbeats_and_reregisters(admin: Admin) -> None:
    c = admin.client
    seen_versions: list[int] = []
    configs: list[int] = []
    await c.register_node(10, common_pb2.NODE_STORAGE)
    await c.create_targets([mgmtd_pb2.TargetSpec(target_id=100, node_id=10)])
    await c.set_config(common_pb2.NODE_STORAGE, "heartbeat_interval_s = 1.0\n")
    state = {"local": common_pb2.UPTODATE}
    agent = NodeAgent(
        c,
        10,
        common_pb2.NODE_STORAGE,
        interval_s=0.05,
        targets=lambda: [
            mgmtd_pb2.TargetHeartbeat(target_id=100, local_state=state["local"], chain_version=1)
        ],
        on_routing_version=seen_versions.append,
        on_config=lambda cfg: configs.append(cfg.version),
    )
    await agent.start()
    try:
        assert configs == [1] and seen_versions
        state["local"] = common_pb2.LOCAL_OFFLINE
        agent.beat_soon()

        async def offline() -> bool:
            targets = {t.target_id: t for t in await c.list_targets()}
            return targets[100].local_state == common_pb2.LOCAL_OFFLINE

        await wait_until(offline, 5, "the target to be reported offline")
        # a meta node registered by the agent, unregistered by an admin, comes back by itself
        meta = NodeAgent(c, 20, common_pb2.NODE_META, interval_s=0.05)
        await meta.start()
        await c.unregister_node(20)

        async def meta_back() -> bool:
            return 20 in [n.node_id for n in await c.list_nodes()]

        await wait_until(meta_back, 5, "the meta node to re-register")
        await meta.stop()
    finally:
        await agent.stop()


async def test_client_session_keeper(admin: Admin) -> None:
    keeper = ClientSessionKeeper(
        admin.client, mgmtd_pb2.ClientSession(client_id="mount-1", hostname="h"), interval_s=0.1
    )
    await keeper.start()
    try:
        await asyncio.sleep(1.5)  # longer than the session timeout: kept alive by extensions
        assert [s.client_id for s in await admin.client.list_client_sessions()] == ["mount-1"]
    finally:
        await keeper.stop()


async def test_client_session_keeper_vouches_only_for_an_unbroken_session(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The keeper vouches for handles opened since its session last started, until a timeout
    after its last extension that succeeded was sent; an extension answered after that, or one
    mgmtd answers session_lost, starts a new run; replies may come in any order."""
    now = [100.0]
    monkeypatch.setattr(mgmtd_client, "session_clock", lambda: now[0])
    pending: list[asyncio.Future[mgmtd_pb2.ExtendClientSessionReply]] = []

    async def extend_session(session, config_version=0, *, renewing=False):  # type: ignore[no-untyped-def]
        pending.append(asyncio.get_running_loop().create_future())
        return await pending[-1]

    keeper = ClientSessionKeeper(
        SimpleNamespace(extend_session=extend_session),  # type: ignore[arg-type]
        mgmtd_pb2.ClientSession(client_id="c"),
    )

    async def send(
        at: float,
    ) -> tuple[asyncio.Task[None], asyncio.Future[mgmtd_pb2.ExtendClientSessionReply]]:
        now[0] = at
        task = asyncio.ensure_future(keeper._extend())  # noqa: SLF001
        await asyncio.sleep(0)
        return task, pending[-1]

    async def answer(sent, at: float, lost: bool = False) -> None:  # type: ignore[no-untyped-def]
        task, fut = sent
        now[0] = at
        fut.set_result(mgmtd_pb2.ExtendClientSessionReply(session_timeout_s=10.0, session_lost=lost))
        await task

    await answer(await send(100.0), 100.1)  # the first: the run starts with its reply
    assert keeper.vouches_for(100.1) and not keeper.vouches_for(100.0)
    await answer(await send(105.0), 105.1)
    opened = 105.2
    now[0] = 111.5  # a timeout after the extension sent at 105, less a third of it
    assert keeper.vouches_for(opened)
    now[0] = 111.8  # too close to when mgmtd may drop the session for a write to go out
    assert not keeper.vouches_for(opened)
    await answer(await send(116.0), 116.1)  # answered after it could have run out: a new run
    assert not keeper.vouches_for(opened) and keeper.vouches_for(116.1)
    # two extensions in flight (the periodic one and another), answered out of order
    first, second = await send(120.0), await send(121.0)
    await answer(second, 121.5)
    await answer(first, 122.0)
    assert keeper.vouches_for(116.1) and keeper.alive_until == 131.0
    # mgmtd says the session had expired: handles opened before its reply are out
    await answer(await send(123.0), 123.1, lost=True)
    assert not keeper.vouches_for(123.0) and keeper.vouches_for(123.1)
    # a reply without a timeout (an older mgmtd) vouches for nothing more
    keeper2 = ClientSessionKeeper(
        SimpleNamespace(extend_session=extend_session),  # type: ignore[arg-type]
        mgmtd_pb2.ClientSession(client_id="d"),
    )
    now[0] = 200.0
    task = asyncio.ensure_future(keeper2._extend())  # noqa: SLF001
    await asyncio.sleep(0)
    pending[-1].set_result(mgmtd_pb2.ExtendClientSessionReply())
    await task
    assert not keeper2.vouches_for(200.0)


async def test_routing_cache_refreshes_early_and_notifies(admin: Admin) -> None:
    cache = RoutingCache(admin.client, refresh_interval_s=30.0)  # only early refreshes in this test
    versions: list[int] = []
    cache.add_listener(lambda r: versions.append(r.version))
    await cache.start()
    try:
        v0 = cache.version
        await admin.client.register_node(10, common_pb2.NODE_STORAGE)
        routing = await cache.wait_for(lambda r: 10 in r.nodes, 5)
        assert routing.version > v0 and versions[-1] == routing.version
        with pytest.raises(FS3Error) as e:
            await cache.wait_for(lambda r: 99 in r.nodes, 0.3)
        assert e.value.code == StatusCode.DEADLINE_EXCEEDED
    finally:
        await cache.stop()


async def test_routing_cache_never_goes_back_to_an_older_version(admin: Admin) -> None:
    """Two polls in flight at once (the refresh loop's and a caller's own refresh) whose answers
    arrive out of order: the cache keeps the newer routing."""
    cache = RoutingCache(admin.client, refresh_interval_s=30.0)
    await cache.start()
    try:
        real_call = admin.client.call
        release = asyncio.Event()
        held: list[int] = []

        async def call(method: str, req, **kw):  # type: ignore[no-untyped-def]
            reply = await real_call(method, req, **kw)
            if method == "GetRoutingInfo" and not held:
                held.append(reply.info.version)
                await release.wait()  # the first poll's answer arrives last
            return reply

        cache.client = SimpleNamespace(call=call)
        await admin.client.register_node(10, common_pb2.NODE_STORAGE)
        slow = asyncio.create_task(cache.refresh())
        await wait_until(lambda: held, 5)
        await admin.client.register_node(11, common_pb2.NODE_STORAGE)
        newer = await cache.refresh()
        assert newer.version > held[0] and {10, 11} <= set(newer.nodes)
        release.set()
        assert (await slow).version == newer.version
        assert cache.version == newer.version and 11 in cache.routing.nodes
    finally:
        release.set()
        await cache.stop()


def test_routing_view() -> None:
    info = mgmtd_pb2.RoutingInfo(
        version=7,
        nodes=[
            mgmtd_pb2.NodeInfo(node_id=1, type=common_pb2.NODE_STORAGE, status=mgmtd_pb2.NODE_STATUS_ACTIVE)
        ],
        targets=[mgmtd_pb2.TargetInfo(target_id=t, node_id=1, chain_id=3) for t in (10, 11, 12)],
        chains=[
            mgmtd_pb2.ChainInfo(
                chain_id=3,
                version=4,
                targets=[
                    mgmtd_pb2.ChainTarget(target_id=10, public_state=common_pb2.SERVING),
                    mgmtd_pb2.ChainTarget(target_id=11, public_state=common_pb2.SYNCING),
                    mgmtd_pb2.ChainTarget(target_id=12, public_state=common_pb2.OFFLINE),
                ],
            )
        ],
        chain_tables=[
            mgmtd_pb2.ChainTable(table_id=1, version=1, chain_ids=[3]),
            mgmtd_pb2.ChainTable(table_id=1, version=2, chain_ids=[3]),
        ],
    )
    r = Routing(info)
    chain = r.chain(3)
    assert chain.head.target_id == 10 and chain.serving == [10]
    assert chain.successor(10).target_id == 11 and chain.successor(11) is None
    assert r.node_of_target(12).node_id == 1
    assert r.chain_table(1).version == 2 and r.chain_table(1, 1).version == 1
    assert [n.node_id for n in r.nodes_of_type(common_pb2.NODE_STORAGE)] == [1]
    for fn, code in [
        (lambda: r.chain(9), StatusCode.MGMTD_UNKNOWN_CHAIN),
        (lambda: r.target(9), StatusCode.MGMTD_UNKNOWN_TARGET),
        (lambda: r.chain_table(9), StatusCode.MGMTD_UNKNOWN_CHAIN_TABLE),
    ]:
        with pytest.raises(FS3Error) as e:
            fn()
        assert e.value.code == code


async def test_client_fails_over_past_a_dead_address(inproc: InProcess) -> None:
    server = await inproc.start(1)
    await inproc.primary()
    from cluster import free_port

    dead = f"127.0.0.1:{free_port()}"
    client = MgmtdClient([dead, server.address], timeout_s=5.0, rpc_timeout_s=1.0)
    try:
        assert await client.init_cluster()
        assert client.primary == server.address
    finally:
        await client.close()
    lonely = MgmtdClient([dead], timeout_s=0.5, rpc_timeout_s=0.2)
    try:
        with pytest.raises(FS3Error) as e:
            await lonely.get_routing_info()
        assert e.value.code == StatusCode.UNAVAILABLE
    finally:
        await lonely.close()


async def test_client_finds_a_mgmtd_restarted_on_the_same_address(inproc: InProcess) -> None:
    from cluster import free_port

    port = free_port()
    first = await inproc.start(1, port=port)
    await inproc.primary()
    client = inproc.client(timeout_s=10.0)
    await client.init_cluster()
    await first.stop(grace_s=0)
    inproc.servers.remove(first)
    with pytest.raises(FS3Error):
        await client.call("GetRoutingInfo", mgmtd_pb2.GetRoutingInfoRequest(), timeout_s=0.5)
    await inproc.start(2, port=port)
    t0 = asyncio.get_running_loop().time()
    assert (await client.get_routing_info()).version > 0
    assert asyncio.get_running_loop().time() - t0 < 5.0


async def test_metrics_endpoint(inproc: InProcess) -> None:
    import urllib.request

    from cluster import free_port

    port = free_port()
    await inproc.start(1, metrics_port=port)
    await inproc.primary()

    def fetch() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    text = await asyncio.to_thread(fetch)
    assert "fs3_mgmtd_is_primary 1.0" in text


def _commits_of_unknown_outcome(db, count: int, key: bytes) -> None:  # type: ignore[no-untyped-def]
    """The next ``count`` commits of ``db`` that set or clear ``key`` commit, then fail as FoundationDB's
    commit_unknown_result does (the fs3 engine maps it to KV_CONFLICT, which Database.run retries)."""
    create = db.create_transaction
    left = [count]

    def create_transaction():  # type: ignore[no-untyped-def]
        tr = create()
        commit, put, clear = tr.commit, tr.set, tr.clear
        wrote: list[bytes] = []

        def set_(k: bytes, v: bytes) -> None:
            wrote.append(k)
            put(k, v)

        def clear_(k: bytes) -> None:
            wrote.append(k)
            clear(k)

        async def commit_then_unknown() -> None:
            await commit()
            if left[0] > 0 and key in wrote:
                left[0] -= 1
                raise FS3Error(StatusCode.KV_CONFLICT, "commit_unknown_result (1021)")

        tr.commit, tr.set, tr.clear = commit_then_unknown, set_, clear_
        return tr

    db.create_transaction = create_transaction


async def test_a_lease_taken_by_a_commit_of_unknown_outcome_is_held() -> None:
    """The retry read back the lease its first attempt took and waited for it to expire as if
    another mgmtd held it: no primary for a lease interval."""
    db = await open_database("mem")
    try:
        _commits_of_unknown_outcome(db, 1, schema.LEASE_KEY)
        election = Election(db, 1, "127.0.0.1:1", 3600.0)
        assert await election.tick() == (True, True)
        assert election.epoch == 1
        assert await election.tick() == (True, False)
    finally:
        await db.close()


async def test_init_cluster_committed_with_an_unknown_outcome_answers_its_token(inproc: InProcess) -> None:
    """The retry found the cluster initialized (ALREADY_EXISTS) and the token it had made was lost,
    while the primary's memory still said the cluster was not initialized."""
    await inproc.start(1)
    await inproc.primary()
    _commits_of_unknown_outcome(inproc.db, 1, schema.CLUSTER_KEY)
    token = await inproc.client().init_cluster("t")
    admin = inproc.client(token=token)
    assert [u.name for u in await admin.list_users()] == ["root"]


async def test_users_added_and_removed_by_commits_of_unknown_outcome(admin: Admin) -> None:
    """A retried add found the user (ALREADY_EXISTS, its token lost), a retried removal did not
    (NOT_FOUND) though each had been done."""
    db = admin.env.db
    _commits_of_unknown_outcome(db, 1, schema.user_key(1234))
    token = await admin.client.add_user(1234, "carol")
    carol = admin.env.client(token=token)
    assert (await carol.verify_token(token)).uid == 1234
    _commits_of_unknown_outcome(db, 1, schema.user_key(1234))
    await admin.client.remove_user(1234)
    assert 1234 not in [u.uid for u in await admin.client.list_users()]


async def test_a_new_primary_loads_the_newest_config_of_each_type(admin: Admin) -> None:
    """It reads one config per node type, the newest, not every version ever set."""
    from fs3.mgmtd.cluster import load_records

    c = admin.client
    for i in range(1, 4):
        await c.set_config(common_pb2.NODE_STORAGE, f"heartbeat_interval_s = {i}.0\n")
    await c.set_config(common_pb2.NODE_META, "session_timeout_s = 60.0\n")
    records = await admin.env.db.run(load_records, read_only=True)
    assert {t: (cfg.version, cfg.content) for t, cfg in records.configs.items()} == {
        common_pb2.NODE_STORAGE: (3, "heartbeat_interval_s = 3.0\n"),
        common_pb2.NODE_META: (1, "session_timeout_s = 60.0\n"),
    }


def test_a_routing_refresh_failing_on_and_on_is_warned_of_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mount whose token was revoked logged 'routing refresh failed' at every poll (every 2 s,
    for ever): the same failure is said once a minute now, with how often it came meanwhile."""
    from fs3.client import routing as routing_mod

    now = [100.0]
    monkeypatch.setattr(routing_mod.time, "monotonic", lambda: now[0])
    cache = RoutingCache(SimpleNamespace(), refresh_interval_s=2.0)  # type: ignore[arg-type]
    revoked = FS3Error(StatusCode.UNAUTHENTICATED, "invalid or expired token")
    with caplog.at_level("WARNING", logger="fs3.client.routing"):
        for _ in range(31):  # a minute of polls, and one more
            cache._refresh_failed(revoked)  # noqa: SLF001
            now[0] += 2.0
        cache._refresh_failed(FS3Error(StatusCode.PERMISSION_DENIED, "other"))  # noqa: SLF001
    warned = [r.getMessage() for r in caplog.records if "routing refresh failed" in r.getMessage()]
    assert len(warned) == 3, warned
    assert "(29 more failures since the last warning)" not in warned[0]
    assert "(29 more failures since the last warning)" in warned[1]
    assert "PERMISSION_DENIED" in warned[2] and "since the last warning" not in warned[2]


def test_a_refused_removal_says_what_it_would_cost() -> None:
    """Removing an OFFLINE target from a chain with one SERVING target said the chain "would have
    one copy of its data left", as if the removal lowered it; removing a LASTSRV target said only
    that no SERVING target would be left, not that its last writes are lost (a review)."""

    def chain(*states: int) -> mgmtd_pb2.ChainInfo:
        targets = [mgmtd_pb2.ChainTarget(target_id=i + 1, public_state=s) for i, s in enumerate(states)]
        return mgmtd_pb2.ChainInfo(chain_id=7, targets=targets)

    serving, offline, lastsrv = common_pb2.SERVING, common_pb2.OFFLINE, common_pb2.LASTSRV
    _refuse_losing_copies(chain(serving, serving, offline), 3)  # two copies stay: allowed
    with pytest.raises(FS3Error) as e:
        _refuse_losing_copies(chain(serving, offline), 2)
    assert "has one copy of its data (on target 1); target 2 (OFFLINE) would make a second" in e.value.message
    with pytest.raises(FS3Error) as e:
        _refuse_losing_copies(chain(serving, serving), 2)
    assert "without target 2 it would have one copy of its data left (on target 1)" in e.value.message
    with pytest.raises(FS3Error) as e:
        _refuse_losing_copies(chain(lastsrv, offline), 1)
    assert "target 1 is its LASTSRV, the only one holding its last writes" in e.value.message
    assert "--force" in e.value.message
