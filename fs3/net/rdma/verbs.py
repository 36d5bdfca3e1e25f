"""The thin layer over pyverbs: an opened NIC (context, protection domain, registered memory) and an
RC queue pair with its own CQ and completion channel.

Everything else in :mod:`fs3.net.rdma` is plain Python over the small interfaces this module
implements (:class:`~fs3.net.rdma.memory.Registrar`, :class:`~fs3.net.rdma.connection.QueuePairOps`),
so only this file needs a device to run.

pyverbs (44.0, as Debian ships it) does not expose a completion channel's file descriptor, which
asyncio needs to watch: ``CompChannel`` has only ``close`` and ``get_cq_event`` (the ``channel``
property that once returned the C pointer was removed upstream), and ``Context.context`` is no
integer handle ctypes could start from (reading it on an unopened Context crashes the interpreter:
it is the C pointer handed to Python as an object). The kernel creates the
descriptor as an anonymous inode named ``[infinibandevent]`` when the channel is created, so
:func:`_create_channel` notes which such descriptors exist before and after creating one (under a
lock) and takes the new one, then makes it non-blocking so ``get_cq_event`` never blocks the loop.
A one-line property in pyverbs' cq.pyx (``return self.cc.fd``) would make this unnecessary.

Memory is registered for local access only and queue pairs are created without remote access;
:meth:`Device.expose` and :meth:`VerbsQueuePair.allow_remote_access` are the only ways a peer gets
to our memory (see :mod:`fs3.net.rdma.connection` for when they are used).

tests/net_rdma/test_pyverbs_api.py checks every pyverbs call made here against the installed pyverbs.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import threading
from typing import Any

from fs3.errors import FS3Error, StatusCode
from fs3.net.rdma.discovery import Nic
from fs3.net.rdma.memory import Exposure, Region, buffer_address
from fs3.net.rdma.wire import ConnectParams, LinkLayer, RemoteBuffer
from fs3.net.rdma.workreq import Completion

try:
    import pyverbs.enums as e
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.cq import CQ, CompChannel
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, RecvWR, SendWR

    HAVE_PYVERBS = True
    REMOTE_ACCESS = e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
except ImportError:  # pragma: no cover - depends on the machine
    HAVE_PYVERBS = False

_EVENT_FD_LINK = "anon_inode:[infinibandevent]"
_channel_lock = threading.Lock()


def _event_fds() -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == _EVENT_FD_LINK:
                out.add(int(name))
        except OSError:
            continue
    return out


def _create_channel(ctx: Any) -> tuple[Any, int]:
    with _channel_lock:
        before = _event_fds()
        channel = CompChannel(ctx)
        new = _event_fds() - before
    if len(new) != 1:
        channel.close()
        raise FS3Error(StatusCode.INTERNAL, f"cannot identify the completion channel's descriptor ({new})")
    fd = new.pop()
    os.set_blocking(fd, False)
    return channel, fd


class Device:
    """One opened NIC (device and port): its context, protection domain and memory registrations."""

    def __init__(self, nic: Nic, *, traffic_class: int = 0, service_level: int = 0) -> None:
        if not HAVE_PYVERBS:
            raise FS3Error(StatusCode.UNAVAILABLE, "pyverbs is not importable; run `make rdma`")
        self.nic = nic
        self.name = nic.name
        self.traffic_class = traffic_class
        self.service_level = service_level
        self.ctx = Context(name=nic.device)
        self.pd = PD(self.ctx)

    # ---- Registrar ------------------------------------------------------------------------------

    def register(self, nbytes: int) -> Region:
        """Page-aligned anonymous memory of ``nbytes``, registered for local access only."""
        mem = mmap.mmap(-1, nbytes)
        view = memoryview(mem)
        addr = buffer_address(view)
        try:
            mr = MR(self.pd, nbytes, e.IBV_ACCESS_LOCAL_WRITE, address=addr)
        except PyverbsError as exc:
            view.release()
            mem.close()
            raise FS3Error(
                StatusCode.RESOURCE_EXHAUSTED, f"registering {nbytes} bytes failed: {exc}"
            ) from exc
        return Region(view, addr, mr.lkey, mr.rkey, nbytes, (mr, mem))

    def deregister(self, region: Region) -> None:
        mr, mem = region.handle
        mr.close()
        try:
            region.view.release()
            mem.close()
        except BufferError:
            pass  # a view of it is still referenced somewhere; the mapping goes with the last one

    def expose(self, region: Region, offset: int, length: int, *, write: bool = False) -> Exposure:
        """A memory region of exactly ``length`` bytes of ``region`` from ``offset`` with remote
        READ (and WRITE) access: the NIC checks every remote access against these bounds."""
        if offset < 0 or length <= 0 or offset + length > region.length:
            raise ValueError(f"{length} bytes at {offset} are outside a {region.length}-byte region")
        # LOCAL_WRITE too: remote write needs it, and pinning for write keeps the pages the ones the
        # region's registration pinned (a read-only pin may map a page that is replaced later).
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ
        if write:
            access |= e.IBV_ACCESS_REMOTE_WRITE
        addr = region.addr + offset
        try:
            mr = MR(self.pd, length, access, address=addr)
        except PyverbsError as exc:
            raise FS3Error(
                StatusCode.RESOURCE_EXHAUSTED, f"registering {length} bytes for a peer failed: {exc}"
            ) from exc
        return Exposure(addr, mr.rkey, length, write, mr)

    def withdraw(self, exposure: Exposure) -> None:
        exposure.handle.close()  # ibv_dereg_mr: the rkey is invalid once this returns

    # ---- queue pairs ----------------------------------------------------------------------------

    def queue_pair(self, max_send_wr: int, max_recv_wr: int) -> VerbsQueuePair:
        """A new RC queue pair in the INIT state."""
        return VerbsQueuePair(self, max_send_wr, max_recv_wr)

    def close(self) -> None:
        self.pd.close()
        self.ctx.close()


class VerbsQueuePair:
    """An RC queue pair with a CQ and completion channel of its own (pyverbs' ``get_cq_event`` wants
    to know which CQ an event is for, so channels are not shared)."""

    def __init__(self, dev: Device, max_send_wr: int, max_recv_wr: int) -> None:
        self.dev = dev
        self.channel, self._fd = _create_channel(dev.ctx)
        try:
            self.cq = CQ(dev.ctx, max_send_wr + max_recv_wr, None, self.channel, 0)
            cap = QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr, max_send_sge=1, max_recv_sge=1)
            # sq_sig_all=0: each work request says whether it wants a completion (SendSignaling)
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
            attr = QPAttr(port_num=dev.nic.port)
            # No remote access until the peer has authenticated (allow_remote_access).
            attr.qp_access_flags = 0
            attr.pkey_index = 0
            self.qp = QP(dev.pd, init, attr)  # pyverbs moves an RC QP to INIT given attributes
        except BaseException:
            self.channel.close()
            raise
        self.psn = random.getrandbits(24)
        self._closed = False

    def local_params(self, recv_buffers: int, buffer_size: int, inline_max: int) -> ConnectParams:
        nic = self.dev.nic
        return ConnectParams(
            self.qp.qp_num,
            self.psn,
            nic.lid,
            nic.mtu,
            nic.link_layer,
            nic.gid,
            recv_buffers,
            buffer_size,
            inline_max,
        )

    def connect(
        self, remote: ConnectParams, *, timeout: int = 14, retry_cnt: int = 7, rnr_retry: int = 7
    ) -> None:
        """INIT -> RTR -> RTS towards ``remote``."""
        dev = self.dev
        attr = rts_attributes(
            dev.nic,
            remote,
            self.psn,
            traffic_class=dev.traffic_class,
            service_level=dev.service_level,
            timeout=timeout,
            retry_cnt=retry_cnt,
            rnr_retry=rnr_retry,
        )
        self.qp.to_rts(attr)

    # ---- QueuePairOps ---------------------------------------------------------------------------

    def allow_remote_access(self) -> None:
        """Let the peer RDMA-READ and RDMA-WRITE (memory it holds an exposure's rkey for): an RTS to
        RTS transition that changes only the queue pair's access flags."""
        attr = QPAttr(qp_state=e.IBV_QPS_RTS, cur_qp_state=e.IBV_QPS_RTS)
        attr.qp_access_flags = REMOTE_ACCESS
        self.qp.modify(attr, e.IBV_QP_ACCESS_FLAGS)

    def fileno(self) -> int:
        return self._fd

    def post_recv(self, wr_id: int, region: Region, offset: int, length: int) -> None:
        sge = SGE(region.addr + offset, length, region.lkey)
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]), None)

    def post_send(self, wr_id: int, region: Region, offset: int, length: int, signaled: bool = True) -> None:
        wr = send_request(e.IBV_WR_SEND, wr_id, region, offset, length, signaled=signaled)
        self.qp.post_send(wr, None)

    def post_read(self, wr_id: int, region: Region, offset: int, length: int, remote: RemoteBuffer) -> None:
        self.qp.post_send(send_request(e.IBV_WR_RDMA_READ, wr_id, region, offset, length, remote), None)

    def post_write(self, wr_id: int, region: Region, offset: int, length: int, remote: RemoteBuffer) -> None:
        self.qp.post_send(send_request(e.IBV_WR_RDMA_WRITE, wr_id, region, offset, length, remote), None)

    def take_events(self) -> None:
        n = 0
        try:
            while True:
                try:
                    self.channel.get_cq_event(self.cq)
                except PyverbsRDMAError as exc:
                    if exc.error_code in (errno.EAGAIN, errno.EWOULDBLOCK):
                        break
                    raise
                n += 1
        finally:
            if n:
                # Unacknowledged events would make destroying the CQ wait forever.
                self.cq.ack_events(n)

    def arm(self) -> None:
        self.cq.req_notify()

    def poll(self, n: int) -> list[Completion]:
        _, wcs = self.cq.poll(n)
        return [Completion(wc.wr_id, wc.status, wc.byte_len) for wc in wcs]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.qp.close()
        self.cq.close()
        self.channel.close()


def gid_string(gid: bytes) -> str:
    """A 16-byte GID as pyverbs writes it (eight groups of four hex digits)."""
    h = gid.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def rts_attributes(
    nic: Nic,
    remote: ConnectParams,
    psn: int,
    *,
    traffic_class: int = 0,
    service_level: int = 0,
    timeout: int = 14,
    retry_cnt: int = 7,
    rnr_retry: int = 7,
) -> Any:
    """The ``QPAttr`` that moves an RC queue pair on ``nic`` to RTR and RTS towards ``remote``: the
    path MTU both sides support, the peer's QPN and PSN, an address vector with the peer's LID and
    (RoCE, or any non-zero GID) a global route to its GID with our GID index and traffic class."""
    attr = QPAttr(port_num=nic.port)
    attr.path_mtu = min(nic.mtu, remote.mtu)
    attr.dest_qp_num = remote.qpn
    attr.rq_psn = remote.psn
    attr.sq_psn = psn
    attr.max_dest_rd_atomic = nic.max_rd_atomic
    attr.max_rd_atomic = nic.max_rd_atomic
    attr.min_rnr_timer = 12
    attr.timeout = timeout
    attr.retry_cnt = retry_cnt
    attr.rnr_retry = rnr_retry
    is_global = 1 if nic.link_layer == LinkLayer.ETHERNET or any(remote.gid) else 0
    gr = GlobalRoute(
        dgid=GID(val=gid_string(remote.gid)), sgid_index=nic.gid_index, traffic_class=traffic_class
    )
    attr.ah_attr = AHAttr(port_num=nic.port, is_global=is_global, gr=gr, dlid=remote.lid, sl=service_level)
    return attr


def send_request(
    opcode: int,
    wr_id: int,
    region: Region,
    offset: int,
    length: int,
    remote: RemoteBuffer | None = None,
    *,
    signaled: bool = True,
) -> Any:
    """A ``SendWR`` of one scatter/gather entry (SEND, or RDMA READ/WRITE to ``remote``), signaled
    unless told otherwise."""
    sge = SGE(region.addr + offset, length, region.lkey)
    flags = e.IBV_SEND_SIGNALED if signaled else 0
    wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge], send_flags=flags)
    if remote is not None:
        wr.set_wr_rdma(remote.rkey, remote.addr)
    return wr
