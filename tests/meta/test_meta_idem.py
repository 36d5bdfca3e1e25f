"""Retried requests and the expiry of their IDEM records: a record is never removed before its
time-to-live has passed by this server's clock, whatever the client's request id claims, and every
record is removed eventually."""

from __future__ import annotations

import asyncio
import errno
import os
import time

import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.kv import open_database
from fs3.meta.idempotency import CLOCK_SKEW_S, expire_idem
from fs3.meta.namespace import CALL_DEADLINE
from fs3.meta.permissions import ROOT
from fs3.meta.schema import ROOT_ID
from fs3.meta.storage_io import NoStorage
from fs3.meta.store import MetaStore
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)

DAY_NS = 86_400 * 10**9


async def _create_twice(store: MetaStore, name: bytes, request_id: int) -> None:
    """A create and its retry: the retry returns the first result."""
    first = await store.create(ROOT, ROOT_ID, name, 0o644, 0o200, idem=(5, request_id))
    again = await store.create(ROOT, ROOT_ID, name, 0o644, 0o200, idem=(5, request_id))
    assert again.inode.id == first.inode.id and again.created


async def test_records_outlive_their_ttl_whatever_the_request_id(store: MetaStore) -> None:
    now = time.time_ns()
    # Request ids that look ancient, current, a little ahead, far ahead, and random-sized.
    ids = [7, now, now + 10**9, now + DAY_NS, (1 << 63) - 11]
    for n, rid in enumerate(ids):
        await _create_twice(store, b"f%d" % n, rid)
    assert await expire_idem(store.db, ttl_s=3600) == 0
    for n, rid in enumerate(ids):  # still answered from the records, not refused with EEXIST
        again = await store.create(ROOT, ROOT_ID, b"f%d" % n, 0o644, 0o200, idem=(5, rid))
        assert again.created


async def test_expired_records_go_and_a_retry_then_is_a_new_request(store: MetaStore) -> None:
    now = time.time_ns()
    ids = [7, now, now + DAY_NS, (1 << 63) - 11]
    for n, rid in enumerate(ids):
        await _create_twice(store, b"f%d" % n, rid)
    assert await expire_idem(store.db, ttl_s=0) == len(ids)
    for n, rid in enumerate(ids):
        with pytest.raises(FS3Error) as e:
            await store.create(ROOT, ROOT_ID, b"f%d" % n, 0o644, 0o200, idem=(5, rid))
        assert e.value.errno == errno.EEXIST  # the record is gone: this is a new create


async def test_a_record_from_a_clock_slightly_ahead_goes_in_a_later_round(store: MetaStore) -> None:
    ahead = time.time_ns() + 10**9 // 2
    assert ahead < time.time_ns() + CLOCK_SKEW_S * 10**9
    await _create_twice(store, b"ahead", ahead)
    await expire_idem(store.db, ttl_s=0)  # its request id reads as recent: it may stay this round
    # Once this server's clock has passed its request id, the next round removes it.
    await asyncio.sleep(max(ahead - time.time_ns(), 0) / 1e9 + 0.01)
    await expire_idem(store.db, ttl_s=0)
    with pytest.raises(FS3Error) as e:
        await store.create(ROOT, ROOT_ID, b"ahead", 0o644, 0o200, idem=(5, ahead))
    assert e.value.errno == errno.EEXIST


class _GatedTruncates(NoStorage):
    """Storage whose truncates wait for ``gate`` (a slow storage), recording each one."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.truncates: list[tuple[int, int]] = []
        self.timeouts: list[float | None] = []

    async def truncate(
        self, layout: m.Layout, inode_id: int, length: int, *, timeout_s: float | None = None
    ) -> None:
        self.truncates.append((inode_id, length))
        self.timeouts.append(timeout_s)
        self.started.set()
        await self.gate.wait()


async def test_a_retried_truncating_open_waits_for_the_first_attempt_s_trim(tmp_path) -> None:
    """The client's retry of an O_TRUNC open whose trim is slow (its first attempt timed out on
    the client) returns only once that attempt's trim is done -- not sooner, nor with a second
    trim beside it: the client writes next, and a trim still on its way to storage would cut
    those bytes. (The first attempt, cancelled, committed nothing: the retry trims again after
    it and commits.)"""
    db = await open_database("lmdb", path=str(tmp_path / "kv"), map_size=1 << 28)
    chunks = _GatedTruncates()
    store = MetaStore(db, chunks=chunks)
    await store.start(background=False)
    try:
        f = (await store.create(ROOT, ROOT_ID, b"f", 0o644)).inode
        first = asyncio.ensure_future(store.open(ROOT, f.id, os.O_WRONLY | os.O_TRUNC, idem=(5, 77)))
        await asyncio.wait_for(chunks.started.wait(), 5)
        first.cancel()  # a caller that gives up does not stop the trim
        retry = asyncio.ensure_future(store.open(ROOT, f.id, os.O_WRONLY | os.O_TRUNC, idem=(5, 77)))
        await asyncio.sleep(0.2)
        assert not retry.done() and chunks.truncates == [(f.id, 0)]
        chunks.gate.set()
        ino, session = await asyncio.wait_for(retry, 5)
        assert session and ino.size == 0 and chunks.truncates == [(f.id, 0), (f.id, 0)]
    finally:
        await store.stop()
        await db.close()


async def test_a_setattr_applied_after_its_retry_and_a_newer_change_changes_nothing(store: MetaStore) -> None:
    """chmod 600 timed out on one meta server and was retried on another; chmod 644 followed. The
    first attempt, applied late by its stalled server, finds its retry's record: the mode stays 644
    (before request ids on Setattr, it went back to 600), and so for a truncate and a layout."""
    f = (await store.create(ROOT, ROOT_ID, b"f", 0o644)).inode.id
    d = (await store.mkdir(ROOT, ROOT_ID, b"d", 0o755)).id
    first = m.SetattrReq(fields=m.SETATTR_MODE, mode=0o600)
    assert (await store.setattr(ROOT, f, first, (5, 1))).mode & 0o777 == 0o600  # the retry
    await store.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_MODE, mode=0o644), (5, 2))
    late = await store.setattr(ROOT, f, first, (5, 1))
    assert late.mode & 0o777 == 0o600  # the first answer, again
    assert (await store.stat(f)).mode & 0o777 == 0o644
    await store.set_layout(ROOT, d, chunk_size=1 << 20, idem=(5, 3))
    await store.set_layout(ROOT, d, chunk_size=4 << 20, idem=(5, 4))
    await store.set_layout(ROOT, d, chunk_size=1 << 20, idem=(5, 3))
    assert (await store.stat(d)).layout.chunk_size == 4 << 20


async def test_a_truncate_whose_caller_gave_up_before_its_trim_trims_and_commits_nothing(tmp_path) -> None:
    """A truncate that waited (behind another's trim of the file, here) past its caller's deadline
    neither trims nor commits: its caller has retried, maybe on another meta server, and may have
    written since. In time, its trim carries what is left of the deadline to storage."""
    db = await open_database("lmdb", path=str(tmp_path / "kv"), map_size=1 << 28)
    chunks = _GatedTruncates()
    store = MetaStore(db, chunks=chunks)
    await store.start(background=False)
    loop = asyncio.get_running_loop()
    try:
        f = (await store.create(ROOT, ROOT_ID, b"f", 0o644)).inode
        chunks.gate.set()  # (an extension trims too)
        await store.setattr(ROOT, f.id, m.SetattrReq(fields=m.SETATTR_SIZE, size=100))
        chunks.gate.clear()
        chunks.started.clear()
        chunks.truncates.clear()
        earlier = asyncio.ensure_future(store.open(ROOT, f.id, os.O_WRONLY | os.O_TRUNC, idem=(5, 1)))
        await asyncio.wait_for(chunks.started.wait(), 5)
        token = CALL_DEADLINE.set(loop.time() + 0.2)  # the next call's deadline (its task copies it)
        try:
            late = asyncio.ensure_future(
                store.setattr(ROOT, f.id, m.SetattrReq(fields=m.SETATTR_SIZE, size=0), (5, 2))
            )
        finally:
            CALL_DEADLINE.reset(token)
        await asyncio.sleep(0.4)
        chunks.gate.set()
        await earlier
        with pytest.raises(FS3Error) as e:
            await late
        assert e.value.code == StatusCode.DEADLINE_EXCEEDED
        assert chunks.truncates == [(f.id, 0)] and (await store.stat(f.id)).size == 0
        token = CALL_DEADLINE.set(loop.time() + 5)
        try:  # the retry, in time: trimmed within what is left of its deadline, and committed
            assert (
                await store.setattr(ROOT, f.id, m.SetattrReq(fields=m.SETATTR_SIZE, size=0), (5, 2))
            ).size == 0
        finally:
            CALL_DEADLINE.reset(token)
        assert chunks.truncates == [(f.id, 0), (f.id, 0)] and 0 < chunks.timeouts[-1] <= 5
    finally:
        await store.stop()
        await db.close()
