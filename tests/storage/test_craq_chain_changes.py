"""CRAQ updates whose chain changes under them (craq ``Replicator``), and truncates of chunks that
hold a pending version.

A replica decides from routing whether it is the tail, and the tail commits without forwarding. One
that mgmtd took out of the chain (OFFLINE, moved to the end; maybe back as SYNCING there) finds no
successor after it; if it carried on with an update it took before, it would commit, and have its
predecessors commit and acknowledge, a version no replica after its old place holds. These tests
drive one daemon's Replicator in-process against a real chunk engine, with the other replicas
faked (the RPCs they would get are recorded) and routing applied by hand at the moments that matter.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import weakref
from pathlib import Path

import pytest
from cycles import released
from replica_harness import (
    ALL_SERVING,
    CHUNK,
    CID,
    INODE,
    OFFLINE,
    SERVING,
    SYNCING,
    Daemon,
    client_write,
    forwarded,
    replica_daemons,
    routing,
)

from fs3.errors import FS3Error, StatusCode
from fs3.proto import storage_pb2
from fs3.storage import craq
from fs3.storage.chain_ops import check_same, chunk_id
from fs3.storage.target_map import OFFLINE as LOCAL_OFFLINE

pytestmark = pytest.mark.timeout(60)

# What the chain looks like in each test, by target id and public state, head first.
MIDDLE_OUT = [(1, SERVING), (3, SERVING), (2, OFFLINE)]
MIDDLE_BACK = [(1, SERVING), (3, SERVING), (2, SYNCING)]
HEAD_OUT = [(2, SERVING), (3, SERVING), (1, OFFLINE)]
HEAD_BACK = [(2, SERVING), (3, SERVING), (1, SYNCING)]


@pytest.fixture
async def daemon(tmp_path: Path):
    """See replica_harness.replica_daemons."""
    async with replica_daemons(tmp_path) as make:
        yield make


async def wait_for_lock_waiter(d: Daemon) -> None:
    """Until a second user queues on CID's lock (the update under test)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while d.rep.locks._locks.get((d.target.target_id, CID), (None, 0))[1] < 2:
        assert loop.time() < deadline, "the update never reached the chunk's lock"
        await asyncio.sleep(0.001)


async def update_after_chain_change(d: Daemon, req: storage_pb2.UpdateReq, *orders) -> storage_pb2.IOResult:
    """``chain_update(req)`` while CID's lock is held elsewhere (the first try of the same update,
    say, stuck forwarding to a slow successor); the chain goes through ``orders`` (versions 2, 3, …)
    while the update waits, then the lock is let go."""
    hold = d.rep.locks.hold(d.target.target_id, CID)
    await hold.__aenter__()
    try:
        update = asyncio.ensure_future(d.rep.chain_update(req, memoryview(b"x" * req.io.length)))
        await wait_for_lock_waiter(d)
        for version, order in enumerate(orders, start=2):
            d.targets.apply_routing(routing(version, order))
    finally:
        await hold.__aexit__(None, None, None)
    return await update


# -- a forwarded update that waited for the chunk's lock ------------------------------------------


@pytest.mark.parametrize("orders", [[MIDDLE_OUT], [MIDDLE_OUT, MIDDLE_BACK]], ids=["offline", "back-syncing"])
async def test_a_forward_to_a_replica_that_left_its_place_while_waiting_commits_nothing(
    daemon, orders
) -> None:
    """Chain [1,2,3]: target 2 is demoted (to OFFLINE at the end, then maybe back as SYNCING there)
    while the forward waits for the chunk's lock. At the end it has no successor; committing there
    would have target 1 commit and acknowledge a write target 3 never got."""
    d = await daemon(2, ALL_SERVING)
    with pytest.raises(FS3Error) as err:
        await update_after_chain_change(d, forwarded(b"x" * 100), *orders)
    assert err.value.code is StatusCode.STORAGE_CHAIN_VERSION_MISMATCH
    assert d.engine.get_meta(CID) is None
    assert d.chain.updates == []


async def test_a_resync_copy_that_waited_across_a_chain_change_is_not_installed(daemon) -> None:
    """Target 2 is SYNCING; it leaves and comes back SYNCING while a resync copy of the sync begun
    at version 1 waits for the lock. That sync's list of chunks is stale (see storage.resync): its
    copy must not be installed as committed."""
    d = await daemon(2, [(1, SERVING), (2, SYNCING)])
    req = forwarded(b"x" * 100, syncing=True, commit=True)
    with pytest.raises(FS3Error) as err:
        await update_after_chain_change(d, req, [(1, SERVING), (2, OFFLINE)], [(1, SERVING), (2, SYNCING)])
    assert err.value.code is StatusCode.STORAGE_CHAIN_VERSION_MISMATCH
    assert d.engine.get_meta(CID) is None


async def test_a_forward_that_waited_on_an_unchanged_chain_commits(daemon) -> None:
    d = await daemon(3, ALL_SERVING)
    r = await update_after_chain_change(d, forwarded(b"x" * 100, target_id=3))
    assert (r.committed_version, r.length) == (1, 100)
    assert d.engine.get_meta(CID).committed_ver == 1
    assert d.chain.updates == []  # the tail forwards nothing


@pytest.mark.parametrize(
    ("target_id", "order", "syncing"),
    [
        (3, [(1, SERVING), (2, SERVING), (3, SERVING), (4, OFFLINE)], False),
        (3, [(1, SERVING), (3, SERVING), (2, OFFLINE)], False),
        (2, [(1, SERVING), (2, SYNCING)], True),
    ],
    ids=["tail", "tail-after-demotion", "syncing-tail"],
)
async def test_the_tail_commits_a_forward(daemon, target_id, order, syncing) -> None:
    """The tail (with OFFLINE targets after it, or SYNCING itself) commits without forwarding."""
    d = await daemon(target_id, order)
    req = forwarded(b"y" * 50, target_id=target_id, syncing=syncing)
    r = await d.rep.chain_update(req, memoryview(b"y" * 50))
    assert (r.committed_version, r.length) == (1, 50)
    meta = d.engine.get_meta(CID)
    assert (meta.committed_ver, meta.pending) == (1, None)
    assert d.chain.updates == []


async def test_a_replica_whose_successor_leaves_during_the_forward_commits_as_the_tail(daemon) -> None:
    d = await daemon(2, ALL_SERVING)

    async def successor_fails(req: storage_pb2.UpdateReq) -> None:
        d.chain.on_update = None
        d.targets.apply_routing(routing(2, [(1, SERVING), (2, SERVING), (3, OFFLINE)]))
        raise FS3Error(StatusCode.UNAVAILABLE, "target 3 is gone")

    d.chain.on_update = successor_fails
    r = await d.rep.chain_update(forwarded(b"z" * 10), memoryview(b"z" * 10))
    assert r.committed_version == 1
    assert d.engine.get_meta(CID).committed_ver == 1
    assert len(d.chain.updates) == 1


async def test_a_syncing_successor_failing_a_forward_is_left_behind_after_a_grace(
    daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last SERVING replica commits an update its SYNCING successor kept failing (out of
    descriptors, say) after craq.SYNCING_FORWARD_GRACE_S, rather than for forward_timeout_s;
    the count it keeps makes the successor's resync start over. A SERVING successor is retried."""
    monkeypatch.setattr(craq, "SYNCING_FORWARD_GRACE_S", 0.2)
    d = await daemon(2, [(1, SERVING), (2, SERVING), (3, SYNCING)])
    d.rep.forward_timeout_s = 30.0

    async def closed(req: storage_pb2.UpdateReq) -> None:
        raise FS3Error(StatusCode.RPC_CONNECTION_CLOSED, "connection to target 3 closed")

    d.chain.on_update = closed
    r = await asyncio.wait_for(d.rep.chain_update(forwarded(b"z" * 10), memoryview(b"z" * 10)), 10)
    assert r.committed_version == 1 and d.engine.get_meta(CID).committed_ver == 1
    assert len(d.chain.updates) > 1 and all(u.syncing for u in d.chain.updates)  # retried first
    assert d.rep.forward_skips(1, 3) == 1

    d.targets.apply_routing(routing(2, [(1, SERVING), (2, SERVING), (3, SERVING)]))
    d.rep.forward_timeout_s = 1.0
    req = forwarded(b"w" * 10)
    req.io.key.chain_version, req.io.update_version = 2, 2
    with pytest.raises(FS3Error) as e:
        await d.rep.chain_update(req, memoryview(b"w" * 10))
    assert e.value.code == StatusCode.UNAVAILABLE
    assert d.rep.forward_skips(1, 3) == 1


async def test_a_forward_to_a_syncing_target_given_up_on_changes_nothing(daemon) -> None:
    """Its predecessor gave up on that try, and may have gone on without this target; a removal
    of the chunk it forwards later could otherwise be overtaken by this write."""
    d = await daemon(2, [(1, SERVING), (2, SYNCING)])
    req = forwarded(b"y" * 50, target_id=2, syncing=True)
    loop = asyncio.get_running_loop()
    with pytest.raises(FS3Error) as e:
        await d.rep.chain_update(req, memoryview(b"y" * 50), loop.time() - 0.001)
    assert e.value.code == StatusCode.DEADLINE_EXCEEDED
    assert d.engine.get_meta(CID) is None
    with pytest.raises(FS3Error) as e:  # its connection closed: given up as well
        await d.rep.chain_update(req, memoryview(b"y" * 50), loop.time() + 10, lambda: True)
    assert e.value.code == StatusCode.RPC_CONNECTION_CLOSED
    assert d.engine.get_meta(CID) is None
    r = await d.rep.chain_update(req, memoryview(b"y" * 50), loop.time() + 10, lambda: False)
    assert (r.committed_version, r.length) == (1, 50)


# -- a replica taken out of the chain during its round ---------------------------------------------


@pytest.mark.parametrize("offset", [0, 10], ids=["whole-chunk", "in-place"])
@pytest.mark.parametrize("position", ["head", "middle"])
async def test_a_replica_that_comes_back_syncing_during_its_forward_does_not_commit(
    daemon, position, offset
) -> None:
    """The forward to the successor fails while mgmtd takes this target out of the chain and it
    comes back SYNCING at the end; the retry finds no successor after it. It must fail the update
    (left pending, which its resync replaces), not commit it as the tail. (A write from offset 0
    is stored and forwarded at the same time, see ``Replicator._update_parallel``.)"""
    tid, out, back = (1, HEAD_OUT, HEAD_BACK) if position == "head" else (2, MIDDLE_OUT, MIDDLE_BACK)
    d = await daemon(tid, ALL_SERVING)

    async def taken_out_and_back(req: storage_pb2.UpdateReq) -> None:
        d.targets.apply_routing(routing(2, out))
        d.targets.apply_routing(routing(3, back))
        raise FS3Error(StatusCode.UNAVAILABLE, "successor timed out")

    d.chain.on_update = taken_out_and_back
    with pytest.raises(FS3Error) as err:
        if position == "head":
            await d.rep.client_update(client_write(b"w" * 10, offset), memoryview(b"w" * 10))
        else:
            await d.rep.chain_update(forwarded(b"w" * 10, offset), memoryview(b"w" * 10))
    assert err.value.code is StatusCode.STORAGE_ROUTING_STALE
    meta = d.engine.get_meta(CID)
    assert (meta.committed_ver, meta.pending_ver) == (0, 1)
    assert len(d.chain.updates) == 1


async def test_a_head_demoted_while_it_settles_does_not_commit_the_clients_write(daemon) -> None:
    """The client's write finds a pending version (of an earlier failed write) and settles it
    first; the head is demoted while the settle is forwarded. The client's write must not then be
    committed here alone, the head having no successor at the chain's end."""
    d = await daemon(1, ALL_SERVING)
    await d.target.engine.update(CID, 0, b"a" * 100, chunk_size=CHUNK, chain_ver=1)
    await d.target.engine.commit(CID, 1)
    await d.target.engine.update(CID, 0, b"b" * 100, chunk_size=CHUNK, chain_ver=1)  # pending v2

    async def demoted(req: storage_pb2.UpdateReq) -> None:
        d.chain.on_update = None
        assert req.settle and req.io.update_version == 2
        d.targets.apply_routing(routing(2, HEAD_OUT))

    d.chain.on_update = demoted
    with pytest.raises(FS3Error) as err:
        await d.rep.client_update(client_write(b"c" * 10), memoryview(b"c" * 10))
    assert err.value.code in (StatusCode.STORAGE_NOT_HEAD, StatusCode.STORAGE_ROUTING_STALE)
    meta = d.engine.get_meta(CID)
    assert (meta.committed_ver, meta.pending) == (2, None)  # the settled version, and no more
    assert bytes(d.engine.read(CID).data) == b"b" * 100
    assert len(d.chain.updates) == 1


async def test_the_tail_demoted_while_a_query_waits_answers_no_committed_version(daemon) -> None:
    """A replica holding a pending version asks the tail which version is committed; the query
    waits for the chunk's lock while the tail is demoted (the new tail may commit newer versions
    from now on). It must refuse, not answer for a chain it is no longer the tail of."""
    d = await daemon(3, ALL_SERVING)
    await d.target.engine.update(CID, 0, b"a" * 100, chunk_size=CHUNK, chain_ver=1)
    await d.target.engine.commit(CID, 1)
    req = storage_pb2.QueryCommittedReq()
    req.key.chain_id, req.key.chain_version, req.key.inode_id, req.key.chunk_index = 1, 1, INODE, 0
    hold = d.rep.locks.hold(3, CID)
    await hold.__aenter__()
    try:
        query = asyncio.ensure_future(d.rep.query_committed(req))
        await wait_for_lock_waiter(d)
        d.targets.apply_routing(routing(2, [(1, SERVING), (2, SERVING), (3, OFFLINE)]))
    finally:
        await hold.__aexit__(None, None, None)
    with pytest.raises(FS3Error) as err:
        await query
    assert err.value.code is StatusCode.STORAGE_TARGET_NOT_SERVING


# -- truncates of chunks holding a pending version -------------------------------------------------


def truncate_req(length: int) -> storage_pb2.TruncateChunksReq:
    return storage_pb2.TruncateChunksReq(
        chain_id=1, chain_version=1, inode_id=INODE, chunk_size=CHUNK, length=length
    )


async def test_a_truncate_settles_the_pending_version_of_the_last_chunk_first(daemon) -> None:
    """Committed: 1000 bytes. Pending (a write whose forward failed): 2000 more at 1000. A truncate
    to 1000 must leave 1000 bytes for good; the pending version, committed by the next write's
    settle, must not bring the 2000 bytes back."""
    d = await daemon(1, [(1, SERVING), (2, SERVING)])
    eng = d.target.engine
    await eng.update(CID, 0, b"A" * 1000, chunk_size=CHUNK, chain_ver=1)
    await eng.commit(CID, 1)
    await eng.update(CID, 1000, b"B" * 2000, chunk_size=CHUNK, chain_ver=1)  # pending v2

    rsp = await d.rep.truncate_chunks(truncate_req(1000))
    assert rsp.truncated
    meta = d.engine.get_meta(CID)
    assert (meta.committed.length, meta.pending) == (1000, None)
    r = await d.rep.client_update(client_write(b"Z"), memoryview(b"Z"))
    assert r.length == 1000
    assert bytes(d.engine.read(CID).data) == b"Z" + b"A" * 999
    # the successor got the settle (whole chunk, all 3000 bytes), then the truncate, then the write
    sent = [(u.settle, u.io.type, u.io.update_version, u.io.length) for u in d.chain.updates]
    assert sent == [
        (True, storage_pb2.UPDATE_REPLACE, 2, 3000),
        (False, storage_pb2.UPDATE_TRUNCATE, 3, 1000),
        (False, storage_pb2.UPDATE_WRITE, 4, 1),
    ]


async def test_a_truncate_of_a_chunk_that_exists_only_as_pending(daemon) -> None:
    d = await daemon(1, [(1, SERVING), (2, SERVING)])
    await d.target.engine.update(CID, 0, b"P" * 2000, chunk_size=CHUNK, chain_ver=1)  # pending v1
    rsp = await d.rep.truncate_chunks(truncate_req(1000))
    assert rsp.truncated
    meta = d.engine.get_meta(CID)
    assert (meta.committed.length, meta.pending) == (1000, None)
    await d.rep.client_update(client_write(b"Z"), memoryview(b"Z"))
    assert bytes(d.engine.read(CID).data) == b"Z" + b"P" * 999


async def test_a_truncate_removes_chunks_past_it_that_exist_only_as_pending(daemon) -> None:
    d = await daemon(1, [(1, SERVING), (2, SERVING)])
    eng = d.target.engine
    await eng.update(CID, 0, b"A" * 1000, chunk_size=CHUNK, chain_ver=1)
    await eng.commit(CID, 1)
    past = chunk_id(INODE, 1)
    await eng.update(past, 0, b"B" * 500, chunk_size=CHUNK, chain_ver=1)  # pending v1 only
    rsp = await d.rep.truncate_chunks(truncate_req(1000))
    assert rsp.removed == 1
    assert d.engine.get_meta(past) is None
    assert d.engine.get_meta(CID).committed.length == 1000


async def test_a_truncate_whose_caller_gave_up_while_it_waited_changes_nothing(daemon) -> None:
    """Meta truncates storage before it commits; a truncate that waited at the head (behind a
    chunk's lock, here) past its caller's deadline is not made: its caller has retried, maybe
    through another meta server, and may have written since."""
    d = await daemon(1, [(1, SERVING), (2, SERVING)])
    eng = d.target.engine
    await eng.update(CID, 0, b"A" * 1000, chunk_size=CHUNK, chain_ver=1)
    await eng.commit(CID, 1)
    past = chunk_id(INODE, 1)
    await eng.update(past, 0, b"B" * 500, chunk_size=CHUNK, chain_ver=1)
    await eng.commit(past, 1)
    loop = asyncio.get_running_loop()
    hold = d.rep.locks.hold(d.target.target_id, past)
    await hold.__aenter__()
    try:
        late = asyncio.ensure_future(d.rep.truncate_chunks(truncate_req(10), loop.time() + 0.2))
        await asyncio.sleep(0.4)
    finally:
        await hold.__aexit__(None, None, None)
    with pytest.raises(FS3Error) as err:
        await late
    assert err.value.code is StatusCode.DEADLINE_EXCEEDED
    assert d.engine.get_meta(past).committed.length == 500
    assert d.engine.get_meta(CID).committed.length == 1000
    assert d.chain.updates == []  # nothing went down the chain either
    rsp = await d.rep.truncate_chunks(truncate_req(10), loop.time() + 5)  # in time: made
    assert rsp.removed == 1 and rsp.truncated and d.engine.get_meta(CID).committed.length == 10


def _tagged(data: bytes, client: int, chain_version: int = 1) -> storage_pb2.WriteReq:
    req = client_write(data, 0)
    req.io.key.chain_version = chain_version
    req.tag.client_id, req.tag.channel, req.tag.seqnum, req.tag.request_id = client, 1, 1, 1
    return req


async def _unreachable(req: storage_pb2.UpdateReq) -> None:
    raise FS3Error(StatusCode.UNAVAILABLE, "successor unreachable")


async def test_a_retry_of_a_write_another_write_settled_is_answered_not_applied_again(daemon) -> None:
    """Client A's write stays pending at the head (its successor did not answer); client B's write
    to the chunk settles it, then is applied and acknowledged. A's retry (same tag) must get its
    first try's answer: applied again, it would land over B's acknowledged bytes."""
    d = await daemon(1, ALL_SERVING, forward_timeout_s=0.2)
    d.chain.on_update = _unreachable
    a = _tagged(b"A" * 10, client=0xA)
    with pytest.raises(FS3Error):
        await d.rep.client_update(a, memoryview(b"A" * 10))
    assert d.engine.get_meta(CID).pending_ver == 1
    d.chain.on_update = None
    b = _tagged(b"B" * 10, client=0xB)
    assert (await d.rep.client_update(b, memoryview(b"B" * 10))).committed_version == 2
    assert (await d.rep.client_update(a, memoryview(b"A" * 10))).committed_version == 1
    assert bytes(d.engine.read(CID).data) == b"B" * 10 and d.engine.get_meta(CID).committed_ver == 2
    # and the retry of a first try no other write settled settles it, once
    a2 = _tagged(b"C" * 10, client=0xA)
    a2.tag.seqnum = 2
    d.chain.on_update = _unreachable
    with pytest.raises(FS3Error):
        await d.rep.client_update(a2, memoryview(b"C" * 10))
    d.chain.on_update = None
    assert (await d.rep.client_update(a2, memoryview(b"C" * 10))).committed_version == 3
    assert d.engine.get_meta(CID).committed_ver == 3


async def test_a_retry_at_the_new_head_of_a_write_settled_there_is_answered(daemon) -> None:
    """The middle replica holds A's forwarded write pending (its successor did not answer), the head
    dies and the middle becomes the head; B's write settles A's and is acknowledged there, and A's
    retry there gets its first try's answer."""
    d = await daemon(2, ALL_SERVING, forward_timeout_s=0.2)
    d.chain.on_update = _unreachable
    fw = forwarded(b"A" * 10)
    fw.tag.client_id, fw.tag.channel, fw.tag.seqnum, fw.tag.request_id = 0xA, 1, 1, 1
    with pytest.raises(FS3Error):
        await d.rep.chain_update(fw, memoryview(b"A" * 10))
    assert d.engine.get_meta(CID).pending_ver == 1
    d.chain.on_update = None
    d.targets.apply_routing(routing(2, HEAD_OUT))
    b = _tagged(b"B" * 10, client=0xB, chain_version=2)
    assert (await d.rep.client_update(b, memoryview(b"B" * 10))).committed_version == 2
    a = _tagged(b"A" * 10, client=0xA, chain_version=2)
    assert (await d.rep.client_update(a, memoryview(b"A" * 10))).committed_version == 1
    assert bytes(d.engine.read(CID).data) == b"B" * 10


async def test_a_replica_that_failed_to_store_a_whole_chunk_write_serves_no_old_version(
    daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-chunk write is stored here and forwarded at the same time. The local write fails
    with an error that alone would leave the target online (EMFILE): the successors may commit the
    new version meanwhile (the tail serving it), so from that moment this replica, which holds no
    pending version, must serve no read of the old one: it goes offline at once, not once the
    forward returns; for such a passing error, not for good (its disk is sound) but until a resync
    has brought it up to date (TargetMap.rejoin)."""
    d = await daemon(1, ALL_SERVING)
    d.engine.update(CID, 0, b"a" * 100, chunk_size=CHUNK, chain_ver=1)
    d.engine.commit(CID, 1)
    files = d.engine._files
    write_new = files.write_new

    def emfile_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(files, "write_new", write_new)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(files, "write_new", emfile_once)
    rio = storage_pb2.ReadIO(offset=0, length=100)
    rio.key.chain_id, rio.key.chain_version, rio.key.inode_id, rio.key.chunk_index = 1, 1, INODE, 0
    read: list[object] = []

    async def successor(req: storage_pb2.UpdateReq) -> None:
        # the successors have committed version 2; a read comes here once the local write ended
        applying = d.rep._applying.get((d.target.target_id, CID))
        assert applying is not None
        await asyncio.wait((applying,))
        try:
            read.append((await d.rep.read(rio))[2])
        except FS3Error as e:
            read.append(e.code)

    d.chain.on_update = successor
    with pytest.raises(FS3Error):
        await d.rep.client_update(client_write(b"b" * 100), memoryview(b"b" * 100))
    assert read == [StatusCode.STORAGE_TARGET_NOT_SERVING]
    assert d.target.local_state == LOCAL_OFFLINE and not d.target.failed


def test_a_syncing_successors_stale_copy_is_no_divergence_alarm(caplog: pytest.LogCaptureFixture) -> None:
    """A forward that finds its version committed with other bytes is an ERROR at a SERVING
    successor (replicas diverged) but expected at a SYNCING one, which can hold a stale copy under
    the same number (the chunk removed and written again while it was away) until its resync
    replaces it: logged at INFO there (the chaos runs logged it as an error 66 times)."""
    caplog.set_level(logging.INFO, logger="fs3.storage.chain_ops")
    check_same(1, CID, 3, 0x1111, 0x2222, syncing=True)
    check_same(1, CID, 3, 0x1111, 0x2222)
    check_same(1, CID, 3, 0x1111, 0x1111)
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.ERROR]


class Payload(bytearray):
    """An update's bytes that can be watched with a weak reference."""


async def test_a_refused_update_keeps_no_bytes_in_a_reference_cycle(daemon) -> None:
    """A write the local store refuses (here a wrong checksum, refused by every replica alike)
    fails; nothing of it may keep its bytes in a reference cycle, which a daemon's seldom cyclic
    collections (fs3.daemon.settle_gc) would leave in memory."""
    d = await daemon(1, ALL_SERVING)
    gc.collect()
    gc.disable()
    try:
        data = Payload(b"q" * 4096)
        watch = weakref.ref(data)
        req = client_write(bytes(data))
        req.io.crc32c ^= 1
        with pytest.raises(FS3Error) as refused:
            await d.rep.client_update(req, memoryview(data))
        assert refused.value.code == StatusCode.STORAGE_CHECKSUM_MISMATCH
        del data, refused
        assert await released(watch), "a refused update's bytes are still referenced"
    finally:
        gc.enable()


async def test_a_forward_that_keeps_failing_is_logged_once_naming_the_successor(
    daemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A successor this daemon cannot reach while it still heartbeats mgmtd is not taken out of its
    chains (a network fault between two storage hosts): writes waited and failed with nothing in
    any log above DEBUG to say which link was down (partition review). After
    FORWARD_WARN_AFTER_S a WARNING names it, once per FORWARD_WARN_EVERY_S."""
    monkeypatch.setattr(craq, "FORWARD_WARN_AFTER_S", 0.2)
    d = await daemon(2, ALL_SERVING)
    d.rep.forward_timeout_s = 0.6

    async def unreachable(req: storage_pb2.UpdateReq) -> None:
        raise FS3Error(StatusCode.RPC_CONNECTION_CLOSED, "connection to target 3 closed")

    d.chain.on_update = unreachable
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        with pytest.raises(FS3Error) as e:
            await asyncio.wait_for(d.rep.chain_update(forwarded(b"z" * 10), memoryview(b"z" * 10)), 10)
        assert e.value.code == StatusCode.UNAVAILABLE
    warned = [r.getMessage() for r in caplog.records if "keeps failing" in r.getMessage()]
    assert len(warned) == 1, warned  # the second failure within FORWARD_WARN_EVERY_S is not repeated
    assert "target_id=2 succ=3" in warned[0] and "connection to target 3 closed" in warned[0]
