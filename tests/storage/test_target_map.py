"""Local target states follow routing: the startup protocol, demotion when mgmtd takes a target for
failed, promotion when the last server comes back, and the checks each kind of request makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fs3.client.routing import Routing
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2, mgmtd_pb2
from fs3.storage.target_map import OFFLINE, ONLINE, UPTODATE, Lease, LocalTarget, TargetMap

pytestmark = pytest.mark.timeout(10)

S, Y, W, L, OFF = (
    common_pb2.SERVING,
    common_pb2.SYNCING,
    common_pb2.WAITING,
    common_pb2.LASTSRV,
    common_pb2.OFFLINE,
)


def routing(version: int, *states: int) -> Routing:
    """Chain 1 of targets 1, 2, 3 (in that order) with the given public states."""
    info = mgmtd_pb2.RoutingInfo(version=version)
    chain = info.chains.add(chain_id=1, version=version)
    for tid, st in zip((1, 2, 3), states, strict=True):
        chain.targets.add(target_id=tid, public_state=st)
        info.targets.add(target_id=tid, node_id=tid, chain_id=1, public_state=st)
        info.nodes.add(node_id=tid, type=common_pb2.NODE_STORAGE)
    return Routing(info)


def make(target_id: int = 2) -> tuple[TargetMap, LocalTarget, list[int]]:
    changes: list[int] = []
    t = LocalTarget(target_id, Path("/nonexistent"), engine=None)  # type: ignore[arg-type]
    tm = TargetMap(target_id, [t], on_change=lambda: changes.append(t.local_state))
    return tm, t, changes


def test_startup_waits_until_mgmtd_agrees_the_target_was_away():
    tm, t, changes = make()
    assert t.local_state == OFFLINE
    tm.apply_routing(routing(1, S, S, S))  # mgmtd has not noticed the restart yet
    assert t.local_state == OFFLINE
    tm.apply_routing(routing(2, S, W, S))
    assert t.local_state == OFFLINE
    tm.apply_routing(routing(3, S, S, OFF))  # still not us
    assert t.local_state == OFFLINE
    tm.apply_routing(routing(4, S, OFF, S))
    assert t.local_state == ONLINE and changes == [ONLINE]
    tm.apply_routing(routing(5, S, W, Y))  # another target syncing first: we wait
    assert t.local_state == ONLINE


def test_syncing_target_waits_for_sync_done():
    tm, t, _ = make()
    tm.apply_routing(routing(1, S, OFF, S))
    tm.apply_routing(routing(2, S, Y, S))
    assert t.local_state == ONLINE
    tm.check_replica(t)  # takes forwarded updates
    with pytest.raises(FS3Error) as e:
        tm.check_readable(t)
    assert e.value.code == StatusCode.STORAGE_TARGET_NOT_SERVING
    tm.set_state(t, UPTODATE, "resync done")
    tm.apply_routing(routing(3, S, Y, S))  # mgmtd has not switched yet
    assert t.local_state == UPTODATE


def test_last_server_coming_back_is_up_to_date():
    tm, t, _ = make(1)
    tm.apply_routing(routing(1, L, OFF, OFF))
    assert t.local_state == ONLINE
    tm.apply_routing(routing(2, S, OFF, OFF))
    assert t.local_state == UPTODATE
    tm.check_head(t, tm.chain(1))
    tm.check_readable(t)


def test_target_taken_for_failed_stops_serving():
    tm, t, _ = make(1)
    tm.apply_routing(routing(1, L, OFF, OFF))
    tm.apply_routing(routing(2, S, S, S))
    assert t.local_state == UPTODATE
    tm.apply_routing(routing(3, OFF, S, S))
    assert t.local_state == ONLINE
    with pytest.raises(FS3Error) as e:
        tm.check_readable(t)
    assert e.value.code == StatusCode.STORAGE_TARGET_NOT_SERVING
    with pytest.raises(FS3Error):
        tm.check_replica(t)


def test_failed_disk_is_offline_for_good():
    tm, t, _ = make(1)
    tm.apply_routing(routing(1, L, OFF, OFF))
    tm.fail(1, FS3Error(StatusCode.STORAGE_IO_ERROR, "boom"))
    assert t.local_state == OFFLINE
    tm.apply_routing(routing(2, S, OFF, OFF))
    assert t.local_state == OFFLINE
    assert tm.heartbeat_reports()[0].local_state == common_pb2.LOCAL_OFFLINE
    with pytest.raises(FS3Error) as e:
        tm.check_readable(t)
    assert e.value.code == StatusCode.STORAGE_TARGET_OFFLINE


def test_only_the_head_takes_client_writes():
    tm, t, _ = make(2)
    tm.apply_routing(routing(1, S, OFF, S))
    tm.apply_routing(routing(2, S, Y, S))
    tm.set_state(t, UPTODATE, "resync done")
    tm.apply_routing(routing(3, S, S, S))
    with pytest.raises(FS3Error) as e:
        tm.check_head(t, tm.chain(1))
    assert e.value.code == StatusCode.STORAGE_NOT_HEAD


def test_reads_need_a_fresh_lease():
    lease = Lease(margin=0.5)
    assert not lease.ok()
    lease.sending()
    lease.confirmed(60.0)
    assert lease.ok()
    lease.confirmed(1e-9)
    assert not lease.ok()


def test_a_starting_daemon_without_routing_asks_callers_to_retry():
    # it listens before its first routing snapshot arrives: a client that still routes to it (the
    # restart was too quick for mgmtd to notice) must retry, not take the chain for unknown
    tm, t, _ = make()
    for call in (lambda: tm.chain(1), lambda: tm.of_chain(1)):
        with pytest.raises(FS3Error) as err:
            call()
        assert err.value.code is StatusCode.STORAGE_ROUTING_STALE and "starting" in err.value.message
    tm.apply_routing(routing(1, S, S, S))
    assert tm.chain(1).chain_id == 1 and tm.of_chain(1) is t
    with pytest.raises(FS3Error) as err:
        tm.chain(7)  # with routing, a chain it lacks is unknown
    assert err.value.code is StatusCode.MGMTD_UNKNOWN_CHAIN
