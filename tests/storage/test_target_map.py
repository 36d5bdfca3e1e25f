"""Local target states follow routing: the startup protocol, demotion when mgmtd takes a target for
failed, promotion when the last server comes back, and the checks each kind of request makes."""

from __future__ import annotations

import logging
import time
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


def routing(version: int, *states: int, chain_version: int = 0) -> Routing:
    """Chain 1 of targets 1, 2, 3 (in that order) with the given public states, at
    ``chain_version`` (by default the routing version: each snapshot a change of the chain)."""
    info = mgmtd_pb2.RoutingInfo(version=version)
    chain = info.chains.add(chain_id=1, version=chain_version or version)
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
    tm.apply_routing(routing(3, S, Y, S, chain_version=2))  # mgmtd has not switched yet
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


def test_target_demoted_while_not_looking_is_resynced():
    # B was SERVING at chain version 1 and then cut off from mgmtd (or slow to poll): mgmtd took
    # it OFFLINE (2), writes went on without it, and its heartbeat made it SYNCING again (3). Its
    # first routing since shows it SYNCING: it must not vouch for being up to date at version 3
    # (mgmtd would make it SERVING with the writes of version 2 missing), but be resynced.
    tm, t, changes = make()
    tm.apply_routing(routing(1, S, OFF, S))
    tm.apply_routing(routing(2, S, Y, S))
    tm.set_state(t, UPTODATE, "resync done")
    tm.apply_routing(routing(3, S, S, S))
    changes.clear()
    tm.apply_routing(routing(6, S, Y, S))  # it never saw versions 4 and 5 (OFFLINE, WAITING)
    assert t.local_state == ONLINE and changes == [ONLINE]
    report = tm.heartbeat_reports()[0]
    assert (report.local_state, report.chain_version) == (common_pb2.ONLINE, 6)
    with pytest.raises(FS3Error) as e:
        tm.check_readable(t)
    assert e.value.code == StatusCode.STORAGE_TARGET_NOT_SERVING
    tm.check_replica(t)  # takes the writes forwarded to it while its predecessor resyncs it


def test_sync_done_vouches_for_its_chain_version_only():
    tm, t, _ = make()
    tm.apply_routing(routing(1, S, OFF, S))
    tm.apply_routing(routing(2, S, Y, S))
    tm.set_state(t, UPTODATE, "resync done")  # SyncDone at chain version 2
    tm.apply_routing(routing(3, S, Y, S, chain_version=2))  # another chain changed, not ours
    assert t.local_state == UPTODATE
    tm.apply_routing(routing(4, S, S, S, chain_version=3))  # mgmtd made it SERVING
    assert t.local_state == UPTODATE
    tm.apply_routing(routing(5, S, S, OFF, chain_version=4))  # serving on through other changes
    assert t.local_state == UPTODATE
    tm.check_readable(t)
    # demoted and SYNCING again later: the SyncDone of chain version 2 vouches for nothing now,
    # even should the chain's versions start over
    tm.apply_routing(routing(6, S, Y, S, chain_version=2))
    assert t.local_state == ONLINE

    # a SyncDone, then the chain changes while the target is still SYNCING: that SyncDone no
    # longer says it is up to date with the chain as it is now (mgmtd takes no UPTODATE report
    # made at an older chain version either), so it is resynced again
    tm, t, _ = make()
    tm.apply_routing(routing(1, S, OFF, S))
    tm.apply_routing(routing(2, S, Y, S))
    tm.set_state(t, UPTODATE, "resync done")
    tm.apply_routing(routing(3, S, Y, OFF))
    assert t.local_state == ONLINE


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


def test_lease_waits_for_the_routing_a_heartbeat_reply_names():
    # A heartbeat that gets through after a partition while this node still acts on the routing
    # from before it: its targets may be OFFLINE in the newer routing, so the reply renews nothing
    # until the node has applied that routing.
    lease = Lease()
    lease.routing_applied(5)
    lease.sending()
    lease.confirmed(60.0, 7)
    assert not lease.ok()
    lease.routing_applied(6)
    assert not lease.ok()
    lease.routing_applied(7)
    assert lease.ok()


def test_lease_keeps_up_with_routing_that_keeps_changing():
    lease = Lease(margin=0.5)
    lease.routing_applied(1)
    lease.sending()
    lease.confirmed(60.0, 1)  # nothing newer: counts at once
    assert lease.ok()
    lease.confirmed(1e-9, 1)
    assert not lease.ok()
    # every reply names a newer version than the node has, and the poll it triggers fetches a
    # newer one still: each reply counts once the poll is in
    for version in range(2, 40, 3):
        lease.sending()
        lease.confirmed(60.0, version)
        lease.routing_applied(version + 1)
        assert lease.ok()
    # replies faster than the polls: each counts once the routing it names is applied
    lease = Lease()
    lease.routing_applied(10)
    for version in (11, 12, 13):
        lease.sending()
        lease.confirmed(60.0, version)
    assert not lease.ok()
    lease.routing_applied(12)
    assert lease.ok()


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


def test_a_lapsed_lease_is_logged_once_and_so_is_its_renewal(caplog: pytest.LogCaptureFixture) -> None:
    """mgmtd away past the lease: the first request refused says why (once, not per request), and
    the heartbeat that renews it says so."""
    caplog.set_level(logging.INFO, logger="fs3.storage.target_map")
    lease = Lease()
    lease.routing_applied(1)
    lease.sending()
    lease.confirmed(1e-9, 1)
    assert not any((lease.ok(), lease.ok(), lease.ok()))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("lease from mgmtd ran out"), lines
    lease.sending()
    lease.confirmed(60.0, 1)
    assert lease.ok()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[1].startswith("lease from mgmtd renewed"), lines
    assert lease.ok() and len(caplog.records) == 2


def test_a_stop_fence_keeps_the_lease_past_the_heartbeat_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """A reply of a primary stopping cleanly carries its fence: no node is failed before it ends,
    so the node serves until then less the margin a heartbeat timeout has, whatever later replies
    say."""
    caplog.set_level(logging.INFO, logger="fs3.storage.target_map")
    lease = Lease(margin=0.5)
    lease.routing_applied(1)
    lease.sending()
    lease.confirmed(0.02, 1, fence_s=0.4)  # lasts 0.4 - 0.02 * 0.5 = 0.39 s, not 0.01 s
    assert [r.getMessage() for r in caplog.records] == [
        "mgmtd is stopping: this node's targets serve on without it for 0.4 s (its stop fence)"
    ]
    time.sleep(0.05)
    assert lease.ok()
    lease.sending()
    lease.confirmed(0.02, 1)  # the next primary's reply: its own short lease does not cut the fence
    time.sleep(0.05)
    assert lease.ok()
    time.sleep(0.35)
    assert not lease.ok()
    assert caplog.records[-1].getMessage().startswith("lease from mgmtd ran out")


def test_a_stop_fence_in_a_reply_naming_newer_routing_waits_for_that_routing() -> None:
    # mgmtd may have taken this node's targets out while it was cut off: the fence, like any
    # confirmation, counts only once the node acts on the routing the reply names
    lease = Lease()
    lease.routing_applied(5)
    lease.sending()
    lease.confirmed(1e-9, 5)
    assert not lease.ok()
    lease.sending()
    lease.confirmed(1e-9, 7, fence_s=60.0)
    lease.sending()
    lease.confirmed(1e-9, 7)  # a later reply naming the same routing keeps the fence held
    assert not lease.ok()
    lease.routing_applied(7)
    assert lease.ok()
