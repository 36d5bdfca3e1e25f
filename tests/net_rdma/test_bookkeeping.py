"""Work-request ids and completion dispatch, registered memory, NIC choice and the one-sided cap."""

from __future__ import annotations

import asyncio

import pytest

from fs3.errors import FS3Error, StatusCode
from fs3.net.rdma.memory import Region, RegionDirectory, RegisteredPool, SlotArena, buffer_address
from fs3.net.rdma.nics import NicSelector, OneSidedLimiter
from fs3.net.rdma.workreq import (
    WC_SUCCESS,
    WC_WR_FLUSH_ERR,
    Completion,
    OneSidedTable,
    SendSignaling,
    WrKind,
    decode_wr_id,
    encode_wr_id,
    status_name,
)

pytestmark = pytest.mark.timeout(30)

# ---- work requests ---------------------------------------------------------------------------


def test_wr_id_round_trip_and_bounds() -> None:
    for kind in WrKind:
        for index in (0, 1, 31, (1 << 60) - 1):
            assert decode_wr_id(encode_wr_id(kind, index)) == (kind, index)
    assert encode_wr_id(WrKind.SEND, 3) != encode_wr_id(WrKind.RECV, 3)
    with pytest.raises(ValueError):
        encode_wr_id(WrKind.READ, 1 << 60)
    with pytest.raises(ValueError):
        encode_wr_id(WrKind.READ, -1)
    with pytest.raises(ValueError, match="no known kind"):
        decode_wr_id(0x7 << 60)
    with pytest.raises(ValueError, match="no known kind"):
        decode_wr_id(5)  # kind 0


def test_one_sided_completions_reach_their_own_callback() -> None:
    table = OneSidedTable()
    seen: list[tuple[str, int, str]] = []
    ids = [
        table.add(k, lambda s, e, n=n: seen.append((n, s, e)))
        for n, k in (("a", WrKind.READ), ("b", WrKind.WRITE), ("c", WrKind.READ))
    ]
    assert len(set(ids)) == 3 and len(table) == 3
    assert [decode_wr_id(i)[0] for i in ids] == [WrKind.READ, WrKind.WRITE, WrKind.READ]
    # out of order, one failing with a remote access error
    assert table.complete(Completion(ids[2], WC_SUCCESS, 0))
    assert table.complete(Completion(ids[0], 10))
    assert seen == [("c", 0, ""), ("a", 10, "remote access error")]
    assert not table.complete(Completion(ids[0], WC_SUCCESS))  # no second completion for one request
    table.fail_all("queue pair destroyed")
    assert seen[-1] == ("b", WC_WR_FLUSH_ERR, "queue pair destroyed") and len(table) == 0
    with pytest.raises(ValueError):
        table.add(WrKind.SEND, lambda s, e: None)


def test_discarded_operation_never_calls_back() -> None:
    table = OneSidedTable()
    wr = table.add(WrKind.WRITE, lambda s, e: pytest.fail("called"))
    table.discard(wr)
    assert not table.complete(Completion(wr, WC_SUCCESS)) and len(table) == 0


def test_send_signaling_vouches_for_the_unsignaled_sends_before_it() -> None:
    sig = SendSignaling(every=3)
    # a burst of 7 SENDs: every third is signaled, and so is the last
    flags = [sig.post(slot, last=slot == 6) for slot in range(7)]
    assert flags == [False, False, True, False, False, True, True]
    assert sig.unsignaled == 0  # nothing is left waiting for a completion after a burst
    # each completion gives back the unsignaled slots posted before it, in order, then its own
    assert sig.completed(2) == [0, 1, 2]
    assert sig.completed(5) == [3, 4, 5]
    assert sig.completed(6) == [6]
    # a burst of one is always signaled; every=1 signals everything
    assert sig.post(9, last=True) and sig.completed(9) == [9]
    one = SendSignaling(every=1)
    assert all(one.post(s, last=False) for s in range(4)) and one.completed(3) == [3]
    # mid-burst, the unsignaled ones are counted until a signaled SEND covers them
    assert not sig.post(1, last=False) and sig.unsignaled == 1
    assert sig.post(2, last=True) and sig.completed(2) == [1, 2]
    with pytest.raises(ValueError):
        SendSignaling(0)


def test_status_names() -> None:
    assert status_name(0) == "success" and status_name(13) == "RNR retry counter exceeded"
    assert status_name(99) == "status 99"


# ---- registered memory -------------------------------------------------------------------------


class FakeRegistrar:
    def __init__(self) -> None:
        self.live: dict[int, Region] = {}
        self.key = 0
        self.calls = 0

    def register(self, nbytes: int) -> Region:
        self.calls += 1
        self.key += 1
        view = memoryview(bytearray(nbytes))
        r = Region(view, buffer_address(view), self.key, self.key, nbytes)
        self.live[self.key] = r
        return r

    def deregister(self, region: Region) -> None:
        del self.live[region.rkey]


def test_buffer_address_works_for_read_only_buffers() -> None:
    b = bytearray(b"abcdef")
    assert buffer_address(memoryview(b)[2:]) == buffer_address(b) + 2
    data = b"immutable bytes"
    assert buffer_address(data) == buffer_address(memoryview(data))
    assert buffer_address(memoryview(b).toreadonly()) == buffer_address(b)


def test_slot_arena() -> None:
    reg = FakeRegistrar()
    arena = SlotArena(reg.register(4096), 1024, 4)
    got = [arena.acquire() for _ in range(4)]
    assert sorted(got) == [0, 1, 2, 3] and arena.acquire() is None and arena.available == 0  # type: ignore[type-var]
    arena.view(2)[:3] = b"xyz"
    assert bytes(arena.region.view[2048:2051]) == b"xyz" and arena.offset(2) == 2048
    arena.release(2)
    assert arena.acquire() == 2
    with pytest.raises(ValueError):
        arena.release(4)
    with pytest.raises(ValueError):
        SlotArena(reg.register(1000), 1024, 1)


def test_pool_reuses_registrations_and_finds_its_buffers() -> None:
    reg = FakeRegistrar()
    pool = RegisteredPool(reg, max_bytes=1 << 20, max_buffer_bytes=1 << 18)
    a = pool.try_acquire(5000)
    assert a is not None and a.view.nbytes == 5000 and a.region.length == 8192
    found = pool.directory.find(a.view[100:200])
    assert found is not None and found[0] is a.region and found[1] == 100
    assert pool.directory.find(bytearray(10)) is None
    pool.release(a)
    b = pool.try_acquire(8000)
    assert b is not None and b.region is a.region and reg.calls == 1  # same class: no new registration
    with pytest.raises(FS3Error) as info:
        pool.try_acquire((1 << 18) + 1)
    assert info.value.code == StatusCode.RPC_FRAME_TOO_LARGE


def test_pool_exhaustion_and_eviction() -> None:
    reg = FakeRegistrar()
    pool = RegisteredPool(reg, max_bytes=64 << 10, max_buffer_bytes=64 << 10)
    bufs = [pool.try_acquire(16 << 10) for _ in range(4)]
    assert all(bufs) and pool.registered_bytes == 64 << 10
    assert pool.try_acquire(4096) is None  # at the cap: nothing more is pinned
    for b in bufs:
        pool.release(b)  # type: ignore[arg-type]
    # a 64 KiB buffer fits only once the idle 16 KiB ones are deregistered
    big = pool.try_acquire(60 << 10)
    assert big is not None and pool.registered_bytes == 64 << 10 and len(reg.live) == 1
    pool.release(big)
    pool.close()
    assert reg.live == {}


async def test_pool_back_pressure_is_fifo_and_survives_cancellation() -> None:
    reg = FakeRegistrar()
    pool = RegisteredPool(reg, max_bytes=32 << 10, max_buffer_bytes=32 << 10)
    held = await pool.acquire(32 << 10)
    order: list[str] = []

    async def want(name: str, n: int) -> None:
        b = await pool.acquire(n)
        order.append(name)
        pool.release(b)

    first = asyncio.ensure_future(want("first", 4096))
    cancelled = asyncio.ensure_future(want("cancelled", 4096))
    second = asyncio.ensure_future(want("second", 8192))
    await asyncio.sleep(0)  # one loop iteration: each new task runs up to its wait
    assert pool.waiting == 3 and pool.try_acquire(10) is None  # waiters go first
    cancelled.cancel()
    cb_got: list[object] = []
    pool.acquire_cb(4096, cb_got.append)  # a callback waiter, queued behind the others
    pool.release(held)
    await asyncio.gather(first, second)
    assert order == ["first", "second"] and len(cb_got) == 1 and pool.waiting == 0
    pool.release(cb_got[0])  # type: ignore[arg-type]
    assert pool.in_use_bytes == 0


def test_directory_needs_the_whole_buffer_inside_one_region() -> None:
    reg = FakeRegistrar()
    d = RegionDirectory()
    r = reg.register(4096)
    d.add(r)
    assert d.find(r.view) == (r, 0)
    assert d.find(r.view[4000:]) == (r, 4000)
    assert d.find(b"") is None
    d.remove(r)
    assert d.find(r.view) is None
    d.remove(r)  # idempotent


# ---- NICs -------------------------------------------------------------------------------------


def test_round_robin_per_peer() -> None:
    sel = NicSelector(["mlx5_0", "mlx5_1", "mlx5_2"])
    a = [sel.pick("10.0.0.1") for _ in range(6)]
    b = [sel.pick("10.0.0.2") for _ in range(3)]
    assert sorted(a[:3]) == ["mlx5_0", "mlx5_1", "mlx5_2"] and a[3:] == a[:3]
    assert sorted(b) == ["mlx5_0", "mlx5_1", "mlx5_2"]  # a second peer gets its own rotation
    with pytest.raises(ValueError):
        NicSelector([])


def test_limiter_caps_and_queues_in_order() -> None:
    lim = OneSidedLimiter(2)
    started: list[int] = []
    for i in range(5):
        lim.submit(lambda i=i: started.append(i))
    assert started == [0, 1] and lim.outstanding == 2 and lim.queued == 3
    lim.release()
    assert started == [0, 1, 2] and lim.outstanding == 2
    for _ in range(4):
        lim.release()
    assert started == [0, 1, 2, 3, 4] and lim.outstanding == 0 and lim.peak == 2
    with pytest.raises(RuntimeError):
        lim.release()
    with pytest.raises(ValueError):
        OneSidedLimiter(0)


async def test_limiter_async_acquire_and_cancel() -> None:
    lim = OneSidedLimiter(1)
    await lim.acquire()
    waiter = asyncio.ensure_future(lim.acquire())
    later: list[str] = []
    lim.submit(lambda: later.append("ran"))
    await asyncio.sleep(0)  # one loop iteration: the waiter task queues
    assert lim.queued == 2
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    lim.release()  # the cancelled waiter's slot passes on to the callback
    assert later == ["ran"] and lim.outstanding == 1
    lim.release()
    assert lim.outstanding == 0
