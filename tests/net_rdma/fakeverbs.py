"""An in-process stand-in for the verbs layer, faithful where the transport's correctness depends on
it.

Queue pairs of one :class:`Fabric` reach each other by queue pair number. A SEND consumes the peer's
oldest posted receive (none posted: an RNR error, counted in ``fabric.rnr_errors``, since fs3's
credits must make that impossible); READ and WRITE check what an HCA checks: the target queue pair's
remote access flags, then an rkey of a memory region with remote access in the target's protection
domain (one per device here), its exact bounds and its READ/WRITE permission. Registered regions
have local access only, as :mod:`fs3.net.rdma.memory` requires; only exposures are reachable by
rkey. Work requests complete asynchronously (on a later loop iteration), SEND completions of a queue
pair in posting order (an unsignaled one produces none, and holds its send queue entry until a later
completion, as on a device), and completion-channel events are delivered through a real pipe file
descriptor only while the CQ is armed, as ``ibv_req_notify_cq`` specifies, so the transport's event
loop integration runs exactly as it would over a device. An error completion puts its queue pair in
the error state, as the IBTA specifies (and a remote access violation or a too-long SEND the
responder's too): its receives and every work request not yet executed are flushed.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import deque
from dataclasses import dataclass, field

from fs3.config import RdmaConfig
from fs3.net.rdma.discovery import Inventory, Nic
from fs3.net.rdma.memory import Exposure, Region, buffer_address
from fs3.net.rdma.wire import ConnectParams, LinkLayer, RemoteBuffer
from fs3.net.rdma.workreq import Completion

WC_SUCCESS = 0
WC_LOC_LEN_ERR = 1
WC_WR_FLUSH_ERR = 5
WC_REM_ACCESS_ERR = 10
WC_RETRY_EXC_ERR = 12
WC_RNR_RETRY_EXC_ERR = 13


@dataclass
class Fabric:
    qps: dict[int, FakeQueuePair] = field(default_factory=dict)
    local_only: dict[int, Region] = field(default_factory=dict)
    exposures: dict[int, tuple[FakeDevice, Exposure, memoryview]] = field(default_factory=dict)
    exposure_log: list[Exposure] = field(default_factory=list)  # every exposure ever made
    next_qpn: int = 100
    next_key: int = 1000
    rnr_errors: int = 0
    sends: int = 0
    send_completions: int = 0  # completions of SEND/READ/WRITE work requests (signaled, or failed)
    reads: int = 0
    writes: int = 0
    registered: int = 0
    fail_next_read: bool = False

    def inventory(self, count: int = 2) -> Inventory:
        gid = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
        return Inventory([Nic(f"fake{i}", 1, 1, gid, 0, LinkLayer.ETHERNET, 3) for i in range(count)])

    def opener(self, nic: Nic, cfg: RdmaConfig) -> FakeDevice:
        return FakeDevice(self, nic)


class FakeDevice:
    def __init__(self, fabric: Fabric, nic: Nic) -> None:
        self.fabric = fabric
        self.nic = nic
        self.name = nic.name
        self.closed = False

    def register(self, nbytes: int) -> Region:
        buf = bytearray(nbytes)
        view = memoryview(buf)
        key = self.fabric.next_key
        self.fabric.next_key += 1
        region = Region(view, buffer_address(view), key, key, nbytes, buf)
        self.fabric.local_only[key] = region  # local access only: no rkey finds it
        self.fabric.registered += nbytes
        return region

    def deregister(self, region: Region) -> None:
        if self.fabric.local_only.pop(region.rkey, None) is not None:
            self.fabric.registered -= region.length

    def expose(self, region: Region, offset: int, length: int, *, write: bool = False) -> Exposure:
        assert region.rkey in self.fabric.local_only, "exposing memory that is not registered"
        if offset < 0 or length <= 0 or offset + length > region.length:
            raise ValueError("exposure outside its region")
        key = self.fabric.next_key
        self.fabric.next_key += 1
        exposure = Exposure(region.addr + offset, key, length, write)
        self.fabric.exposures[key] = (self, exposure, region.view[offset : offset + length])
        self.fabric.exposure_log.append(exposure)
        return exposure

    def withdraw(self, exposure: Exposure) -> None:
        del self.fabric.exposures[exposure.rkey]

    def queue_pair(self, max_send_wr: int, max_recv_wr: int) -> FakeQueuePair:
        return FakeQueuePair(self, max_send_wr, max_recv_wr)

    def close(self) -> None:
        self.closed = True


def _find(target: FakeQueuePair | None, rkey: int, addr: int, length: int, write: bool) -> memoryview | None:
    """What a responder checks before a remote READ/WRITE touches its memory (None: access error)."""
    if target is None or target.closed or target.errored or not target.remote_access:
        return None
    entry = target.fabric.exposures.get(rkey)
    if entry is None:
        return None
    dev, exp, view = entry
    if dev is not target.dev or (write and not exp.write):
        return None
    if addr < exp.addr or addr + length > exp.addr + exp.length:
        return None
    off = addr - exp.addr
    return view[off : off + length]


class FakeQueuePair:
    def __init__(self, dev: FakeDevice, max_send_wr: int, max_recv_wr: int) -> None:
        self.dev = dev
        self.fabric = dev.fabric
        self.loop = asyncio.get_running_loop()
        self.qpn = self.fabric.next_qpn
        self.fabric.next_qpn += 1
        self.fabric.qps[self.qpn] = self
        self.psn = random.getrandbits(24)
        self.max_send_wr = max_send_wr
        self.max_recv_wr = max_recv_wr
        self.recvs: deque[tuple[int, Region, int, int]] = deque()
        self.send_outstanding = 0
        self.sq_held = 0  # entries of unsignaled work requests not yet vouched for by a completion
        self.cq: deque[Completion] = deque()
        self.armed = False
        self.events = 0
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        self.peer: int | None = None
        self.closed = False
        self.remote_access = False  # created without remote access flags, as verbs.py does
        self.errored = False  # in the error state: everything posted is flushed
        self.held: list | None = None  # a test's: work requests posted, not executed until it runs them

    def local_params(self, recv_buffers: int, buffer_size: int, inline_max: int) -> ConnectParams:
        nic = self.dev.nic
        return ConnectParams(
            self.qpn,
            self.psn,
            nic.lid,
            nic.mtu,
            nic.link_layer,
            nic.gid,
            recv_buffers,
            buffer_size,
            inline_max,
        )

    def connect(self, remote: ConnectParams, *, timeout: int, retry_cnt: int, rnr_retry: int) -> None:
        self.peer = remote.qpn

    # ---- QueuePairOps -------------------------------------------------------------------------

    def allow_remote_access(self) -> None:
        assert not self.closed and self.peer is not None  # RTS -> RTS, as verbs.py does
        self.remote_access = True

    def fileno(self) -> int:
        return self.rfd

    def _complete(self, wc: Completion) -> None:
        if self.closed:
            return
        self.cq.append(wc)
        if self.armed:
            self.armed = False
            self.events += 1
            os.write(self.wfd, b"e")

    def to_error(self) -> None:
        """The IBTA error state, which any error completion puts a queue pair in (a requester's
        own, or a responder's for a class C error: a remote access violation, a too-long SEND):
        the receives it holds, and every work request posted to it from now on, complete with
        WR_FLUSH_ERR. Nothing on the queue pair works again."""
        if self.errored or self.closed:
            return
        self.errored = True
        while self.recvs:
            self._complete(Completion(self.recvs.popleft()[0], WC_WR_FLUSH_ERR))

    def post_recv(self, wr_id: int, region: Region, offset: int, length: int) -> None:
        assert not self.closed
        if self.errored:
            self.loop.call_soon(self._complete, Completion(wr_id, WC_WR_FLUSH_ERR))
            return
        if len(self.recvs) >= self.max_recv_wr:
            raise OSError(12, "receive queue full")
        self.recvs.append((wr_id, region, offset, length))

    def _post(self, wr_id: int, op) -> None:  # type: ignore[no-untyped-def]
        assert not self.closed and self.peer is not None
        if self.send_outstanding >= self.max_send_wr:
            raise OSError(12, "send queue full")
        self.send_outstanding += 1

        def run() -> None:  # posted before the error state and not yet executed: flushed too
            if self.errored:
                self._done(wr_id, WC_WR_FLUSH_ERR)
            else:
                op()

        if self.held is not None:
            self.held.append(run)
        else:
            self.loop.call_soon(run)

    def _done(self, wr_id: int, status: int, signaled: bool = True) -> None:
        if not signaled and status == WC_SUCCESS:
            # an unsignaled work request keeps its send queue entry until a later completion
            self.sq_held += 1
            return
        self.send_outstanding -= 1 + self.sq_held
        self.sq_held = 0
        self.fabric.send_completions += 1
        self._complete(Completion(wr_id, status))
        if status != WC_SUCCESS:
            self.to_error()

    def post_send(self, wr_id: int, region: Region, offset: int, length: int, signaled: bool = True) -> None:
        data = bytes(region.view[offset : offset + length])

        def deliver() -> None:
            self.fabric.sends += 1
            peer = self.fabric.qps.get(self.peer)  # type: ignore[arg-type]
            if peer is None or peer.closed or peer.errored:  # nobody answers: retries run out
                self._done(wr_id, WC_RETRY_EXC_ERR)
                return
            if not peer.recvs:
                self.fabric.rnr_errors += 1
                self._done(wr_id, WC_RNR_RETRY_EXC_ERR)
                return
            rid, rregion, roff, rlen = peer.recvs.popleft()
            if length > rlen:
                peer._complete(Completion(rid, WC_LOC_LEN_ERR))
                peer.to_error()
                self._done(wr_id, WC_REM_ACCESS_ERR)
                return
            rregion.view[roff : roff + length] = data
            peer._complete(Completion(rid, WC_SUCCESS, length))
            self._done(wr_id, WC_SUCCESS, signaled)

        self._post(wr_id, deliver)

    def post_read(self, wr_id: int, region: Region, offset: int, length: int, remote: RemoteBuffer) -> None:
        def run() -> None:
            self.fabric.reads += 1
            target = self.fabric.qps.get(self.peer)  # type: ignore[arg-type]
            src = _find(target, remote.rkey, remote.addr, length, False)
            if src is None or self.fabric.fail_next_read:
                if src is None and target is not None:
                    target.to_error()  # the responder's class C error
                self.fabric.fail_next_read = False
                self._done(wr_id, WC_REM_ACCESS_ERR)
                return
            region.view[offset : offset + length] = src
            self._done(wr_id, WC_SUCCESS)

        self._post(wr_id, run)

    def post_write(self, wr_id: int, region: Region, offset: int, length: int, remote: RemoteBuffer) -> None:
        def run() -> None:
            self.fabric.writes += 1
            target = self.fabric.qps.get(self.peer)  # type: ignore[arg-type]
            dst = _find(target, remote.rkey, remote.addr, length, True)
            if dst is None:
                if target is not None:
                    target.to_error()  # the responder's class C error
                self._done(wr_id, WC_REM_ACCESS_ERR)
                return
            dst[:] = region.view[offset : offset + length]
            self._done(wr_id, WC_SUCCESS)

        self._post(wr_id, run)

    def take_events(self) -> None:
        try:
            while os.read(self.rfd, 4096):
                pass
        except BlockingIOError:
            pass

    def arm(self) -> None:
        self.armed = True

    def poll(self, n: int) -> list[Completion]:
        out = []
        while self.cq and len(out) < n:
            out.append(self.cq.popleft())
        return out

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.fabric.qps.pop(self.qpn, None)
        os.close(self.rfd)
        os.close(self.wfd)
